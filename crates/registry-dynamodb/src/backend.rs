//! [`DynamoDbRegistry`]: connecting, reads, writes and batches.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, Delete, KeySchemaElement, KeyType, Put, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableDescription, TableStatus, TimeToLiveSpecification,
    TransactWriteItem,
};
use futures::future::try_join_all;
use registry_api::{
    validate_ops, Batch, Capabilities, Endpoint, EndpointKey, Error, EventStream, Op, Polling,
    PollingConfig, Registry, Result, Snapshot, Version, Watch,
};

use crate::config::{DynamoDbConfig, WatchMode};
use crate::error::{map_sdk, map_transact, Ctx};
use crate::item::{self, Item};
use crate::stream::StreamWatch;

/// Most actions DynamoDB takes in one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

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

/// The clients and settings shared by the registry and its watch task.
pub(crate) struct Core {
    pub(crate) cfg: DynamoDbConfig,
    pub(crate) client: aws_sdk_dynamodb::Client,
    pub(crate) streams: aws_sdk_dynamodbstreams::Client,
    pub(crate) endpoint: String,
    pub(crate) clock: Clock,
}

/// Versions: microseconds since the Unix epoch, strictly increasing within
/// the process.
#[derive(Debug, Default)]
pub(crate) struct Clock(AtomicU64);

impl Clock {
    /// The next version: the current time in µs, or one more than the last
    /// version when the clock has not moved (or went back).
    pub(crate) fn next(&self) -> Version {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let prev = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |prev| {
                Some(now.max(prev.saturating_add(1)))
            })
            .unwrap_or_else(|p| p);
        Version(now.max(prev.saturating_add(1)))
    }
}

impl Core {
    pub(crate) fn ctx(&self, op: &'static str) -> Ctx<'_> {
        Ctx {
            op,
            table: &self.cfg.table,
            endpoint: &self.endpoint,
            key: None,
        }
    }

    /// [`Core::ctx`] for a request about one item.
    pub(crate) fn ctx_key<'a>(&'a self, op: &'static str, key: &'a EndpointKey) -> Ctx<'a> {
        Ctx {
            key: Some(key),
            ..self.ctx(op)
        }
    }

    fn ttl_write(&self) -> Option<(&str, Duration)> {
        match (&self.cfg.ttl_attribute, self.cfg.item_ttl) {
            (Some(attr), Some(ttl)) => Some((attr.as_str(), ttl)),
            _ => None,
        }
    }

    /// The endpoint an item holds, or `None` when it expired or is corrupt
    /// (logged: one bad hand-written item must not blind every reader).
    pub(crate) fn endpoint_of(&self, item: &Item, now: u64) -> Option<Endpoint> {
        if item::expired(item, self.cfg.ttl_attribute.as_deref(), now) {
            return None;
        }
        match item::decode(item) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(table = %self.cfg.table, error = %e, "skipping an item that is not an endpoint");
                None
            }
        }
    }

    async fn scan_segment(&self, segment: u32, total: u32) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        let now = item::now_secs();
        loop {
            let mut req = self
                .client
                .scan()
                .table_name(&self.cfg.table)
                .consistent_read(self.cfg.consistent_reads)
                .set_exclusive_start_key(start.take());
            if total > 1 {
                req = req.segment(segment as i32).total_segments(total as i32);
            }
            let page = req.send().await.map_err(|e| map_sdk(e, self.ctx("Scan")))?;
            out.extend(page.items().iter().filter_map(|i| self.endpoint_of(i, now)));
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }

    async fn transact(&self, ops: Vec<Op>, token: &str) -> Result<()> {
        let ttl = self.ttl_write();
        let keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        let items = ops
            .iter()
            .map(|op| {
                let b = TransactWriteItem::builder();
                let built = match op {
                    Op::Register(e) => Put::builder()
                        .table_name(&self.cfg.table)
                        .set_item(Some(item::encode(e, ttl)))
                        .build()
                        .map(|p| b.put(p).build()),
                    Op::Deregister(k) => Delete::builder()
                        .table_name(&self.cfg.table)
                        .set_key(Some(item::key_item(k)))
                        .build()
                        .map(|d| b.delete(d).build()),
                };
                built.map_err(|e| {
                    Error::internal(format!("building a transaction item: {e}")).with_source(e)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        tracing::debug!(table = %self.cfg.table, actions = items.len(), token, "TransactWriteItems");
        self.client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(token)
            .send()
            .await
            .map_err(|e| map_transact(e, self.ctx("TransactWriteItems"), &keys))?;
        Ok(())
    }
}

/// The id of the item [`Core::probe`] tries to write under
/// [`registry_api::PROBE_SERVICE`]; no item is ever created.
pub(crate) const PROBE_ID: &str = "write-check";

/// The condition of the probe's write: never true, for any item or none.
const NEVER: &str = "attribute_exists(#s) AND attribute_not_exists(#s)";

impl Core {
    /// [`Registry::probe`]: the table is there and active, and writes to it
    /// are allowed. Changes nothing:
    ///
    /// 1. `DescribeTable`: missing, being deleted or archived gives
    ///    `NotFound`; still being created `Unavailable`; encryption key
    ///    out of reach `Unauthorized`.
    /// 2. A `PutItem` of the key (`registry-probe`, `write-check`) with a
    ///    condition that can never hold. DynamoDB checks the caller's
    ///    permission (`dynamodb:PutItem`) before it evaluates the
    ///    condition, so `ConditionalCheckFailedException` means writes are
    ///    allowed, and no item is created (no stream record either).
    ///
    /// Costs one control-plane read and one write request (on AWS, a failed
    /// condition consumes write capacity like a write of a key-only item:
    /// 1 WCU).
    pub(crate) async fn probe(&self) -> Result<()> {
        let table = describe(self).await?.ok_or_else(|| missing(self))?;
        let name = &self.cfg.table;
        let at = &self.endpoint;
        match table.table_status() {
            Some(TableStatus::Active | TableStatus::Updating) | None => {}
            Some(TableStatus::Creating) => {
                return Err(Error::unavailable(format!(
                    "DynamoDB table {name} at {at} is still being created"
                )))
            }
            Some(TableStatus::InaccessibleEncryptionCredentials) => {
                return Err(Error::Unauthorized {
                    message: format!("DynamoDB table {name} at {at}: its KMS key cannot be used"),
                    source: None,
                })
            }
            Some(status) => {
                return Err(Error::NotFound {
                    what: format!("DynamoDB table {name} at {at} (status {})", status.as_str()),
                })
            }
        }
        let key = EndpointKey::new(registry_api::PROBE_SERVICE, PROBE_ID);
        let res = self
            .client
            .put_item()
            .table_name(name)
            .set_item(Some(item::key_item(&key)))
            .condition_expression(NEVER)
            .expression_attribute_names("#s", item::SERVICE)
            .send()
            .await;
        match res {
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(map_sdk(e, self.ctx_key("PutItem (probe)", &key))),
            Ok(_) => Err(Error::internal(format!(
                "probe of DynamoDB table {name} at {at}: a PutItem with an impossible \
                 condition succeeded"
            ))),
        }
    }
}

/// The net effect of `ops` per key (a later op on a key replaces an earlier
/// one), in the order each key first appears.
pub(crate) fn net_ops(ops: Vec<Op>) -> Vec<Op> {
    let mut index: HashMap<EndpointKey, usize> = HashMap::new();
    let mut out: Vec<Op> = Vec::new();
    for op in ops {
        let key = match &op {
            Op::Register(e) => e.key(),
            Op::Deregister(k) => k.clone(),
        };
        match index.get(&key) {
            Some(&i) => out[i] = op,
            None => {
                index.insert(key, out.len());
                out.push(op);
            }
        }
    }
    out
}

/// A `ClientRequestToken` unique to this call: 32 hex digits from the time,
/// the process, a counter and the process's random hash seed.
fn new_token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let seed = SEED.get_or_init(std::collections::hash_map::RandomState::new);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let part = |salt: u8| seed.hash_one((salt, n, nanos, std::process::id()));
    format!("{:016x}{:016x}", part(1), part(2))
}

async fn sdk_config(cfg: &DynamoDbConfig) -> (aws_config::SdkConfig, String) {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(cfg.operation_timeout)
                .connect_timeout(Duration::from_secs(3).min(cfg.operation_timeout))
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(cfg.max_attempts));
    if let Some(r) = &cfg.region {
        loader = loader.region(Region::new(r.clone()));
    }
    if let Some(url) = &cfg.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    if let Some(c) = &cfg.credentials {
        loader = loader.credentials_provider(Credentials::new(
            c.access_key_id.clone(),
            c.secret_access_key.clone(),
            c.session_token.clone(),
            None,
            "registry-dynamodb",
        ));
    }
    let sdk = loader.load().await;
    let region = sdk
        .region()
        .map(|r| r.to_string())
        .unwrap_or_else(|| "us-east-1".to_string());
    (sdk, region)
}

async fn clients(cfg: &DynamoDbConfig) -> Core {
    let (sdk, region) = sdk_config(cfg).await;
    let ddb = aws_sdk_dynamodb::config::Builder::from(&sdk)
        .region(Region::new(region.clone()))
        .build();
    let streams = aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
        .region(aws_sdk_dynamodbstreams::config::Region::new(region.clone()))
        .build();
    Core {
        endpoint: cfg.endpoint_name(&region),
        cfg: cfg.clone(),
        client: aws_sdk_dynamodb::Client::from_conf(ddb),
        streams: aws_sdk_dynamodbstreams::Client::from_conf(streams),
        clock: Clock::default(),
    }
}

pub(crate) async fn describe(core: &Core) -> Result<Option<TableDescription>> {
    match core
        .client
        .describe_table()
        .table_name(&core.cfg.table)
        .send()
        .await
    {
        Ok(out) => Ok(out.table),
        Err(e)
            if matches!(
                e.as_service_error(),
                Some(DescribeTableError::ResourceNotFoundException(_))
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(map_sdk(e, core.ctx("DescribeTable"))),
    }
}

pub(crate) fn missing(core: &Core) -> Error {
    Error::NotFound {
        what: format!(
            "DynamoDB table {} at {} (create it with DynamoDbRegistry::create_table_if_missing)",
            core.cfg.table, core.endpoint
        ),
    }
}

/// The key schema must be `service` (HASH, S) and `id` (RANGE, S).
fn check_schema(core: &Core, table: &TableDescription) -> Result<()> {
    let want = [(item::SERVICE, KeyType::Hash), (item::ID, KeyType::Range)];
    let got: Vec<(&str, &KeyType)> = table
        .key_schema()
        .iter()
        .map(|k| (k.attribute_name(), k.key_type()))
        .collect();
    let ok = got.len() == 2
        && want
            .iter()
            .all(|(n, t)| got.iter().any(|(gn, gt)| gn == n && *gt == t));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "table",
            format!(
                "table {} has the key schema {got:?}; this registry needs `service` (HASH, S) \
                 and `id` (RANGE, S)",
                core.cfg.table
            ),
        ))
    }
}

/// The ARN of the table's stream when it carries new images.
pub(crate) fn usable_stream(table: &TableDescription) -> Option<String> {
    let spec = table.stream_specification()?;
    let images = matches!(
        spec.stream_view_type(),
        Some(StreamViewType::NewImage) | Some(StreamViewType::NewAndOldImages)
    );
    (spec.stream_enabled() && images)
        .then(|| table.latest_stream_arn().map(str::to_string))
        .flatten()
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
        let core = clients(cfg).await;
        if describe(&core).await?.is_some() {
            return Ok(false);
        }
        let attr = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let key = |name: &str, t: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(t)
                .build()
        };
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::internal(format!("building CreateTable: {e}")).with_source(e)
        };
        let mut req = core
            .client
            .create_table()
            .table_name(&cfg.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attr(item::SERVICE).map_err(build)?)
            .attribute_definitions(attr(item::ID).map_err(build)?)
            .key_schema(key(item::SERVICE, KeyType::Hash).map_err(build)?)
            .key_schema(key(item::ID, KeyType::Range).map_err(build)?);
        if with_stream {
            req = req.stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::NewAndOldImages)
                    .build()
                    .map_err(build)?,
            );
        }
        let created = match req.send().await {
            Ok(_) => true,
            // Someone else created it meanwhile.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_in_use_exception()) =>
            {
                false
            }
            Err(e) => return Err(map_sdk(e, core.ctx("CreateTable"))),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let table = describe(&core).await?.ok_or_else(|| missing(&core))?;
            if table.table_status() == Some(&TableStatus::Active) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::unavailable(format!(
                    "table {} at {} did not become active within 120 s",
                    cfg.table, core.endpoint
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if let (true, Some(attr)) = (created, &cfg.ttl_attribute) {
            let spec = TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(attr)
                .build()
                .map_err(build)?;
            let res = core
                .client
                .update_time_to_live()
                .table_name(&cfg.table)
                .time_to_live_specification(spec)
                .send()
                .await;
            if let Err(e) = res {
                // Reads filter expired items anyway; only the clean-up is lost.
                let e = map_sdk(e, core.ctx("UpdateTimeToLive"));
                tracing::warn!(table = %cfg.table, error = %e, "could not enable TTL");
            }
        }
        tracing::info!(table = %cfg.table, created, with_stream, "table ready");
        Ok(created)
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
        validate_ops(&ops)?;
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

impl fmt::Display for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DynamoDb({})", self.cfg.table)
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDb")
            .field("table", &self.cfg.table)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

#[async_trait]
impl Registry for Core {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        let key = endpoint.key();
        self.client
            .put_item()
            .table_name(&self.cfg.table)
            .set_item(Some(item::encode(&endpoint, self.ttl_write())))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.ctx_key("PutItem", &key)))?;
        Ok(())
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.client
            .delete_item()
            .table_name(&self.cfg.table)
            .set_key(Some(item::key_item(key)))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.ctx_key("DeleteItem", key)))?;
        Ok(())
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        let now = item::now_secs();
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.cfg.table)
                .key_condition_expression("#s = :s")
                .expression_attribute_names("#s", item::SERVICE)
                .expression_attribute_values(
                    ":s",
                    aws_sdk_dynamodb::types::AttributeValue::S(service.to_string()),
                )
                .consistent_read(self.cfg.consistent_reads)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, self.ctx("Query")))?;
            out.extend(page.items().iter().filter_map(|i| self.endpoint_of(i, now)));
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        // DynamoDB sorts by the bytes of the sort key, as `String` does; sort
        // anyway so the order never depends on that.
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        let version = self.clock.next();
        let total = self.cfg.scan_segments.max(1);
        let parts = try_join_all((0..total).map(|s| self.scan_segment(s, total))).await?;
        Ok(Snapshot::from_endpoints(
            version,
            parts.into_iter().flatten(),
        ))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_atomic_batch(true)
            .with_max_batch(MAX_TRANSACTION_ITEMS)
            .with_persistent(true)
            .with_resumable_watch(true)
    }

    async fn probe(&self) -> Result<()> {
        Core::probe(self).await
    }
}

#[async_trait]
impl Batch for Core {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        let ops = net_ops(ops);
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            let chunk: Vec<Op> = ops.by_ref().take(MAX_TRANSACTION_ITEMS).collect();
            self.transact(chunk, &new_token()).await?;
        }
        Ok(())
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
    /// Validates every op, merges ops on one key to their net effect (a
    /// later op wins: DynamoDB refuses two actions on one item), and writes
    /// chunks of 100 as one `TransactWriteItems` each, each with its own
    /// `ClientRequestToken` (kept across the SDK's retries of that call).
    /// Up to 100 distinct keys are all-or-nothing; larger batches are
    /// atomic per chunk, and a failure leaves the earlier chunks applied.
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

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::testing::ep;

    #[test]
    fn net_ops_keep_the_last_op_per_key_in_first_seen_order() {
        let ops = vec![
            Op::Register(ep("s", "a", 1)),
            Op::Register(ep("s", "b", 1)),
            Op::Deregister(EndpointKey::new("s", "a")),
            Op::Register(ep("s", "b", 2)),
        ];
        assert_eq!(
            net_ops(ops),
            vec![
                Op::Deregister(EndpointKey::new("s", "a")),
                Op::Register(ep("s", "b", 2))
            ]
        );
    }

    #[test]
    fn tokens_are_unique_and_short() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert!(a.len() <= 36);
    }

    #[test]
    fn clock_is_strictly_increasing() {
        let c = Clock::default();
        let mut last = c.next();
        for _ in 0..1000 {
            let v = c.next();
            assert!(v > last);
            last = v;
        }
    }
}
