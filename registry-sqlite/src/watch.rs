//! Watch: the change log read as a stream, and the poller that sees other
//! processes' writes.
//!
//! A read that fails is reported on the stream as an `Err` item; the
//! stream then retries by itself, after a delay that doubles from
//! [`RETRY_MIN`] up to [`RETRY_MAX`], with jitter (a local commit, which
//! shows the file works again, cuts the wait short), reporting each
//! failed attempt. Its first `Ok` item after a failure is a fresh
//! `Event::Snapshot` of the whole state. Only a closed or dropped
//! registry ends a stream.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use backon::ExponentialBackoff;
use futures::stream::{self, StreamExt};
use tokio::sync::watch;
use waypost::backend::backoff;
use waypost::{Event, EventStream, Result, Snapshot, Version};

use crate::database::Database;
use crate::endpoints::snapshot;
use crate::layout::{decode_change, to_i64, ChangeRow};

/// Changes read from the log per query while a watch catches up.
const PAGE: i64 = 1024;

/// The first delay before a watch retries a failed read.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(100);

/// The longest delay between a watch's retries.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5);

/// Wake the watchers of this handle when another process changed the
/// file, and when the log cannot be read any more (so that they try, and
/// report the failure on their streams instead of waiting silently).
pub(crate) async fn poll_log(db: Weak<Database>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let Some(db) = db.upgrade() else { return };
        if db.notify.receiver_count() == 0 {
            continue;
        }
        match db.version().await {
            Ok(v) => {
                if failing {
                    tracing::info!(path = %db.cfg.path.display(), "the change log can be read again");
                }
                failing = false;
                db.bump(v.0);
            }
            Err(e) => {
                tracing::warn!(error = %e, "polling the change log failed");
                if !failing {
                    failing = true;
                    db.notify.send_modify(|_| {});
                }
            }
        }
    }
}

enum Catchup {
    Snapshot(Snapshot),
    Changes(Vec<Event>),
}

/// What a watcher at `from` needs next.
async fn catch_up(db: &Database, from: Option<u64>) -> Result<Catchup> {
    let Some(from) = from else {
        return Ok(Catchup::Snapshot(snapshot(db).await?));
    };
    let what = "read the change log";
    let mut tx = db.read_tx(what).await?;
    let res = async {
        let (rev, floor) = db.counters(tx.conn(), what).await?;
        if from < floor || from > rev {
            return Ok(None);
        }
        if from == rev {
            return Ok(Some(Vec::new()));
        }
        let rows: Vec<ChangeRow> = sqlx::query_as(
            "SELECT revision, kind, service, id, endpoint FROM changes \
             WHERE revision > ?1 ORDER BY revision LIMIT ?2",
        )
        .bind(to_i64(from))
        .bind(PAGE)
        .fetch_all(tx.conn())
        .await
        .map_err(|e| db.map(e, what))?;
        Ok(Some(rows))
    }
    .await;
    let Some(rows) = tx.end(res, what).await? else {
        // Outside the log: start over from a snapshot.
        return Ok(Catchup::Snapshot(snapshot(db).await?));
    };
    let events = rows
        .into_iter()
        .map(|r| decode_change(&db.cfg.path, r))
        .collect::<Result<Vec<_>>>()?;
    Ok(Catchup::Changes(events))
}

struct WatchState {
    db: Weak<Database>,
    rx: watch::Receiver<u64>,
    last: Option<u64>,
    pending: VecDeque<Event>,
    /// Since a failed read: the delays before the next attempts.
    retry: Option<ExponentialBackoff>,
    done: bool,
}

/// The delays between a failing watch's attempts.
fn retry_delays() -> ExponentialBackoff {
    backoff(RETRY_MIN, RETRY_MAX)
}

impl WatchState {
    async fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                self.last = Some(ev.version().0);
                return Some(Ok(ev));
            }
            if self.done {
                return None;
            }
            if let Some(delays) = &mut self.retry {
                let delay = delays.next().unwrap_or(RETRY_MAX);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    // A commit through this handle: the file works.
                    changed = self.rx.changed() => {
                        if changed.is_err() {
                            return None;
                        }
                    }
                }
            }
            let db = self.db.upgrade()?;
            // Mark the current notification seen before reading, so a
            // commit after the read wakes us again.
            self.rx.borrow_and_update();
            // After a failure, start over from a snapshot.
            let from = if self.retry.is_some() {
                None
            } else {
                self.last
            };
            match catch_up(&db, from).await {
                Err(e) => {
                    if db.readers.is_closed() {
                        // Closed: this failure is the last item.
                        self.done = true;
                    } else {
                        tracing::warn!(path = %db.cfg.path.display(), error = %e, "a watch could not read the change log; it will retry");
                        self.retry.get_or_insert_with(retry_delays);
                    }
                    return Some(Err(e));
                }
                Ok(Catchup::Snapshot(s)) => {
                    if self.retry.take().is_some() {
                        tracing::info!(path = %db.cfg.path.display(), version = %s.version(), "a watch recovered; sending a fresh snapshot");
                    }
                    self.pending.push_back(Event::Snapshot(s));
                }
                Ok(Catchup::Changes(evs)) if !evs.is_empty() => self.pending.extend(evs),
                Ok(Catchup::Changes(_)) => {
                    drop(db);
                    if self.rx.changed().await.is_err() {
                        // The registry was dropped.
                        return None;
                    }
                }
            }
        }
    }
}

/// A native watch of `db`'s change log; see [`waypost::Watch`] on
/// [`crate::SqliteRegistry`].
pub(crate) fn watch(db: &Arc<Database>, from: Option<Version>) -> EventStream {
    let state = WatchState {
        db: Arc::downgrade(db),
        rx: db.notify.subscribe(),
        last: from.map(|v| v.0),
        pending: VecDeque::new(),
        retry: None,
        done: false,
    };
    stream::unfold(state, |mut st| async move {
        let item = st.next().await?;
        Some((item, st))
    })
    .boxed()
}
