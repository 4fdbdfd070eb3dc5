#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod error;
mod item;
mod stream;

pub use backend::{DynamoDbRegistry, MAX_TRANSACTION_ITEMS};
pub use config::{DynamoDbConfig, StaticCredentials, WatchMode};

/// The AWS SDK for DynamoDB this crate is built on, for
/// [`DynamoDbRegistry::client`].
pub use aws_sdk_dynamodb;
