//! [`Core`]: the clients, settings and version clock shared by the registry
//! and its watch task, and the requests they make.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{Delete, Put, TableDescription, TableStatus, TransactWriteItem};
use futures::future::try_join_all;
use registry_api::{
    backend::check_batch, Capabilities, Endpoint, EndpointKey, Error, Op, Result, Snapshot, Version,
};

use crate::config::DynamoDbConfig;
use crate::error::{map_sdk, map_transact, Ctx};
use crate::item::{self, Item};

/// Most actions DynamoDB takes in one `TransactWriteItems`.
pub const MAX_TRANSACTION_ITEMS: usize = 100;

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

    pub(crate) async fn transact(&self, ops: Vec<Op>, token: &str) -> Result<()> {
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
/// [`registry_api::backend::PROBE_SERVICE`]; no item is ever created.
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
        let key = EndpointKey::new(registry_api::backend::PROBE_SERVICE, PROBE_ID);
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

/// The clients and settings for `cfg`.
pub(crate) async fn clients(cfg: &DynamoDbConfig) -> Core {
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

impl Core {
    /// `PutItem` of one endpoint (validated first).
    pub(crate) async fn put_endpoint(&self, endpoint: Endpoint) -> Result<()> {
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

    /// `DeleteItem` of one key.
    pub(crate) async fn delete_endpoint(&self, key: &EndpointKey) -> Result<()> {
        self.client
            .delete_item()
            .table_name(&self.cfg.table)
            .set_key(Some(item::key_item(key)))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.ctx_key("DeleteItem", key)))?;
        Ok(())
    }

    /// The endpoints of `service`: a paginated `Query`, sorted by id.
    pub(crate) async fn query_service(&self, service: &str) -> Result<Vec<Endpoint>> {
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

    /// What the table offers (a stream watch is added by the registry).
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_atomic_writes(true)
            // Query and Scan read committed items: a reader may see part of a
            // transaction that is being applied.
            .with_isolated_reads(false)
            .with_max_batch(MAX_TRANSACTION_ITEMS)
            .with_resumable_watch(true)
    }

    /// At most 100 valid ops (the batch rule: more are refused, nothing
    /// written), merged per key, in one transaction.
    pub(crate) async fn apply_ops(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, MAX_TRANSACTION_ITEMS)?;
        let ops = net_ops(ops);
        if ops.is_empty() {
            return Ok(());
        }
        self.transact(ops, &new_token()).await
    }
}

/// The table's description, `None` when it does not exist.
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

/// `NotFound` naming the table and how to create it.
pub(crate) fn missing(core: &Core) -> Error {
    Error::not_found(format!(
        "DynamoDB table {} at {} (create it with DynamoDbRegistry::create_table_if_missing)",
        core.cfg.table, core.endpoint
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::testing::ep;
    use registry_api::EndpointKey;

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
