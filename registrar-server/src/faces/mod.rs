//! The registrar's faces: each serves the engine's state in one protocol
//! and writes through it. A face imports the engine and `auth`, never
//! another face; `serve` is the one module that knows them all.

#[cfg(feature = "dns")]
pub(crate) mod dns;
pub(crate) mod grpc;
#[cfg(feature = "http-api")]
pub(crate) mod http;
pub(crate) mod ui;
#[cfg(feature = "xds")]
pub(crate) mod xds;
