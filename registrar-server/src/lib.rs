#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod auth;
mod engine;
mod faces;
mod metrics;
mod serve;

pub use crate::auth::policy::Policy;
pub use crate::auth::{AuthzConfig, DEFAULT_ID_PATTERN};
pub use crate::engine::config::{
    Ack, RegistrarConfig, StreamEncoding, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_SNAPSHOT_CHUNK_BYTES,
};
pub use crate::engine::open::{backend_scheme, open_backend, stack_config, Backend};
pub use crate::engine::refusals::Refusal;
pub use crate::engine::registrar::Registrar;
pub use crate::engine::status::{Readiness, Status};
pub use crate::engine::streams::WatchStats;
pub use crate::engine::sync::SyncMetered;
#[cfg(feature = "dns")]
pub use crate::faces::dns::{
    serve_dns, DnsConfig, DnsError, DnsListeners, DEFAULT_DNS_DOMAIN, MAX_DNS_TTL,
};
pub use crate::faces::grpc::{RegistrarGrpc, RegistrarService};
#[cfg(feature = "http-api")]
pub use crate::faces::http::{
    http_api_router, ApiError, DEFAULT_WAIT, INDEX_HEADER, LAST_EVENT_ID, MAX_BODY_BYTES, MAX_WAIT,
};
#[cfg(feature = "xds")]
pub use crate::faces::xds::{
    XdsServer, XdsService, MAX_WEIGHT, REGION_LABEL, WEIGHT_LABEL, ZONE_LABEL,
};
pub use crate::metrics::{describe_metrics, install_prometheus_recorder};
pub use crate::serve::health::health_router;
pub use crate::serve::{serve, serve_with, Bound, OpenPolicy, Opening, Protocols, ServeOptions};
pub use waypost_registrar_client::TlsFiles;
