#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod config;
mod endpoints;
mod error;
mod keyspace;
mod layout;
mod leases;
mod registry;
mod url;
mod watch;

pub use config::{
    EtcdConfig, TlsConfig, DEFAULT_LEASE_TTL, DEFAULT_MAX_BATCH, DEFAULT_MAX_TXN_BYTES,
    DEFAULT_PAGE_SIZE, DEFAULT_PREFIX,
};
pub use layout::ENCODING_VERSION;
pub use registry::EtcdRegistry;

/// The etcd client this crate uses, for [`EtcdRegistry::client`].
pub use etcd_client;

/// docs/migrating-from-etcd.md, so that its code compiles as doctests.
#[doc = include_str!("../../docs/migrating-from-etcd.md")]
#[cfg(doctest)]
pub struct MigratingFromEtcdDoc;
