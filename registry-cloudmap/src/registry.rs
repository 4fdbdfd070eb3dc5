//! [`CloudMapRegistry`]: the backend over `aws-sdk-servicediscovery`; its
//! public face and trait implementations.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_servicediscovery::config::{BehaviorVersion, Region};
use aws_sdk_servicediscovery::Client;
use futures::stream::{self, StreamExt};
use waypost::backend::{
    check_batch, sweep_loop, validate_endpoint, NodeRecord, NodeTable, SharedLiveness,
};
use waypost::liveness::SweepReport;
use waypost::{
    Batch, Capabilities, Endpoint, EndpointKey, Heartbeat, Op, Registry, Result, Snapshot,
};

use crate::client::{Client as NamespaceClient, CloudMapStats};
use crate::config::CloudMapConfig;
use crate::endpoints::{Endpoints, MAX_BATCH};
use crate::layout;
use crate::nodes::NodeStore;
use crate::watch::SnapshotCache;

/// A [`Registry`], [`Batch`] and [`Heartbeat`] over one AWS Cloud Map
/// namespace.
///
/// Cheap to clone (the clones share the client, caches, rate limit and
/// liveness sweeper). Liveness is kept in the namespace, one record per
/// node shared by every process (see "Liveness" in the crate docs); the
/// sweeper runs in the background until the last clone is dropped. Cloud
/// Map has no change feed: [`waypost::stack::stack`] wraps the
/// registry in [`waypost::polling::Polling`] for a
/// [`waypost::Watch`]. Its `snapshot()` skips services whose
/// `DiscoverInstancesRevision` did not change, and reads everything every
/// [`full_poll_every`](CloudMapConfig::full_poll_every)-th time. See the
/// crate documentation for the mapping.
#[derive(Clone)]
pub struct CloudMapRegistry {
    endpoints: Arc<Endpoints>,
    snapshots: Arc<SnapshotCache>,
    nodes: Arc<NodeStore>,
    liveness: Arc<SharedLiveness>,
    /// Held for its `Drop`: the last clone stops the sweeper.
    _sweeper: Arc<Sweeper>,
}

/// The liveness sweeper task, stopped when the last clone of the registry
/// is dropped.
struct Sweeper(tokio::task::JoinHandle<()>);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl CloudMapRegistry {
    /// Connect with credentials and region from the environment (the
    /// standard AWS chain), then find or create the namespace.
    pub async fn connect(cfg: CloudMapConfig) -> Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &cfg.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(credentials) = &cfg.credentials {
            loader = loader.credentials_provider(credentials.clone());
        }
        let shared = loader.load().await;
        Self::with_sdk_config(aws_sdk_servicediscovery::Config::from(&shared), cfg).await
    }

    /// Connect with a ready SDK configuration (credentials, retries,
    /// timeouts); `cfg.endpoint_url` and `cfg.region` override it when set.
    /// Starts the liveness sweeper (`cfg.liveness`, checked first).
    pub async fn with_sdk_config(
        sdk: aws_sdk_servicediscovery::Config,
        cfg: CloudMapConfig,
    ) -> Result<Self> {
        let liveness = Arc::new(SharedLiveness::new(cfg.liveness.clone())?);
        let client = Arc::new(NamespaceClient::open(sdk, cfg).await?);
        let endpoints = Arc::new(Endpoints::new(client));
        let nodes = Arc::new(NodeStore::new(Arc::clone(&endpoints)));
        let sweeper = tokio::spawn(sweep_loop(
            Arc::downgrade(&nodes),
            Arc::downgrade(&liveness),
        ));
        Ok(Self {
            endpoints,
            snapshots: Arc::new(SnapshotCache::new()),
            nodes,
            liveness,
            _sweeper: Arc::new(Sweeper(sweeper)),
        })
    }

    /// Run one liveness sweep now (the background sweeper runs one every
    /// `cfg.liveness.sweep_interval`).
    pub async fn sweep(&self) -> Result<SweepReport> {
        self.liveness.sweep(&*self.nodes).await
    }

    /// The nodes' liveness records in the namespace, as every process sees
    /// them.
    pub async fn node_records(&self) -> Result<Vec<NodeRecord>> {
        self.nodes.node_records().await
    }

    /// The namespace's name.
    pub fn namespace(&self) -> &str {
        &self.endpoints.client.cfg.namespace
    }

    /// The namespace's Cloud Map id.
    pub fn namespace_id(&self) -> &str {
        &self.endpoints.client.namespace_id
    }

    /// The settings in use.
    pub fn config(&self) -> &CloudMapConfig {
        &self.endpoints.client.cfg
    }

    /// The SDK client, for calls this crate does not make.
    pub fn client(&self) -> &Client {
        &self.endpoints.client.sdk
    }

    /// Request counts so far.
    pub fn stats(&self) -> CloudMapStats {
        self.endpoints.client.stats()
    }
}

impl fmt::Display for CloudMapRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloudMap({})", self.endpoints.client.cfg.namespace)
    }
}

impl fmt::Debug for CloudMapRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudMapRegistry")
            .field("namespace", &self.endpoints.client.cfg.namespace)
            .field("namespace_id", &self.endpoints.client.namespace_id)
            .field("endpoint", &self.endpoints.client.endpoint)
            .field("read_mode", &self.endpoints.client.cfg.read_mode)
            .field("write_mode", &self.endpoints.client.cfg.write_mode)
            .field("liveness", &self.liveness.config())
            .finish()
    }
}

#[async_trait]
impl Registry for CloudMapRegistry {
    /// A `RegisterInstance` (waited for in [`crate::WriteMode::Wait`]); the
    /// node's liveness record is written first when it is due.
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        validate_endpoint(&endpoint)?;
        layout::encode(&endpoint)?;
        self.liveness.seen_endpoint(&*self.nodes, &endpoint).await?;
        self.endpoints.put(&endpoint).await
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.endpoints.delete(key).await
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.endpoints.list(service).await
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.snapshots.snapshot(&self.endpoints).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(false)
            .with_resumable_watch(false)
            .with_atomic_writes(false)
            .with_max_batch(MAX_BATCH)
            .with_max_labels(layout::MAX_LABELS)
            .with_max_encoded_len(layout::MAX_ENCODED_LEN)
            .with_native_liveness(true)
    }

    /// A read only (`GetNamespace`): Cloud Map has no write without a
    /// visible effect. `NotFound` when the namespace was deleted,
    /// `Unauthorized` when the credentials are refused, `Unavailable` when
    /// Cloud Map does not answer.
    async fn probe(&self) -> Result<()> {
        self.endpoints.client.probe().await
    }
}

#[async_trait]
impl Batch for CloudMapRegistry {
    /// Not atomic. The batch rule first ([`check_batch`]): more than
    /// [`MAX_BATCH`] ops, or an invalid op, are refused (`InvalidInput`
    /// naming `ops` or `ops[i].…`) and nothing is sent; every registration
    /// is also checked against Cloud Map's attribute limits
    /// ([`layout::encode`]) before anything is sent. Then the liveness
    /// records of the nodes owning registered endpoints are written when
    /// due, and the net op of each key ([`Op::net`]) is applied, up to
    /// [`CloudMapConfig::concurrency`] at once under the rate limit; when
    /// some writes fail, the others may have been applied and the first
    /// error is returned.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, MAX_BATCH)?;
        for (i, op) in ops.iter().enumerate() {
            if let Op::Register(ep) = op {
                layout::encode(ep).map_err(|e| e.in_field(&format!("ops[{i}].")))?;
            }
        }
        self.liveness.seen(&*self.nodes, &ops).await?;
        let ops = Op::net(ops);
        let total = ops.len();
        let results: Vec<Result<()>> = stream::iter(ops)
            .map(|op| self.endpoints.write(op))
            .buffer_unordered(self.endpoints.client.cfg.concurrency.max(1))
            .collect()
            .await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        if failed > 0 {
            tracing::warn!(registry = %self, failed, total, "batch partly failed");
        }
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

#[async_trait]
impl Heartbeat for CloudMapRegistry {
    /// Record that `node` is alive in its liveness record (at most once
    /// per `suspect_after / 3` from this process, however often it is
    /// called: a read and a `RegisterInstance`), and revive the endpoints
    /// liveness had marked unhealthy. `NotFound` for a node with neither a
    /// record nor an endpoint: it should register again.
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.liveness.heartbeat(&*self.nodes, node).await
    }
}

/// CloudMapRegistry keeps liveness in the namespace (native) but has no
/// watch: [`waypost::stack::stack`] wraps it in `Polling` only
/// (`StackConfig::liveness` is not used: set [`CloudMapConfig::liveness`]).
impl waypost::stack::IntoStack for CloudMapRegistry {
    fn into_stack(
        self,
        cfg: &waypost::stack::StackConfig,
    ) -> waypost::Result<std::sync::Arc<dyn waypost::stack::Stack>> {
        let polled = waypost::polling::Polling::with_config(self, cfg.polling.clone())?;
        Ok(Arc::new(polled))
    }
}
