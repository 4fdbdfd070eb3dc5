//! The integration tests of `waypost-cloudmap`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

mod common;

mod cloudmap;
mod conformance;
mod liveness;
