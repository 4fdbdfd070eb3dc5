#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod config;
mod error;
mod instances;
pub mod layout;
mod nodes;
mod records;
mod registry;
mod services;
mod shared;
mod url;
mod watch;

pub use crate::shared::{CloudMapStats, MAX_BATCH};
pub use aws_sdk_servicediscovery;
pub use config::{CloudMapConfig, NamespaceKind, ReadMode, WriteMode};
pub use registry::CloudMapRegistry;
