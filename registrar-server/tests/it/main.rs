//! The integration tests of `waypost-registrar-server`, one module per area, in
//! one binary (each test binary links the whole server): the registrar
//! served in process on loopback (the fixtures' `TestRegistrar`, or an
//! `Opening` with its HTTP API, DNS and xDS listeners) and driven by real
//! clients: the agent client's conformance run, gRPC streams and resume,
//! mTLS and authorization, the HTTP/JSON and Consul APIs (with py-consul),
//! DNS (with dig and HAProxy), xDS over mTLS, and the dashboard (also in
//! headless Chromium). The tests that run the `registrar` binary are
//! `waypost-registrar`'s (`registrar/tests/it/`).

#![allow(clippy::unwrap_used)]

mod common;

#[cfg(feature = "http-api")]
mod consul_agent;
#[cfg(feature = "http-api")]
mod consul_maintenance;
#[cfg(feature = "http-api")]
mod consul_reads;
#[cfg(feature = "dns")]
mod dns;
#[cfg(feature = "etcd")]
mod etcd_fanout;
#[cfg(feature = "dns")]
mod haproxy;
mod hardening;
#[cfg(feature = "http-api")]
mod http_api;
#[cfg(feature = "http-api")]
mod http_native;
mod registrar;
mod resume;
mod streams;
mod stuck;
mod tls;
mod trust;
mod ui;
mod ui_browser;
#[cfg(feature = "xds")]
mod xds;
