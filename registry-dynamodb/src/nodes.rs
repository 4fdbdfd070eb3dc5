//! Liveness kept in the table: one item per node, so that every process
//! using the table judges every node by the same record
//! ([`waypost::backend::SharedLiveness`] does the judging).
//!
//! Layout (partition [`NODE_PARTITION`], which no endpoint can use; sort
//! key the node's name):
//! - `beats` (N): how many heartbeats were recorded, one more at each
//!   (missing in records of a release that did not count them: read as
//!   0); liveness is judged by its changes, timed on each sweeper's own
//!   clock;
//! - `beat` (N): the node's last recorded heartbeat, in milliseconds since
//!   the Unix epoch, as the process that recorded it saw the time (for
//!   people and for the TTL attribute);
//! - `marked` (L of M, endpoint keys in the endpoint layout): the
//!   endpoints liveness marked unhealthy, revived when the node is back;
//! - the TTL attribute (when the table has one): the heartbeat's wall time
//!   plus twice `remove_after` plus [`TTL_CLOCK_MARGIN`], so the records of
//!   forgotten nodes disappear, and a writer whose clock is behind by less
//!   than the margin never has a live node's record expire. (Were it to
//!   happen, the node's next heartbeat or the next sweep writes the record
//!   again: an expired record marks nothing.)
//!
//! Marking and removing are transactions that carry a condition on the
//! record's `beats` and `beat` being those the sweep read, beside the
//! endpoint writes (and, with the change log, the log's head and entries).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, ReturnValue, TransactWriteItem, Update,
};
use waypost::backend::{NodeRecord, NodeTable};
use waypost::{Endpoint, EndpointKey, Op, Result, Snapshot};

use crate::changelog::CHANGELOG_MAX_BATCH;
use crate::client::Client;
use crate::endpoints::Endpoints;
use crate::error::{map_sdk, map_transact};
use crate::layout::{self, Item, NODE_PARTITION};
use crate::transact::{build_err, failed_within, Guard, MAX_TRANSACTION_ITEMS};

const BEAT: &str = "beat";
const BEATS: &str = "beats";
const MARKED: &str = "marked";

/// What a record's TTL attribute adds to its wall time beyond twice
/// `remove_after`, so that the clock of the process that wrote it may be
/// behind by up to an hour without the record expiring while its node
/// lives.
pub const TTL_CLOCK_MARGIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// The key of `node`'s record.
fn record_key(node: &str) -> Item {
    layout::key_item(&EndpointKey::new(NODE_PARTITION, node))
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn keys_value(keys: &[EndpointKey]) -> AttributeValue {
    AttributeValue::L(
        keys.iter()
            .map(|k| AttributeValue::M(layout::key_item(k)))
            .collect(),
    )
}

/// A record item as a [`NodeRecord`] (`None`: not one).
fn decode_record(item: &Item) -> Option<NodeRecord> {
    let node = match item.get(layout::ID) {
        Some(AttributeValue::S(s)) => s.clone(),
        _ => return None,
    };
    let number = |attr: &str| match item.get(attr) {
        Some(AttributeValue::N(v)) => v.parse().ok(),
        _ => Some(0),
    };
    let (beat, beats) = (number(BEAT)?, number(BEATS)?);
    let marked = match item.get(MARKED) {
        Some(AttributeValue::L(l)) => l
            .iter()
            .filter_map(|v| v.as_m().ok().and_then(layout::decode_key))
            .collect(),
        _ => Vec::new(),
    };
    Some(
        NodeRecord::new(node, beat)
            .with_beats(beats)
            .with_marked(marked),
    )
}

/// The nodes' liveness records in one registry's table, and the
/// [`NodeTable`] that [`waypost::backend::SharedLiveness`] judges them by.
pub(crate) struct Nodes {
    client: Arc<Client>,
    endpoints: Arc<Endpoints>,
}

impl Nodes {
    /// The records beside `endpoints`, in the same table.
    pub(crate) fn new(endpoints: Arc<Endpoints>) -> Self {
        Self {
            client: Arc::clone(&endpoints.client),
            endpoints,
        }
    }

    /// The TTL attribute's value for a record with heartbeat `beat_ms`.
    fn record_expiry(&self, beat_ms: u64) -> Option<(&str, AttributeValue)> {
        let attr = self.client.cfg.ttl_attribute.as_deref()?;
        let keep = self
            .client
            .cfg
            .liveness
            .remove_after
            .as_secs()
            .saturating_mul(2)
            .saturating_add(TTL_CLOCK_MARGIN.as_secs());
        Some((attr, n((beat_ms / 1000).saturating_add(keep))))
    }

    /// Most endpoints one guarded transaction writes beside its guard.
    fn guarded_chunk(&self) -> usize {
        if self.client.logged() {
            CHANGELOG_MAX_BATCH - 1
        } else {
            MAX_TRANSACTION_ITEMS - 1
        }
    }

    /// The guard "the record of `seen.node` still holds `seen.beats` and
    /// `seen.beat_ms`", as a condition check, an update of `marked`, or the
    /// record's delete.
    fn record_guard(&self, seen: &NodeRecord, action: GuardAction<'_>) -> Result<Guard> {
        let key = record_key(&seen.node);
        let cond = if seen.beats == 0 {
            "#b = :seen AND (attribute_not_exists(#g) OR #g = :g)"
        } else {
            "#b = :seen AND #g = :g"
        };
        let item = match action {
            GuardAction::Check => TransactWriteItem::builder()
                .condition_check(
                    ConditionCheck::builder()
                        .table_name(&self.client.cfg.table)
                        .set_key(Some(key))
                        .condition_expression(cond)
                        .expression_attribute_names("#b", BEAT)
                        .expression_attribute_names("#g", BEATS)
                        .expression_attribute_values(":seen", n(seen.beat_ms))
                        .expression_attribute_values(":g", n(seen.beats))
                        .build()
                        .map_err(build_err)?,
                )
                .build(),
            GuardAction::SetMarked(keys) => TransactWriteItem::builder()
                .update(
                    Update::builder()
                        .table_name(&self.client.cfg.table)
                        .set_key(Some(key))
                        .update_expression("SET #m = :m")
                        .condition_expression(cond)
                        .expression_attribute_names("#b", BEAT)
                        .expression_attribute_names("#g", BEATS)
                        .expression_attribute_names("#m", MARKED)
                        .expression_attribute_values(":seen", n(seen.beat_ms))
                        .expression_attribute_values(":g", n(seen.beats))
                        .expression_attribute_values(":m", keys_value(keys))
                        .build()
                        .map_err(build_err)?,
                )
                .build(),
            GuardAction::Delete => TransactWriteItem::builder()
                .delete(
                    Delete::builder()
                        .table_name(&self.client.cfg.table)
                        .set_key(Some(key))
                        .condition_expression(cond)
                        .expression_attribute_names("#b", BEAT)
                        .expression_attribute_names("#g", BEATS)
                        .expression_attribute_values(":seen", n(seen.beat_ms))
                        .expression_attribute_values(":g", n(seen.beats))
                        .build()
                        .map_err(build_err)?,
                )
                .build(),
        };
        Ok(Guard {
            items: vec![item],
            keys: vec![EndpointKey::new(NODE_PARTITION, &seen.node)],
            existing: true,
        })
    }

    /// A guard alone, as a transaction outside the change log (it writes
    /// no endpoint).
    async fn commit_record_only(&self, guard: Guard) -> Result<bool> {
        let res = self
            .client
            .ddb
            .transact_write_items()
            .set_transact_items(Some(guard.items))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if failed_within(&e, 0..1) => Ok(false),
            Err(e) => Err(map_transact(
                e,
                self.client.ctx("TransactWriteItems (node record)"),
                &guard.keys,
            )),
        }
    }
}

/// What the guard of a liveness transaction does to the node's record.
enum GuardAction<'a> {
    Check,
    SetMarked(&'a [EndpointKey]),
    Delete,
}

impl fmt::Display for Nodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DynamoDb({})", self.client.cfg.table)
    }
}

#[async_trait]
impl NodeTable for Nodes {
    async fn endpoints(&self) -> Result<Snapshot> {
        self.endpoints.scan_all().await
    }

    async fn service_endpoints(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.endpoints.query_service(service).await
    }

    /// A paginated `Query` of the records' partition.
    async fn node_records(&self) -> Result<Vec<NodeRecord>> {
        let mut records = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let out = self
                .client
                .ddb
                .query()
                .table_name(&self.client.cfg.table)
                .key_condition_expression("#s = :s")
                .expression_attribute_names("#s", layout::SERVICE)
                .expression_attribute_values(":s", AttributeValue::S(NODE_PARTITION.into()))
                .consistent_read(self.client.cfg.consistent_reads)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, self.client.ctx("Query (node records)")))?;
            records.extend(out.items().iter().filter_map(decode_record));
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(records),
            }
        }
    }

    /// One `UpdateItem` that counts the heartbeat and sets `beat`
    /// (returning the old record); without `create`, on condition that the
    /// record exists.
    async fn touch(&self, node: &str, at_ms: u64, create: bool) -> Result<Option<NodeRecord>> {
        let mut u = self
            .client
            .ddb
            .update_item()
            .table_name(&self.client.cfg.table)
            .set_key(Some(record_key(node)))
            .expression_attribute_names("#b", BEAT)
            .expression_attribute_names("#g", BEATS)
            .expression_attribute_values(":at", n(at_ms))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllOld);
        if !create {
            u = u
                .condition_expression("attribute_exists(#id)")
                .expression_attribute_names("#id", layout::ID);
        }
        let counted = "SET #b = :at, #g = if_not_exists(#g, :zero) + :one";
        u = match self.record_expiry(at_ms) {
            Some((attr, at)) => u
                .update_expression(format!("{counted}, #t = :t"))
                .expression_attribute_names("#t", attr)
                .expression_attribute_values(":t", at),
            None => u.update_expression(counted),
        };
        match u.send().await {
            Ok(out) => Ok(out.attributes.as_ref().and_then(decode_record)),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(UpdateItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(map_sdk(e, self.client.ctx("UpdateItem (node record)"))),
        }
    }

    /// A `PutItem` on condition that the record does not exist.
    async fn admit(&self, node: &str, at_ms: u64) -> Result<()> {
        let mut item = record_key(node);
        item.insert(BEAT.into(), n(at_ms));
        if let Some((attr, at)) = self.record_expiry(at_ms) {
            item.insert(attr.to_string(), at);
        }
        match self
            .client
            .ddb
            .put_item()
            .table_name(&self.client.cfg.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#id)")
            .expression_attribute_names("#id", layout::ID)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(PutItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(map_sdk(e, self.client.ctx("PutItem (node record)"))),
        }
    }

    /// Transactions of at most a batch of endpoints each, every one
    /// guarded by the record's `beat` and adding its keys to `marked`.
    async fn mark(&self, seen: &NodeRecord, endpoints: Vec<Endpoint>) -> Result<bool> {
        let mut marked = seen.marked.clone();
        for chunk in endpoints.chunks(self.guarded_chunk()) {
            marked.extend(chunk.iter().map(Endpoint::key));
            let guard = self.record_guard(seen, GuardAction::SetMarked(&marked))?;
            let ops = chunk.iter().cloned().map(Op::Register).collect();
            if !self.endpoints.commit_guarded(ops, guard).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Transactions of at most a batch of endpoints each, leaving in
    /// `marked` what is still to revive. A condition that fails (an
    /// endpoint deregistered meanwhile, the record removed) leaves the
    /// rest to the next sweep.
    async fn revive(&self, node: &str, endpoints: Vec<Endpoint>) -> Result<()> {
        let mut rest: Vec<EndpointKey> = endpoints.iter().map(Endpoint::key).collect();
        let mut chunks: Vec<&[Endpoint]> = endpoints.chunks(self.guarded_chunk()).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for chunk in chunks {
            rest.drain(..chunk.len());
            let update = Update::builder()
                .table_name(&self.client.cfg.table)
                .set_key(Some(record_key(node)))
                .update_expression("SET #m = :m")
                .condition_expression("attribute_exists(#b)")
                .expression_attribute_names("#b", BEAT)
                .expression_attribute_names("#m", MARKED)
                .expression_attribute_values(":m", keys_value(&rest))
                .build()
                .map_err(build_err)?;
            let guard = Guard {
                items: vec![TransactWriteItem::builder().update(update).build()],
                keys: vec![EndpointKey::new(NODE_PARTITION, node)],
                existing: true,
            };
            let ops: Vec<Op> = chunk.iter().cloned().map(Op::Register).collect();
            let done = if ops.is_empty() {
                self.commit_record_only(guard).await?
            } else {
                self.endpoints.commit_guarded(ops, guard).await?
            };
            if !done {
                tracing::debug!(table = %self.client.cfg.table, node, "reviving a node's endpoints met a change; the next sweep finishes it");
                return Ok(());
            }
        }
        Ok(())
    }

    /// Transactions of at most a batch of deletes each, guarded by the
    /// record's `beat`; the last one deletes the record.
    async fn remove(&self, seen: &NodeRecord, keys: Vec<EndpointKey>) -> Result<bool> {
        let chunks: Vec<&[EndpointKey]> = keys.chunks(self.guarded_chunk()).collect();
        let last = chunks.len().saturating_sub(1);
        if keys.is_empty() {
            let guard = self.record_guard(seen, GuardAction::Delete)?;
            return self.commit_record_only(guard).await;
        }
        for (i, chunk) in chunks.into_iter().enumerate() {
            let action = if i == last {
                GuardAction::Delete
            } else {
                GuardAction::Check
            };
            let guard = Guard {
                existing: false,
                ..self.record_guard(seen, action)?
            };
            let ops = chunk.iter().cloned().map(Op::Deregister).collect();
            if !self.endpoints.commit_guarded(ops, guard).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_item(node: &str, beat_ms: u64) -> Item {
        let mut item = record_key(node);
        item.insert(BEAT.into(), n(beat_ms));
        item
    }

    #[test]
    fn records_round_trip_and_are_not_endpoints() {
        let mut item = record_item("node-1", 1_700_000_000_123);
        item.insert(
            MARKED.into(),
            keys_value(&[EndpointKey::new("web", "a"), EndpointKey::new("db", "b")]),
        );
        let rec = decode_record(&item).expect("a record");
        assert_eq!(rec.node, "node-1");
        assert_eq!(rec.beat_ms, 1_700_000_000_123);
        // Written by a release that did not count heartbeats.
        assert_eq!(rec.beats, 0);
        item.insert(BEATS.into(), n(42));
        assert_eq!(decode_record(&item).expect("a record").beats, 42);
        assert_eq!(
            rec.marked,
            vec![EndpointKey::new("web", "a"), EndpointKey::new("db", "b")]
        );
        assert!(layout::is_internal(&item));
        assert!(layout::decode_key(&item).is_none());
    }
}
