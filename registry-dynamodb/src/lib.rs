#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod changelog;
mod changelog_watch;
mod config;
mod error;
mod layout;
mod nodes;
mod shards;
mod shared;
mod watch;

pub use crate::changelog::CHANGELOG_MAX_BATCH;
pub use crate::shared::MAX_TRANSACTION_ITEMS;
pub use backend::DynamoDbRegistry;
pub use config::{DynamoDbConfig, StaticCredentials, WatchMode};

/// The AWS SDK for DynamoDB this crate is built on, for
/// [`DynamoDbRegistry::client`].
pub use aws_sdk_dynamodb;
