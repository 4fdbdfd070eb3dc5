//! The integration tests of `waypost-etcd`, one module per area, in one
//! binary.

mod common;

mod conformance;
mod etcd;
