//! The integration tests of `registry-etcd`, one module per area, in one
//! binary.

mod common;

mod conformance;
mod etcd;
