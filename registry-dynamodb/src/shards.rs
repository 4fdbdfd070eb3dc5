//! Reading a DynamoDB Stream: its shards, their iterators and positions,
//! and what each record means for the registry. The watch task
//! ([`crate::watch`]) drives a [`Reader`] round by round.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use aws_sdk_dynamodbstreams::error::SdkError;
use aws_sdk_dynamodbstreams::types::{OperationType, Record, ShardIteratorType};
use futures::future::join_all;
use waypost::Error;

use crate::client::Client;
use crate::error::{is_position_lost, map_sdk};
use crate::layout::{self, Change};

/// How often the shard list is read again when no shard ended.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);
/// Records per `GetRecords` (the API's maximum).
const RECORDS_PER_CALL: i32 = 1000;

/// Why following stopped.
pub(crate) enum Stop {
    /// A shard's position is gone: start over from a fresh snapshot.
    Lost(String),
    /// A failure (reported by [`run`], which then looks for the table's
    /// current stream and starts over from a fresh snapshot).
    Failed(Error),
    /// Polling found that the table has a usable stream again.
    StreamBack(String),
}

/// Where the reader is in one shard.
#[derive(Debug, Default)]
struct Shard {
    parent: Option<String>,
    iterator: Option<String>,
    last_seq: Option<String>,
    finished: bool,
}

pub(crate) struct Reader {
    arn: String,
    shards: BTreeMap<String, Shard>,
    last_discovery: Instant,
    shard_ended: bool,
}

impl Reader {
    /// Open `arn`: list its shards, open shards at `LATEST`.
    pub(crate) async fn open(table: &Client, arn: &str) -> Result<Self, Stop> {
        let mut r = Reader {
            arn: arn.to_string(),
            shards: BTreeMap::new(),
            last_discovery: Instant::now(),
            shard_ended: false,
        };
        r.discover(table, true).await?;
        Ok(r)
    }

    /// Whether the shard list is due to be read again.
    pub(crate) fn needs_discovery(&self) -> bool {
        self.shard_ended || self.last_discovery.elapsed() >= DISCOVERY_INTERVAL
    }

    fn fail<E>(table: &Client, op: &'static str, e: SdkError<E>) -> Stop
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
            Stop::Failed(map_sdk(e, table.ctx(op)))
        }
    }

    /// Read the shard list; `initial`: open shards start at `LATEST`,
    /// closed ones count as read. Later, new shards start at
    /// `TRIM_HORIZON` once their parent is finished.
    pub(crate) async fn discover(&mut self, table: &Client, initial: bool) -> Result<(), Stop> {
        let mut listed = BTreeSet::new();
        let mut start: Option<String> = None;
        loop {
            let out = table
                .streams
                .describe_stream()
                .stream_arn(&self.arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .map_err(|e| Self::fail(table, "Streams.DescribeStream", e))?;
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
                            .iterator(table, id, ShardIteratorType::Latest, None)
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
                .iterator(table, &id, ShardIteratorType::TrimHorizon, None)
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
        table: &Client,
        shard: &str,
        kind: ShardIteratorType,
        seq: Option<&str>,
    ) -> Result<Option<String>, Stop> {
        let out = table
            .streams
            .get_shard_iterator()
            .stream_arn(&self.arn)
            .shard_id(shard)
            .shard_iterator_type(kind)
            .set_sequence_number(seq.map(str::to_string))
            .send()
            .await
            .map_err(|e| Self::fail(table, "Streams.GetShardIterator", e))?;
        Ok(out.shard_iterator)
    }

    /// One `GetRecords` per active shard, concurrently. Returns the changes
    /// read (in shard order, each shard's in stream order) and the first
    /// failure, if any; shards that succeeded keep their progress.
    pub(crate) async fn round(&mut self, table: &Client) -> (Vec<Change>, Option<Stop>) {
        let active: Vec<(String, String)> = self
            .shards
            .iter()
            .filter(|(_, s)| !s.finished)
            .filter_map(|(id, s)| Some((id.clone(), s.iterator.clone()?)))
            .collect();
        let calls = active.iter().map(|(_, it)| {
            table
                .streams
                .get_records()
                .shard_iterator(it)
                .limit(RECORDS_PER_CALL)
                .send()
        });
        let results = join_all(calls).await;
        let now = layout::now_secs();
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
                        changes.extend(change_of(table, rec, now));
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
                                table,
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
                    failure.get_or_insert(Self::fail(table, "Streams.GetRecords", e));
                }
            }
        }
        (changes, failure)
    }
}

/// What one stream record means for the registry. A new image that expired
/// or is not a valid endpoint counts as a removal, as reads skip it.
fn change_of(table: &Client, rec: &Record, now: u64) -> Option<Change> {
    let data = rec.dynamodb()?;
    match rec.event_name()? {
        OperationType::Insert | OperationType::Modify => {
            let Some(image) = data.new_image() else {
                tracing::warn!(table = %table.cfg.table, "stream record without a new image; is the stream KEYS_ONLY?");
                return None;
            };
            let image = layout::from_stream_image(image);
            match table.endpoint_of(&image, now) {
                Some(e) => Some(Change::Put(e)),
                None => layout::decode_key(&image).map(Change::Remove),
            }
        }
        OperationType::Remove => {
            layout::decode_key(&layout::from_stream_image(data.keys()?)).map(Change::Remove)
        }
        _ => None,
    }
}
