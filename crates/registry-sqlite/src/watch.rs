//! Watch: the change log read as a stream, and the poller that sees other
//! processes' writes.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::stream::{self, StreamExt};
use registry_api::{Event, EventStream, Result, Snapshot, Version};
use tokio::sync::watch;

use crate::core::Inner;
use crate::layout::{decode_change, to_i64, ChangeRow};

/// Changes read from the log per query while a watch catches up.
const PAGE: i64 = 1024;

/// Wake the watchers of this handle when another process changed the file.
pub(crate) async fn poll_log(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.notify.receiver_count() == 0 {
            continue;
        }
        match inner.version().await {
            Ok(v) => inner.bump(v.0),
            Err(e) => tracing::warn!(error = %e, "polling the change log failed"),
        }
    }
}

enum Catchup {
    Snapshot(Snapshot),
    Changes(Vec<Event>),
}

impl Inner {
    /// What a watcher at `from` needs next.
    async fn catch_up(&self, from: Option<u64>) -> Result<Catchup> {
        let Some(from) = from else {
            return Ok(Catchup::Snapshot(self.snapshot().await?));
        };
        let what = "read the change log";
        let mut tx = self.read_tx(what).await?;
        let res = async {
            let (rev, floor) = self.counters(tx.conn(), what).await?;
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
            .map_err(|e| self.map(e, what))?;
            Ok(Some(rows))
        }
        .await;
        let Some(rows) = tx.end(res, what).await? else {
            // Outside the log: start over from a snapshot.
            return Ok(Catchup::Snapshot(self.snapshot().await?));
        };
        let events = rows
            .into_iter()
            .map(|r| decode_change(&self.cfg.path, r))
            .collect::<Result<Vec<_>>>()?;
        Ok(Catchup::Changes(events))
    }
}

struct WatchState {
    inner: Weak<Inner>,
    rx: watch::Receiver<u64>,
    last: Option<u64>,
    pending: VecDeque<Event>,
    done: bool,
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
            let inner = self.inner.upgrade()?;
            // Mark the current notification seen before reading, so a
            // commit after the read wakes us again.
            self.rx.borrow_and_update();
            match inner.catch_up(self.last).await {
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Ok(Catchup::Snapshot(s)) => self.pending.push_back(Event::Snapshot(s)),
                Ok(Catchup::Changes(evs)) if !evs.is_empty() => self.pending.extend(evs),
                Ok(Catchup::Changes(_)) => {
                    drop(inner);
                    if self.rx.changed().await.is_err() {
                        // The registry was dropped.
                        return None;
                    }
                }
            }
        }
    }
}

/// A native watch of `inner`'s change log; see [`registry_api::Watch`] on
/// [`crate::SqliteRegistry`].
pub(crate) fn watch(inner: &Arc<Inner>, from: Option<Version>) -> EventStream {
    let state = WatchState {
        inner: Arc::downgrade(inner),
        rx: inner.notify.subscribe(),
        last: from.map(|v| v.0),
        pending: VecDeque::new(),
        done: false,
    };
    stream::unfold(state, |mut st| async move {
        let item = st.next().await?;
        Some((item, st))
    })
    .boxed()
}
