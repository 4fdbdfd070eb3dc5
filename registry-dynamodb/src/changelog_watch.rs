//! The change log watch ([`crate::WatchMode::ChangeLog`]): a task that
//! reads the log (see `changelog.rs`) every `poll_interval` and feeds a
//! [`Hub`] that every `watch()` subscribes to.
//!
//! - **Position**: the last version applied. Each sync is one `Query` of
//!   the log after it, which also returns the head; its entries are applied
//!   in version order, a batch (`last`) only once all its entries are read.
//! - **Gaps**: when the head is past the entries read (an entry missing),
//!   the reader stops before the gap. A gap can be a batch whose
//!   transaction is still becoming visible (`Query` is read-committed), so
//!   only a gap still there on the next sync means the entry is gone:
//!   trimmed by TTL (the reader was away longer than the retention) or
//!   deleted. Then, and on the first sync, and when the head went back
//!   (the table was recreated), the reader **resyncs**: reads the head `H`,
//!   scans the table, reads the log after `H` and applies it over the
//!   scan (which makes it the state at the head read last, without moving
//!   any endpoint back in its history), and goes on from there. The first
//!   state is sent as [`registry_api::Event::Snapshot`], later ones as the difference.
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

use registry_api::backend::{backoff, Hub};
use registry_api::{Error, EventStream, Version};

use crate::changelog::Entry;
use crate::shards::Change;
use crate::shared::Table;
use crate::watch::{publish_changes, publish_fresh, publish_snapshot_with, FeedTask};

/// The change log watch of one registry.
pub(crate) struct LogWatch {
    table: Arc<Table>,
    hub: Arc<Hub>,
    task: FeedTask,
}

impl LogWatch {
    pub(crate) fn new(table: Arc<Table>) -> Self {
        let hub = Arc::new(Hub::pending(Hub::DEFAULT_BUFFER, table.cfg.watch_history));
        Self {
            table,
            hub,
            task: FeedTask::default(),
        }
    }

    pub(crate) fn watch(&self, from: Option<Version>) -> EventStream {
        self.task
            .start_once(|| run(Arc::clone(&self.table), Arc::downgrade(&self.hub)));
        self.hub.subscribe(from)
    }
}

/// The entries of a `Query` applied from `pos` on: the changes of every
/// whole batch that follows `pos` without a gap, and the version after
/// the last of them.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Walk {
    pub changes: Vec<Change>,
    pub pos: u64,
}

/// Apply `entries` (in version order) after `pos`: batch by batch, each
/// only when all its entries are there, up to the first missing version.
pub(crate) fn walk(pos: u64, entries: Vec<Entry>) -> Walk {
    let mut out = Walk {
        changes: Vec::new(),
        pos,
    };
    let mut pending: Vec<Change> = Vec::new();
    let mut expected = pos + 1;
    for entry in entries {
        if entry.version < expected {
            continue;
        }
        if entry.version > expected {
            break;
        }
        pending.extend(entry.changes);
        expected += 1;
        if entry.version >= entry.last {
            out.changes.append(&mut pending);
            out.pos = entry.version;
        }
    }
    out
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
    /// The last version applied; `None`: resync.
    pos: Option<u64>,
    why: Resync,
    /// A gap (the first missing version) seen on the last sync.
    gap: Option<u64>,
    /// A failure was reported: the next state is sent whole.
    failed: bool,
}

async fn run(table: Arc<Table>, hub: Weak<Hub>) {
    let mut r = Reader {
        pos: None,
        why: Resync::First,
        gap: None,
        failed: false,
    };
    let interval = table.cfg.poll_interval.max(Duration::from_millis(10));
    let every = table
        .cfg
        .changelog_check_interval
        .max(Duration::from_secs(1));
    let next = || Instant::now() + registry_api::backend::spread(every, 0.2);
    let mut check_at = next();
    let mut delays = backoff(Duration::from_millis(100), Duration::from_secs(10));
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        if r.pos.is_some() && Instant::now() >= check_at {
            resync_next(&table, &mut r, Resync::Check);
        }
        let res = match r.pos {
            None => {
                let res = resync(&table, &hub, &mut r).await;
                if r.pos.is_some() {
                    check_at = next();
                }
                res
            }
            Some(pos) => sync(&table, &hub, &mut r, pos).await,
        };
        match res {
            Ok(()) => {
                delays = backoff(Duration::from_millis(100), Duration::from_secs(10));
                tokio::time::sleep(interval).await;
            }
            Err(e) => {
                tracing::warn!(table = %table.cfg.table, error = %e, "reading the change log failed; reporting it to watchers");
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

/// One sync from `pos`: a `Query` of the log, its whole batches applied.
async fn sync(table: &Table, hub: &Weak<Hub>, r: &mut Reader, pos: u64) -> Result<(), Error> {
    let page = table.query_log(pos).await?;
    let head = page.head.unwrap_or(0);
    let first = page.entries.first().map(|e| e.version);
    let walked = walk(pos, page.entries);
    let Some(strong) = hub.upgrade() else {
        return Ok(());
    };
    if r.failed {
        publish_snapshot_with(&strong, &table.clock, walked.changes);
        r.failed = false;
    } else {
        publish_changes(&strong, &table.clock, walked.changes);
    }
    r.pos = Some(walked.pos);
    if head < pos {
        resync_next(table, r, Resync::HeadBack);
        return Ok(());
    }
    if walked.pos < head {
        let missing = walked.pos + 1;
        if r.gap == Some(missing) {
            let why = if walked.pos == pos && first.is_none_or(|f| f > missing) {
                Resync::Trimmed
            } else {
                Resync::Gap
            };
            resync_next(table, r, why);
            return Ok(());
        }
        tracing::debug!(table = %table.cfg.table, missing, head, "change log entry not there (yet); waiting one sync");
        r.gap = Some(missing);
    } else {
        r.gap = None;
    }
    Ok(())
}

/// Resync on the next round, for `why`.
fn resync_next(table: &Table, r: &mut Reader, why: Resync) {
    if matches!(why, Resync::Check) {
        tracing::debug!(table = %table.cfg.table, why = why.as_str(), "change log: resyncing from a scan");
    } else {
        tracing::info!(table = %table.cfg.table, why = why.as_str(), "change log: resyncing from a scan");
    }
    metrics::counter!("registry_dynamodb_changelog_resyncs_total", "reason" => why.as_str())
        .increment(1);
    r.pos = None;
    r.gap = None;
    r.why = why;
}

/// Read the head, scan, and apply the log after that head over the scan;
/// publish the result (whole the first time and after a failure, else as
/// the difference).
async fn resync(table: &Table, hub: &Weak<Hub>, r: &mut Reader) -> Result<(), Error> {
    tracing::debug!(table = %table.cfg.table, why = r.why.as_str(), "change log: scanning");
    let h1 = table.read_log_head().await?;
    let mut state = table.scan_all().await?;
    let page = table.query_log(h1).await?;
    let head = page.head.unwrap_or(0);
    let walked = walk(h1, page.entries);
    if walked.pos < head {
        // Versions after the head read before the scan are not all
        // readable yet; scan again on the next round.
        tracing::debug!(table = %table.cfg.table, h1, head, "change log: entries after the scan not all visible; scanning again");
        return Ok(());
    }
    for change in walked.changes {
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
        &table.clock,
        state.at_version(table.clock.next()),
        whole,
    );
    r.failed = false;
    r.pos = Some(walked.pos);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::testing::ep;

    fn entry(version: u64, last: u64, id: &str) -> Entry {
        Entry {
            version,
            last,
            changes: vec![Change::Put(ep("s", id, 1))],
        }
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
        assert_eq!(w.changes, vec![Change::Put(ep("s", "b", 1))]);
    }
}
