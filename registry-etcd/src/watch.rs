//! The watch stream: etcd's native watch on `<prefix>/services/`, with
//! snapshots when history is gone and reconnection with backoff.
//!
//! Failures are never hidden: while etcd cannot be reached, every failed
//! attempt to (re)establish or keep the watch is sent to the consumer as an
//! `Err` item and the stream goes on retrying (100 ms to 5 s, jitter). The
//! first session that succeeds after a reported failure starts with a fresh
//! [`Event::Snapshot`] read at one revision, and watches from the revision
//! after it, so the consumer learns that the source is healthy again and
//! misses nothing. A permanent failure (refused credentials, a malformed
//! request) is sent as the last item and the stream ends.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, KeyValue, WatchOptions, WatchResponse, WatchStream};
use futures::{stream, StreamExt};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use waypost::{Error, Event, EventStream, Result, Version};

use crate::error;
use crate::keyspace::Keyspace;
use crate::layout;

/// Events buffered between the task that reads etcd and the consumer.
const BUFFER: usize = 256;

/// Start a watch. The task that reads etcd starts on the first poll (so
/// `watch()` needs no runtime) and ends when the stream is dropped.
pub(crate) fn watch(keyspace: Arc<Keyspace>, from: Option<Version>) -> EventStream {
    stream::once(async move {
        let (tx, rx) = mpsc::channel(BUFFER);
        tokio::spawn(run(keyspace, from, tx));
        stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) },
        )
    })
    .flatten()
    .boxed()
}

/// How one session (one etcd watch) ended.
enum Outcome {
    /// The consumer dropped the stream.
    Closed,
    /// History is gone or etcd cancelled the watch: start over from a
    /// snapshot.
    Resync,
}

struct Watcher {
    keyspace: Arc<Keyspace>,
    tx: mpsc::Sender<Result<Event>>,
    /// Every change up to this revision has been delivered.
    last: i64,
    need_snapshot: bool,
    /// `from` was given and not yet checked against the current revision.
    check_from: bool,
    /// The last session got a watch going (resets the backoff).
    connected: bool,
}

/// The first and the longest delay before reconnecting.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

fn backoff() -> impl Iterator<Item = Duration> {
    waypost::backend::backoff(RETRY_MIN, RETRY_MAX)
}

async fn run(keyspace: Arc<Keyspace>, from: Option<Version>, tx: mpsc::Sender<Result<Event>>) {
    let mut w = Watcher {
        keyspace,
        tx,
        last: from.map_or(0, |v| i64::try_from(v.0).unwrap_or(i64::MAX)),
        need_snapshot: from.is_none(),
        check_from: from.is_some(),
        connected: false,
    };
    let mut delays = backoff();
    loop {
        w.connected = false;
        match w.session().await {
            Ok(Outcome::Closed) => return,
            Ok(Outcome::Resync) => {
                w.need_snapshot = true;
                delays = backoff();
            }
            Err(e) if e.is_retryable() => {
                if w.connected {
                    delays = backoff();
                }
                let delay = delays.next().unwrap_or(RETRY_MAX);
                warn!(error = %e, ?delay, last = w.last, "etcd watch interrupted; reporting it and reconnecting");
                // The consumer learns of the failure now, and of the
                // recovery from the fresh snapshot the next session starts
                // with (the watch contract): no silent retries.
                w.need_snapshot = true;
                if w.tx.send(Err(e)).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = w.tx.closed() => return,
                }
            }
            Err(e) => {
                warn!(error = %e, "etcd watch failed for good");
                let _ = w.tx.send(Err(e)).await;
                return;
            }
        }
    }
}

impl Watcher {
    async fn send(&self, ev: Event) -> bool {
        self.tx.send(Ok(ev)).await.is_ok()
    }

    /// One etcd watch: catch up (a snapshot when one is needed), watch
    /// from the revision after the last delivered, deliver what it sends.
    async fn session(&mut self) -> Result<Outcome> {
        let root = self.keyspace.layout.root().to_string();
        if self.check_from {
            self.verify_from(&root).await?;
        }
        if self.need_snapshot && !self.send_snapshot().await? {
            return Ok(Outcome::Closed);
        }
        // Keep the sender: closing it would end the watch on etcd's side.
        let (mut requests, mut responses) = self.open(&root).await?.split();
        let every = self
            .keyspace
            .cfg
            .progress_interval
            .max(Duration::from_millis(100));
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            let resp = tokio::select! {
                _ = self.tx.closed() => return Ok(Outcome::Closed),
                _ = progress.tick() => {
                    requests.request_progress().await.map_err(|e| {
                        error::map(e, format!("ask for progress on the watch of {root}"))
                    })?;
                    continue;
                }
                msg = responses.next() => msg,
            };
            let resp = match resp {
                Some(Ok(r)) => r,
                Some(Err(e)) => return Err(error::map(e, format!("watch {root}"))),
                None => {
                    return Err(Error::unavailable(format!(
                        "watch {root}: etcd closed the stream"
                    )))
                }
            };
            if let Some(outcome) = self.receive(resp).await {
                return Ok(outcome);
            }
        }
    }

    /// A revision from the future (another cluster, a wiped etcd):
    /// watching from it would skip changes, so start over.
    async fn verify_from(&mut self, root: &str) -> Result<()> {
        let current = self.current_revision(root).await?;
        self.check_from = false;
        if self.last > current {
            info!(
                from = self.last,
                current, "watch from a revision etcd has not reached; sending a snapshot"
            );
            self.need_snapshot = true;
        }
        Ok(())
    }

    /// Send a snapshot and go on from its revision; `false` when the
    /// consumer is gone.
    async fn send_snapshot(&mut self) -> Result<bool> {
        let snap = self.keyspace.snapshot().await?;
        let revision = i64::try_from(snap.version().0).unwrap_or(i64::MAX);
        if !self.send(Event::Snapshot(snap)).await {
            return Ok(false);
        }
        self.last = revision;
        self.need_snapshot = false;
        Ok(true)
    }

    /// Open the watch of `root` from the revision after the last delivered.
    async fn open(&self, root: &str) -> Result<WatchStream> {
        let from = self.last.saturating_add(1);
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_progress_notify();
        let mut client = self.keyspace.client.watch_client();
        self.keyspace
            .timed(client.watch(root.to_string(), Some(opts)))
            .await
            .map_err(|e| error::map(e, format!("watch {root} from revision {from}")))
    }

    /// Take one response of the watch; how the session ends, if it does.
    async fn receive(&mut self, resp: WatchResponse) -> Option<Outcome> {
        if resp.compact_revision() > 0 {
            info!(
                last = self.last,
                compacted = resp.compact_revision(),
                "watch history compacted; sending a fresh snapshot"
            );
            return Some(Outcome::Resync);
        }
        if resp.canceled() {
            warn!(
                reason = resp.cancel_reason(),
                "etcd cancelled the watch; sending a fresh snapshot"
            );
            return Some(Outcome::Resync);
        }
        if resp.created() {
            debug!(from = self.last.saturating_add(1), "etcd watch created");
            self.connected = true;
            return None;
        }
        if resp.events().is_empty() {
            // A progress notification: every change up to the header's
            // revision has been sent.
            if let Some(h) = resp.header() {
                self.last = self.last.max(h.revision());
            }
            return None;
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            if let Some(event) = self.event(ev.event_type(), kv) {
                if !self.send(event).await {
                    return Some(Outcome::Closed);
                }
            }
            self.last = self.last.max(kv.mod_revision());
        }
        None
    }

    /// A change of etcd as an event of the registry (none for a record that
    /// is not an endpoint's).
    fn event(&self, kind: EventType, kv: &KeyValue) -> Option<Event> {
        let version = Version(u64::try_from(kv.mod_revision()).unwrap_or(0));
        match kind {
            EventType::Put => match layout::decode(&self.keyspace.layout, kv.key(), kv.value()) {
                Ok(endpoint) if kv.create_revision() == kv.mod_revision() => {
                    Some(Event::Added { version, endpoint })
                }
                Ok(endpoint) => Some(Event::Updated { version, endpoint }),
                Err(e) => {
                    warn!(error = %e, "skipping a record that is not an endpoint");
                    None
                }
            },
            EventType::Delete => self
                .keyspace
                .layout
                .parse(kv.key())
                .map(|key| Event::Removed { version, key }),
        }
    }

    async fn current_revision(&self, root: &str) -> Result<i64> {
        let mut kv = self.keyspace.client.kv_client();
        let resp = self
            .keyspace
            .timed(
                kv.get(
                    root.to_string(),
                    Some(
                        etcd_client::GetOptions::new()
                            .with_prefix()
                            .with_count_only(),
                    ),
                ),
            )
            .await
            .map_err(|e| error::map(e, format!("read the revision of {root}")))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }
}
