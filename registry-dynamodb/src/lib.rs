#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod changelog;
mod config;
mod error;
mod layout;
mod nodes;
mod registry;
mod shards;
mod shared;
mod url;
mod watch;

pub use crate::changelog::{
    changelog_head_of, changelog_max_batch, changelog_retry_ceiling, CHANGELOG_ATTEMPTS,
    CHANGELOG_MAX_BATCH, CHANGELOG_MAX_HEADS,
};
pub use crate::shared::MAX_TRANSACTION_ITEMS;
pub use config::{DynamoDbConfig, StaticCredentials, WatchMode};
pub use registry::DynamoDbRegistry;

/// The AWS SDK for DynamoDB this crate is built on, for
/// [`DynamoDbRegistry::client`].
pub use aws_sdk_dynamodb;
