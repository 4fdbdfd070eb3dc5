//! [`DynamoDbRegistry`]: the registry's public face and its trait
//! implementations.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use waypost::backend::{
    check_batch, sweep_loop, validate_endpoint, NodeRecord, NodeTable, SharedLiveness,
};
use waypost::liveness::SweepReport;
use waypost::{
    Batch, Capabilities, Endpoint, EndpointKey, Error, EventStream, Heartbeat, Op, Registry,
    Result, Snapshot, Version, Watch,
};

use crate::admin::usable_stream;
use crate::changelog::changelog_max_batch;
use crate::client::Client;
use crate::config::{DynamoDbConfig, WatchMode, CHANGELOG_MAX_HEADS};
use crate::endpoints::Endpoints;
use crate::nodes::Nodes;
use crate::transact::MAX_TRANSACTION_ITEMS;
use crate::watch::changelog::LogWatch;
use crate::watch::{self, StreamWatch};

/// A service registry in one DynamoDB table.
///
/// Reads are `Query` (one service) and a paginated, optionally parallel
/// `Scan` (a snapshot). Writes are `PutItem` / `DeleteItem`; batches are
/// one `TransactWriteItems` of at most 100 actions. When the table has a
/// DynamoDB Stream with new images, `watch()` follows it (see "Watch" in
/// the crate docs); otherwise the registry does not watch by itself: its
/// capabilities say `native_watch: false`, its `watch()` reports an error,
/// and [`waypost::stack::stack`] wraps it in
/// [`waypost::polling::Polling`]. See the crate documentation for the
/// item layout and the meaning of versions.
pub struct DynamoDbRegistry {
    endpoints: Arc<Endpoints>,
    /// The nodes' liveness records in the table.
    nodes: Arc<Nodes>,
    /// Liveness kept in the table, and its sweeper task.
    liveness: Arc<SharedLiveness>,
    sweeper: tokio::task::JoinHandle<()>,
    /// The watch of the table's stream; `None` when it is not followed.
    stream: Option<StreamWatch>,
    /// The watch of the change log ([`WatchMode::ChangeLog`]).
    log: Option<LogWatch>,
}

impl DynamoDbRegistry {
    /// Connect to the table in `cfg`: checks that it exists (else
    /// [`Error::NotFound`] naming it) and has the expected key schema, and
    /// follows its stream when it has one with new images and `cfg.watch`
    /// is [`WatchMode::Auto`].
    pub async fn connect(cfg: DynamoDbConfig) -> Result<Self> {
        if !(1..=CHANGELOG_MAX_HEADS).contains(&cfg.changelog_heads) {
            return Err(waypost::Error::invalid(
                "changelog_heads",
                format!(
                    "{} is not a number of change log heads: 1 to {}",
                    cfg.changelog_heads, CHANGELOG_MAX_HEADS
                ),
            ));
        }
        if cfg.create_table {
            Client::create_if_missing(&cfg, cfg.watch == WatchMode::Auto).await?;
        }
        let client = Client::new(&cfg).await;
        let description = client.describe_existing().await?;
        client.check_schema(&description)?;
        let arn = match cfg.watch {
            WatchMode::Auto => usable_stream(&description),
            WatchMode::Polling | WatchMode::ChangeLog => None,
        };
        let endpoints = Arc::new(Endpoints::new(Arc::new(client)));
        let stream = match arn {
            Some(arn) => {
                tracing::info!(table = %cfg.table, stream = %arn, "watching the table's stream");
                Some(StreamWatch::new(Arc::clone(&endpoints), arn))
            }
            None if cfg.watch == WatchMode::ChangeLog => None,
            None => {
                tracing::info!(table = %cfg.table, "not following a stream: native_watch is false (waypost::stack::stack polls it)");
                None
            }
        };
        let log = (cfg.watch == WatchMode::ChangeLog).then(|| {
            tracing::info!(table = %cfg.table, "writing and following the table's change log");
            LogWatch::new(Arc::clone(&endpoints))
        });
        let liveness = Arc::new(SharedLiveness::new(cfg.liveness.clone())?);
        let nodes = Arc::new(Nodes::new(Arc::clone(&endpoints)));
        let sweeper = tokio::spawn(sweep_loop(
            Arc::downgrade(&nodes),
            Arc::downgrade(&liveness),
        ));
        Ok(Self {
            endpoints,
            nodes,
            liveness,
            sweeper,
            stream,
            log,
        })
    }

    /// Run one liveness sweep now (the background sweeper runs one every
    /// `cfg.liveness.sweep_interval`).
    pub async fn sweep(&self) -> Result<SweepReport> {
        self.liveness.sweep(&*self.nodes).await
    }

    /// The nodes' liveness records in the table, as every process sees
    /// them.
    pub async fn node_records(&self) -> Result<Vec<NodeRecord>> {
        self.nodes.node_records().await
    }

    /// Create the table in `cfg` unless it exists: keys `service` (HASH) and
    /// `id` (RANGE), on-demand billing, with a stream of new and old images
    /// when `with_stream`, and TTL on `cfg.ttl_attribute` when that is set.
    /// Waits until the table is active. Returns whether it created it.
    pub async fn create_table_if_missing(cfg: &DynamoDbConfig, with_stream: bool) -> Result<bool> {
        Client::create_if_missing(cfg, with_stream).await
    }

    /// The DynamoDB client, for what this API does not cover.
    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.endpoints.client.ddb
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.endpoints.client.cfg.table
    }

    /// Whether `watch()` follows the table's stream (`false`: it does not
    /// watch; wrap the registry with [`waypost::stack::stack`]).
    pub fn watches_stream(&self) -> bool {
        self.stream.is_some()
    }

    /// Whether writes go through the table's change log and `watch()`
    /// follows it ([`WatchMode::ChangeLog`]).
    pub fn uses_changelog(&self) -> bool {
        self.log.is_some()
    }

    /// Most ops in one batch: [`MAX_TRANSACTION_ITEMS`], or
    /// [`crate::changelog_max_batch`] with the change log (its entries and
    /// heads share the transaction).
    fn batch_limit(&self) -> usize {
        if self.uses_changelog() {
            changelog_max_batch(self.endpoints.client.log_heads())
        } else {
            MAX_TRANSACTION_ITEMS
        }
    }

    /// Apply at most 100 ops (after merging ops on one key) as one
    /// transaction with the caller's `ClientRequestToken` (1 to 36
    /// characters). DynamoDB applies a token's transaction at most once
    /// within 10 minutes, so a caller that retries after a lost answer
    /// (even from another process) passes the same token again.
    pub async fn apply_with_token(&self, ops: Vec<Op>, token: &str) -> Result<()> {
        check_batch(&ops, self.batch_limit())?;
        if token.is_empty() || token.len() > 36 {
            return Err(Error::invalid(
                "token",
                format!("must be 1 to 36 characters, got {}", token.len()),
            ));
        }
        self.liveness.seen(&*self.nodes, &ops).await?;
        self.endpoints.apply_ops(ops, Some(token)).await
    }
}

impl fmt::Display for DynamoDbRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DynamoDb({})", self.endpoints.client.cfg.table)
    }
}

impl fmt::Debug for DynamoDbRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbRegistry")
            .field("table", &self.endpoints.client.cfg.table)
            .field("endpoint", &self.endpoints.client.endpoint)
            .field("watches_stream", &self.watches_stream())
            .field("uses_changelog", &self.uses_changelog())
            .field("config", &self.endpoints.client.cfg)
            .finish()
    }
}

#[async_trait]
impl Registry for DynamoDbRegistry {
    /// A `PutItem` (with the change log, a transaction); the node's
    /// liveness record is written first when it is due.
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        validate_endpoint(&endpoint)?;
        self.liveness.seen_endpoint(&*self.nodes, &endpoint).await?;
        self.endpoints.put_endpoint(&endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.endpoints.delete_endpoint(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.endpoints.query_service(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.endpoints.scan_all().await
    }
    /// Atomic batches of up to 100 ops; a native, resumable watch only
    /// when the table's stream is followed.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_atomic_writes(true)
            // Query and Scan read committed items: a reader may see part of
            // a transaction that is being applied.
            .with_isolated_reads(false)
            .with_max_batch(self.batch_limit())
            .with_native_watch(self.watches_stream() || self.uses_changelog())
            .with_resumable_watch(self.watches_stream() || self.uses_changelog())
            .with_native_liveness(true)
    }
    /// `DescribeTable` (present and active) and a `PutItem` with a
    /// condition that never holds (writes allowed, nothing written); see
    /// the crate docs.
    async fn probe(&self) -> Result<()> {
        self.endpoints.client.probe().await
    }
}

#[async_trait]
impl Batch for DynamoDbRegistry {
    /// The batch rule first ([`check_batch`]): more than 100 ops, or an
    /// invalid op, are refused (`InvalidInput`, nothing written). Then ops
    /// on one key are merged to their net effect (a later op wins: DynamoDB
    /// refuses two actions on one item), and written as one
    /// `TransactWriteItems` with its own `ClientRequestToken` (kept across
    /// the SDK's retries of that call): all-or-nothing.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, self.batch_limit())?;
        self.liveness.seen(&*self.nodes, &ops).await?;
        self.endpoints.apply_ops(ops, None).await
    }

    fn max_batch(&self) -> usize {
        self.batch_limit()
    }
}

#[async_trait]
impl Heartbeat for DynamoDbRegistry {
    /// Record that `node` is alive in its liveness record (at most once
    /// per `suspect_after / 3` from this process, however often it is
    /// called), and revive the endpoints liveness had marked unhealthy.
    /// `NotFound` for a node with neither a record nor an endpoint: it
    /// should register again.
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.liveness.heartbeat(&*self.nodes, node).await
    }
}

impl Drop for DynamoDbRegistry {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

impl Watch for DynamoDbRegistry {
    /// The table's stream, followed as the crate docs describe; without
    /// one, a stream with one `InvalidInput` error naming the table (wrap
    /// the registry with [`waypost::stack::stack`], which polls it).
    fn watch(&self, from: Option<Version>) -> EventStream {
        match (&self.stream, &self.log) {
            (Some(stream), _) => stream.watch(from),
            (None, Some(log)) => log.watch(from),
            (None, None) => watch::unwatched(&self.endpoints),
        }
    }
}

/// DynamoDbRegistry keeps liveness in the table (native), and watches
/// only when it follows the table's stream or change log:
/// [`waypost::stack::stack`] wraps it in `Polling` when it does not.
impl waypost::stack::IntoStack for DynamoDbRegistry {
    fn into_stack(
        self,
        cfg: &waypost::stack::StackConfig,
    ) -> waypost::Result<std::sync::Arc<dyn waypost::stack::Stack>> {
        waypost::stack::by_capabilities(self, cfg)
    }
}
