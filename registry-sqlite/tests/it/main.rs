//! The integration tests of `waypost-sqlite`, one module per area, in one
//! binary.

mod support;

mod behaviour;
mod conformance;
mod faults;
mod liveness;
mod ownership;
mod processes;
