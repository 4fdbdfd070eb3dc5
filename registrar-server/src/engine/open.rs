//! Opening the backend the registrar runs on: [`BackendKind`] (chosen with
//! cargo features and `--registry-backend`) and [`open_backend`], which
//! wraps it in the combinators its capabilities call for.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::names;
use registry_api::liveness::LivenessConfig;
use registry_api::memory::MemoryRegistry;
use registry_api::polling::PollingConfig;
use registry_api::stack::{stack, StackConfig};
use registry_api::Result;

/// What the registrar needs of a backend: batches, a watch and heartbeats
/// ([`registry_api::stack::Stack`]). [`open_backend`] wraps each backend
/// as its capabilities call for ([`registry_api::stack::stack`]).
pub use registry_api::stack::Stack as Backend;

/// The backends this build of the registrar can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// the usual AWS chain or `--aws-region`, `--aws-endpoint-url`); its
    /// stream is followed when the table has one, otherwise it is polled
    /// every `--sync-interval`.
    #[cfg(feature = "dynamodb")]
    Dynamodb,
    /// AWS Cloud Map (`--cloudmap-namespace`), polled every
    /// `--sync-interval`.
    #[cfg(feature = "cloudmap")]
    Cloudmap,
}

impl BackendKind {
    /// Every kind this build includes, in the order `--help` lists them.
    pub const ALL: &'static [BackendKind] = &[
        BackendKind::Memory,
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite,
        #[cfg(feature = "etcd")]
        BackendKind::Etcd,
        #[cfg(feature = "dynamodb")]
        BackendKind::Dynamodb,
        #[cfg(feature = "cloudmap")]
        BackendKind::Cloudmap,
    ];

    /// Its `--registry-backend` value.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            #[cfg(feature = "sqlite")]
            BackendKind::Sqlite => "sqlite",
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => "etcd",
            #[cfg(feature = "dynamodb")]
            BackendKind::Dynamodb => "dynamodb",
            #[cfg(feature = "cloudmap")]
            BackendKind::Cloudmap => "cloudmap",
        }
    }

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

/// How the registrar follows a DynamoDB table (`--dynamodb-sync`); see
/// "Change log" in registry-dynamodb's docs for the costs of each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DynamoDbSync {
    /// The table's stream when it has one (at most two readers per shard:
    /// one cluster's pair of replicas), else a Scan every
    /// `--sync-interval`.
    #[default]
    Auto,
    /// The change log: every write also appends its changes to a log in
    /// the table, and each replica reads what follows its position with
    /// one Query every `--sync-interval`; a Scan only on start or after a
    /// gap. For many replicas on one table. Every registrar writing the
    /// table must use it.
    Changelog,
    /// A Scan of the whole table every `--sync-interval`.
    Scan,
}

impl DynamoDbSync {
    /// Every mode, in the order `--help` lists them.
    pub const ALL: &'static [DynamoDbSync] = &[
        DynamoDbSync::Auto,
        DynamoDbSync::Changelog,
        DynamoDbSync::Scan,
    ];

    /// Its `--dynamodb-sync` value.
    pub fn as_str(self) -> &'static str {
        match self {
            DynamoDbSync::Auto => "auto",
            DynamoDbSync::Changelog => "changelog",
            DynamoDbSync::Scan => "scan",
        }
    }
}

/// `s` as one of `all` (by its `as_str` name), or an error naming `what`
/// and the names it could be.
fn parse_named<T: Copy>(s: &str, all: &[T], name: fn(T) -> &'static str, what: &str) -> Result<T> {
    all.iter().copied().find(|k| name(*k) == s).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|k| name(*k)).collect();
        registry_api::Error::invalid(
            what,
            format!(
                "{:?} ({} bytes) is not one of this build's: {}",
                s.chars().take(64).collect::<String>(),
                s.len(),
                names.join(", ")
            ),
        )
    })
}

impl std::str::FromStr for BackendKind {
    type Err = registry_api::Error;
    /// A `--registry-backend` value of this build.
    fn from_str(s: &str) -> Result<Self> {
        parse_named(s, Self::ALL, Self::as_str, "registry backend")
    }
}

impl std::str::FromStr for DynamoDbSync {
    type Err = registry_api::Error;
    /// A `--dynamodb-sync` value.
    fn from_str(s: &str) -> Result<Self> {
        parse_named(s, Self::ALL, Self::as_str, "DynamoDB sync mode")
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
    /// Key prefix in etcd. Default `/registry`.
    pub etcd_prefix: String,
    /// The DynamoDB table. Default `registry`.
    pub dynamodb_table: String,
    /// Create the DynamoDB table (on-demand, with a stream) if missing.
    pub dynamodb_create_table: bool,
    /// How the DynamoDB table is followed. Default [`DynamoDbSync::Auto`].
    pub dynamodb_sync: DynamoDbSync,
    /// Heads of the DynamoDB change log ([`DynamoDbSync::Changelog`]);
    /// every registrar on the table must use the same. Default 1.
    pub dynamodb_changelog_heads: u32,
    /// The Cloud Map namespace. Default `registry`.
    pub cloudmap_namespace: String,
    /// AWS region (default: the AWS chain's).
    pub aws_region: Option<String>,
    /// AWS endpoint URL (an emulator, a VPC endpoint).
    pub aws_endpoint_url: Option<String>,
    /// Liveness settings: kept in the backend on DynamoDB, Cloud Map and
    /// SQLite (every replica judges a node by the same record), in the
    /// process on memory; on etcd, `suspect_after` is the TTL of each
    /// node's lease (its endpoints are deleted when it lapses). Default
    /// [`LivenessConfig::default`] (30 s, 5 min, a sweep every 10 s).
    pub liveness: LivenessConfig,
}

impl BackendOptions {
    /// Defaults for `kind`.
    pub fn new(kind: BackendKind) -> Self {
        Self {
            kind,
            sync_interval: Duration::from_secs(5),
            sqlite_path: PathBuf::from("registry.db"),
            etcd_endpoints: vec!["http://127.0.0.1:2379".to_string()],
            etcd_prefix: "/registry".to_string(),
            dynamodb_table: "registry".to_string(),
            dynamodb_create_table: false,
            dynamodb_sync: DynamoDbSync::Auto,
            dynamodb_changelog_heads: 1,
            cloudmap_namespace: "registry".to_string(),
            aws_region: None,
            aws_endpoint_url: None,
            liveness: LivenessConfig::default(),
        }
    }
}

/// Open the backend `opts` describes and wrap it in what its capabilities
/// call for ([`registry_api::stack::stack`]: polling when it has no native
/// watch, the generic liveness sweeper when it has no liveness). Errors
/// keep the backend's kind: transient ones (unreachable) are worth a
/// retry, permanent ones (a read-only or corrupt file, a missing table
/// without `dynamodb_create_table`, bad credentials) are not.
pub async fn open_backend(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    let polling = PollingConfig::default()
        .with_interval(opts.sync_interval)
        .with_metrics_prefix(names::PREFIX);
    let cfg = StackConfig::default()
        .with_polling(polling)
        .with_liveness(opts.liveness.clone());
    match opts.kind {
        BackendKind::Memory => stack(MemoryRegistry::new(), &cfg),
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => {
            let live = &opts.liveness;
            let file = registry_sqlite::SqliteConfig::new(&opts.sqlite_path)
                .with_suspect_after(live.suspect_after)
                .with_remove_after(live.remove_after)
                .with_sweep_interval(Some(live.sweep_interval));
            stack(registry_sqlite::SqliteRegistry::open(file).await?, &cfg)
        }
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => {
            let etcd = registry_etcd::EtcdConfig::new(opts.etcd_endpoints.clone())
                .with_prefix(opts.etcd_prefix.clone())
                .with_lease_ttl(opts.liveness.suspect_after);
            stack(registry_etcd::EtcdRegistry::connect(etcd).await?, &cfg)
        }
        #[cfg(feature = "dynamodb")]
        BackendKind::Dynamodb => {
            let watch = match opts.dynamodb_sync {
                DynamoDbSync::Auto => registry_dynamodb::WatchMode::Auto,
                DynamoDbSync::Changelog => registry_dynamodb::WatchMode::ChangeLog,
                DynamoDbSync::Scan => registry_dynamodb::WatchMode::Polling,
            };
            let mut table = registry_dynamodb::DynamoDbConfig::new(opts.dynamodb_table.clone())
                .with_poll_interval(opts.sync_interval)
                .with_watch(watch)
                .with_changelog_heads(opts.dynamodb_changelog_heads)
                .with_liveness(opts.liveness.clone());
            if let Some(region) = &opts.aws_region {
                table = table.with_region(region.clone());
            }
            if let Some(url) = &opts.aws_endpoint_url {
                table = table.with_endpoint_url(url.clone());
            }
            if opts.dynamodb_create_table {
                // A stream only where it is read.
                let with_stream = opts.dynamodb_sync == DynamoDbSync::Auto;
                registry_dynamodb::DynamoDbRegistry::create_table_if_missing(&table, with_stream)
                    .await?;
            }
            let name = table.table.clone();
            let opened = registry_dynamodb::DynamoDbRegistry::connect(table)
                .await
                .map_err(|e| match e.kind() {
                    // The library's hint names its Rust call; the
                    // registrar's user needs the flag.
                    registry_api::ErrorKind::NotFound => registry_api::Error::not_found(format!(
                        "DynamoDB table {name} does not exist; start the registrar with \
                         --dynamodb-create-table to create it"
                    ))
                    .with_source(e),
                    _ => e,
                })?;
            stack(opened, &cfg)
        }
        #[cfg(feature = "cloudmap")]
        BackendKind::Cloudmap => {
            let mut ns = registry_cloudmap::CloudMapConfig::new(opts.cloudmap_namespace.clone())
                .with_liveness(opts.liveness.clone());
            if let Some(region) = &opts.aws_region {
                ns = ns.with_region(region.clone());
            }
            if let Some(url) = &opts.aws_endpoint_url {
                ns = ns.with_endpoint_url(url.clone());
            }
            stack(
                registry_cloudmap::CloudMapRegistry::connect(ns).await?,
                &cfg,
            )
        }
    }
}
