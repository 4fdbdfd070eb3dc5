//! `registrar`: the registrar server and its operator commands.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use registrar_server::{serve, Backend, Registrar, RegistrarConfig};
use registry_api::{Liveness, MemoryRegistry, Polling, PollingConfig};

#[derive(Parser)]
#[command(
    name = "registrar",
    version,
    about = "The in-cluster registrar: one backend connection shared by every agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the registrar.
    Serve(ServeArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BackendKind {
    /// In memory: lost on exit (tests, development).
    Memory,
    /// One SQLite file (`--sqlite-path`).
    #[cfg(feature = "sqlite")]
    Sqlite,
    /// etcd (`--etcd-endpoints`, `--etcd-prefix`).
    #[cfg(feature = "etcd")]
    Etcd,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The backend holding the registry.
    #[arg(long, value_enum, default_value = "memory")]
    registry_backend: BackendKind,
    /// This registrar's cluster.
    #[arg(long, default_value = "default")]
    cluster_name: String,
    /// How often backends without a native watch are polled.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    /// How often the write queue is flushed.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    write_batch_interval: Duration,
    /// gRPC address.
    #[arg(long, default_value = "0.0.0.0:9443")]
    grpc_addr: SocketAddr,
    /// Health and metrics address.
    #[arg(long, default_value = "0.0.0.0:8081")]
    health_addr: SocketAddr,
    /// The SQLite file (`--registry-backend=sqlite`).
    #[arg(long, default_value = "registry.db")]
    sqlite_path: std::path::PathBuf,
    /// etcd endpoints, comma-separated (`--registry-backend=etcd`).
    #[arg(long, default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/aether")]
    etcd_prefix: String,
}

/// Wrap a backend for the registrar: polling when it has no native watch,
/// the generic sweeper when it has no native liveness.
fn assemble<B>(backend: B, sync_interval: Duration) -> Arc<dyn Backend>
where
    B: registry_api::Batch + registry_api::Watch + registry_api::Heartbeat,
{
    let caps = registry_api::Registry::capabilities(&backend);
    let polling = PollingConfig::default().with_interval(sync_interval);
    match (caps.native_watch, caps.native_liveness) {
        (true, true) => Arc::new(backend),
        (true, false) => Arc::new(Liveness::new(backend)),
        (false, true) => Arc::new(Polling::with_config(backend, polling)),
        (false, false) => Arc::new(Polling::with_config(Liveness::new(backend), polling)),
    }
}

async fn open_backend(args: &ServeArgs) -> registry_api::Result<Arc<dyn Backend>> {
    Ok(match args.registry_backend {
        BackendKind::Memory => assemble(MemoryRegistry::new(), args.sync_interval),
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => assemble(
            registry_sqlite::SqliteRegistry::open_path(&args.sqlite_path).await?,
            args.sync_interval,
        ),
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => {
            let cfg = registry_etcd::EtcdConfig::new(args.etcd_endpoints.clone())
                .with_prefix(args.etcd_prefix.clone());
            assemble(
                registry_etcd::EtcdRegistry::connect(cfg).await?,
                args.sync_interval,
            )
        }
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = futures::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown signal received");
}

async fn run_serve(args: ServeArgs) -> Result<(), String> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let backend = open_backend(&args)
        .await
        .map_err(|e| format!("cannot open the {:?} backend: {e}", args.registry_backend))?;
    let grpc = tokio::net::TcpListener::bind(args.grpc_addr)
        .await
        .map_err(|e| format!("cannot listen on {} (gRPC): {e}", args.grpc_addr))?;
    let health = tokio::net::TcpListener::bind(args.health_addr)
        .await
        .map_err(|e| format!("cannot listen on {} (health): {e}", args.health_addr))?;
    let grpc_addr = grpc.local_addr().map_err(|e| e.to_string())?;
    let health_addr = health.local_addr().map_err(|e| e.to_string())?;
    let cfg = RegistrarConfig::new(args.cluster_name.clone())
        .with_write_batch_interval(args.write_batch_interval);
    let registrar = Registrar::new(backend, cfg);
    tracing::warn!("no certificates configured: serving plaintext gRPC");
    tracing::info!(
        backend = %registrar.backend(),
        cluster = %args.cluster_name,
        epoch = registrar.epoch(),
        "registrar up"
    );
    // One line for scripts and tests to read the bound addresses from.
    println!("registrar listening grpc={grpc_addr} health={health_addr}");
    serve(registrar, grpc, health, Some(metrics), shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("registrar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => run_serve(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("registrar: {e}");
            ExitCode::FAILURE
        }
    }
}
