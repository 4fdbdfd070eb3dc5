#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod config;
mod error;
mod layout;
mod liveness;
mod registry;
mod shared;
mod tx;
mod url;
mod watch;

pub use config::{Clock, ManualClock, SqliteConfig, SystemClock, DEFAULT_PATH};
pub use liveness::{NodeRecord, SqliteSweepReport};
pub use registry::SqliteRegistry;
