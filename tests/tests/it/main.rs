//! The integration tests of `registry-fixtures`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

#[cfg(feature = "announcer")]
mod announce;
mod containers;
mod faults;
mod fixtures;
mod open_url;
mod registries;
