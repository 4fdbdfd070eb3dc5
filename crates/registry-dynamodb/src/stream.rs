//! The native watch: a task that follows the table's DynamoDB Stream and
//! feeds a [`Hub`] that every `watch()` subscribes to.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodbstreams::error::SdkError;
use aws_sdk_dynamodbstreams::types::{
    AttributeValue as StreamValue, OperationType, Record, ShardIteratorType,
};
use futures::future::join_all;
use registry_api::{
    diff, Endpoint, EndpointKey, Error, Event, EventStream, Hub, Registry, Snapshot, Version,
    DEFAULT_SUBSCRIBER_BUFFER,
};

use crate::backend::{describe, missing, usable_stream, Clock, Core};
use crate::error::{is_position_lost, map_sdk};
use crate::item::{self, Item};

/// How often the shard list is read again when no shard ended.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);
/// Records per `GetRecords` (the API's maximum).
const RECORDS_PER_CALL: i32 = 1000;

/// The stream watch of one registry.
pub(crate) struct StreamWatch {
    core: Arc<Core>,
    arn: String,
    hub: Arc<Hub>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl StreamWatch {
    pub(crate) fn new(core: Arc<Core>, arn: String) -> Self {
        let hub = Arc::new(Hub::pending(
            DEFAULT_SUBSCRIBER_BUFFER,
            core.cfg.watch_history,
        ));
        Self {
            core,
            arn,
            hub,
            task: Mutex::new(None),
        }
    }

    pub(crate) fn watch(&self, from: Option<Version>) -> EventStream {
        {
            let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
            if task.is_none() {
                *task = Some(tokio::spawn(run(
                    Arc::clone(&self.core),
                    self.arn.clone(),
                    Arc::downgrade(&self.hub),
                )));
            }
        }
        self.hub.subscribe(from)
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// Why following stopped.
enum Stop {
    /// A shard's position is gone: start over from a fresh snapshot.
    Lost(String),
    /// A failure (reported by [`run`], which then looks for the table's
    /// current stream and starts over from a fresh snapshot).
    Failed(Error),
    /// Polling found that the table has a usable stream again.
    StreamBack(String),
}

/// How often the table is described to see that it, and its stream, are
/// still the ones being read.
fn table_check_interval(core: &Core) -> Duration {
    core.cfg
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
    fn report(&mut self, core: &Core, hub: &Weak<Hub>, e: Error, what: &str) {
        tracing::warn!(table = %core.cfg.table, error = %e, "{what}; reporting it to watchers");
        if let Some(hub) = hub.upgrade() {
            if hub.is_ready() {
                hub.report_error(e);
                self.failed = true;
            }
        }
    }
}

async fn run(core: Arc<Core>, arn: String, hub: Weak<Hub>) {
    let mut health = Health { failed: false };
    // `None`: the table has no usable stream; poll it.
    let mut arn = Some(arn);
    let mut locate = false;
    let mut pause = Duration::from_millis(100);
    loop {
        if hub.strong_count() == 0 {
            return;
        }
        if locate {
            match locate_stream(&core).await {
                Ok(found) => {
                    if found != arn {
                        tracing::info!(table = %core.cfg.table, old = ?arn, new = ?found, "the table's stream changed; following the current one");
                    }
                    arn = found;
                    locate = false;
                }
                Err(e) => {
                    health.report(&core, &hub, e, "looking for the table's stream failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(10));
                    continue;
                }
            }
        }
        let stop = match &arn {
            Some(a) => follow(&core, a, &hub, &mut health).await,
            None => poll(&core, &hub, &mut health).await,
        };
        match stop {
            Ok(()) => return,
            Err(Stop::Lost(why)) => {
                tracing::info!(table = %core.cfg.table, why, "stream position lost; resyncing from a fresh snapshot");
            }
            Err(Stop::StreamBack(found)) => {
                tracing::info!(table = %core.cfg.table, stream = %found, "the table has a stream again; following it");
                arn = Some(found);
            }
            Err(Stop::Failed(e)) => {
                if !health.failed {
                    pause = Duration::from_millis(100);
                }
                health.report(&core, &hub, e, "following the table's changes failed");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
                locate = true;
            }
        }
    }
}

/// The table's current usable stream (`None`: it has none), or `NotFound`
/// when the table is gone.
async fn locate_stream(core: &Core) -> Result<Option<String>, Error> {
    let table = describe(core).await?.ok_or_else(|| missing(core))?;
    Ok(usable_stream(&table))
}

/// One life of the reader: open, snapshot, then rounds until the hub is
/// gone (`Ok`), the position is lost or the feed fails.
async fn follow(core: &Core, arn: &str, hub: &Weak<Hub>, health: &mut Health) -> Result<(), Stop> {
    let mut reader = Reader::open(core, arn).await?;
    let fresh = core.snapshot().await.map_err(Stop::Failed)?;
    {
        let Some(hub) = hub.upgrade() else {
            return Ok(());
        };
        publish_fresh(&hub, &core.clock, fresh, health.failed);
        health.failed = false;
    }
    let check_every = table_check_interval(core);
    let mut last_check = Instant::now();
    let mut pause = Duration::from_millis(100);
    // Since when reading fails, and what was read meanwhile (published
    // with the snapshot that ends the failure).
    let mut failing: Option<Instant> = None;
    let mut held: Vec<Change> = Vec::new();
    loop {
        let (changes, mut failure) = reader.round(core).await;
        let found = !changes.is_empty();
        if failure.is_none() && reader.needs_discovery() {
            failure = reader.discover(core, false).await.err();
        }
        if failure.is_none() && last_check.elapsed() >= check_every {
            last_check = Instant::now();
            failure = check_table(core, arn).await;
        }
        let Some(strong) = hub.upgrade() else {
            return Ok(());
        };
        match failure {
            None if failing.is_some() => {
                held.extend(changes);
                tracing::info!(table = %core.cfg.table, "reading the stream works again; sending a fresh snapshot");
                publish_snapshot_with(&strong, &core.clock, std::mem::take(&mut held));
                health.failed = false;
                failing = None;
                pause = Duration::from_millis(100);
            }
            None => {
                publish_changes(&strong, &core.clock, changes);
                pause = Duration::from_millis(100);
            }
            Some(Stop::Failed(e)) if e.is_retryable() => {
                if failing.is_some() {
                    held.extend(changes);
                } else {
                    publish_changes(&strong, &core.clock, changes);
                }
                drop(strong);
                let since = *failing.get_or_insert_with(Instant::now);
                if since.elapsed() >= check_every {
                    // Failing for long: look for the table's stream again
                    // and start over (reported by `run`).
                    return Err(Stop::Failed(e));
                }
                health.report(core, hub, e, "reading the stream failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
                continue;
            }
            Some(stop) => {
                if failing.is_none() {
                    publish_changes(&strong, &core.clock, changes);
                }
                return Err(stop);
            }
        }
        if !found {
            tokio::time::sleep(core.cfg.stream_poll_interval).await;
        }
    }
}
/// Poll the table (it has no usable stream): a scan every `poll_interval`,
/// published as the difference (whole after a reported failure), until
/// the table has a usable stream again (`StreamBack`), the hub is gone
/// (`Ok`) or a read fails.
async fn poll(core: &Core, hub: &Weak<Hub>, health: &mut Health) -> Result<(), Stop> {
    let check_every = table_check_interval(core);
    let mut last_check = Instant::now();
    tracing::info!(table = %core.cfg.table, interval = ?core.cfg.poll_interval, "the table has no usable stream; polling it");
    loop {
        let fresh = core.snapshot().await.map_err(Stop::Failed)?;
        {
            let Some(hub) = hub.upgrade() else {
                return Ok(());
            };
            publish_fresh(&hub, &core.clock, fresh, health.failed);
            health.failed = false;
        }
        tokio::time::sleep(core.cfg.poll_interval).await;
        if last_check.elapsed() >= check_every {
            last_check = Instant::now();
            if let Some(arn) = locate_stream(core).await.map_err(Stop::Failed)? {
                return Err(Stop::StreamBack(arn));
            }
        }
    }
}

/// Whether the table is still there with the stream `arn`: `None` when it
/// is; a lost feed (`NotFound`) when the table is gone or has another
/// stream. A transient failure of the check itself is only logged (reading
/// the stream reports those).
async fn check_table(core: &Core, arn: &str) -> Option<Stop> {
    match locate_stream(core).await {
        Ok(Some(current)) if current == arn => None,
        Ok(current) => Some(Stop::Failed(Error::NotFound {
            what: format!(
                "the stream {arn} of DynamoDB table {}: the table now has {}",
                core.cfg.table,
                current.map_or_else(
                    || "no usable stream".to_string(),
                    |c| format!("the stream {c}")
                )
            ),
        })),
        Err(e) if e.is_retryable() => {
            tracing::debug!(table = %core.cfg.table, error = %e, "could not check the table");
            None
        }
        Err(e) => Some(Stop::Failed(e)),
    }
}

/// A fresh scan: as an [`Event::Snapshot`] the first time or when `whole`
/// (after a reported failure), otherwise as the difference to what
/// watchers hold, so they need not start over.
fn publish_fresh(hub: &Hub, clock: &Clock, fresh: Snapshot, whole: bool) {
    if !hub.is_ready() || whole {
        hub.publish([Event::Snapshot(fresh)]);
        return;
    }
    let events: Vec<Event> = diff(&hub.current(), &fresh)
        .into_iter()
        .map(|ev| restamp(ev, clock.next()))
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
fn publish_snapshot_with(hub: &Hub, clock: &Clock, changes: Vec<Change>) {
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

fn restamp(ev: Event, version: Version) -> Event {
    match ev {
        Event::Added { endpoint, .. } => Event::Added { version, endpoint },
        Event::Updated { endpoint, .. } => Event::Updated { version, endpoint },
        Event::Removed { key, .. } => Event::Removed { version, key },
        snapshot @ Event::Snapshot(_) => snapshot,
    }
}

/// A change read from the stream.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Put(Endpoint),
    Remove(EndpointKey),
}

/// Turn changes into events relative to the hub's state, dropping those
/// that change nothing.
fn publish_changes(hub: &Hub, clock: &Clock, changes: Vec<Change>) {
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

/// Where the reader is in one shard.
#[derive(Debug, Default)]
struct Shard {
    parent: Option<String>,
    iterator: Option<String>,
    last_seq: Option<String>,
    finished: bool,
}

struct Reader {
    arn: String,
    shards: BTreeMap<String, Shard>,
    last_discovery: Instant,
    shard_ended: bool,
}

impl Reader {
    async fn open(core: &Core, arn: &str) -> Result<Self, Stop> {
        let mut r = Reader {
            arn: arn.to_string(),
            shards: BTreeMap::new(),
            last_discovery: Instant::now(),
            shard_ended: false,
        };
        r.discover(core, true).await?;
        Ok(r)
    }

    fn needs_discovery(&self) -> bool {
        self.shard_ended || self.last_discovery.elapsed() >= DISCOVERY_INTERVAL
    }

    fn fail<E>(core: &Core, op: &'static str, e: SdkError<E>) -> Stop
    where
        E: aws_sdk_dynamodbstreams::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
    {
        if is_position_lost(&e) {
            Stop::Lost(format!(
                "{op}: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(&e)
            ))
        } else {
            Stop::Failed(map_sdk(e, core.ctx(op)))
        }
    }

    /// Read the shard list; `initial`: open shards start at `LATEST`,
    /// closed ones count as read. Later, new shards start at
    /// `TRIM_HORIZON` once their parent is finished.
    async fn discover(&mut self, core: &Core, initial: bool) -> Result<(), Stop> {
        let mut listed = BTreeSet::new();
        let mut start: Option<String> = None;
        loop {
            let out = core
                .streams
                .describe_stream()
                .stream_arn(&self.arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .map_err(|e| Self::fail(core, "Streams.DescribeStream", e))?;
            let Some(desc) = out.stream_description else {
                break;
            };
            for s in desc.shards() {
                let Some(id) = s.shard_id() else { continue };
                listed.insert(id.to_string());
                if self.shards.contains_key(id) {
                    continue;
                }
                let closed = s
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .is_some();
                let mut shard = Shard {
                    parent: s.parent_shard_id().map(str::to_string),
                    ..Shard::default()
                };
                if initial {
                    if closed {
                        shard.finished = true;
                    } else {
                        shard.iterator = self
                            .iterator(core, id, ShardIteratorType::Latest, None)
                            .await?;
                    }
                }
                tracing::debug!(shard = id, parent = ?shard.parent, initial, "new stream shard");
                self.shards.insert(id.to_string(), shard);
            }
            match desc.last_evaluated_shard_id {
                Some(last) => start = Some(last),
                None => break,
            }
        }
        // Start children whose parent is done (or unknown: trimmed).
        let ready: Vec<String> = self
            .shards
            .iter()
            .filter(|(_, s)| !s.finished && s.iterator.is_none() && s.last_seq.is_none())
            .filter(|(_, s)| match &s.parent {
                None => true,
                Some(p) => self.shards.get(p).is_none_or(|p| p.finished),
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in ready {
            let it = self
                .iterator(core, &id, ShardIteratorType::TrimHorizon, None)
                .await?;
            if let Some(s) = self.shards.get_mut(&id) {
                s.iterator = it;
                if s.iterator.is_none() {
                    s.finished = true;
                }
            }
        }
        // Forget finished shards the stream no longer lists (trimmed).
        self.shards
            .retain(|id, s| !s.finished || listed.contains(id.as_str()));
        self.last_discovery = Instant::now();
        self.shard_ended = false;
        Ok(())
    }

    async fn iterator(
        &self,
        core: &Core,
        shard: &str,
        kind: ShardIteratorType,
        seq: Option<&str>,
    ) -> Result<Option<String>, Stop> {
        let out = core
            .streams
            .get_shard_iterator()
            .stream_arn(&self.arn)
            .shard_id(shard)
            .shard_iterator_type(kind)
            .set_sequence_number(seq.map(str::to_string))
            .send()
            .await
            .map_err(|e| Self::fail(core, "Streams.GetShardIterator", e))?;
        Ok(out.shard_iterator)
    }

    /// One `GetRecords` per active shard, concurrently. Returns the changes
    /// read (in shard order, each shard's in stream order) and the first
    /// failure, if any; shards that succeeded keep their progress.
    async fn round(&mut self, core: &Core) -> (Vec<Change>, Option<Stop>) {
        let active: Vec<(String, String)> = self
            .shards
            .iter()
            .filter(|(_, s)| !s.finished)
            .filter_map(|(id, s)| Some((id.clone(), s.iterator.clone()?)))
            .collect();
        let calls = active.iter().map(|(_, it)| {
            core.streams
                .get_records()
                .shard_iterator(it)
                .limit(RECORDS_PER_CALL)
                .send()
        });
        let results = join_all(calls).await;
        let now = item::now_secs();
        let mut changes = Vec::new();
        let mut failure = None;
        for ((id, _), res) in active.into_iter().zip(results) {
            match res {
                Ok(out) => {
                    let Some(shard) = self.shards.get_mut(&id) else {
                        continue;
                    };
                    for rec in out.records() {
                        if let Some(seq) = rec.dynamodb().and_then(|d| d.sequence_number()) {
                            shard.last_seq = Some(seq.to_string());
                        }
                        changes.extend(change_of(core, rec, now));
                    }
                    shard.iterator = out.next_shard_iterator;
                    if shard.iterator.is_none() {
                        tracing::debug!(shard = %id, "stream shard ended");
                        shard.finished = true;
                        self.shard_ended = true;
                    }
                }
                Err(e) if is_position_lost(&e) => {
                    let seq = self.shards.get(&id).and_then(|s| s.last_seq.clone());
                    let resumed = match seq {
                        Some(seq) => {
                            tracing::info!(shard = %id, seq, "shard iterator lost; resuming after the last sequence number");
                            self.iterator(
                                core,
                                &id,
                                ShardIteratorType::AfterSequenceNumber,
                                Some(&seq),
                            )
                            .await
                        }
                        None => Err(Stop::Lost(format!(
                            "shard {id}: iterator lost before any record was read"
                        ))),
                    };
                    match resumed {
                        Ok(it) => {
                            if let Some(s) = self.shards.get_mut(&id) {
                                s.iterator = it;
                            }
                        }
                        Err(stop) => {
                            failure.get_or_insert(stop);
                        }
                    }
                }
                Err(e) => {
                    failure.get_or_insert(Self::fail(core, "Streams.GetRecords", e));
                }
            }
        }
        (changes, failure)
    }
}

/// What one stream record means for the registry. A new image that expired
/// or is not a valid endpoint counts as a removal, as reads skip it.
fn change_of(core: &Core, rec: &Record, now: u64) -> Option<Change> {
    let data = rec.dynamodb()?;
    match rec.event_name()? {
        OperationType::Insert | OperationType::Modify => {
            let Some(image) = data.new_image() else {
                tracing::warn!(table = %core.cfg.table, "stream record without a new image; is the stream KEYS_ONLY?");
                return None;
            };
            let image = convert(image);
            match core.endpoint_of(&image, now) {
                Some(e) => Some(Change::Put(e)),
                None => item::decode_key(&image).map(Change::Remove),
            }
        }
        OperationType::Remove => item::decode_key(&convert(data.keys()?)).map(Change::Remove),
        _ => None,
    }
}

/// A Streams image as a DynamoDB item (the two SDKs have their own types).
fn convert(image: &HashMap<String, StreamValue>) -> Item {
    image.iter().map(|(k, v)| (k.clone(), value(v))).collect()
}

fn value(v: &StreamValue) -> AttributeValue {
    match v {
        StreamValue::S(s) => AttributeValue::S(s.clone()),
        StreamValue::N(n) => AttributeValue::N(n.clone()),
        StreamValue::Bool(b) => AttributeValue::Bool(*b),
        StreamValue::Null(n) => AttributeValue::Null(*n),
        StreamValue::B(b) => AttributeValue::B(b.clone()),
        StreamValue::Ss(v) => AttributeValue::Ss(v.clone()),
        StreamValue::Ns(v) => AttributeValue::Ns(v.clone()),
        StreamValue::Bs(v) => AttributeValue::Bs(v.clone()),
        StreamValue::L(v) => AttributeValue::L(v.iter().map(value).collect()),
        StreamValue::M(m) => AttributeValue::M(convert(m)),
        _ => AttributeValue::Null(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::testing::ep;

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
        let clock = Clock::default();
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
        let clock = Clock::default();
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
        hub.report_error(Error::NotFound {
            what: "table".into(),
        });
        assert!(matches!(w.next().await, Some(Err(_))));
        let fresh = Snapshot::from_endpoints(clock.next(), [ep("s", "d", 4)]);
        publish_fresh(&hub, &clock, fresh, true);
        let Some(Ok(Event::Snapshot(s))) = w.next().await else {
            panic!("no snapshot after the table came back");
        };
        assert_eq!(s.len(), 1);
        assert!(s.version() > Version(0));
    }

    #[test]
    fn stream_images_convert_to_items() {
        let image = HashMap::from([
            ("service".to_string(), StreamValue::S("s".into())),
            ("id".to_string(), StreamValue::S("a".into())),
            ("address".to_string(), StreamValue::S("h".into())),
            ("port".to_string(), StreamValue::N("80".into())),
            (
                "labels".to_string(),
                StreamValue::M(HashMap::from([(
                    "k".to_string(),
                    StreamValue::S("v".into()),
                )])),
            ),
        ]);
        let e = item::decode(&convert(&image)).expect("decode");
        assert_eq!(e, Endpoint::new("s", "a", "h", 80).with_label("k", "v"));
    }
}
