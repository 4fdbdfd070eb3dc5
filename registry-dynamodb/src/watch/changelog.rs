//! The change log watch ([`crate::WatchMode::ChangeLog`]): a task that
//! reads the log (see [`crate::changelog`]) every `poll_interval` and feeds a
//! [`Hub`] that every `watch()` subscribes to.
//!
//! - **Position**: per head, the last version applied. Each sync is one
//!   `Query` per head (sent at once) of its log after it, which also
//!   returns the head; each head's entries are applied in version order, a
//!   batch (`last`) only once all its entries on that head are read. Each
//!   key's changes are on one head, so every key's history is applied in
//!   order; a batch that spans heads may reach watchers over two syncs when
//!   one of its parts is not visible yet (reads are not isolated).
//! - **Gaps**: when the head is past the entries read (an entry missing),
//!   the reader stops before the gap on that head. A gap can be a batch whose
//!   transaction is still becoming visible (`Query` is read-committed), so
//!   only a gap still there on the next sync means the entry is gone:
//!   trimmed by TTL (the reader was away longer than the retention) or
//!   deleted. Then, and on the first sync, and when the head went back
//!   (the table was recreated), the reader **resyncs**: reads every head
//!   `H_h`, scans the table, reads each head's log after `H_h` and applies
//!   it over the scan (which makes each key's state the one at its head
//!   read last, without moving any endpoint back in its history), and goes
//!   on from there. The first
//!   state is sent as [`waypost::Event::Snapshot`], later ones as the difference.
//! - **Checks**: every `changelog_check_interval` (±20 %) the reader
//!   resyncs anyway, so that what bypasses the log (another tool's
//!   writes, endpoints expired by `item_ttl`) reaches its watchers as the
//!   difference to what they hold.
//! - **Failures** reach every watcher as an `Err` item while they keep the
//!   last state; the reader keeps its position, retries with backoff
//!   (100 ms to 10 s), and after the failure sends a whole snapshot.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use waypost::backend::{backoff, Hub};
use waypost::{Error, EventStream, Version};

use futures::future::try_join_all;

use crate::changelog::{Entry, LogPage};
use crate::endpoints::Endpoints;
use crate::layout::Change;
use crate::watch::{publish_changes, publish_fresh, publish_snapshot_with, FeedTask};

/// The change log watch of one registry.
pub(crate) struct LogWatch {
    endpoints: Arc<Endpoints>,
    hub: Arc<Hub>,
    task: FeedTask,
}

impl LogWatch {
    pub(crate) fn new(endpoints: Arc<Endpoints>) -> Self {
        let hub = Arc::new(Hub::pending(
            Hub::DEFAULT_BUFFER,
            endpoints.client.cfg.watch_history,
        ));
        Self {
            endpoints,
            hub,
            task: FeedTask::default(),
        }
    }

    pub(crate) fn watch(&self, from: Option<Version>) -> EventStream {
        self.task
            .start_once(|| run(Arc::clone(&self.endpoints), Arc::downgrade(&self.hub)));
        self.hub.subscribe(from)
    }
}

/// The entries of a `Query` applied from `pos` on: the changes of every
/// whole batch that follows `pos` without a gap, and the version after
/// the last of them.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Walk {
    /// Each with its batch's stamp.
    pub changes: Vec<(u64, Change)>,
    pub pos: u64,
}

/// Apply `entries` (in version order) after `pos`: batch by batch, each
/// only when all its entries are there, up to the first missing version.
pub(crate) fn walk(pos: u64, entries: Vec<Entry>) -> Walk {
    let mut out = Walk {
        changes: Vec::new(),
        pos,
    };
    let mut pending: Vec<(u64, Change)> = Vec::new();
    let mut expected = pos + 1;
    for entry in entries {
        if entry.version < expected {
            continue;
        }
        if entry.version > expected {
            break;
        }
        let at = entry.at;
        pending.extend(entry.changes.into_iter().map(|c| (at, c)));
        expected += 1;
        if entry.version >= entry.last {
            out.changes.append(&mut pending);
            out.pos = entry.version;
        }
    }
    out
}

/// The changes one sync read from every head (`heads[h]`, in head `h`'s
/// order, each with its batch's stamp), merged: each head's order kept
/// (it is each of its keys' history), and otherwise the order of the
/// stamps, the smallest pending first (ties: the lower head).
fn merge_heads(heads: Vec<Vec<(u64, Change)>>) -> Vec<Change> {
    let mut heads: Vec<std::collections::VecDeque<(u64, Change)>> =
        heads.into_iter().map(Into::into).collect();
    let mut out = Vec::with_capacity(heads.iter().map(|h| h.len()).sum());
    loop {
        let next = heads
            .iter()
            .enumerate()
            .filter_map(|(h, q)| q.front().map(|(at, _)| (*at, h)))
            .min();
        let Some((_, h)) = next else {
            return out;
        };
        if let Some((_, change)) = heads[h].pop_front() {
            out.push(change);
        }
    }
}

/// Why the reader scans the table.
#[derive(Debug, Clone, Copy)]
enum Resync {
    First,
    Trimmed,
    Gap,
    HeadBack,
    Check,
}

impl Resync {
    fn as_str(self) -> &'static str {
        match self {
            Resync::First => "first sync",
            Resync::Trimmed => "the versions after this reader's position were trimmed",
            Resync::Gap => "a log entry is missing",
            Resync::HeadBack => "the log's head went back (the table was recreated?)",
            Resync::Check => "the periodic check of the table",
        }
    }
}

/// The reader's state between syncs.
struct Reader {
    /// Per head, the last version applied; `None`: resync.
    pos: Option<Vec<u64>>,
    why: Resync,
    /// Per head, a gap (the first missing version) seen on the last sync.
    gap: Vec<Option<u64>>,
    /// A failure was reported: the next state is sent whole.
    failed: bool,
}

async fn run(endpoints: Arc<Endpoints>, hub: Weak<Hub>) {
    let mut r = Reader {
        pos: None,
        why: Resync::First,
        gap: vec![None; endpoints.client.log_heads() as usize],
        failed: false,
    };
    let interval = endpoints
        .client
        .cfg
        .poll_interval
        .max(Duration::from_millis(10));
    let every = endpoints
        .client
        .cfg
        .changelog_check_interval
        .max(Duration::from_secs(1));
    let next = || Instant::now() + waypost::backend::spread(every, 0.2);
    let mut check_at = next();
    let mut delays = backoff(Duration::from_millis(100), Duration::from_secs(10));
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        if r.pos.is_some() && Instant::now() >= check_at {
            resync_next(&endpoints, &mut r, Resync::Check);
        }
        let res = match r.pos.clone() {
            None => {
                let res = resync(&endpoints, &hub, &mut r).await;
                if r.pos.is_some() {
                    check_at = next();
                }
                res
            }
            Some(pos) => sync(&endpoints, &hub, &mut r, pos).await,
        };
        match res {
            Ok(()) => {
                delays = backoff(Duration::from_millis(100), Duration::from_secs(10));
                tokio::time::sleep(interval).await;
            }
            Err(e) => {
                tracing::warn!(table = %endpoints.client.cfg.table, error = %e, "reading the change log failed; reporting it to watchers");
                if let Some(hub) = hub.upgrade() {
                    if hub.is_ready() {
                        hub.report_error(e);
                        r.failed = true;
                    }
                }
                let pause = delays.next().unwrap_or(Duration::from_secs(10));
                tokio::time::sleep(pause.max(interval)).await;
            }
        }
    }
}

/// The log of every head after `pos` (one position per head), read at once.
async fn query_heads(endpoints: &Endpoints, pos: &[u64]) -> Result<Vec<LogPage>, Error> {
    try_join_all(
        pos.iter()
            .enumerate()
            .map(|(h, after)| endpoints.log.query(h as u32, *after)),
    )
    .await
}

/// One sync from `pos`: a `Query` of each head's log, its whole batches
/// applied.
async fn sync(
    endpoints: &Endpoints,
    hub: &Weak<Hub>,
    r: &mut Reader,
    pos: Vec<u64>,
) -> Result<(), Error> {
    let pages = query_heads(endpoints, &pos).await?;
    let mut changes = Vec::new();
    let mut next = Vec::with_capacity(pos.len());
    let mut resync = None;
    for (h, (page, at)) in pages.into_iter().zip(&pos).enumerate() {
        let head = page.head.unwrap_or(0);
        let first = page.entries.first().map(|e| e.version);
        let mut walked = walk(*at, page.entries);
        changes.push(std::mem::take(&mut walked.changes));
        next.push(walked.pos);
        if head < *at {
            resync = Some(Resync::HeadBack);
        } else if walked.pos < head {
            let missing = walked.pos + 1;
            if r.gap[h] == Some(missing) {
                let why = if walked.pos == *at && first.is_none_or(|f| f > missing) {
                    Resync::Trimmed
                } else {
                    Resync::Gap
                };
                resync = resync.or(Some(why));
            } else {
                tracing::debug!(table = %endpoints.client.cfg.table, head = h, missing, version = head, "change log entry not there (yet); waiting one sync");
                r.gap[h] = Some(missing);
            }
        } else {
            r.gap[h] = None;
        }
    }
    let changes = merge_heads(changes);
    let Some(strong) = hub.upgrade() else {
        return Ok(());
    };
    if r.failed {
        publish_snapshot_with(&strong, &endpoints.clock, changes);
        r.failed = false;
    } else {
        publish_changes(&strong, &endpoints.clock, changes);
    }
    r.pos = Some(next);
    if let Some(why) = resync {
        resync_next(endpoints, r, why);
    }
    Ok(())
}

/// Resync on the next round, for `why`.
fn resync_next(endpoints: &Endpoints, r: &mut Reader, why: Resync) {
    if matches!(why, Resync::Check) {
        tracing::debug!(table = %endpoints.client.cfg.table, why = why.as_str(), "change log: resyncing from a scan");
    } else {
        tracing::info!(table = %endpoints.client.cfg.table, why = why.as_str(), "change log: resyncing from a scan");
    }
    metrics::counter!("registry_dynamodb_changelog_resyncs_total", "reason" => why.as_str())
        .increment(1);
    r.pos = None;
    r.gap.iter_mut().for_each(|g| *g = None);
    r.why = why;
}

/// Read every head, scan, and apply each head's log after it over the
/// scan; publish the result (whole the first time and after a failure,
/// else as the difference).
async fn resync(endpoints: &Endpoints, hub: &Weak<Hub>, r: &mut Reader) -> Result<(), Error> {
    tracing::debug!(table = %endpoints.client.cfg.table, why = r.why.as_str(), "change log: scanning");
    let read: Vec<u64> =
        try_join_all((0..endpoints.client.log_heads()).map(|h| endpoints.log.read_head(h))).await?;
    let mut state = endpoints.scan_all().await?;
    let pages = query_heads(endpoints, &read).await?;
    let mut changes = Vec::new();
    let mut pos = Vec::with_capacity(read.len());
    for (h, (page, at)) in pages.into_iter().zip(&read).enumerate() {
        let head = page.head.unwrap_or(0);
        let mut walked = walk(*at, page.entries);
        if walked.pos < head {
            // Versions after the head read before the scan are not all
            // readable yet; scan again on the next round.
            tracing::debug!(table = %endpoints.client.cfg.table, head = h, read = at, version = head, "change log: entries after the scan not all visible; scanning again");
            return Ok(());
        }
        changes.push(std::mem::take(&mut walked.changes));
        pos.push(walked.pos);
    }
    for change in merge_heads(changes) {
        state = match change {
            Change::Put(e) => state.with_endpoint(e),
            Change::Remove(key) => state.without(&key),
        };
    }
    let Some(strong) = hub.upgrade() else {
        return Ok(());
    };
    let whole = r.failed || !strong.is_ready();
    publish_fresh(
        &strong,
        &endpoints.clock,
        state.at_version(endpoints.clock.next()),
        whole,
    );
    r.failed = false;
    r.pos = Some(pos);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::testing::ep;

    fn entry(version: u64, last: u64, id: &str) -> Entry {
        Entry {
            version,
            last,
            at: version,
            changes: vec![Change::Put(ep("s", id, 1))],
        }
    }

    #[test]
    fn heads_are_merged_by_stamp_each_in_its_own_order() {
        let a = |id: &str| Change::Put(ep("s", id, 1));
        let merged = merge_heads(vec![
            // A later stamp committed first on head 0 stays first there.
            vec![(5, a("h0-first")), (1, a("h0-second"))],
            vec![(1, a("h1-tie")), (3, a("h1")), (9, a("h1-last"))],
        ]);
        assert_eq!(
            merged,
            vec![
                a("h1-tie"),
                a("h1"),
                a("h0-first"),
                a("h0-second"),
                a("h1-last")
            ]
        );
    }

    #[test]
    fn whole_batches_are_applied_up_to_the_first_gap() {
        // 3..=4 is one batch; 6 is missing.
        let w = walk(
            2,
            vec![
                entry(3, 4, "a"),
                entry(4, 4, "b"),
                entry(5, 5, "c"),
                entry(7, 7, "d"),
            ],
        );
        assert_eq!(w.pos, 5);
        assert_eq!(w.changes.len(), 3);
        // Half a batch is not applied.
        let w = walk(2, vec![entry(3, 4, "a")]);
        assert_eq!(
            w,
            Walk {
                changes: vec![],
                pos: 2
            }
        );
        // Nothing after a missing first version.
        let w = walk(2, vec![entry(4, 4, "a")]);
        assert_eq!(w.pos, 2);
        // Entries at or before the position are skipped.
        let w = walk(3, vec![entry(3, 3, "a"), entry(4, 4, "b")]);
        assert_eq!(w.changes, vec![(4, Change::Put(ep("s", "b", 1)))]);
    }
}
