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
//!    too, starts over at 1 (a fresh snapshot, delivered as its diff).
//!
//! Transient errors are logged and retried with backoff (100 ms to 10 s);
//! watchers keep the last state meanwhile.

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

use crate::backend::{Clock, Core};
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
    /// A transient (or unexpected) error.
    Failed(Error),
}

async fn run(core: Arc<Core>, arn: String, hub: Weak<Hub>) {
    let mut pause = Duration::from_millis(100);
    loop {
        match follow(&core, &arn, &hub).await {
            Ok(()) => return,
            Err(Stop::Lost(why)) => {
                tracing::info!(table = %core.cfg.table, why, "stream position lost; resyncing from a fresh snapshot");
            }
            Err(Stop::Failed(e)) => {
                tracing::warn!(table = %core.cfg.table, error = %e, retry_in = ?pause, "following the stream failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
        }
        if hub.strong_count() == 0 {
            return;
        }
    }
}

/// One life of the reader: open, snapshot, then rounds until the hub is
/// gone (`Ok`) or the position is lost.
async fn follow(core: &Core, arn: &str, hub: &Weak<Hub>) -> Result<(), Stop> {
    let mut reader = Reader::open(core, arn).await?;
    let fresh = core.snapshot().await.map_err(Stop::Failed)?;
    {
        let Some(hub) = hub.upgrade() else {
            return Ok(());
        };
        publish_fresh(&hub, &core.clock, fresh);
    }
    let mut pause = Duration::from_millis(100);
    loop {
        let (changes, failure) = reader.round(core).await;
        let found = !changes.is_empty();
        {
            let Some(hub) = hub.upgrade() else {
                return Ok(());
            };
            publish_changes(&hub, &core.clock, changes);
        }
        match failure {
            None => pause = Duration::from_millis(100),
            Some(Stop::Failed(e)) => {
                tracing::warn!(table = %core.cfg.table, error = %e, retry_in = ?pause, "reading the stream failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
                continue;
            }
            Some(lost) => return Err(lost),
        }
        if reader.needs_discovery() {
            if let Err(e) = reader.discover(core, false).await {
                match e {
                    Stop::Failed(e) => {
                        tracing::warn!(table = %core.cfg.table, error = %e, "listing the stream's shards failed; retrying");
                    }
                    lost => return Err(lost),
                }
            }
        }
        if !found {
            tokio::time::sleep(core.cfg.stream_poll_interval).await;
        }
    }
}

/// The first snapshot as such; later ones as the diff to what watchers
/// hold, so they need not start over.
fn publish_fresh(hub: &Hub, clock: &Clock, fresh: Snapshot) {
    if !hub.is_ready() {
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
        publish_fresh(&hub, &clock, fresh);
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(w.next().await.expect("event").expect("ok"));
        }
        assert_eq!(
            kinds(&got),
            vec![("removed", "b".to_string()), ("added", "c".to_string())]
        );
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
