//! [`Table`]: one DynamoDB table as the registry uses it, shared by the
//! registry and its watch task: the clients, the settings and the version
//! clock, and every request (reads, writes, the probe, describing and
//! creating the table).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableDescription, TableStatus, TimeToLiveSpecification,
};
use futures::future::try_join_all;
use waypost::backend::VersionClock;
use waypost::{Endpoint, EndpointKey, Error, Op, Result, Snapshot};

use crate::changelog::{failed_within, Guard};
use crate::config::DynamoDbConfig;
use crate::error::{map_sdk, map_transact, Ctx};
use crate::layout::{self, Item};

/// Most actions DynamoDB takes in one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

/// The clients, settings and version clock shared by the registry and its
/// watch task.
pub(crate) struct Table {
    pub(crate) cfg: DynamoDbConfig,
    pub(crate) client: aws_sdk_dynamodb::Client,
    pub(crate) streams: aws_sdk_dynamodbstreams::Client,
    /// Where requests go, for messages.
    pub(crate) endpoint: String,
    /// Versions of snapshots and watch events (DynamoDB has none of its
    /// own): they start at the current time in microseconds, so they grow
    /// across restarts.
    pub(crate) clock: VersionClock,
    /// The change log's head as this process last saw it.
    pub(crate) log_head: crate::changelog::HeadCache,
}

impl Table {
    /// The clients for `cfg` (nothing is sent yet).
    pub(crate) async fn new(cfg: &DynamoDbConfig) -> Table {
        let (sdk, region) = sdk_config(cfg).await;
        let ddb = aws_sdk_dynamodb::config::Builder::from(&sdk)
            .region(Region::new(region.clone()))
            .build();
        let streams = aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
            .region(aws_sdk_dynamodbstreams::config::Region::new(region.clone()))
            .build();
        Table {
            endpoint: cfg.endpoint_name(&region),
            cfg: cfg.clone(),
            client: aws_sdk_dynamodb::Client::from_conf(ddb),
            streams: aws_sdk_dynamodbstreams::Client::from_conf(streams),
            clock: VersionClock::new(),
            log_head: Default::default(),
        }
    }

    /// What a request is about, for its errors.
    pub(crate) fn ctx(&self, op: &'static str) -> Ctx<'_> {
        Ctx {
            op,
            table: &self.cfg.table,
            endpoint: &self.endpoint,
            key: None,
        }
    }

    /// [`Table::ctx`] for a request about one item.
    pub(crate) fn ctx_key<'a>(&'a self, op: &'static str, key: &'a EndpointKey) -> Ctx<'a> {
        Ctx {
            key: Some(key),
            ..self.ctx(op)
        }
    }

    pub(crate) fn ttl_write(&self) -> Option<(&str, Duration)> {
        match (&self.cfg.ttl_attribute, self.cfg.item_ttl) {
            (Some(attr), Some(ttl)) => Some((attr.as_str(), ttl)),
            _ => None,
        }
    }

    /// Whether writes go through the change log.
    pub(crate) fn logged(&self) -> bool {
        self.cfg.watch == crate::config::WatchMode::ChangeLog
    }

    /// The endpoint an item holds, or `None` when it expired or is corrupt
    /// (logged: one bad hand-written item must not blind every reader).
    pub(crate) fn endpoint_of(&self, item: &Item, now: u64) -> Option<Endpoint> {
        if layout::is_internal(item) {
            return None;
        }
        if layout::expired(item, self.cfg.ttl_attribute.as_deref(), now) {
            return None;
        }
        match layout::decode(item) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(table = %self.cfg.table, error = %e, "skipping an item that is not an endpoint");
                None
            }
        }
    }
}

/// Reads.
impl Table {
    /// The endpoints of `service`: a paginated `Query`, sorted by id.
    pub(crate) async fn query_service(&self, service: &str) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        let now = layout::now_secs();
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.cfg.table)
                .key_condition_expression("#s = :s")
                .expression_attribute_names("#s", layout::SERVICE)
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

    /// Every endpoint: a (parallel) paginated `Scan`, at a version taken
    /// before it started.
    pub(crate) async fn scan_all(&self) -> Result<Snapshot> {
        let version = self.clock.next();
        let total = self.cfg.scan_segments.max(1);
        let parts = try_join_all((0..total).map(|s| self.scan_segment(s, total))).await?;
        Ok(Snapshot::from_endpoints(
            version,
            parts.into_iter().flatten(),
        ))
    }

    /// One segment of a `Scan`, every page.
    async fn scan_segment(&self, segment: u32, total: u32) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        let now = layout::now_secs();
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
}

/// Writes.
impl Table {
    /// `PutItem` of one endpoint (already validated).
    pub(crate) async fn put_endpoint(&self, endpoint: &Endpoint) -> Result<()> {
        if self.logged() {
            return self
                .commit_logged(vec![Op::Register(endpoint.clone())], None)
                .await;
        }
        let key = endpoint.key();
        self.client
            .put_item()
            .table_name(&self.cfg.table)
            .set_item(Some(layout::encode(endpoint, self.ttl_write())))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.ctx_key("PutItem", &key)))?;
        Ok(())
    }

    /// `DeleteItem` of one key.
    pub(crate) async fn delete_endpoint(&self, key: &EndpointKey) -> Result<()> {
        if self.logged() {
            return self
                .commit_logged(vec![Op::Deregister(key.clone())], None)
                .await;
        }
        self.client
            .delete_item()
            .table_name(&self.cfg.table)
            .set_key(Some(layout::key_item(key)))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.ctx_key("DeleteItem", key)))?;
        Ok(())
    }

    /// Ops already checked against the batch rule, merged to their net
    /// effect per key ([`Op::net`]: DynamoDB refuses two actions on one
    /// item), as one transaction with `token` (a fresh one when `None`).
    pub(crate) async fn apply_ops(&self, ops: Vec<Op>, token: Option<&str>) -> Result<()> {
        let ops = Op::net(ops);
        if ops.is_empty() {
            return Ok(());
        }
        if self.logged() {
            return self.commit_logged(ops, token).await;
        }
        match token {
            Some(token) => self.transact(ops, token).await,
            None => self.transact(ops, &new_token()).await,
        }
    }

    /// Ops (net, one per key, already checked) and `guard` in one
    /// transaction, through the change log when the table keeps one:
    /// `false` when a condition failed (nothing was written).
    pub(crate) async fn commit_guarded(&self, ops: Vec<Op>, guard: Guard) -> Result<bool> {
        if self.logged() {
            return self.commit_logged_guarded(ops, None, guard).await;
        }
        let mut keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        keys.extend(guard.keys);
        let mut items = self.op_items_if(&ops, guard.existing)?;
        items.extend(guard.items);
        let n = items.len();
        match self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(new_token())
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if failed_within(&e, 0..n) => Ok(false),
            Err(e) => Err(map_transact(e, self.ctx("TransactWriteItems"), &keys)),
        }
    }

    /// One `TransactWriteItems` of `ops` (one action per key) with `token`.
    async fn transact(&self, ops: Vec<Op>, token: &str) -> Result<()> {
        let keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        let items = self.op_items(&ops)?;
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

/// The id of the item [`Table::probe`] tries to write under
/// [`waypost::backend::PROBE_SERVICE`]; no item is ever created.
pub(crate) const PROBE_ID: &str = "write-check";

/// The condition of the probe's write: never true, for any item or none.
const NEVER: &str = "attribute_exists(#s) AND attribute_not_exists(#s)";

/// The table itself: finding it, checking it, creating it.
impl Table {
    /// The table's description, `None` when it does not exist.
    pub(crate) async fn describe(&self) -> Result<Option<TableDescription>> {
        match self
            .client
            .describe_table()
            .table_name(&self.cfg.table)
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
            Err(e) => Err(map_sdk(e, self.ctx("DescribeTable"))),
        }
    }

    /// The table's description; `NotFound` when it does not exist.
    pub(crate) async fn describe_existing(&self) -> Result<TableDescription> {
        self.describe().await?.ok_or_else(|| self.missing())
    }

    /// `NotFound` naming the table and how to create it.
    pub(crate) fn missing(&self) -> Error {
        Error::not_found(format!(
            "DynamoDB table {} at {} (create it with DynamoDbRegistry::create_table_if_missing)",
            self.cfg.table, self.endpoint
        ))
    }

    /// The ARN of the table's current usable stream (`None`: it has
    /// none); `NotFound` when the table is gone.
    pub(crate) async fn locate_stream(&self) -> Result<Option<String>> {
        Ok(usable_stream(&self.describe_existing().await?))
    }

    /// The key schema must be `service` (HASH, S) and `id` (RANGE, S).
    pub(crate) fn check_schema(&self, table: &TableDescription) -> Result<()> {
        let want = [
            (layout::SERVICE, KeyType::Hash),
            (layout::ID, KeyType::Range),
        ];
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
                    self.cfg.table
                ),
            ))
        }
    }

    /// [`waypost::Registry::probe`]: the table is there and active, and writes to it
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
        let table = self.describe_existing().await?;
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
                return Err(Error::unauthorized(format!(
                    "DynamoDB table {name} at {at}: its KMS key cannot be used"
                )))
            }
            Some(status) => {
                return Err(Error::not_found(format!(
                    "DynamoDB table {name} at {at} (status {})",
                    status.as_str()
                )))
            }
        }
        let key = EndpointKey::new(waypost::backend::PROBE_SERVICE, PROBE_ID);
        let res = self
            .client
            .put_item()
            .table_name(name)
            .set_item(Some(layout::key_item(&key)))
            .condition_expression(NEVER)
            .expression_attribute_names("#s", layout::SERVICE)
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

    /// Create the table in `cfg` unless it exists: keys `service` (HASH) and
    /// `id` (RANGE), on-demand billing, with a stream of new and old images
    /// when `with_stream`, and TTL on `cfg.ttl_attribute` when that is set.
    /// Waits until the table is active. Returns whether it created it.
    pub(crate) async fn create_if_missing(cfg: &DynamoDbConfig, with_stream: bool) -> Result<bool> {
        let table = Table::new(cfg).await;
        if table.describe().await?.is_some() {
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
        let mut req = table
            .client
            .create_table()
            .table_name(&cfg.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attr(layout::SERVICE).map_err(build)?)
            .attribute_definitions(attr(layout::ID).map_err(build)?)
            .key_schema(key(layout::SERVICE, KeyType::Hash).map_err(build)?)
            .key_schema(key(layout::ID, KeyType::Range).map_err(build)?);
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
            Err(e) => return Err(map_sdk(e, table.ctx("CreateTable"))),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let status = table.describe_existing().await?.table_status;
            if status == Some(TableStatus::Active) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::unavailable(format!(
                    "table {} at {} did not become active within 120 s",
                    cfg.table, table.endpoint
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
            let res = table
                .client
                .update_time_to_live()
                .table_name(&cfg.table)
                .time_to_live_specification(spec)
                .send()
                .await;
            if let Err(e) = res {
                // Reads filter expired items anyway; only the clean-up is lost.
                let e = map_sdk(e, table.ctx("UpdateTimeToLive"));
                tracing::warn!(table = %cfg.table, error = %e, "could not enable TTL");
            }
        }
        tracing::info!(table = %cfg.table, created, with_stream, "table ready");
        Ok(created)
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

/// A `ClientRequestToken` unique to this call: 32 hex digits from the time,
/// the process, a counter and the process's random hash seed.
pub(crate) fn new_token() -> String {
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
            "waypost-dynamodb",
        ));
    }
    let sdk = loader.load().await;
    let region = sdk
        .region()
        .map(|r| r.to_string())
        .unwrap_or_else(|| "us-east-1".to_string());
    (sdk, region)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_short() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert!(a.len() <= 36);
    }
}
