#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod auth;
mod backends;
mod config;
mod http;
mod metered;
mod monitor;
mod refusals;
mod registrar;
mod serve;
mod service;
mod status;

use registry_api::{Batch, Heartbeat, Watch};

pub use auth::{AuthzConfig, DEFAULT_ID_PATTERN};
pub use backends::{open_backend, BackendKind, BackendOptions};
pub use config::{Ack, RegistrarConfig};
pub use http::health_router;
pub use metered::{describe_metrics, SyncMetered};
pub use refusals::Refusal;
pub use registrar::Registrar;
pub use registry_registrar::TlsFiles;
pub use serve::{serve, serve_with, Bound, OpenPolicy, Opening, ServeOptions};
pub use service::RegistrarService;
pub use status::{Readiness, Status};

/// What the registrar needs of a backend: batches, a watch and heartbeats.
/// [`open_backend`] wraps backends without a native watch in
/// [`registry_api::Polling`] and those without native liveness in
/// [`registry_api::Liveness`].
pub trait Backend: Batch + Watch + Heartbeat {}
impl<T: Batch + Watch + Heartbeat> Backend for T {}
