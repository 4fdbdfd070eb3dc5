#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod admin;
mod client;
mod config;
mod endpoints;
mod error;
pub mod layout;
mod nodes;
mod records;
mod registry;
mod services;
mod url;
mod watch;

pub use crate::client::CloudMapStats;
pub use crate::endpoints::MAX_BATCH;
pub use aws_sdk_servicediscovery;
pub use config::{CloudMapConfig, NamespaceKind, ReadMode, WriteMode};
pub use registry::CloudMapRegistry;
