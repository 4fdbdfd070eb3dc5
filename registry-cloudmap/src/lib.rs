#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod core;
mod error;
mod instances;
pub mod layout;
mod nodes;
mod records;
mod services;
mod watch;

pub use crate::core::{CloudMapStats, MAX_BATCH};
pub use aws_sdk_servicediscovery;
pub use backend::CloudMapRegistry;
pub use config::{CloudMapConfig, NamespaceKind, ReadMode, WriteMode};
