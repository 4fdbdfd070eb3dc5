//! The integration tests of `waypost-registrar`, one module per area, in
//! one binary: the tests that run the `registrar` binary. Its flags and
//! their refusals; the CLI (`ls`, `watch`, `register`, `heartbeat`,
//! `deregister`) against a started `registrar serve`; processes killed,
//! paused and restarted (crash, faults, the chaos soak) or with their wall
//! clock moved (libfaketime); `serve` on each backend; real clients talking
//! to a started `registrar serve` (its metrics and HTTP API, xDS from
//! Python's grpcio and Rust's tonic-xds); and the deployment files and the
//! docs checked against the flags the binary accepts. The server library's
//! tests in process are `waypost-registrar-server`'s
//! (`registrar-server/tests/it/`).

#![allow(clippy::unwrap_used)]

mod common;

mod backends;
mod cli;
#[cfg(feature = "http-api")]
mod clocks;
mod crash;
mod deploy;
mod deploy_aws;
mod docs;
#[cfg(all(feature = "sqlite", feature = "etcd"))]
mod faults;
#[cfg(feature = "http-api")]
mod http_api;
mod metrics;
mod operators;
mod registry_url;
#[cfg(all(feature = "sqlite", feature = "http-api"))]
mod soak;
mod tls;
mod ui;
#[cfg(feature = "xds")]
mod xds;
#[cfg(all(feature = "xds", feature = "sqlite"))]
mod xds_resume;
#[cfg(feature = "xds")]
mod xds_tonic;
#[cfg(feature = "xds")]
mod xds_traffic;
