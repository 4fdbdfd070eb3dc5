#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod error;
pub mod mapping;

pub use aws_sdk_servicediscovery;
pub use backend::{CloudMapRegistry, CloudMapStats, MAX_BATCH};
pub use config::{CloudMapConfig, NamespaceKind, ReadMode, WriteMode};
