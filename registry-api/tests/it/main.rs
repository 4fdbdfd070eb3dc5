//! The integration tests of `waypost`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

mod announce;
mod cached;
mod coalescing;
mod discover_balance;
mod liveness;
mod memory_conformance;
mod suite_catches;
