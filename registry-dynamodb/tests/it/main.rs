//! The integration tests of `waypost-dynamodb`, one module per area, in one
//! binary.

#![allow(clippy::unwrap_used)]

mod common;

mod changelog;
mod conformance;
mod dynamodb;
mod liveness;
