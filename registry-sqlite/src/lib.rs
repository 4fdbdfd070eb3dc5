#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod admin;
mod config;
mod database;
mod endpoints;
mod error;
mod layout;
mod liveness;
mod nodes;
mod registry;
mod tx;
mod url;
mod watch;

pub use config::{Clock, ManualClock, SqliteConfig, SystemClock, DEFAULT_PATH};
pub use liveness::SqliteSweepReport;
pub use nodes::NodeRecord;
pub use registry::SqliteRegistry;
