//! [`Client`]: the connection to one DynamoDB table, shared by every part
//! of a registry: the SDK clients (DynamoDB and DynamoDB Streams), the
//! settings, where requests go, and what a request's errors name
//! ([`crate::error`] maps them). The table itself (describing, checking,
//! probing, creating it) is in [`crate::admin`].

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use waypost::{Endpoint, EndpointKey};

use crate::config::{DynamoDbConfig, WatchMode};
use crate::error::Ctx;
use crate::layout::{self, Item};

/// The SDK clients and settings of one registry's table.
pub(crate) struct Client {
    pub(crate) cfg: DynamoDbConfig,
    /// DynamoDB.
    pub(crate) ddb: aws_sdk_dynamodb::Client,
    /// DynamoDB Streams.
    pub(crate) streams: aws_sdk_dynamodbstreams::Client,
    /// Where requests go, for messages.
    pub(crate) endpoint: String,
}

impl Client {
    /// The clients for `cfg` (nothing is sent yet).
    pub(crate) async fn new(cfg: &DynamoDbConfig) -> Client {
        let (sdk, region) = sdk_config(cfg).await;
        let ddb = aws_sdk_dynamodb::config::Builder::from(&sdk)
            .region(Region::new(region.clone()))
            .build();
        let streams = aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
            .region(aws_sdk_dynamodbstreams::config::Region::new(region.clone()))
            .build();
        Client {
            endpoint: cfg.endpoint_name(&region),
            cfg: cfg.clone(),
            ddb: aws_sdk_dynamodb::Client::from_conf(ddb),
            streams: aws_sdk_dynamodbstreams::Client::from_conf(streams),
        }
    }

    /// The table's name.
    pub(crate) fn table(&self) -> &str {
        &self.cfg.table
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

    /// [`Client::ctx`] for a request about one item.
    pub(crate) fn ctx_key<'a>(&'a self, op: &'static str, key: &'a EndpointKey) -> Ctx<'a> {
        Ctx {
            key: Some(key),
            ..self.ctx(op)
        }
    }

    /// The TTL attribute and how long written items live, when both are
    /// set.
    pub(crate) fn ttl_write(&self) -> Option<(&str, Duration)> {
        match (&self.cfg.ttl_attribute, self.cfg.item_ttl) {
            (Some(attr), Some(ttl)) => Some((attr.as_str(), ttl)),
            _ => None,
        }
    }

    /// Whether writes go through the change log.
    pub(crate) fn logged(&self) -> bool {
        self.cfg.watch == WatchMode::ChangeLog
    }

    /// The number of heads this registry's change log has (its setting).
    pub(crate) fn log_heads(&self) -> u32 {
        self.cfg.changelog_heads.max(1)
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

/// The SDK configuration of `cfg` (timeouts, retries, region, endpoint,
/// credentials) and its region.
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
