//! The integration tests of `registry-cloudmap`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

mod common;

mod cloudmap;
mod conformance;
mod liveness;
