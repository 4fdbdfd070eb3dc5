//! The integration tests of `waypost-gossip`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

mod conformance;
mod crdt_laws;
mod formation;
mod replay;
mod seed;
mod simulation;
mod skew;
mod udp;
mod udp_replay;
