//! Opening the backend the registrar runs on: [`BackendKind`] (chosen with
//! cargo features and `--registry-backend`) and [`open_backend`], which
//! wraps it in the combinators its capabilities call for.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use registry_api::{
    Batch, Heartbeat, Liveness, MemoryRegistry, Polling, PollingConfig, Result, Watch,
};

use crate::Backend;

/// The backends this build of the registrar can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum BackendKind {
    /// In memory: lost on exit (tests, development).
    Memory,
    /// One SQLite file (`--sqlite-path`).
    #[cfg(feature = "sqlite")]
    Sqlite,
    /// etcd (`--etcd-endpoints`, `--etcd-prefix`).
    #[cfg(feature = "etcd")]
    Etcd,
    /// DynamoDB (`--dynamodb-table`; region, endpoint and credentials from
    /// the usual AWS chain or `--aws-region`, `--aws-endpoint-url`).
    #[cfg(feature = "dynamodb")]
    Dynamodb,
    /// AWS Cloud Map (`--cloudmap-namespace`), polled every
    /// `--sync-interval`.
    #[cfg(feature = "cloudmap")]
    Cloudmap,
}

impl BackendKind {
    /// The product's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "in-memory",
            #[cfg(feature = "sqlite")]
            BackendKind::Sqlite => "SQLite",
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => "etcd",
            #[cfg(feature = "dynamodb")]
            BackendKind::Dynamodb => "DynamoDB",
            #[cfg(feature = "cloudmap")]
            BackendKind::Cloudmap => "AWS Cloud Map",
        }
    }
}

/// Where each backend is; only the fields of the chosen kind are read.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Which backend.
    pub kind: BackendKind,
    /// How often backends without a native watch are polled. Default 5 s.
    pub sync_interval: Duration,
    /// The SQLite file. Default `registry.db`.
    pub sqlite_path: PathBuf,
    /// etcd endpoints. Default `http://127.0.0.1:2379`.
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in etcd. Default `/aether`.
    pub etcd_prefix: String,
    /// The DynamoDB table. Default `aether-registry`.
    pub dynamodb_table: String,
    /// Create the DynamoDB table (on-demand, with a stream) if missing.
    pub dynamodb_create_table: bool,
    /// The Cloud Map namespace. Default `aether`.
    pub cloudmap_namespace: String,
    /// AWS region (default: the AWS chain's).
    pub aws_region: Option<String>,
    /// AWS endpoint URL (an emulator, a VPC endpoint).
    pub aws_endpoint_url: Option<String>,
}

impl BackendOptions {
    /// Defaults for `kind`.
    pub fn new(kind: BackendKind) -> Self {
        Self {
            kind,
            sync_interval: Duration::from_secs(5),
            sqlite_path: PathBuf::from("registry.db"),
            etcd_endpoints: vec!["http://127.0.0.1:2379".to_string()],
            etcd_prefix: "/aether".to_string(),
            dynamodb_table: "aether-registry".to_string(),
            dynamodb_create_table: false,
            cloudmap_namespace: "aether".to_string(),
            aws_region: None,
            aws_endpoint_url: None,
        }
    }
}

/// Wrap a backend for the registrar: [`Polling`] when it has no native
/// watch, the generic [`Liveness`] sweeper when it has no native liveness.
pub fn assemble<B>(backend: B, sync_interval: Duration) -> Result<Arc<dyn Backend>>
where
    B: Batch + Watch + Heartbeat,
{
    let caps = backend.capabilities();
    let polling = PollingConfig::default().with_interval(sync_interval);
    Ok(match (caps.native_watch, caps.native_liveness) {
        (true, true) => Arc::new(backend),
        (true, false) => Arc::new(Liveness::new(backend)),
        (false, true) => Arc::new(Polling::with_config(backend, polling)?),
        (false, false) => Arc::new(Polling::with_config(Liveness::new(backend), polling)?),
    })
}

/// Open the backend `opts` describes and wrap it ([`assemble`]). Errors
/// keep the backend's kind: transient ones (unreachable) are worth a
/// retry, permanent ones (a read-only or corrupt file, a missing table
/// without `dynamodb_create_table`, bad credentials) are not.
pub async fn open_backend(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    let every = opts.sync_interval;
    match opts.kind {
        BackendKind::Memory => assemble(MemoryRegistry::new(), every),
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => assemble(
            registry_sqlite::SqliteRegistry::open_path(&opts.sqlite_path).await?,
            every,
        ),
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => {
            let cfg = registry_etcd::EtcdConfig::new(opts.etcd_endpoints.clone())
                .with_prefix(opts.etcd_prefix.clone());
            assemble(registry_etcd::EtcdRegistry::connect(cfg).await?, every)
        }
        #[cfg(feature = "dynamodb")]
        BackendKind::Dynamodb => {
            let mut cfg = registry_dynamodb::DynamoDbConfig::new(opts.dynamodb_table.clone())
                .with_poll_interval(every);
            if let Some(region) = &opts.aws_region {
                cfg = cfg.with_region(region.clone());
            }
            if let Some(url) = &opts.aws_endpoint_url {
                cfg = cfg.with_endpoint_url(url.clone());
            }
            if opts.dynamodb_create_table {
                registry_dynamodb::DynamoDbRegistry::create_table_if_missing(&cfg, true).await?;
            }
            // Its watch is native (Streams) or its own polling; no native
            // liveness.
            Ok(Arc::new(Liveness::new(
                registry_dynamodb::DynamoDbRegistry::connect(cfg).await?,
            )))
        }
        #[cfg(feature = "cloudmap")]
        BackendKind::Cloudmap => {
            let mut cfg = registry_cloudmap::CloudMapConfig::new(opts.cloudmap_namespace.clone());
            if let Some(region) = &opts.aws_region {
                cfg = cfg.with_region(region.clone());
            }
            if let Some(url) = &opts.aws_endpoint_url {
                cfg = cfg.with_endpoint_url(url.clone());
            }
            // Neither a watch nor liveness of its own.
            let raw = registry_cloudmap::CloudMapRegistry::connect(cfg).await?;
            Ok(Arc::new(Polling::with_config(
                Liveness::new(raw),
                PollingConfig::default().with_interval(every),
            )?))
        }
    }
}
