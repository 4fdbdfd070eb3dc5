//! [`NodeStore`]: liveness kept in the namespace, one record per node
//! ([`crate::records`] says how it is written), so that every process
//! using the namespace judges every node by the same record
//! ([`waypost::backend::SharedLiveness`] does the judging).
//!
//! Cloud Map has neither transactions nor conditional writes. What the
//! [`NodeTable`] contract asks to be conditional ("only if the record still
//! holds the heartbeat the sweep read") is a check and then an act:
//!
//! - **mark**: read the record again right before writing; skip when its
//!   heartbeat (count or wall time) moved. Write the record with the keys added to its marked
//!   ones, then the unhealthy copies of the endpoints, then read the record
//!   once more: when a heartbeat landed in between, the heartbeat may have
//!   revived before the unhealthy copies arrived, so the sweep revives what
//!   it just marked itself; when the record is gone (removed meanwhile), it
//!   deletes what it just wrote.
//! - **remove**: read the record again right before deleting; skip when
//!   its heartbeat (count or wall time) moved. Delete the endpoints, then the record, then read
//!   once more and delete a record written back by a heartbeat that read
//!   it just before it was deleted (the node's next heartbeat is then
//!   `NotFound`, and the node registers again).
//!
//! The check and the act are not atomic: a write of another process can
//! land between them. Every such case ends in a state that a heartbeat or
//! the next sweep repairs (see "Liveness" in the crate docs); writes of one
//! record by this process are serialized.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_servicediscovery::operation::register_instance::RegisterInstanceError;
use aws_sdk_servicediscovery::types::HealthStatusFilter;
use futures::stream::{self, StreamExt, TryStreamExt};
use waypost::backend::{backoff, NodeRecord, NodeTable};
use waypost::{Endpoint, EndpointKey, Error, ErrorKind, Health, Result, Snapshot};

use crate::client::{request_id, Client, KeyGuard, DISCOVER_MAX};
use crate::config::WriteMode;
use crate::endpoints::Endpoints;
use crate::error;
use crate::layout;
use crate::records::{self, Encoded};
use crate::watch::SnapshotCache;

/// Most `RegisterInstance` attempts of one record write while another
/// write of it is in flight (`DuplicateRequest`).
const RECORD_WRITE_ATTEMPTS: usize = 4;

/// The node records of one namespace, and the sweeps' view of its
/// endpoints.
pub(crate) struct NodeStore {
    endpoints: Arc<Endpoints>,
    /// The sweeps' snapshots, revision-skipping on their own (apart from
    /// the snapshots the registry's watch polls).
    snapshots: SnapshotCache,
}

/// What errors about `node`'s record name.
fn target(node: &str) -> String {
    format!("liveness record of node {node:?}")
}

impl NodeStore {
    /// The records beside `endpoints`, in the same namespace.
    pub(crate) fn new(endpoints: Arc<Endpoints>) -> Self {
        Self {
            endpoints,
            snapshots: SnapshotCache::new(),
        }
    }

    /// The namespace's client.
    fn client(&self) -> &Client {
        &self.endpoints.client
    }

    /// Hold `node`'s record against other writes of this process.
    async fn lock(&self, node: &str) -> KeyGuard<'_> {
        self.client().lock_key(format!("node\0{node}")).await
    }

    /// The records in the reserved service `cm_name` (only `node`'s when
    /// given): one `DiscoverInstances`, or every page of `ListInstances`
    /// when it returns its maximum. Emulators that keep a copy per write
    /// return the newest last.
    async fn read_service(&self, cm_name: &str, node: Option<&str>) -> Result<Vec<NodeRecord>> {
        let target = match node {
            Some(n) => target(n),
            None => format!("node liveness records in service {cm_name}"),
        };
        let client = self.client();
        client.counters.record_reads.fetch_add(1, Ordering::Relaxed);
        let res = client
            .call("DiscoverInstances", &target, |c| {
                let req = c
                    .discover_instances()
                    .namespace_name(&client.cfg.namespace)
                    .service_name(cm_name)
                    .health_status(HealthStatusFilter::All)
                    .max_results(DISCOVER_MAX);
                let req = match node {
                    Some(n) => req.query_parameters(layout::ATTR_NODE, layout::escape(n)),
                    None => req,
                };
                req.send()
            })
            .await;
        let out = match res {
            Ok(out) => out,
            // No such service yet: no records.
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let found: Vec<NodeRecord> = if out.instances().len() >= DISCOVER_MAX as usize {
            self.list_service(cm_name, &target).await?
        } else {
            out.instances()
                .iter()
                .filter_map(|i| i.attributes().and_then(records::decode))
                .collect()
        };
        Ok(found
            .into_iter()
            .filter(|r| node.is_none_or(|n| r.node == n))
            .collect())
    }

    /// Every page of `ListInstances` of the reserved service `cm_name`.
    async fn list_service(&self, cm_name: &str, target: &str) -> Result<Vec<NodeRecord>> {
        let Some(id) = self
            .endpoints
            .services
            .node_service_id(cm_name, false)
            .await?
        else {
            return Ok(Vec::new());
        };
        let mut token = None;
        let mut found = Vec::new();
        loop {
            let client = self.client();
            client.counters.record_reads.fetch_add(1, Ordering::Relaxed);
            let out = client
                .call("ListInstances", target, |c| {
                    c.list_instances()
                        .service_id(&id)
                        .set_next_token(token)
                        .send()
                })
                .await?;
            found.extend(
                out.instances()
                    .iter()
                    .filter_map(|i| i.attributes().and_then(records::decode)),
            );
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(found),
            }
        }
    }

    /// `node`'s record as Cloud Map answers now (`None`: there is none).
    async fn read_record(&self, node: &str) -> Result<Option<NodeRecord>> {
        let cm_name = layout::node_service(node);
        Ok(self.read_service(&cm_name, Some(node)).await?.pop())
    }

    /// Write `node`'s record with the heartbeat `heard` (count, wall time;
    /// see [`NodeRecord::heard`]) and the marked keys that fit (see
    /// [`records::encode`]); the keys written.
    async fn write_record(
        &self,
        node: &str,
        heard: (u64, u64),
        marked: &[EndpointKey],
    ) -> Result<Vec<EndpointKey>> {
        let enc = records::encode(node, heard.0, heard.1, marked);
        if enc.left_out > 0 {
            tracing::warn!(
                registry = %self,
                node,
                left_out = enc.left_out,
                kept = enc.kept.len(),
                "a node record holds at most 5,000 characters of attributes: \
                 {} marked endpoints do not fit and stay as they are",
                enc.left_out
            );
        }
        self.put_record(node, &enc).await?;
        Ok(enc.kept)
    }

    /// `RegisterInstance` of `node`'s record, creating its service on the
    /// first write; waited for in [`WriteMode::Wait`]. Cloud Map takes one
    /// write of an instance at a time: while another is in flight
    /// (`DuplicateRequest`), it is waited for and the write repeated.
    async fn put_record(&self, node: &str, enc: &Encoded) -> Result<()> {
        let cm_name = layout::node_service(node);
        let target = target(node);
        let instance_id = layout::instance_id(node);
        let mut delays = backoff(
            self.client().cfg.operation_poll_min,
            self.client().cfg.operation_poll_max,
        );
        let mut refreshed = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let service_id = self
                .endpoints
                .services
                .node_service_id(&cm_name, true)
                .await?
                .ok_or_else(|| {
                    Error::internal(format!("{target}: service {cm_name} was not created"))
                })?;
            let client = self.client();
            client
                .counters
                .record_writes
                .fetch_add(1, Ordering::Relaxed);
            let res = client
                .send(|c| {
                    c.register_instance()
                        .service_id(&service_id)
                        .instance_id(&instance_id)
                        .creator_request_id(request_id("node"))
                        .set_attributes(Some(enc.attrs.clone()))
                        .send()
                })
                .await;
            let e = match res {
                Ok(out) => {
                    return self
                        .client()
                        .finish(out.operation_id(), "RegisterInstance", &target)
                        .await
                }
                Err(e) => e,
            };
            if let Some(RegisterInstanceError::DuplicateRequest(dup)) = e.as_service_error() {
                if attempt < RECORD_WRITE_ATTEMPTS {
                    match dup.duplicate_operation_id() {
                        Some(op) => {
                            if let Err(why) = self.client().wait_operation(op, &target).await {
                                tracing::debug!(%target, error = %why, "the write in flight failed; writing again");
                            }
                        }
                        None => tokio::time::sleep(delays.next().unwrap_or_default()).await,
                    }
                    continue;
                }
            }
            let err = error::from_sdk(e, self.client().about("RegisterInstance", &target));
            if err.kind() == ErrorKind::NotFound && !refreshed {
                // The cached service was deleted behind our back.
                self.endpoints.services.forget_node_service(&cm_name);
                refreshed = true;
                continue;
            }
            return Err(err);
        }
    }

    /// `DeregisterInstance` of `node`'s record (every copy, with
    /// [`crate::CloudMapConfig::repeat_deregister`]); a missing one is not
    /// an error.
    async fn delete_record(&self, node: &str) -> Result<()> {
        let cm_name = layout::node_service(node);
        let target = target(node);
        let Some(service_id) = self
            .endpoints
            .services
            .node_service_id(&cm_name, false)
            .await?
        else {
            return Ok(());
        };
        let instance_id = layout::instance_id(node);
        let repeat =
            self.client().cfg.repeat_deregister && self.client().cfg.write_mode == WriteMode::Wait;
        for _ in 0..17 {
            let client = self.client();
            client
                .counters
                .record_writes
                .fetch_add(1, Ordering::Relaxed);
            let res = client
                .call("DeregisterInstance", &target, |c| {
                    c.deregister_instance()
                        .service_id(&service_id)
                        .instance_id(&instance_id)
                        .send()
                })
                .await;
            match res {
                Ok(out) => {
                    self.client()
                        .finish(out.operation_id(), "DeregisterInstance", &target)
                        .await?;
                    if !repeat {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(Error::internal(format!(
            "{target}: Cloud Map still lists it after 17 deregistrations"
        )))
    }

    /// Write `endpoints` through the ordinary write path, up to
    /// `concurrency` at once.
    async fn put_endpoints(&self, endpoints: &[Endpoint]) -> Result<()> {
        let store = &*self.endpoints;
        stream::iter(endpoints.to_vec())
            .map(|e| async move { store.put(&e).await })
            .buffer_unordered(self.client().cfg.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// Deregister `keys`, up to `concurrency` at once.
    async fn delete_endpoints(&self, keys: &[EndpointKey]) -> Result<()> {
        let store = &*self.endpoints;
        stream::iter(keys.to_vec())
            .map(|k| async move { store.delete(&k).await })
            .buffer_unordered(self.client().cfg.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    /// After marking `marked` of `seen.node`: when the record moved on (a
    /// heartbeat landed) take the marking back; when it is gone (removed
    /// meanwhile) delete what was just written. Whether the marking stands.
    async fn confirm_mark(&self, seen: &NodeRecord, marked: Vec<Endpoint>) -> Result<bool> {
        let node = &seen.node;
        match self.read_record(node).await? {
            Some(after) if after.heard() == seen.heard() => Ok(true),
            Some(after) => {
                tracing::debug!(registry = %self, node, "a heartbeat landed while the node was marked; reviving");
                let keys: Vec<EndpointKey> = marked.iter().map(Endpoint::key).collect();
                let healthy: Vec<Endpoint> = marked
                    .into_iter()
                    .map(|e| e.with_health(Health::Healthy))
                    .collect();
                self.put_endpoints(&healthy).await?;
                if after.marked.iter().any(|k| keys.contains(k)) {
                    let heard = after.heard();
                    let rest: Vec<EndpointKey> = after
                        .marked
                        .into_iter()
                        .filter(|k| !keys.contains(k))
                        .collect();
                    self.write_record(node, heard, &rest).await?;
                }
                Ok(false)
            }
            None => {
                tracing::debug!(registry = %self, node, "the node was removed while it was marked; deleting what was marked");
                let keys: Vec<EndpointKey> = marked.iter().map(Endpoint::key).collect();
                self.delete_endpoints(&keys).await?;
                Ok(false)
            }
        }
    }
}

impl fmt::Display for NodeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloudMap({})", self.client().cfg.namespace)
    }
}

#[async_trait]
impl NodeTable for NodeStore {
    async fn endpoints(&self) -> Result<Snapshot> {
        self.snapshots.snapshot(&self.endpoints).await
    }

    async fn service_endpoints(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.endpoints.list(service).await
    }

    /// One `DiscoverInstances` per reserved service that exists (those the
    /// last `ListServices` saw; listed first when none is known).
    async fn node_records(&self) -> Result<Vec<NodeRecord>> {
        let known = || self.endpoints.services.node_service_names();
        let mut services = known();
        if services.is_empty() {
            self.endpoints.services.list_services().await?;
            services = known();
        }
        let read: Vec<Vec<NodeRecord>> = stream::iter(services)
            .map(|s| async move { self.read_service(&s, None).await })
            .buffer_unordered(self.client().cfg.concurrency.max(1))
            .try_collect()
            .await?;
        // One record per node: emulators that keep a copy per write list
        // the newest last.
        let mut by_node = std::collections::BTreeMap::new();
        for rec in read.into_iter().flatten() {
            by_node.insert(rec.node.clone(), rec);
        }
        Ok(by_node.into_values().collect())
    }

    /// A read of the record (`DiscoverInstances` asking for the node), and
    /// a `RegisterInstance` with the heartbeat counted, its wall time, and
    /// the marked keys it held.
    async fn touch(&self, node: &str, at_ms: u64, create: bool) -> Result<Option<NodeRecord>> {
        let _guard = self.lock(node).await;
        let before = self.read_record(node).await?;
        if before.is_none() && !create {
            return Ok(None);
        }
        let (beats, marked) = before
            .as_ref()
            .map(|b| (b.beats, b.marked.clone()))
            .unwrap_or_default();
        self.write_record(node, (beats.saturating_add(1), at_ms), &marked)
            .await?;
        Ok(before)
    }

    /// A read, and a `RegisterInstance` when there is no record.
    async fn admit(&self, node: &str, at_ms: u64) -> Result<()> {
        let _guard = self.lock(node).await;
        if self.read_record(node).await?.is_none() {
            self.write_record(node, (0, at_ms), &[]).await?;
        }
        Ok(())
    }

    /// See the module documentation: checked right before, and once more
    /// after, writing. Endpoints whose keys do not fit the record are left
    /// healthy (and logged), so that every endpoint liveness marks is one
    /// it can revive.
    async fn mark(&self, seen: &NodeRecord, endpoints: Vec<Endpoint>) -> Result<bool> {
        let node = &seen.node;
        let _guard = self.lock(node).await;
        let Some(current) = self.read_record(node).await? else {
            return Ok(false);
        };
        if current.heard() != seen.heard() {
            return Ok(false);
        }
        let mut marked = current.marked;
        for e in &endpoints {
            let key = e.key();
            if !marked.contains(&key) {
                marked.push(key);
            }
        }
        let enc = records::encode(node, seen.beats, seen.beat_ms, &marked);
        let (endpoints, unrecorded): (Vec<Endpoint>, Vec<Endpoint>) = endpoints
            .into_iter()
            .partition(|e| enc.kept.contains(&e.key()));
        if !unrecorded.is_empty() {
            tracing::warn!(
                registry = %self,
                node,
                unrecorded = unrecorded.len(),
                "the node is silent, but the keys of {} of its endpoints do not fit its record \
                 (5,000 characters of attributes): they stay healthy until the node is removed",
                unrecorded.len()
            );
        }
        if endpoints.is_empty() {
            return Ok(false);
        }
        self.put_record(node, &enc).await?;
        self.put_endpoints(&endpoints).await?;
        self.confirm_mark(seen, endpoints).await
    }

    /// The endpoints first, then the record's marked keys cleared (when
    /// there are any), so that a failure leaves them for the next try.
    async fn revive(&self, node: &str, endpoints: Vec<Endpoint>) -> Result<()> {
        let _guard = self.lock(node).await;
        self.put_endpoints(&endpoints).await?;
        match self.read_record(node).await? {
            Some(rec) if !rec.marked.is_empty() => {
                self.write_record(node, rec.heard(), &[]).await?;
            }
            _ => {}
        }
        Ok(())
    }

    /// See the module documentation: checked right before deleting.
    async fn remove(&self, seen: &NodeRecord, keys: Vec<EndpointKey>) -> Result<bool> {
        let node = &seen.node;
        let _guard = self.lock(node).await;
        match self.read_record(node).await? {
            Some(current) if current.heard() == seen.heard() => {}
            _ => return Ok(false),
        }
        self.delete_endpoints(&keys).await?;
        self.delete_record(node).await?;
        if self.read_record(node).await?.is_some() {
            tracing::debug!(registry = %self, node, "a heartbeat wrote the record back while the node was removed; deleting it again");
            self.delete_record(node).await?;
        }
        Ok(true)
    }
}
