#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod capabilities;
mod model;
mod settings;
mod snapshot;
mod traits;
mod validate;

pub mod announce;
pub mod backend;
pub mod cached;
pub mod coalescing;
pub mod error;
#[doc(hidden)]
pub mod forward;
pub mod limits;
pub mod liveness;
pub mod memory;
pub mod polling;
pub mod prelude;
pub mod stack;
pub mod traffic;

#[cfg(feature = "tower")]
pub mod balance;
#[cfg(feature = "tonic")]
pub mod channel;
#[cfg(feature = "tower")]
pub mod discover;
#[cfg(feature = "mock")]
pub mod mock;
#[cfg(feature = "testing")]
pub mod testing;

pub use capabilities::Capabilities;
pub use error::{Error, ErrorKind, Result};
pub use model::{Endpoint, EndpointKey, Health, Op, Protocol, Version};
pub use snapshot::{Event, Snapshot};
pub use traits::{Batch, EventStream, Heartbeat, Registry, Watch};
