//! The change log ([`crate::WatchMode::ChangeLog`]): items of their own in
//! the registry's table, written in the same `TransactWriteItems` as the
//! endpoints they describe, so the log and the table cannot disagree.
//!
//! Layout (partition [`LOG_PARTITION`], which no endpoint can use):
//! - the **head**, sort key [`HEAD_ID`]: attribute `v` (N), the last
//!   version written;
//! - one **entry** per version, sort key `v` + the version in 20 digits
//!   (so they sort by version, all before the head): `put` (L of M, the
//!   endpoint items written, in the endpoint layout), `del` (L of M, the
//!   keys deleted), `last` (N, the last version of the same batch: a batch
//!   too big for one 400 KB item takes several consecutive versions), and
//!   the TTL attribute (`now + changelog_retention`).
//!
//! A batch that finds the head at `V` writes, in one transaction, its
//! endpoint actions, an update of the head from `V` to `V + p` (condition
//! `v = V`, or no head yet when `V` is 0) and the entries `V + 1` to
//! `V + p` (condition: not there yet). DynamoDB applies a transaction
//! whole or not at all and serialises transactions on the head item, so
//! versions are handed out once each, in commit order, with no leader: a
//! writer whose condition failed wrote nothing, reads the head again and
//! retries after a pause drawn at random up to a ceiling that starts at the
//! lost transaction's round trip and doubles with each loss (full jitter;
//! [`CHANGELOG_ATTEMPTS`] times, then `Conflict`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, TransactWriteItem, Update};
use registry_api::{EndpointKey, Error, Op, Result};

use crate::error::{map_sdk, map_transact};
use crate::layout::{self, Item, LOG_PARTITION};
use crate::shards::Change;
use crate::shared::{new_token, Table, MAX_TRANSACTION_ITEMS};

/// The sort key of the head item (after every entry's).
pub(crate) const HEAD_ID: &str = "~head";
const VERSION: &str = "v";
const LAST: &str = "last";
const PUT: &str = "put";
const DEL: &str = "del";

/// Most ops in one batch in change log mode: their actions, the head and
/// up to 9 entries fit the 100 actions of a transaction (90 endpoints of
/// at most 16 KiB need at most 5 entries of 350 KiB).
pub const CHANGELOG_MAX_BATCH: usize = 90;

/// Largest entry written, in bytes as DynamoDB counts them (the item
/// limit is 400 KB).
pub(crate) const ENTRY_BUDGET: usize = 350 * 1024;

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
/// ([`registry_api::backend::full_jitter`]). Public for models of
/// contention, such as the crate's `contention` bench.
///
/// ```
/// use std::time::Duration;
/// use registry_dynamodb::changelog_retry_ceiling;
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
    registry_api::backend::full_jitter(changelog_retry_ceiling(attempt, round_trip))
}

/// The sort key of entry `version`.
pub(crate) fn entry_id(version: u64) -> String {
    format!("v{version:020}")
}

/// The version of an entry's sort key.
fn parse_entry_id(id: &str) -> Option<u64> {
    id.strip_prefix('v')?.parse().ok()
}

/// A value's size as DynamoDB counts it (numbers at most 21 bytes; 3
/// bytes per map or list plus 1 per element), rounded up a little where
/// DynamoDB's rule is not public.
fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| 1 + k.len() + value_size(v))
                .sum::<usize>()
        }
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        _ => 32,
    }
}

/// One version read from the log.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub version: u64,
    /// The last version of the batch this entry belongs to.
    pub last: u64,
    pub changes: Vec<Change>,
}

/// What one `Query` of the log found.
#[derive(Debug, Default)]
pub(crate) struct LogPage {
    /// Entries after the asked version, in version order.
    pub entries: Vec<Entry>,
    /// The head (`None`: no head item, the log was never written).
    pub head: Option<u64>,
    /// Items read (entries and the head).
    pub items: usize,
}

/// The pieces of a batch's log: puts and deletes, packed into entries of
/// at most [`ENTRY_BUDGET`] bytes.
fn pack(table: &Table, ops: &[Op]) -> Vec<(Vec<AttributeValue>, Vec<AttributeValue>)> {
    let ttl = table.ttl_write();
    let mut parts = vec![(Vec::new(), Vec::new())];
    let mut size = 0usize;
    for op in ops {
        let (value, is_put) = match op {
            Op::Register(e) => (AttributeValue::M(layout::encode(e, ttl)), true),
            Op::Deregister(k) => (AttributeValue::M(layout::key_item(k)), false),
        };
        let n = value_size(&value) + 1;
        if size + n > ENTRY_BUDGET && size > 0 {
            parts.push((Vec::new(), Vec::new()));
            size = 0;
        }
        size += n;
        if let Some(last) = parts.last_mut() {
            if is_put {
                last.0.push(value);
            } else {
                last.1.push(value);
            }
        }
    }
    parts
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn build_err(e: aws_sdk_dynamodb::error::BuildError) -> Error {
    Error::internal(format!("building a transaction item: {e}")).with_source(e)
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

/// Conditions written in one transaction with a batch: `items` (whose
/// keys, for messages, are `keys`), and with `existing`, each endpoint
/// write only if its item exists.
#[derive(Default)]
pub(crate) struct Guard {
    pub items: Vec<TransactWriteItem>,
    pub keys: Vec<EndpointKey>,
    pub existing: bool,
}

/// Whether a cancelled transaction failed a condition of an action in
/// `range` (the batch's own endpoint actions, or its guard).
pub(crate) fn failed_within(
    err: &aws_sdk_dynamodb::error::SdkError<TransactWriteItemsError>,
    range: std::ops::Range<usize>,
) -> bool {
    match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(e)) => e
            .cancellation_reasons()
            .iter()
            .enumerate()
            .any(|(i, r)| range.contains(&i) && r.code() == Some("ConditionalCheckFailed")),
        _ => false,
    }
}

/// The key of the head item.
fn head_key() -> Item {
    layout::key_item(&EndpointKey::new(LOG_PARTITION, HEAD_ID))
}

/// The change log's requests.
impl Table {
    /// The head's version: a strongly consistent `GetItem` (0 when the
    /// log was never written).
    pub(crate) async fn read_log_head(&self) -> Result<u64> {
        let out = self
            .client
            .get_item()
            .table_name(&self.cfg.table)
            .set_key(Some(head_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| map_sdk(e, self.ctx("GetItem (change log head)")))?;
        Ok(out.item().map_or(Some(0), head_version).unwrap_or(0))
    }

    /// Write `ops` (net, one per key, already checked) with their log
    /// entries, as described in the module docs. `token` is used for the
    /// first attempt; later attempts (after a lost race, when nothing was
    /// written) use fresh ones.
    pub(crate) async fn commit_logged(&self, ops: Vec<Op>, token: Option<&str>) -> Result<()> {
        self.commit_logged_guarded(ops, token, Guard::default())
            .await
            .map(drop)
    }

    /// [`Table::commit_logged`] with `guard`'s conditions in the same
    /// transaction: `false` when one of them failed (nothing was written).
    pub(crate) async fn commit_logged_guarded(
        &self,
        ops: Vec<Op>,
        token: Option<&str>,
        guard: Guard,
    ) -> Result<bool> {
        let parts = pack(self, &ops);
        let p = parts.len() as u64;
        let guarded = ops.len() + guard.items.len();
        let actions = guarded + 1 + parts.len();
        if actions > MAX_TRANSACTION_ITEMS {
            return Err(Error::invalid(
                "ops",
                format!(
                    "{} ops need {} change log entries: {actions} transaction actions, over \
                     {MAX_TRANSACTION_ITEMS}; split the batch",
                    ops.len(),
                    parts.len()
                ),
            ));
        }
        let mut endpoint_items = self.op_items_if(&ops, guard.existing)?;
        endpoint_items.extend(guard.items);
        let _turn = self.log_head.1.lock().await;
        let mut keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        let mut head = match self.log_head.0.load(Ordering::Acquire) {
            0 => self.read_log_head().await?,
            v => v,
        };
        let expires =
            layout::now_secs().saturating_add(self.cfg.changelog_retention.as_secs().max(1));
        let mut fresh;
        let mut token = match token {
            Some(t) => t,
            None => {
                fresh = new_token();
                fresh.as_str()
            }
        };
        for attempt in 1..=CHANGELOG_ATTEMPTS {
            let mut items = endpoint_items.clone();
            keys.truncate(ops.len());
            keys.extend(guard.keys.iter().cloned());
            items.push(self.head_update(head, head + p)?);
            keys.push(EndpointKey::new(LOG_PARTITION, HEAD_ID));
            for (i, (puts, dels)) in parts.iter().enumerate() {
                let version = head + 1 + i as u64;
                items.push(self.entry_put(version, head + p, puts, dels, expires)?);
                keys.push(EndpointKey::new(LOG_PARTITION, entry_id(version)));
            }
            let sent = std::time::Instant::now();
            let res = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .client_request_token(token)
                .send()
                .await;
            let round_trip = sent.elapsed();
            match res {
                Ok(_) => {
                    // Only ever forward: another writer may have moved it further.
                    self.log_head.0.fetch_max(head + p, Ordering::AcqRel);
                    metrics::counter!("registry_dynamodb_changelog_entries_total").increment(p);
                    tracing::debug!(table = %self.cfg.table, version = head + p, entries = p, attempt, "change log batch written");
                    return Ok(true);
                }
                Err(e) if failed_within(&e, ops.len()..guarded) => return Ok(false),
                Err(e) if lost_race(&e, guarded) => {
                    metrics::counter!("registry_dynamodb_changelog_races_total").increment(1);
                    tracing::debug!(table = %self.cfg.table, head, attempt, "lost the race for the change log head; reading it again");
                    self.log_head.0.store(0, Ordering::Release);
                    // Pause first, then read the head: the head read after
                    // the pause is the one the next attempt races for.
                    tokio::time::sleep(race_pause(attempt, round_trip)).await;
                    head = self.read_log_head().await?;
                    fresh = new_token();
                    token = fresh.as_str();
                }
                Err(e) => {
                    self.log_head.0.store(0, Ordering::Release);
                    return Err(map_transact(e, self.ctx("TransactWriteItems"), &keys));
                }
            }
        }
        Err(Error::conflict(format!(
            "change log of DynamoDB table {}: {CHANGELOG_ATTEMPTS} transactions lost the race for the head \
             to other writers; nothing was written",
            self.cfg.table
        )))
    }

    /// The update of the head from `from` to `to`, on condition that it
    /// still holds `from`.
    fn head_update(&self, from: u64, to: u64) -> Result<TransactWriteItem> {
        let mut u = Update::builder()
            .table_name(&self.cfg.table)
            .set_key(Some(head_key()))
            .update_expression("SET #v = :to")
            .expression_attribute_names("#v", VERSION)
            .expression_attribute_values(":to", n(to));
        u = if from == 0 {
            u.condition_expression("attribute_not_exists(#v)")
        } else {
            u.condition_expression("#v = :from")
                .expression_attribute_values(":from", n(from))
        };
        Ok(TransactWriteItem::builder()
            .update(u.build().map_err(build_err)?)
            .build())
    }

    /// The put of entry `version`, on condition that it is not there yet.
    fn entry_put(
        &self,
        version: u64,
        last: u64,
        puts: &[AttributeValue],
        dels: &[AttributeValue],
        expires: u64,
    ) -> Result<TransactWriteItem> {
        let mut item = layout::key_item(&EndpointKey::new(LOG_PARTITION, entry_id(version)));
        item.insert(LAST.into(), n(last));
        item.insert(PUT.into(), AttributeValue::L(puts.to_vec()));
        item.insert(DEL.into(), AttributeValue::L(dels.to_vec()));
        if let Some(attr) = &self.cfg.ttl_attribute {
            item.insert(attr.clone(), n(expires));
        }
        let put = Put::builder()
            .table_name(&self.cfg.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#id)")
            .expression_attribute_names("#id", layout::ID)
            .build()
            .map_err(build_err)?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// The transaction actions of `ops` (one per key): a put of the
    /// endpoint's item, or a delete of the key.
    pub(crate) fn op_items(&self, ops: &[Op]) -> Result<Vec<TransactWriteItem>> {
        self.op_items_if(ops, false)
    }

    /// [`Table::op_items`]; with `existing`, each put only if the item
    /// exists.
    pub(crate) fn op_items_if(&self, ops: &[Op], existing: bool) -> Result<Vec<TransactWriteItem>> {
        let ttl = self.ttl_write();
        ops.iter()
            .map(|op| {
                let b = TransactWriteItem::builder();
                match op {
                    Op::Register(e) => {
                        let put = Put::builder()
                            .table_name(&self.cfg.table)
                            .set_item(Some(layout::encode(e, ttl)));
                        let put = if existing {
                            put.condition_expression("attribute_exists(#id)")
                                .expression_attribute_names("#id", layout::ID)
                        } else {
                            put
                        };
                        put.build().map(|p| b.put(p).build())
                    }
                    Op::Deregister(k) => Delete::builder()
                        .table_name(&self.cfg.table)
                        .set_key(Some(layout::key_item(k)))
                        .build()
                        .map(|d| b.delete(d).build()),
                }
                .map_err(build_err)
            })
            .collect()
    }

    /// The entries after `after` and the head: one paginated `Query`
    /// (strongly consistent when `consistent_reads`) of the log's
    /// partition from `after`'s sort key on, which ends with the head.
    pub(crate) async fn query_log(&self, after: u64) -> Result<LogPage> {
        let mut page = LogPage::default();
        let mut start: Option<Item> = None;
        let now = layout::now_secs();
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.cfg.table)
                .key_condition_expression("#s = :s AND #id > :after")
                .expression_attribute_names("#s", layout::SERVICE)
                .expression_attribute_names("#id", layout::ID)
                .expression_attribute_values(":s", AttributeValue::S(LOG_PARTITION.into()))
                .expression_attribute_values(":after", AttributeValue::S(entry_id(after)))
                .consistent_read(self.cfg.consistent_reads)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, self.ctx("Query (change log)")))?;
            for item in out.items() {
                page.items += 1;
                let id = match item.get(layout::ID) {
                    Some(AttributeValue::S(id)) => id.as_str(),
                    _ => continue,
                };
                if id == HEAD_ID {
                    page.head = head_version(item);
                } else if let Some(entry) = self.decode_entry(id, item, now) {
                    page.entries.push(entry);
                }
            }
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(page),
            }
        }
    }

    /// An entry item as changes (an expired or corrupt put reads as the
    /// removal of its key, as the table's reads treat such items).
    fn decode_entry(&self, id: &str, item: &Item, now: u64) -> Option<Entry> {
        let version = parse_entry_id(id)?;
        let last = match item.get(LAST) {
            Some(AttributeValue::N(v)) => v.parse().ok()?,
            _ => version,
        };
        let list = |name: &str| match item.get(name) {
            Some(AttributeValue::L(l)) => l.as_slice(),
            _ => &[],
        };
        let mut changes = Vec::new();
        for v in list(DEL) {
            if let Some(key) = v.as_m().ok().and_then(layout::decode_key) {
                changes.push(Change::Remove(key));
            }
        }
        for v in list(PUT) {
            let Ok(m) = v.as_m() else { continue };
            match self.endpoint_of(m, now) {
                Some(e) => changes.push(Change::Put(e)),
                None => changes.extend(layout::decode_key(m).map(Change::Remove)),
            }
        }
        Some(Entry {
            version,
            last,
            changes,
        })
    }
}

fn head_version(item: &Item) -> Option<u64> {
    match item.get(VERSION) {
        Some(AttributeValue::N(v)) => v.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_sort_by_version_and_before_the_head() {
        let ids = [entry_id(9), entry_id(10), entry_id(u64::MAX - 1)];
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        assert!(ids.iter().all(|i| i.as_str() < HEAD_ID));
        assert_eq!(parse_entry_id(&entry_id(42)), Some(42));
        assert_eq!(parse_entry_id(HEAD_ID), None);
    }

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

    #[test]
    fn sizes_follow_dynamodb_rules() {
        assert_eq!(value_size(&AttributeValue::S("xyz".into())), 3);
        assert_eq!(value_size(&AttributeValue::N("12345".into())), 4);
        let l = AttributeValue::L(vec![AttributeValue::S("a".into())]);
        assert_eq!(value_size(&l), 3 + 1 + 1);
    }
}
