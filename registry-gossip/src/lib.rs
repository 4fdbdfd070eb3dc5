#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod buf;
mod config;
mod crdt;
mod driver;
mod error;
mod layout;
mod machine;
mod names;
mod registry;
#[cfg(feature = "sim")]
pub mod sim;
mod url;
mod watch;
// The wire format is public only to what simulates nodes and crafts their
// datagrams (the `sim` feature).
#[cfg(feature = "sim")]
pub mod wire;
#[cfg(not(feature = "sim"))]
mod wire;

pub use config::GossipConfig;
pub use crdt::{Change, Entry, NodeId, Replica, Stamp};
pub use machine::{describe_metrics, dissemination_count, Machine, Stats};
pub use names::{NameBinding, NameEvent, NAME_PORT, NAME_SERVICE};
pub use registry::GossipRegistry;
pub use wire::GossipId;
