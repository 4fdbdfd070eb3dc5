#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod error;
mod memory;
mod model;
mod snapshot;
mod traits;
mod validate;

#[cfg(feature = "testing")]
pub mod testing;

pub use error::{Cause, Error, ErrorKind, Result};
pub use memory::{MemoryRegistry, DEFAULT_HISTORY};
pub use model::{
    Capabilities, Endpoint, EndpointKey, Event, Health, Op, Protocol, Version, DEFAULT_CLUSTER,
};
pub use snapshot::Snapshot;
pub use traits::{validate_ops, Batch, EventStream, Heartbeat, Registry, Watch};
pub use validate::{check_name, encoded_len, limits, validate_endpoint};
