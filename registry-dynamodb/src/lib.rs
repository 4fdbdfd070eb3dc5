#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod admin;
mod changelog;
mod client;
mod config;
mod endpoints;
mod error;
mod layout;
mod nodes;
mod registry;
mod shards;
mod transact;
mod url;
mod watch;

pub use crate::changelog::{
    changelog_head_of, changelog_max_batch, changelog_retry_ceiling, CHANGELOG_ATTEMPTS,
    CHANGELOG_MAX_BATCH,
};
pub use crate::transact::MAX_TRANSACTION_ITEMS;
pub use config::{DynamoDbConfig, StaticCredentials, WatchMode, CHANGELOG_MAX_HEADS};
pub use registry::DynamoDbRegistry;

/// The AWS SDK for DynamoDB this crate is built on, for
/// [`DynamoDbRegistry::client`].
pub use aws_sdk_dynamodb;
