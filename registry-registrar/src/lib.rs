#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod client_state;
mod config;
mod digest;
mod error;
mod layout;
mod overlay;
mod registry;
mod rpc;
pub mod tls;
mod url;
mod watch;

/// The generated protobuf and gRPC code.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
pub mod proto;

pub use crate::client_state::Refusal;
pub use config::{Ack, ClientConfig, Direct, Fallback};
pub use digest::{
    merge_partial, service_digest, total_digest, Differing, Digests, MAX_SUMMARY_BYTES,
};
pub use error::{error_from_status, status_from_error};
pub use layout::{endpoint_from_proto, endpoint_to_proto, key_from_parts, Token};
pub use overlay::{Overlay, DEFAULT_HOLD};
pub use registry::RegistrarClient;
pub use rpc::RpcClient;
pub use tls::TlsFiles;
