//! [`EtcdRegistry`]: the `Registry`, `Watch`, `Batch` and `Heartbeat`
//! implementation over etcd v3.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::Client;
use waypost::{
    backend::{check_batch, check_name},
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Heartbeat, Op, Registry, Result,
    Snapshot, Version, Watch,
};

use crate::config::EtcdConfig;
use crate::keyspace::Keyspace;
use crate::leases;

/// A registry stored in etcd.
///
/// Keys are `<prefix>/services/<service>/<id>` (see the crate docs for the
/// escaping and the value encoding); [`Version`] is etcd's revision.
///
/// - `snapshot()` and `list()` read at one revision, in pages of
///   [`EtcdConfig::page_size`] keys.
/// - `watch()` is etcd's watch from the revision after `from`; when etcd
///   has compacted that revision, or cancels the watch, the stream sends a
///   fresh [`waypost::Event::Snapshot`] and goes on. When the
///   connection drops it reports each failed attempt as an `Err` item and
///   reconnects by itself with exponential backoff; the first session after
///   that starts with a fresh `Snapshot` read at one revision (so the
///   consumer learns the source is healthy again and misses nothing). It
///   ends only when the consumer drops it or etcd refuses it for good (a
///   last `Err` item says why).
/// - `apply()` refuses more than [`EtcdConfig::max_batch`] ops
///   (`InvalidInput` naming `ops`, nothing written), and writes the net
///   effect of the batch per key (a later op on a key wins) in one `Txn`,
///   or one per [`EtcdConfig::max_txn_bytes`] bytes when it is larger;
///   each `Txn` is atomic.
/// - An endpoint with a non-empty `node` is attached to that node's lease
///   (one per node, granted on first use, TTL [`EtcdConfig::lease_ttl`]).
///   `heartbeat(node)` keeps the lease alive: when a node stops
///   heartbeating, etcd deletes its endpoints one TTL after the last
///   heartbeat, and its next heartbeat is `NotFound` (as is one of a node
///   that owns no endpoint here): it registers again. When the lease is lost while the node is alive (revoked,
///   or expired while etcd was down), the registry grants a new one and
///   writes that node's endpoints again by itself.
///
/// Cloning is cheap and clones share the connection and the leases.
#[derive(Clone)]
pub struct EtcdRegistry {
    keyspace: Arc<Keyspace>,
}

impl EtcdRegistry {
    /// Connect to etcd and check that it answers.
    ///
    /// Fails with `Unavailable` when no endpoint answers within the
    /// connect and request timeouts, `Unauthorized` when the user or
    /// password is refused, `InvalidInput` for a malformed configuration.
    pub async fn connect(cfg: EtcdConfig) -> Result<Self> {
        Ok(Self {
            keyspace: Keyspace::connect(cfg).await?,
        })
    }

    /// The configuration this registry was opened with.
    pub fn config(&self) -> &EtcdConfig {
        &self.keyspace.cfg
    }

    /// The underlying etcd client (for operations this crate does not
    /// offer, such as compaction).
    pub fn client(&self) -> &Client {
        &self.keyspace.client
    }

    /// The etcd key under which the endpoint with `key` is stored.
    pub fn key_of(&self, key: &EndpointKey) -> String {
        self.keyspace.layout.key(key)
    }

    /// The lease currently attached to `node`'s endpoints, if any.
    pub async fn lease_of(&self, node: &str) -> Option<i64> {
        leases::lease_of(&self.keyspace, node).await
    }
}

impl fmt::Display for EtcdRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Etcd({})", self.keyspace.cfg.normalized_prefix())
    }
}

impl fmt::Debug for EtcdRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdRegistry")
            .field("config", &self.keyspace.cfg)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Registry for EtcdRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        self.keyspace.commit(vec![Op::Register(endpoint)]).await
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.keyspace
            .commit(vec![Op::Deregister(key.clone())])
            .await
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        if service.is_empty() {
            return Ok(Vec::new());
        }
        let prefix = self.keyspace.layout.service_prefix(service);
        let (_, mut eps) = self.keyspace.read_range(&prefix).await?;
        eps.retain(|e| e.service == service);
        eps.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(eps)
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.keyspace.snapshot().await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_atomic_writes(true)
            .with_isolated_reads(true)
            .with_max_batch(self.keyspace.cfg.max_batch)
            .with_native_liveness(true)
    }

    /// A one-key read of the prefix and a write
    /// permission check (a `Txn` that can never succeed) that writes
    /// nothing. `Unavailable` when etcd does not answer, `Unauthorized`
    /// when the user may not read or write the prefix.
    async fn probe(&self) -> Result<()> {
        self.keyspace.probe().await
    }
}

impl Watch for EtcdRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        crate::watch::watch(self.keyspace.clone(), from)
    }
}

#[async_trait]
impl Batch for EtcdRegistry {
    /// The batch rule first ([`check_batch`]): more than
    /// [`EtcdConfig::max_batch`] ops, or an invalid op, are refused and
    /// nothing is written.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, self.keyspace.cfg.max_batch)?;
        if ops.is_empty() {
            return Ok(());
        }
        self.keyspace.commit(ops).await
    }
}

#[async_trait]
impl Heartbeat for EtcdRegistry {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        check_name("node", node, true)?;
        leases::keep_alive(&self.keyspace, node).await
    }
}

/// EtcdRegistry implements all four traits, with etcd's watch and leases:
/// [`waypost::stack::stack`] wraps it as its capabilities call for.
impl waypost::stack::IntoStack for EtcdRegistry {
    fn into_stack(
        self,
        cfg: &waypost::stack::StackConfig,
    ) -> waypost::Result<std::sync::Arc<dyn waypost::stack::Stack>> {
        waypost::stack::by_capabilities(self, cfg)
    }
}
