//! The table itself: finding it and its stream, checking its key schema,
//! the probe, and creating it.

use std::time::Duration;

use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableDescription, TableStatus, TimeToLiveSpecification,
};
use waypost::{EndpointKey, Error, Result};

use crate::client::Client;
use crate::config::DynamoDbConfig;
use crate::error::map_sdk;
use crate::layout;

/// The id of the item [`Client::probe`] tries to write under
/// [`waypost::backend::PROBE_SERVICE`]; no item is ever created.
pub(crate) const PROBE_ID: &str = "write-check";

/// The condition of the probe's write: never true, for any item or none.
const NEVER: &str = "attribute_exists(#s) AND attribute_not_exists(#s)";

/// The table itself: finding it, checking it, creating it.
impl Client {
    /// The table's description, `None` when it does not exist.
    pub(crate) async fn describe(&self) -> Result<Option<TableDescription>> {
        match self
            .ddb
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
            .ddb
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
        let table = Client::new(cfg).await;
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
            .ddb
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
                .ddb
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
