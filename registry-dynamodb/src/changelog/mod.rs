//! The change log ([`crate::WatchMode::ChangeLog`]): items of their own in
//! the registry's table, written in the same `TransactWriteItems` as the
//! endpoints they describe, so the log and the table cannot disagree.
//!
//! The log has `changelog_heads` heads (default 1). Each key's changes go
//! to one head ([`changelog_head_of`]); head 0's items are in the partition
//! [`LOG_PARTITION`], head `h`'s (h ≥ 1) in `LOG_PARTITION/h`, which no
//! endpoint can use. In each head's partition:
//! - the **head**, sort key [`HEAD_ID`]: attribute `v` (N), the last
//!   version written there; with more than one head, `heads` (N), their
//!   number;
//! - one **entry** per version, sort key `v` + the version in 20 digits
//!   (so they sort by version, all before the head): `put` (L of M, the
//!   endpoint items written, in the endpoint layout), `del` (L of M, the
//!   keys deleted), `last` (N, the last version of the same batch on this
//!   head: a batch too big for one 400 KB item takes several consecutive
//!   versions), and the TTL attribute (`now + changelog_retention`); with
//!   more than one head, `at` (N), the batch's stamp: the writer's clock in
//!   microseconds when it sent the transaction, never going back within
//!   one process.
//!
//! A batch whose keys route to heads `h…` that it finds at `V_h` writes, in
//! one transaction, its endpoint actions and, per head, an update from
//! `V_h` to `V_h + p_h` (condition `v = V_h` and the same number of heads,
//! or no head yet when `V_h` is 0) and the entries `V_h + 1` to `V_h + p_h`
//! (condition: not there yet). DynamoDB applies a transaction whole or not
//! at all and serialises transactions on each head item, so each head's
//! versions are handed out once each, in commit order, with no leader, and
//! each key's history is in its head's order. A writer whose condition
//! failed wrote nothing, reads its heads again and retries after a pause
//! drawn at random up to a ceiling that starts at the lost transaction's
//! round trip and doubles with each loss (full jitter;
//! [`CHANGELOG_ATTEMPTS`] times, then `Conflict`). Writers only race each
//! other for the heads their batches share, so more heads hold more
//! writers; readers pay one `Query` per head and sync, and merge what one
//! sync read by the batches' stamps, each head in its own order (so each
//! key's history is exact, and batches on different heads reach readers in
//! commit order up to the writers' clock skew).

mod items;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use waypost::{EndpointKey, Error, Op, Result};

/// What the change log's writer keeps between batches.
#[derive(Debug, Default)]
pub(crate) struct HeadCache {
    /// Its guess of the version of a one-head log's head (0: unknown or
    /// empty: read it).
    pub(crate) version: std::sync::atomic::AtomicU64,
    /// Lets one batch of this process at a time race for the heads
    /// (batches of one process would only make each other retry).
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// The last stamp this process gave a batch of a log of several heads
    /// (microseconds, never going back).
    pub(crate) last_stamp: std::sync::atomic::AtomicU64,
}

pub use items::changelog_head_of;
use items::{
    decode_entry, entry_id, entry_put, head_key, head_update, head_version, log_partition, pack,
    Part, HEAD_ID,
};
pub(crate) use items::{Entry, LogPage};

use crate::client::Client;
use crate::config::CHANGELOG_MAX_HEADS;
use crate::error::{map_sdk, map_transact};
use crate::layout::{self, Item};
use crate::transact::{failed_within, new_token, op_items, Guard, MAX_TRANSACTION_ITEMS};

/// Most ops in one batch in change log mode: their actions, the head and
/// up to 9 entries fit the 100 actions of a transaction (90 endpoints of
/// at most 16 KiB need at most 5 entries of 350 KiB).
pub const CHANGELOG_MAX_BATCH: usize = 90;

/// Most ops in one batch with a log of `heads` heads: a batch may touch
/// every head, each with its update and at least one entry, so the limit
/// falls from [`CHANGELOG_MAX_BATCH`] with one head to 32 with 32 or more.
///
/// ```
/// use waypost_dynamodb::{changelog_max_batch, CHANGELOG_MAX_BATCH};
/// assert_eq!(changelog_max_batch(1), CHANGELOG_MAX_BATCH);
/// assert_eq!(changelog_max_batch(16), 64);
/// assert_eq!(changelog_max_batch(64), 32);
/// ```
pub fn changelog_max_batch(heads: u32) -> usize {
    // n ops on m = min(heads, n) heads: n + 2m + 4 further entries of a
    // batch of the largest endpoints fit the 100 actions.
    let heads = heads.clamp(1, CHANGELOG_MAX_HEADS) as usize;
    if heads == 1 {
        CHANGELOG_MAX_BATCH
    } else {
        MAX_TRANSACTION_ITEMS
            .saturating_sub(4 + 2 * heads)
            .clamp(32, CHANGELOG_MAX_BATCH)
    }
}

/// Transactions tried before a change log batch that keeps losing the
/// race for the head gives up with `Conflict` (nothing written).
pub const CHANGELOG_ATTEMPTS: u32 = 16;

/// The least ceiling of the first pause after a lost race. The ceiling is
/// the longer of this and the lost transaction's round trip (how long a
/// rival holds the head), doubles with each further loss up to
/// [`RETRY_CAP`] (or 16 round trips, if longer), and each pause is drawn
/// from zero to its ceiling (full jitter), so writers that collided once
/// spread out over a window that grows with the contention and with the
/// server's latency.
const RETRY_BASE: Duration = Duration::from_millis(4);

/// The largest ceiling of a pause after a lost race, on a fast server.
const RETRY_CAP: Duration = Duration::from_millis(250);

/// The ceiling of the pause before the `attempt`-th retry (1-based) of a
/// change log batch that lost the race for the head, when the lost
/// transaction took `round_trip`; the pause is drawn from zero to it
/// ([`waypost::backend::full_jitter`]). Public for models of
/// contention, such as the crate's `contention` bench.
///
/// ```
/// use std::time::Duration;
/// use waypost_dynamodb::changelog_retry_ceiling;
/// let ms = Duration::from_millis;
/// assert_eq!(changelog_retry_ceiling(1, ms(10)), ms(10));
/// assert_eq!(changelog_retry_ceiling(2, ms(10)), ms(20));
/// assert_eq!(changelog_retry_ceiling(16, ms(10)), ms(250));
/// ```
pub fn changelog_retry_ceiling(attempt: u32, round_trip: Duration) -> Duration {
    let cap = RETRY_CAP.max(round_trip.saturating_mul(16));
    round_trip
        .max(RETRY_BASE)
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(cap)
}

/// The pause before the `attempt`-th retry after a lost race.
fn race_pause(attempt: u32, round_trip: Duration) -> Duration {
    waypost::backend::full_jitter(changelog_retry_ceiling(attempt, round_trip))
}

/// Whether a cancelled transaction lost the race for the head (the head's
/// or an entry's condition failed, or another transaction held them):
/// nothing was written, read the head and try again.
fn lost_race(
    err: &aws_sdk_dynamodb::error::SdkError<TransactWriteItemsError>,
    log_from: usize,
) -> bool {
    match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(e)) => {
            e.cancellation_reasons().iter().skip(log_from).any(|r| {
                matches!(
                    r.code(),
                    Some("ConditionalCheckFailed" | "TransactionConflict")
                )
            })
        }
        _ => false,
    }
}

/// The change log of one registry's table: its writer's cache of the
/// heads, and its reads.
pub(crate) struct ChangeLog {
    client: Arc<Client>,
    /// The heads as this process last saw them.
    head: HeadCache,
}

/// The change log's writes.
impl ChangeLog {
    /// The change log of `client`'s table.
    pub(crate) fn new(client: Arc<Client>) -> Self {
        Self {
            client,
            head: HeadCache::default(),
        }
    }

    /// Write `ops` (net, one per key, already checked) with their log
    /// entries, as described in the module docs. `token` is used for the
    /// first attempt; later attempts (after a lost race, when nothing was
    /// written) use fresh ones.
    pub(crate) async fn commit(&self, ops: Vec<Op>, token: Option<&str>) -> Result<()> {
        self.commit_guarded(ops, token, Guard::default())
            .await
            .map(drop)
    }

    /// A stamp for a batch of a log of several heads, taken as its
    /// transaction is sent: the clock in microseconds, past every stamp
    /// this process gave before.
    fn next_stamp(&self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut last = self.head.last_stamp.load(Ordering::Acquire);
        loop {
            let at = now.max(last + 1);
            match self.head.last_stamp.compare_exchange(
                last,
                at,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return at,
                Err(seen) => last = seen,
            }
        }
    }

    /// The versions of `heads` (in order): one head's from this process's
    /// cache when it holds it, else strongly consistent reads, at once.
    async fn read_heads(&self, logs: &[(u32, Vec<Part>)]) -> Result<Vec<u64>> {
        if self.client.log_heads() == 1 {
            match self.head.version.load(Ordering::Acquire) {
                0 => {}
                v => return Ok(vec![v]),
            }
        }
        futures::future::try_join_all(logs.iter().map(|(h, _)| self.read_head(*h))).await
    }

    /// [`ChangeLog::commit`] with `guard`'s conditions in the same
    /// transaction: `false` when one of them failed (nothing was written).
    pub(crate) async fn commit_guarded(
        &self,
        ops: Vec<Op>,
        token: Option<&str>,
        guard: Guard,
    ) -> Result<bool> {
        let heads = self.client.log_heads();
        let mut routed: BTreeMap<u32, Vec<&Op>> = BTreeMap::new();
        for op in &ops {
            routed
                .entry(changelog_head_of(&op.key(), heads))
                .or_default()
                .push(op);
        }
        if routed.is_empty() {
            routed.insert(0, Vec::new());
        }
        let logs: Vec<(u32, Vec<Part>)> = routed
            .into_iter()
            .map(|(h, ops)| (h, pack(&self.client, ops)))
            .collect();
        let entries: usize = logs.iter().map(|(_, p)| p.len()).sum();
        let guarded = ops.len() + guard.items.len();
        let actions = guarded + logs.len() + entries;
        if actions > MAX_TRANSACTION_ITEMS {
            return Err(Error::invalid(
                "ops",
                format!(
                    "{} ops need {entries} change log entries on {} head(s): {actions} transaction \
                     actions, over {MAX_TRANSACTION_ITEMS}; split the batch",
                    ops.len(),
                    logs.len()
                ),
            ));
        }
        let mut endpoint_items = op_items(&self.client, &ops, guard.existing)?;
        endpoint_items.extend(guard.items);
        let _turn = self.head.turn.lock().await;
        let mut keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        let mut from = self.read_heads(&logs).await?;
        let expires =
            layout::now_secs().saturating_add(self.client.cfg.changelog_retention.as_secs().max(1));
        let mut fresh;
        let mut token = match token {
            Some(t) => t,
            None => {
                fresh = new_token();
                fresh.as_str()
            }
        };
        for attempt in 1..=CHANGELOG_ATTEMPTS {
            let mut items: Vec<TransactWriteItem> = endpoint_items.clone();
            keys.truncate(ops.len());
            keys.extend(guard.keys.iter().cloned());
            let at = (heads > 1).then(|| self.next_stamp());
            for ((h, parts), v) in logs.iter().zip(&from) {
                let to = v + parts.len() as u64;
                items.push(head_update(&self.client, *h, *v, to)?);
                keys.push(EndpointKey::new(log_partition(*h), HEAD_ID));
                for (i, part) in parts.iter().enumerate() {
                    let version = v + 1 + i as u64;
                    items.push(entry_put(&self.client, *h, version, to, part, expires, at)?);
                    keys.push(EndpointKey::new(log_partition(*h), entry_id(version)));
                }
            }
            let sent = std::time::Instant::now();
            let res = self
                .client
                .ddb
                .transact_write_items()
                .set_transact_items(Some(items))
                .client_request_token(token)
                .send()
                .await;
            let round_trip = sent.elapsed();
            match res {
                Ok(_) => {
                    if heads == 1 {
                        // Only ever forward: another writer may have moved it further.
                        self.head
                            .version
                            .fetch_max(from[0] + entries as u64, Ordering::AcqRel);
                    }
                    metrics::counter!("registry_dynamodb_changelog_entries_total")
                        .increment(entries as u64);
                    tracing::debug!(table = %self.client.cfg.table, heads = logs.len(), entries, attempt, "change log batch written");
                    return Ok(true);
                }
                Err(e) if failed_within(&e, ops.len()..guarded) => return Ok(false),
                Err(e) if lost_race(&e, guarded) => {
                    metrics::counter!("registry_dynamodb_changelog_races_total").increment(1);
                    tracing::debug!(table = %self.client.cfg.table, attempt, "lost the race for a change log head; reading it again");
                    self.head.version.store(0, Ordering::Release);
                    // Pause first, then read the heads: the heads read after
                    // the pause are the ones the next attempt races for.
                    tokio::time::sleep(race_pause(attempt, round_trip)).await;
                    from = self.read_heads(&logs).await?;
                    fresh = new_token();
                    token = fresh.as_str();
                }
                Err(e) => {
                    self.head.version.store(0, Ordering::Release);
                    return Err(map_transact(
                        e,
                        self.client.ctx("TransactWriteItems"),
                        &keys,
                    ));
                }
            }
        }
        Err(Error::conflict(format!(
            "change log of DynamoDB table {}: {CHANGELOG_ATTEMPTS} transactions lost the race for a head \
             to other writers; nothing was written (with {heads} head(s): more writers need more \
             heads, see changelog_heads)",
            self.client.cfg.table
        )))
    }
}

/// The change log's reads.
impl ChangeLog {
    /// Head `head`'s version: a strongly consistent `GetItem` (0 when it
    /// was never written). A head written by registries with another
    /// number of heads is an error naming both.
    pub(crate) async fn read_head(&self, head: u32) -> Result<u64> {
        let out = self
            .client
            .ddb
            .get_item()
            .table_name(&self.client.cfg.table)
            .set_key(Some(head_key(head)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_sdk(e, self.client.ctx("GetItem (change log head)")))?;
        match out.item() {
            None => Ok(0),
            Some(item) => head_version(&self.client, head, item),
        }
    }

    /// Head `head`'s entries after `after`, and the head: one paginated
    /// `Query` (strongly consistent when `consistent_reads`) of the head's
    /// partition from `after`'s sort key on, which ends with the head.
    pub(crate) async fn query(&self, head: u32, after: u64) -> Result<LogPage> {
        let mut page = LogPage::default();
        let mut start: Option<Item> = None;
        let now = layout::now_secs();
        let partition = log_partition(head);
        loop {
            let out = self
                .client
                .ddb
                .query()
                .table_name(&self.client.cfg.table)
                .key_condition_expression("#s = :s AND #id > :after")
                .expression_attribute_names("#s", layout::SERVICE)
                .expression_attribute_names("#id", layout::ID)
                .expression_attribute_values(":s", AttributeValue::S(partition.clone()))
                .expression_attribute_values(":after", AttributeValue::S(entry_id(after)))
                .consistent_read(self.client.cfg.consistent_reads)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, self.client.ctx("Query (change log)")))?;
            for item in out.items() {
                page.items += 1;
                let id = match item.get(layout::ID) {
                    Some(AttributeValue::S(id)) => id.as_str(),
                    _ => continue,
                };
                if id == HEAD_ID {
                    page.head = Some(head_version(&self.client, head, item)?);
                } else if let Some(entry) = decode_entry(&self.client, id, item, now) {
                    page.entries.push(entry);
                }
            }
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(page),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn race_pauses_are_drawn_up_to_a_doubling_capped_ceiling() {
        let ms = Duration::from_millis;
        for rtt in [ms(1), ms(30), ms(400)] {
            for attempt in 1..=CHANGELOG_ATTEMPTS {
                let ceiling = changelog_retry_ceiling(attempt, rtt);
                let pauses: Vec<Duration> = (0..200).map(|_| race_pause(attempt, rtt)).collect();
                assert!(
                    pauses.iter().all(|p| *p <= ceiling),
                    "{attempt}: {pauses:?}"
                );
                // Full jitter: pauses land in the lower half too.
                assert!(
                    pauses.iter().any(|p| *p < ceiling / 2),
                    "{attempt}: {pauses:?}"
                );
            }
        }
        // A fast server: from 4 ms, doubling, up to 250 ms.
        assert_eq!(changelog_retry_ceiling(1, ms(1)), ms(4));
        assert_eq!(changelog_retry_ceiling(2, ms(1)), ms(8));
        assert_eq!(
            changelog_retry_ceiling(CHANGELOG_ATTEMPTS, ms(1)),
            RETRY_CAP
        );
        // A slow one: from its round trip, up to 16 of them.
        assert_eq!(changelog_retry_ceiling(1, ms(400)), ms(400));
        assert_eq!(
            changelog_retry_ceiling(CHANGELOG_ATTEMPTS, ms(400)),
            ms(6400)
        );
    }
}
