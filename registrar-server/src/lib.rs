#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[cfg(feature = "http-api")]
pub mod api_http;
mod auth;
mod backends;
mod config;
#[cfg(feature = "dns")]
pub mod dns;
mod http;
mod metered;
mod monitor;
mod policy;
mod refusals;
mod registrar;
mod serve;
mod service;
mod status;
mod stream;
mod ui;
#[cfg(feature = "xds")]
pub mod xds;

#[cfg(feature = "http-api")]
pub use api_http::http_api_router;
pub use auth::{AuthzConfig, DEFAULT_ID_PATTERN};
pub use backends::{open_backend, BackendKind, BackendOptions, DynamoDbSync};
pub use config::{Ack, RegistrarConfig, StreamEncoding};
#[cfg(feature = "dns")]
pub use dns::{serve_dns, DnsConfig, DnsListeners};
pub use http::health_router;
pub use metered::{describe_metrics, SyncMetered};
pub use policy::Policy;
pub use refusals::Refusal;
pub use registrar::Registrar;
pub use registry_registrar::TlsFiles;
pub use serve::{serve, serve_with, Bound, OpenPolicy, Opening, Protocols, ServeOptions};
pub use service::{RegistrarGrpc, RegistrarService, DEFAULT_MAX_REQUEST_BYTES};
pub use status::{Readiness, Status};
pub use stream::WatchStats;
#[cfg(feature = "xds")]
pub use xds::XdsService;

/// What the registrar needs of a backend: batches, a watch and heartbeats
/// ([`registry_api::stack::Stack`]). [`open_backend`] wraps each backend
/// as its capabilities call for ([`registry_api::stack::stack`]).
pub use registry_api::stack::Stack as Backend;
