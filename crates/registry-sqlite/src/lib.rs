#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod error;
mod schema;

pub use backend::{NodeRecord, SqliteRegistry, SweepReport};
pub use config::{Clock, ManualClock, SqliteConfig, SystemClock, DEFAULT_PATH};
