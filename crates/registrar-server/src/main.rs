//! `registrar`: the registrar server and its operator commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use registrar_server::{
    serve_with, AuthzConfig, Backend, Registrar, RegistrarConfig, ServeOptions, TlsFiles,
    DEFAULT_ID_PATTERN,
};
use registry_api::{
    Endpoint, EndpointKey, Event, Health, Liveness, MemoryRegistry, Polling, PollingConfig,
    Protocol, Registry, Watch,
};
use registry_registrar::{ClientConfig, Raw};

#[derive(Parser)]
#[command(
    name = "registrar",
    version,
    about = "The in-cluster registrar: one backend connection shared by every agent",
    long_about = "The in-cluster registrar: one backend connection shared by every agent.\n\n\
                  `serve` runs it; `ls`, `watch`, `register` and `deregister` talk to a \
                  running one at --address."
)]
struct Cli {
    /// The registrar to talk to (all commands but `serve`).
    #[arg(
        long,
        global = true,
        env = "REGISTRAR_ADDRESS",
        default_value = "http://127.0.0.1:9443"
    )]
    address: String,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(subcommand)]
    command: Command,
}

/// Certificate files (PEM), re-read when they change. Without them the
/// connection is plaintext.
#[derive(clap::Args)]
struct TlsArgs {
    /// CA bundle: for `serve` the CA of the agents' certificates, for the
    /// other commands the CA of the registrar's certificate.
    #[arg(long, global = true, env = "REGISTRAR_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This side's certificate chain (for `serve` the server's).
    #[arg(long, global = true, env = "REGISTRAR_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// This side's private key.
    #[arg(long, global = true, env = "REGISTRAR_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// For the server: all three files or none.
    fn server_files(&self) -> Result<Option<TlsFiles>, String> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles::new(ca, cert, key))),
            _ => Err("serve needs all of --tls-ca, --tls-cert and --tls-key, or none".to_string()),
        }
    }

    /// For a client: a CA bundle, and a certificate and key when given.
    fn client_files(&self) -> Result<Option<TlsFiles>, String> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles::new(ca, cert, key))),
            (Some(ca), None, None) => Ok(Some(TlsFiles::ca_only(ca))),
            _ => Err("--tls-cert and --tls-key need --tls-ca (the registrar's CA)".to_string()),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the registrar.
    Serve(Box<ServeArgs>),
    /// List the registered endpoints.
    Ls(LsArgs),
    /// Follow the changes: a snapshot, then every change as it happens.
    Watch(WatchArgs),
    /// Register (or replace) an endpoint.
    Register(RegisterArgs),
    /// Remove an endpoint.
    Deregister(DeregisterArgs),
}

#[derive(clap::Args)]
struct LsArgs {
    /// Only this service.
    #[arg(long)]
    service: Option<String>,
    /// Only this cluster.
    #[arg(long)]
    cluster: Option<String>,
    /// Only this node.
    #[arg(long)]
    node: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct WatchArgs {
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Stop after this many events (the first snapshot is one).
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this long (e.g. `30s`); exits 0.
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
}

#[derive(clap::Args)]
struct RegisterArgs {
    /// Service name.
    service: String,
    /// Endpoint id, unique within the service.
    id: String,
    /// Where it listens, `HOST:PORT` (`[v6]:PORT` for IPv6).
    target: String,
    /// Transport: tcp, udp, http, https, grpc.
    #[arg(long, default_value = "tcp")]
    protocol: Protocol,
    /// Owning cluster.
    #[arg(long, default_value = registry_api::DEFAULT_CLUSTER)]
    cluster: String,
    /// Owning node.
    #[arg(long, default_value = "")]
    node: String,
    /// A label `KEY=VALUE`; repeat for more.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Register it as not serving.
    #[arg(long)]
    unhealthy: bool,
}

#[derive(clap::Args)]
struct DeregisterArgs {
    /// Service name.
    service: String,
    /// Endpoint id.
    id: String,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

fn parse_target(s: &str) -> Result<(String, u16), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|e| format!("bad port in {s:?}: {e}"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("no host in {s:?}"));
    }
    Ok((host.to_string(), port))
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
    /// DynamoDB (`--dynamodb-table`; region, endpoint and credentials from
    /// the usual AWS chain or `--aws-region`, `--aws-endpoint-url`).
    #[cfg(feature = "dynamodb")]
    Dynamodb,
    /// AWS Cloud Map (`--cloudmap-namespace`), polled every
    /// `--sync-interval`.
    #[cfg(feature = "cloudmap")]
    Cloudmap,
}

#[derive(clap::Args, Clone)]
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
    /// The DynamoDB table (`--registry-backend=dynamodb`).
    #[arg(long, default_value = "aether-registry")]
    dynamodb_table: String,
    /// Create the DynamoDB table (on-demand, with a stream) if it is missing.
    #[arg(long)]
    dynamodb_create_table: bool,
    /// The Cloud Map namespace (`--registry-backend=cloudmap`); created as an
    /// HTTP namespace if missing.
    #[arg(long, default_value = "aether")]
    cloudmap_namespace: String,
    /// AWS region for DynamoDB and Cloud Map (default: the AWS chain's).
    #[arg(long, env = "AWS_REGION")]
    aws_region: Option<String>,
    /// AWS endpoint URL for DynamoDB and Cloud Map (an emulator, a VPC endpoint).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    aws_endpoint_url: Option<String>,
    /// Authorize agents by SPIFFE ID in this trust domain (needs TLS):
    /// an agent may write only endpoints of its own node.
    #[arg(long, env = "REGISTRAR_TRUST_DOMAIN")]
    trust_domain: Option<String>,
    /// The SPIFFE ID of an agent; `{trust_domain}` and `{node}` are
    /// replaced.
    #[arg(long, default_value = DEFAULT_ID_PATTERN)]
    spiffe_id_pattern: String,
    /// A SPIFFE ID that may write endpoints of any node (an operator);
    /// repeat for more.
    #[arg(long = "admin-id")]
    admin_ids: Vec<String>,
}

/// Wrap a backend for the registrar: polling when it has no native watch,
/// the generic sweeper when it has no native liveness.
fn assemble<B>(backend: B, sync_interval: Duration) -> registry_api::Result<Arc<dyn Backend>>
where
    B: registry_api::Batch + registry_api::Watch + registry_api::Heartbeat,
{
    let caps = registry_api::Registry::capabilities(&backend);
    let polling = PollingConfig::default().with_interval(sync_interval);
    Ok(match (caps.native_watch, caps.native_liveness) {
        (true, true) => Arc::new(backend),
        (true, false) => Arc::new(Liveness::new(backend)),
        (false, true) => Arc::new(Polling::with_config(backend, polling)?),
        (false, false) => Arc::new(Polling::with_config(Liveness::new(backend), polling)?),
    })
}

async fn open_backend(args: &ServeArgs) -> registry_api::Result<Arc<dyn Backend>> {
    Ok(match args.registry_backend {
        BackendKind::Memory => assemble(MemoryRegistry::new(), args.sync_interval)?,
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite => assemble(
            registry_sqlite::SqliteRegistry::open_path(&args.sqlite_path).await?,
            args.sync_interval,
        )?,
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => {
            let cfg = registry_etcd::EtcdConfig::new(args.etcd_endpoints.clone())
                .with_prefix(args.etcd_prefix.clone());
            assemble(
                registry_etcd::EtcdRegistry::connect(cfg).await?,
                args.sync_interval,
            )?
        }
        #[cfg(feature = "dynamodb")]
        BackendKind::Dynamodb => {
            let mut cfg = registry_dynamodb::DynamoDbConfig::new(args.dynamodb_table.clone())
                .with_poll_interval(args.sync_interval);
            if let Some(region) = &args.aws_region {
                cfg = cfg.with_region(region.clone());
            }
            if let Some(url) = &args.aws_endpoint_url {
                cfg = cfg.with_endpoint_url(url.clone());
            }
            if args.dynamodb_create_table {
                registry_dynamodb::DynamoDbRegistry::create_table_if_missing(&cfg, true).await?;
            }
            // Native watch (Streams, or its own polling); no native liveness.
            Arc::new(Liveness::new(
                registry_dynamodb::DynamoDbRegistry::connect(cfg).await?,
            ))
        }
        #[cfg(feature = "cloudmap")]
        BackendKind::Cloudmap => {
            let mut cfg = registry_cloudmap::CloudMapConfig::new(args.cloudmap_namespace.clone());
            if let Some(region) = &args.aws_region {
                cfg = cfg.with_region(region.clone());
            }
            if let Some(url) = &args.aws_endpoint_url {
                cfg = cfg.with_endpoint_url(url.clone());
            }
            let raw = registry_cloudmap::CloudMapRegistry::connect(cfg).await?;
            Arc::new(Polling::with_config(
                Liveness::new(raw),
                PollingConfig::default().with_interval(args.sync_interval),
            )?)
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

/// Histogram buckets (the exporter renders histograms without buckets as
/// summaries).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("registrar_sync_duration_seconds".into()),
            SECONDS_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("registrar_write_batch_size".into()),
                BATCH_BUCKETS,
            )
        })
        .and_then(|b| b.install_recorder())
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    registrar_server::describe_metrics();
    // Present from the start, at zero, rather than after the first event.
    metrics::gauge!("registrar_connected_agents").increment(0.0);
    metrics::gauge!("registrar_write_queue_depth").set(0.0);
    metrics::counter!("registrar_sync_errors_total").increment(0);
    metrics::counter!("agent_registrar_stream_reconnects_total").increment(0);
    Ok(handle)
}

async fn run_serve(args: ServeArgs, tls: &TlsArgs) -> Result<(), String> {
    let tls_files = tls.server_files()?;
    let authz = args.trust_domain.as_ref().map(|td| {
        args.admin_ids.iter().fold(
            AuthzConfig::new(td.clone()).with_id_pattern(args.spiffe_id_pattern.clone()),
            |a, id| a.with_admin(id.clone()),
        )
    });
    let mut options = ServeOptions::default();
    if let Some(files) = tls_files {
        options = options.with_tls(files);
    }
    if let Some(authz) = authz {
        options = options.with_authz(authz);
    }
    options.check().map_err(|e| e.to_string())?;
    let metrics = install_metrics()?;
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
    let registrar = Registrar::new(backend, cfg).map_err(|e| e.to_string())?;
    tracing::info!(
        backend = %registrar.backend(),
        cluster = %args.cluster_name,
        epoch = registrar.epoch(),
        tls = options.tls.is_some(),
        "registrar up"
    );
    // One line for scripts and tests to read the bound addresses from.
    println!("registrar listening grpc={grpc_addr} health={health_addr}");
    serve_with(
        registrar,
        grpc,
        health,
        Some(metrics),
        options,
        shutdown_signal(),
    )
    .await
    .map_err(|e| e.to_string())
}

/// A plain client of the registrar at `--address`.
fn client(cli: &Cli) -> Result<Raw, String> {
    let mut cfg = ClientConfig::new(cli.address.clone(), "operator", "registrar-cli")
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(10));
    if let Some(files) = cli.tls.client_files()? {
        cfg = cfg.with_tls(files);
    }
    Raw::connect(cfg).map_err(|e| format!("registrar {}: {e}", cli.address))
}

fn endpoint_line(e: &Endpoint) -> String {
    let labels: Vec<String> = e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "{}/{} {} {} cluster={} node={} {}{}{}",
        e.service,
        e.id,
        host_port(e),
        e.protocol.as_str(),
        e.cluster,
        if e.node.is_empty() { "-" } else { &e.node },
        e.health.as_str(),
        if labels.is_empty() { "" } else { " " },
        labels.join(",")
    )
}

fn host_port(e: &Endpoint) -> String {
    if e.address.contains(':') {
        format!("[{}]:{}", e.address, e.port)
    } else {
        format!("{}:{}", e.address, e.port)
    }
}

fn json(v: &serde_json::Value) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| format!("cannot encode JSON: {e}"))
}

async fn run_ls(cli: &Cli, args: &LsArgs) -> Result<(), String> {
    let raw = client(cli)?;
    let snap = raw.snapshot().await.map_err(|e| format!("ls: {e}"))?;
    let eps: Vec<Endpoint> = snap
        .iter()
        .filter(|e| args.service.as_ref().is_none_or(|s| &e.service == s))
        .filter(|e| args.cluster.as_ref().is_none_or(|c| &e.cluster == c))
        .filter(|e| args.node.as_ref().is_none_or(|n| &e.node == n))
        .cloned()
        .collect();
    if args.json {
        for e in &eps {
            let line = serde_json::to_string(e).map_err(|e| format!("cannot encode JSON: {e}"))?;
            println!("{line}");
        }
        return Ok(());
    }
    let rows: Vec<[String; 8]> = eps
        .iter()
        .map(|e| {
            [
                e.service.clone(),
                e.id.clone(),
                host_port(e),
                e.protocol.as_str().to_string(),
                e.cluster.clone(),
                if e.node.is_empty() {
                    "-".into()
                } else {
                    e.node.clone()
                },
                e.health.as_str().to_string(),
                e.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    let header = [
        "SERVICE", "ID", "ADDRESS", "PROTOCOL", "CLUSTER", "NODE", "HEALTH", "LABELS",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if rows.is_empty() {
        eprintln!(
            "(no endpoints at {} version {})",
            raw.address(),
            snap.version()
        );
    }
    Ok(())
}

/// One event as a line of text or JSON.
fn event_line(ev: &Event, as_json: bool) -> Result<String, String> {
    if as_json {
        let v = match ev {
            Event::Snapshot(s) => serde_json::json!({
                "type": "snapshot",
                "version": s.version().0,
                "endpoints": s.iter().collect::<Vec<_>>(),
            }),
            Event::Added { version, endpoint } => {
                serde_json::json!({"type": "added", "version": version.0, "endpoint": endpoint})
            }
            Event::Updated { version, endpoint } => {
                serde_json::json!({"type": "updated", "version": version.0, "endpoint": endpoint})
            }
            Event::Removed { version, key } => serde_json::json!({
                "type": "removed",
                "version": version.0,
                "service": key.service,
                "id": key.id,
            }),
        };
        return json(&v);
    }
    Ok(match ev {
        Event::Snapshot(s) => {
            let mut out = format!("snapshot v{}: {} endpoints", s.version(), s.len());
            for e in s.iter() {
                out.push_str("\n  ");
                out.push_str(&endpoint_line(e));
            }
            out
        }
        Event::Added { version, endpoint } => {
            format!("added   v{version} {}", endpoint_line(endpoint))
        }
        Event::Updated { version, endpoint } => {
            format!("updated v{version} {}", endpoint_line(endpoint))
        }
        Event::Removed { version, key } => format!("removed v{version} {key}"),
    })
}

async fn run_watch(cli: &Cli, args: &WatchArgs) -> Result<(), String> {
    let raw = client(cli)?;
    let mut stream = raw.watch(None);
    let deadline = args.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut seen = 0u64;
    while args.count.is_none_or(|n| seen < n) {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, stream.next()).await {
                Ok(n) => n,
                Err(_) => return Ok(()),
            },
            None => stream.next().await,
        };
        match next {
            Some(Ok(ev)) => {
                println!("{}", event_line(&ev, args.json)?);
                seen += 1;
            }
            Some(Err(e)) => return Err(format!("watch: {e}")),
            None => {
                return Err(format!(
                    "watch: registrar {} ended the stream",
                    raw.address()
                ))
            }
        }
    }
    Ok(())
}

async fn run_register(cli: &Cli, args: &RegisterArgs) -> Result<(), String> {
    let (host, port) = parse_target(&args.target)?;
    let mut ep = Endpoint::new(args.service.clone(), args.id.clone(), host, port)
        .with_protocol(args.protocol)
        .with_cluster(args.cluster.clone())
        .with_node(args.node.clone());
    if args.unhealthy {
        ep = ep.with_health(Health::Unhealthy);
    }
    for (k, v) in &args.labels {
        ep = ep.with_label(k.clone(), v.clone());
    }
    ep.validate().map_err(|e| format!("register: {e}"))?;
    let raw = client(cli)?;
    let line = endpoint_line(&ep);
    raw.register(ep)
        .await
        .map_err(|e| format!("register: {e}"))?;
    println!("registered {line}");
    Ok(())
}

async fn run_deregister(cli: &Cli, args: &DeregisterArgs) -> Result<(), String> {
    let key = EndpointKey::new(args.service.clone(), args.id.clone());
    let raw = client(cli)?;
    raw.deregister(&key)
        .await
        .map_err(|e| format!("deregister: {e}"))?;
    println!("deregistered {key}");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("registrar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Serve(args) => run_serve(ServeArgs::clone(args), &cli.tls).await,
            Command::Ls(args) => run_ls(&cli, args).await,
            Command::Watch(args) => run_watch(&cli, args).await,
            Command::Register(args) => run_register(&cli, args).await,
            Command::Deregister(args) => run_deregister(&cli, args).await,
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
