#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod error;
mod layout;
mod liveness;
mod shared;
mod tx;
mod watch;

pub use backend::SqliteRegistry;
pub use config::{Clock, ManualClock, SqliteConfig, SystemClock, DEFAULT_PATH};
pub use liveness::{NodeRecord, SqliteSweepReport};
