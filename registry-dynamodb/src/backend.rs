//! [`DynamoDbRegistry`]: the registry's public face and the trait
//! implementations (of the registry, and of the `Core` it polls when the
//! table has no stream).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use registry_api::{
    backend::check_batch,
    polling::{Polling, PollingConfig},
    Batch, Capabilities, Endpoint, EndpointKey, Error, EventStream, Op, Registry, Result, Snapshot,
    Version, Watch,
};

use crate::config::{DynamoDbConfig, WatchMode};
use crate::core::{clients, net_ops, Core, MAX_TRANSACTION_ITEMS};
use crate::core::{describe, missing};
use crate::table::{self, check_schema, usable_stream};
use crate::watch::StreamWatch;

/// A service registry in one DynamoDB table.
///
/// Reads are `Query` (one service) and a paginated, optionally parallel
/// `Scan` (a snapshot). Writes are `PutItem` / `DeleteItem`; batches are
/// `TransactWriteItems` of at most 100 actions. Watches follow the table's
/// DynamoDB Stream when it has one (see "Watch" in the crate docs), and
/// poll otherwise. See the crate documentation for the item layout and the
/// meaning of versions.
pub struct DynamoDbRegistry {
    core: Arc<Core>,
    watcher: Watcher,
}

enum Watcher {
    Stream(StreamWatch),
    Polling(Polling<Arc<Core>>),
}

impl DynamoDbRegistry {
    /// Connect to the table in `cfg`: checks that it exists (else
    /// [`Error::NotFound`] naming it) and has the expected key schema, and
    /// picks the watch: its stream when it has one with new images (and
    /// `cfg.watch` is [`WatchMode::Auto`]), polling otherwise.
    pub async fn connect(cfg: DynamoDbConfig) -> Result<Self> {
        let core = clients(&cfg).await;
        let table = describe(&core).await?.ok_or_else(|| missing(&core))?;
        check_schema(&core, &table)?;
        let stream = match cfg.watch {
            WatchMode::Auto => usable_stream(&table),
            WatchMode::Polling => None,
        };
        let core = Arc::new(core);
        let watcher = match stream {
            Some(arn) => {
                tracing::info!(table = %cfg.table, stream = %arn, "watching the table's stream");
                Watcher::Stream(StreamWatch::new(Arc::clone(&core), arn))
            }
            None => {
                tracing::info!(table = %cfg.table, interval = ?cfg.poll_interval, "no usable stream; watching by polling");
                Watcher::Polling(Polling::with_config(
                    Arc::clone(&core),
                    PollingConfig::default()
                        .with_interval(cfg.poll_interval)
                        .with_history(cfg.watch_history),
                )?)
            }
        };
        Ok(Self { core, watcher })
    }

    /// Create the table in `cfg` unless it exists: keys `service` (HASH) and
    /// `id` (RANGE), on-demand billing, with a stream of new and old images
    /// when `with_stream`, and TTL on `cfg.ttl_attribute` when that is set.
    /// Waits until the table is active. Returns whether it created it.
    pub async fn create_table_if_missing(cfg: &DynamoDbConfig, with_stream: bool) -> Result<bool> {
        table::create_table(cfg, with_stream).await
    }

    /// The DynamoDB client, for what this API does not cover.
    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.core.client
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.core.cfg.table
    }

    /// Whether watches follow the table's stream (`false`: polling).
    pub fn watches_stream(&self) -> bool {
        matches!(self.watcher, Watcher::Stream(_))
    }

    /// Apply at most 100 ops (after merging ops on one key) as one
    /// transaction with the caller's `ClientRequestToken` (1 to 36
    /// characters). DynamoDB applies a token's transaction at most once
    /// within 10 minutes, so a caller that retries after a lost answer
    /// (even from another process) passes the same token again.
    pub async fn apply_with_token(&self, ops: Vec<Op>, token: &str) -> Result<()> {
        check_batch(&ops, MAX_TRANSACTION_ITEMS)?;
        if token.is_empty() || token.len() > 36 {
            return Err(Error::invalid(
                "token",
                format!("must be 1 to 36 characters, got {}", token.len()),
            ));
        }
        let ops = net_ops(ops);
        if ops.len() > MAX_TRANSACTION_ITEMS {
            return Err(Error::invalid(
                "ops",
                format!(
                    "{} distinct keys, more than the {MAX_TRANSACTION_ITEMS} of one transaction",
                    ops.len()
                ),
            ));
        }
        if ops.is_empty() {
            return Ok(());
        }
        self.core.transact(ops, token).await
    }
}

impl fmt::Display for DynamoDbRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DynamoDb({})", self.core.cfg.table)
    }
}

impl fmt::Debug for DynamoDbRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbRegistry")
            .field("table", &self.core.cfg.table)
            .field("endpoint", &self.core.endpoint)
            .field("watches_stream", &self.watches_stream())
            .field("config", &self.core.cfg)
            .finish()
    }
}

#[async_trait]
impl Registry for Core {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.put_endpoint(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.delete_endpoint(key).await
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.query_service(service).await
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.scan_all().await
    }

    fn capabilities(&self) -> Capabilities {
        Core::capabilities(self)
    }

    async fn probe(&self) -> Result<()> {
        Core::probe(self).await
    }
}

#[async_trait]
impl Batch for Core {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.apply_ops(ops).await
    }
}

#[async_trait]
impl Registry for DynamoDbRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.core.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.core.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.core.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.core.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.core
            .capabilities()
            .with_native_watch(self.watches_stream())
    }
    /// `DescribeTable` (present and active) and a `PutItem` with a
    /// condition that never holds (writes allowed, nothing written); see
    /// the crate docs.
    async fn probe(&self) -> Result<()> {
        self.core.probe().await
    }
}

#[async_trait]
impl Batch for DynamoDbRegistry {
    /// Refuses more than 100 ops (the batch rule: `InvalidInput` naming
    /// `ops`, nothing written) and any invalid op, merges ops on one key to
    /// their net effect (a later op wins: DynamoDB refuses two actions on
    /// one item), and writes them as one `TransactWriteItems` with its own
    /// `ClientRequestToken` (kept across the SDK's retries of that call):
    /// all-or-nothing.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.core.apply(ops).await
    }
    fn max_batch(&self) -> usize {
        MAX_TRANSACTION_ITEMS
    }
}

impl Watch for DynamoDbRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        match &self.watcher {
            Watcher::Stream(s) => s.watch(from),
            Watcher::Polling(p) => p.watch(from),
        }
    }
}

/// DynamoDbRegistry has no heartbeats of its own (liveness comes from the generic sweeper): [`registry_api::stack::stack`] wraps it as its capabilities call
/// for.
impl registry_api::stack::IntoStack for DynamoDbRegistry {
    fn into_stack(
        self,
        cfg: &registry_api::stack::StackConfig,
    ) -> registry_api::Result<std::sync::Arc<dyn registry_api::stack::Stack>> {
        registry_api::stack::without_heartbeat(self, cfg)
    }
}
