#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod client;
mod config;
mod convert;
mod overlay;
mod raw;
pub mod tls;
mod writes;

/// The generated protobuf and gRPC code.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
pub mod proto {
    /// `aether.registry`
    pub mod registry {
        /// `aether.registry.v1`: the endpoint model.
        pub mod v1 {
            tonic::include_proto!("aether.registry.v1");
        }
    }
    /// `aether.registrar`
    pub mod registrar {
        /// `aether.registrar.v1`: the `Registrar` service.
        pub mod v1 {
            tonic::include_proto!("aether.registrar.v1");
        }
    }
}

pub use client::{Refusal, RegistrarClient};
pub use config::{Ack, ClientConfig, Direct, Fallback};
pub use convert::{
    endpoint_from_proto, endpoint_to_proto, error_from_status, key_from_parts, status_from_error,
    Token,
};
pub use overlay::{Overlay, DEFAULT_HOLD};
pub use raw::Raw;
pub use tls::TlsFiles;
