//! The native watch: a task that follows the table's DynamoDB Stream and
//! feeds a [`Hub`] that every `watch()` subscribes to, and what both
//! watches share to publish (the change log's watch is in [`changelog`]).
//!
//! The task (started by the first `watch()`, stopped when the registry is
//! dropped):
//! 1. lists the stream's shards and takes a `LATEST` iterator for every
//!    open one (closed shards hold only older changes);
//! 2. scans a fresh snapshot and publishes it (the first time as
//!    [`Event::Snapshot`], after a resync as the diff to what watchers hold);
//! 3. reads every open shard with `GetRecords`, turning each record into an
//!    `Added` / `Updated` / `Removed` relative to the current state (so a
//!    record that changes nothing, e.g. one replayed over the snapshot, is
//!    dropped), and pauses `stream_poll_interval` when a round found nothing;
//! 4. follows shard splits: a shard that ends is finished, and its children
//!    are read from `TRIM_HORIZON` once their parent is done;
//! 5. when an iterator expired or its position was trimmed, resumes the shard
//!    `AFTER_SEQUENCE_NUMBER` of the last record it read; when that is gone
//!    too, starts over at 1 (a fresh snapshot, delivered as its diff: no
//!    change is lost and nothing failed);
//! 6. every `poll_interval` (at least 1 s, at most 60 s) describes the
//!    table: when it is gone, or has another stream than the one being read
//!    (it was deleted and created again, or its stream was turned off and on),
//!    the feed is lost (see below). This check is needed because a deleted
//!    table's stream stays readable for 24 h on AWS, and on moto an old
//!    iterator keeps answering with nothing.
//!
//! Failures are reported, never hidden: each one reaches every watcher as an
//! `Err` item ([`Hub::report_error`]) while they keep the last state.
//! - A failed `GetRecords` or shard listing is retried with backoff
//!   (100 ms to 10 s), keeping every shard's position; once a round
//!   succeeds, watchers get a fresh [`Event::Snapshot`] (the state they
//!   hold plus what was read meanwhile) and then the changes.
//! - When failures go on for longer than the table check interval, or the
//!   feed is lost (`ResourceNotFoundException`, the table gone or
//!   recreated), the task re-describes the table to find its current
//!   stream, opens that stream at `LATEST` and scans the table again: the
//!   scan is published whole as an [`Event::Snapshot`], which drops
//!   endpoints that exist nowhere any more. While the table is missing, every
//!   attempt (with backoff) reports `NotFound`.
//! - When the table comes back without a usable stream, the task polls it
//!   instead (a scan every `poll_interval`, published as the difference)
//!   and goes back to following a stream as soon as the table has one.

pub(crate) mod changelog;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use waypost::{
    backend::{backoff, diff, Hub, VersionClock},
    Error, Event, EventStream, Snapshot, Version,
};

use crate::endpoints::Endpoints;
use crate::layout::Change;
use crate::shards::{Reader, Stop};

/// The stream watch of one registry.
pub(crate) struct StreamWatch {
    endpoints: Arc<Endpoints>,
    arn: String,
    hub: Arc<Hub>,
    task: FeedTask,
}

/// The task that feeds a watch's hub: started by the first `watch()`,
/// aborted when the watch (so the registry) is dropped.
#[derive(Default)]
pub(crate) struct FeedTask(Mutex<Option<tokio::task::JoinHandle<()>>>);

impl FeedTask {
    /// Spawn `feed()` unless it runs already.
    pub(crate) fn start_once<F>(&self, feed: impl FnOnce() -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut task = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_none() {
            *task = Some(tokio::spawn(feed()));
        }
    }
}

impl Drop for FeedTask {
    fn drop(&mut self) {
        if let Some(task) = self.0.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

impl StreamWatch {
    pub(crate) fn new(endpoints: Arc<Endpoints>, arn: String) -> Self {
        let hub = Arc::new(Hub::pending(
            Hub::DEFAULT_BUFFER,
            endpoints.client.cfg.watch_history,
        ));
        Self {
            endpoints,
            arn,
            hub,
            task: FeedTask::default(),
        }
    }

    pub(crate) fn watch(&self, from: Option<Version>) -> EventStream {
        self.task.start_once(|| {
            run(
                Arc::clone(&self.endpoints),
                self.arn.clone(),
                Arc::downgrade(&self.hub),
            )
        });
        self.hub.subscribe(from)
    }
}

/// The watch of a registry that does not follow its table's stream (the
/// table had no usable stream at `connect`, or [`crate::WatchMode::Polling`]):
/// one `InvalidInput` error naming the table and saying how to watch it,
/// then the end of the stream.
pub(crate) fn unwatched(endpoints: &Endpoints) -> EventStream {
    let error = Error::invalid(
        "watch",
        format!(
            "DynamoDB table {} at {} is not watched by this registry (it had no stream with new \
             images when the registry connected, or WatchMode::Polling is set); wrap the \
             registry with waypost::stack::stack, which polls it \
             (waypost::polling::Polling), or enable a NEW_IMAGE or NEW_AND_OLD_IMAGES \
             stream on the table and connect again",
            endpoints.client.cfg.table, endpoints.client.endpoint
        ),
    );
    futures::stream::once(async move { Err(error) }).boxed()
}

/// How often the table is described to see that it, and its stream, are
/// still the ones being read.
fn table_check_interval(endpoints: &Endpoints) -> Duration {
    endpoints
        .client
        .cfg
        .poll_interval
        .clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// What the task tells watchers about failures.
struct Health {
    /// A failure was reported and no snapshot has followed yet: the next
    /// thing published is a whole [`Event::Snapshot`].
    failed: bool,
}

impl Health {
    /// Report `e` to every watcher (when there is a state to keep) and log it.
    fn report(&mut self, endpoints: &Endpoints, hub: &Weak<Hub>, e: Error, what: &str) {
        tracing::warn!(table = %endpoints.client.cfg.table, error = %e, "{what}; reporting it to watchers");
        if let Some(hub) = hub.upgrade() {
            if hub.is_ready() {
                hub.report_error(e);
                self.failed = true;
            }
        }
    }
}

/// The first and the longest pause before a failed step is tried again.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// The pauses between the attempts of a failing step.
fn retry_delays() -> impl Iterator<Item = Duration> {
    backoff(RETRY_MIN, RETRY_MAX)
}

async fn run(endpoints: Arc<Endpoints>, arn: String, hub: Weak<Hub>) {
    let mut health = Health { failed: false };
    // `None`: the table has no usable stream; poll it.
    let mut arn = Some(arn);
    let mut locate = false;
    let mut delays = retry_delays();
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        if locate {
            match endpoints.client.locate_stream().await {
                Ok(found) => {
                    if found != arn {
                        tracing::info!(table = %endpoints.client.cfg.table, old = ?arn, new = ?found, "the table's stream changed; following the current one");
                    }
                    arn = found;
                    locate = false;
                }
                Err(e) => {
                    health.report(&endpoints, &hub, e, "looking for the table's stream failed");
                    tokio::time::sleep(delays.next().unwrap_or(RETRY_MAX)).await;
                    continue;
                }
            }
        }
        let stop = match &arn {
            Some(a) => follow(&endpoints, a, &hub, &mut health).await,
            None => poll(&endpoints, &hub, &mut health).await,
        };
        match stop {
            Ok(()) => return,
            Err(Stop::Lost(why)) => {
                tracing::info!(table = %endpoints.client.cfg.table, why, "stream position lost; resyncing from a fresh snapshot");
            }
            Err(Stop::StreamBack(found)) => {
                tracing::info!(table = %endpoints.client.cfg.table, stream = %found, "the table has a stream again; following it");
                arn = Some(found);
            }
            Err(Stop::Failed(e)) => {
                if !health.failed {
                    delays = retry_delays();
                }
                health.report(&endpoints, &hub, e, "following the table's changes failed");
                tokio::time::sleep(delays.next().unwrap_or(RETRY_MAX)).await;
                locate = true;
            }
        }
    }
}

/// One life of the reader: open, snapshot, then rounds until the hub is
/// gone (`Ok`), the position is lost or the feed fails.
async fn follow(
    endpoints: &Endpoints,
    arn: &str,
    hub: &Weak<Hub>,
    health: &mut Health,
) -> Result<(), Stop> {
    let mut reader = Reader::open(&endpoints.client, arn).await?;
    let fresh = endpoints.scan_all().await.map_err(Stop::Failed)?;
    {
        let Some(hub) = hub.upgrade() else {
            return Ok(());
        };
        publish_fresh(&hub, &endpoints.clock, fresh, health.failed);
        health.failed = false;
    }
    let check_every = table_check_interval(endpoints);
    let mut last_check = Instant::now();
    let mut delays = retry_delays();
    // Since when reading fails, and what was read meanwhile (published
    // with the snapshot that ends the failure).
    let mut failing: Option<Instant> = None;
    let mut held: Vec<Change> = Vec::new();
    loop {
        let (changes, mut failure) = reader.round(&endpoints.client).await;
        let found = !changes.is_empty();
        if failure.is_none() && reader.needs_discovery() {
            failure = reader.discover(&endpoints.client, false).await.err();
        }
        if failure.is_none() && last_check.elapsed() >= check_every {
            last_check = Instant::now();
            failure = check_table(endpoints, arn).await;
        }
        let Some(strong) = hub.upgrade() else {
            return Ok(());
        };
        match failure {
            None if failing.is_some() => {
                held.extend(changes);
                tracing::info!(table = %endpoints.client.cfg.table, "reading the stream works again; sending a fresh snapshot");
                publish_snapshot_with(&strong, &endpoints.clock, std::mem::take(&mut held));
                health.failed = false;
                failing = None;
                delays = retry_delays();
            }
            None => {
                publish_changes(&strong, &endpoints.clock, changes);
                delays = retry_delays();
            }
            Some(Stop::Failed(e)) if e.is_retryable() => {
                if failing.is_some() {
                    held.extend(changes);
                } else {
                    publish_changes(&strong, &endpoints.clock, changes);
                }
                drop(strong);
                let since = *failing.get_or_insert_with(Instant::now);
                if since.elapsed() >= check_every {
                    // Failing for long: look for the table's stream again
                    // and start over (reported by `run`).
                    return Err(Stop::Failed(e));
                }
                health.report(endpoints, hub, e, "reading the stream failed; retrying");
                tokio::time::sleep(delays.next().unwrap_or(RETRY_MAX)).await;
                continue;
            }
            Some(stop) => {
                if failing.is_none() {
                    publish_changes(&strong, &endpoints.clock, changes);
                }
                return Err(stop);
            }
        }
        if !found {
            tokio::time::sleep(endpoints.client.cfg.stream_poll_interval).await;
        }
    }
}
/// Poll the table (it has no usable stream): a scan every `poll_interval`,
/// published as the difference (whole after a reported failure), until
/// the table has a usable stream again (`StreamBack`), the hub is gone
/// (`Ok`) or a read fails.
async fn poll(endpoints: &Endpoints, hub: &Weak<Hub>, health: &mut Health) -> Result<(), Stop> {
    let check_every = table_check_interval(endpoints);
    let mut last_check = Instant::now();
    tracing::info!(table = %endpoints.client.cfg.table, interval = ?endpoints.client.cfg.poll_interval, "the table has no usable stream; polling it");
    loop {
        let fresh = endpoints.scan_all().await.map_err(Stop::Failed)?;
        {
            let Some(hub) = hub.upgrade() else {
                return Ok(());
            };
            publish_fresh(&hub, &endpoints.clock, fresh, health.failed);
            health.failed = false;
        }
        tokio::time::sleep(endpoints.client.cfg.poll_interval).await;
        if last_check.elapsed() >= check_every {
            last_check = Instant::now();
            if let Some(arn) = endpoints
                .client
                .locate_stream()
                .await
                .map_err(Stop::Failed)?
            {
                return Err(Stop::StreamBack(arn));
            }
        }
    }
}

/// Whether the table is still there with the stream `arn`: `None` when it
/// is; a lost feed (`NotFound`) when the table is gone or has another
/// stream. A transient failure of the check itself is only logged (reading
/// the stream reports those).
async fn check_table(endpoints: &Endpoints, arn: &str) -> Option<Stop> {
    match endpoints.client.locate_stream().await {
        Ok(Some(current)) if current == arn => None,
        Ok(current) => Some(Stop::Failed(Error::not_found(format!(
            "the stream {arn} of DynamoDB table {}: the table now has {}",
            endpoints.client.cfg.table,
            current.map_or_else(
                || "no usable stream".to_string(),
                |c| format!("the stream {c}")
            )
        )))),
        Err(e) if e.is_retryable() => {
            tracing::debug!(table = %endpoints.client.cfg.table, error = %e, "could not check the table");
            None
        }
        Err(e) => Some(Stop::Failed(e)),
    }
}

/// A fresh scan: as an [`Event::Snapshot`] the first time or when `whole`
/// (after a reported failure), otherwise as the difference to what
/// watchers hold, so they need not start over.
pub(crate) fn publish_fresh(hub: &Hub, clock: &VersionClock, fresh: Snapshot, whole: bool) {
    if !hub.is_ready() || whole {
        hub.publish([Event::Snapshot(fresh)]);
        return;
    }
    let events: Vec<Event> = diff(&hub.current(), &fresh)
        .into_iter()
        .map(|ev| ev.with_version(clock.next()))
        .collect();
    if !events.is_empty() {
        tracing::info!(
            changes = events.len(),
            "resync found changes the stream did not deliver"
        );
        hub.publish(events);
    }
}

/// The state watchers hold with `changes` applied, published whole: the
/// end of a failure after which no position was lost.
pub(crate) fn publish_snapshot_with(hub: &Hub, clock: &VersionClock, changes: Vec<Change>) {
    let mut state = Snapshot::clone(&hub.current());
    for change in changes {
        match change {
            Change::Put(endpoint) => state = state.with_endpoint(endpoint),
            Change::Remove(key) => {
                state.apply(&Event::Removed {
                    version: state.version(),
                    key,
                });
            }
        }
    }
    hub.publish([Event::Snapshot(state.at_version(clock.next()))]);
}

/// Turn changes into events relative to the hub's state, dropping those
/// that change nothing.
pub(crate) fn publish_changes(hub: &Hub, clock: &VersionClock, changes: Vec<Change>) {
    if changes.is_empty() {
        return;
    }
    let mut state = Snapshot::clone(&hub.current());
    let mut events = Vec::new();
    for change in changes {
        let ev = match change {
            Change::Put(endpoint) => match state.get(&endpoint.key()) {
                Some(old) if *old == endpoint => continue,
                Some(_) => Event::Updated {
                    version: clock.next(),
                    endpoint,
                },
                None => Event::Added {
                    version: clock.next(),
                    endpoint,
                },
            },
            Change::Remove(key) => {
                if !state.contains(&key) {
                    continue;
                }
                Event::Removed {
                    version: clock.next(),
                    key,
                }
            }
        };
        state.apply(&ev);
        events.push(ev);
    }
    if !events.is_empty() {
        hub.publish(events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::testing::ep;
    use waypost::EndpointKey;

    fn kinds(events: &[Event]) -> Vec<(&'static str, String)> {
        events
            .iter()
            .filter_map(|e| e.key().map(|k| (e.type_name(), k.id)))
            .collect()
    }

    #[tokio::test]
    async fn changes_become_events_relative_to_the_state() {
        use futures::StreamExt;
        let hub = Arc::new(Hub::pending(64, 64));
        let clock = VersionClock::new();
        let a = ep("s", "a", 1);
        publish_fresh(
            &hub,
            &clock,
            Snapshot::from_endpoints(clock.next(), [a.clone()]),
            false,
        );
        let mut w = hub.subscribe(None);
        let Some(Ok(Event::Snapshot(s))) = w.next().await else {
            panic!("no snapshot");
        };
        assert_eq!(s.len(), 1);
        // A replayed record of what the snapshot holds changes nothing.
        publish_changes(
            &hub,
            &clock,
            vec![
                Change::Put(a.clone()),
                Change::Remove(EndpointKey::new("s", "never")),
                Change::Put(ep("s", "b", 2)),
                Change::Put(ep("s", "a", 3)),
                Change::Remove(a.key()),
            ],
        );
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(w.next().await.expect("event").expect("ok"));
        }
        assert_eq!(
            kinds(&got),
            vec![
                ("added", "b".to_string()),
                ("updated", "a".to_string()),
                ("removed", "a".to_string())
            ]
        );
        assert!(got.windows(2).all(|p| p[0].version() < p[1].version()));

        // A resync is delivered as the difference, not a new snapshot.
        let fresh = Snapshot::from_endpoints(clock.next(), [ep("s", "c", 4)]);
        publish_fresh(&hub, &clock, fresh, false);
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(w.next().await.expect("event").expect("ok"));
        }
        assert_eq!(
            kinds(&got),
            vec![("removed", "b".to_string()), ("added", "c".to_string())]
        );
    }

    #[tokio::test]
    async fn after_a_reported_failure_the_state_is_sent_whole() {
        use futures::StreamExt;
        let hub = Arc::new(Hub::pending(64, 64));
        let clock = VersionClock::new();
        let (a, b) = (ep("s", "a", 1), ep("s", "b", 2));
        publish_fresh(
            &hub,
            &clock,
            Snapshot::from_endpoints(clock.next(), [a.clone(), b.clone()]),
            false,
        );
        let mut w = hub.subscribe(None);
        assert!(matches!(w.next().await, Some(Ok(Event::Snapshot(_)))));
        hub.report_error(Error::unavailable("GetRecords failed"));
        assert!(matches!(w.next().await, Some(Err(_))));
        // Positions kept: what was read meanwhile goes into the snapshot.
        publish_snapshot_with(
            &hub,
            &clock,
            vec![Change::Remove(a.key()), Change::Put(ep("s", "c", 3))],
        );
        let Some(Ok(Event::Snapshot(s))) = w.next().await else {
            panic!("no snapshot after the failure");
        };
        let ids: Vec<_> = s.list("s").into_iter().map(|e| e.id).collect();
        assert_eq!(ids, vec!["b", "c"]);
        // A rescan after a lost feed (the table recreated): whole, so the
        // endpoints that exist nowhere any more are dropped.
        hub.report_error(Error::not_found("table"));
        assert!(matches!(w.next().await, Some(Err(_))));
        let fresh = Snapshot::from_endpoints(clock.next(), [ep("s", "d", 4)]);
        publish_fresh(&hub, &clock, fresh, true);
        let Some(Ok(Event::Snapshot(s))) = w.next().await else {
            panic!("no snapshot after the table came back");
        };
        assert_eq!(s.len(), 1);
        assert!(s.version() > Version(0));
    }
}
