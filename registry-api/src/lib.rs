#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod cached;
mod coalescing;
mod error;
mod history;
mod hub;
mod liveness;
mod memory;
mod model;
mod polling;
mod settings;
mod snapshot;
mod traits;
mod validate;

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(feature = "tower")]
mod discover;
#[cfg(feature = "mock")]
pub mod mock;

pub use cached::{CachedConfig, CachedRegistry};
pub use coalescing::{Coalescing, CoalescingConfig, DrainReport, WriteTicket, WriterStatus};
#[cfg(feature = "tower")]
pub use discover::{discover, Discovery};
pub use error::{Cause, Error, ErrorKind, Result};
pub use hub::{Hub, DEFAULT_SUBSCRIBER_BUFFER};
pub use liveness::{Liveness, LivenessConfig, SweepReport};
pub use memory::{MemoryRegistry, DEFAULT_HISTORY};
pub use model::{
    Capabilities, Endpoint, EndpointKey, Event, Health, Op, Protocol, Version, DEFAULT_CLUSTER,
};
pub use polling::{diff, Polling, PollingConfig};
pub use settings::{check_count, check_duration};
pub use snapshot::Snapshot;
pub use traits::{validate_ops, Batch, EventStream, Heartbeat, Registry, Watch, PROBE_SERVICE};
pub use validate::{check_name, encoded_len, limits, validate_endpoint};
