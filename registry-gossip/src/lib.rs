#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
pub mod crdt;
mod error;
mod layout;
pub mod machine;
mod names;
mod shared;
mod watch;
pub mod wire;

pub use backend::GossipRegistry;
pub use config::GossipConfig;
pub use crdt::{Change, Entry, NodeId, Replica, Stamp};
pub use machine::{dissemination_count, Machine, Stats};
pub use names::{NameBinding, NameEvent, NAME_PORT, NAME_SERVICE};
