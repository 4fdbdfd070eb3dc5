//! The integration tests of `waypost-registrar-server`, one module per area, in
//! one binary (each test binary links the whole server).

#![allow(clippy::unwrap_used)]

mod common;

mod backends;
mod cli;
#[cfg(feature = "http-api")]
mod clocks;
#[cfg(feature = "http-api")]
mod consul_agent;
#[cfg(feature = "http-api")]
mod consul_reads;
mod crash;
mod deploy;
mod deploy_aws;
#[cfg(feature = "dns")]
mod dns;
mod docs;
#[cfg(feature = "etcd")]
mod etcd_fanout;
#[cfg(all(feature = "sqlite", feature = "etcd"))]
mod faults;
#[cfg(feature = "dns")]
mod haproxy;
mod hardening;
#[cfg(feature = "http-api")]
mod http_api;
#[cfg(feature = "http-api")]
mod http_native;
mod operators;
mod registrar;
mod registry_url;
mod resume;
#[cfg(all(feature = "sqlite", feature = "http-api"))]
mod soak;
mod streams;
mod stuck;
mod tls;
mod trust;
mod ui;
mod ui_browser;
#[cfg(feature = "xds")]
mod xds;
#[cfg(all(feature = "xds", feature = "sqlite"))]
mod xds_resume;
#[cfg(feature = "xds")]
mod xds_tonic;
#[cfg(feature = "xds")]
mod xds_traffic;
