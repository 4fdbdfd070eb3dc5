//! The table itself: looking it up, checking its key schema, finding its
//! stream, creating it.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableDescription, TableStatus, TimeToLiveSpecification,
};
use registry_api::{Error, Result};

use crate::config::DynamoDbConfig;
use crate::core::{clients, describe, missing, Core};
use crate::error::map_sdk;
use crate::item;

/// The key schema must be `service` (HASH, S) and `id` (RANGE, S).
pub(crate) fn check_schema(core: &Core, table: &TableDescription) -> Result<()> {
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

/// Create the table in `cfg` unless it exists: keys `service` (HASH) and
/// `id` (RANGE), on-demand billing, with a stream of new and old images
/// when `with_stream`, and TTL on `cfg.ttl_attribute` when that is set.
/// Waits until the table is active. Returns whether it created it.
pub(crate) async fn create_table(cfg: &DynamoDbConfig, with_stream: bool) -> Result<bool> {
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
