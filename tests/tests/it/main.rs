//! The integration tests of `waypost-fixtures`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

#[cfg(feature = "announcer")]
mod announce;
mod containers;
mod faults;
mod fixtures;
mod open_url;
mod registries;
