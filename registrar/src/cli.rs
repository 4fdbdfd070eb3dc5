//! The command line: every flag, with its value checked when it is parsed,
//! so a bad value exits 2 with a message naming the flag and the allowed
//! range.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use waypost_registrar_server::{Ack, RegistrarConfig};

use crate::backend::BackendArgs;
use waypost::liveness::LivenessConfig;

use crate::connect::{ClientArgs, EarlyClientArgs, ServerTlsArgs};
use crate::values::{
    count_in, duration_in, parse_ack, parse_label, parse_target, parse_token, show, DAYS_30, HOUR,
    MS, SECOND,
};
use waypost::Protocol;

#[derive(Parser)]
#[command(
    name = "registrar",
    version,
    about = "The in-cluster registrar: one backend connection shared by every agent",
    long_about = "The in-cluster registrar: one backend connection shared by every agent.\n\n\
                  `serve` runs it; `ls`, `watch`, `register` and `deregister` talk to a \
                  running one at --address."
)]
pub struct Cli {
    /// The client flags given before the command name (hidden).
    #[command(flatten)]
    pub early: EarlyClientArgs,
    /// Print the whole chain of causes of an error (one cause per line)
    /// instead of one line.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// Log lines as plain text or as one JSON object per line.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "REGISTRAR_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written (to stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line (tracing-subscriber's JSON layer).
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the registrar.
    Serve(Box<ServeArgs>),
    /// List the registered endpoints.
    Ls(LsArgs),
    /// Follow the changes: a snapshot, then every change as it happens.
    Watch(WatchArgs),
    /// Register (or replace) an endpoint; with --keep-alive, keep it
    /// registered (heartbeating its node) until Ctrl-C or SIGTERM.
    Register(RegisterArgs),
    /// Heartbeat a node once (its endpoints stay registered on backends
    /// with leases, such as etcd).
    Heartbeat(HeartbeatArgs),
    /// Remove an endpoint.
    Deregister(DeregisterArgs),
}

#[derive(clap::Args)]
pub struct LsArgs {
    /// Only this service.
    #[arg(long)]
    pub service: Option<String>,
    /// Only this cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Output format: `table` (default), `wide` (with cluster and labels),
    /// `json` or `yaml` (one document with the version and the items).
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
    /// One JSON object per line (JSON Lines) instead of a table.
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// Where the registrar is.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `ls -o`: in the style of `kubectl get`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Service, id, address, protocol, node and health.
    Table,
    /// The table with the cluster and the labels.
    Wide,
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

#[derive(clap::Args)]
pub struct HeartbeatArgs {
    /// The node to heartbeat.
    pub node: String,
    /// Where the registrar is.
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args)]
pub struct WatchArgs {
    /// One JSON object per line instead of text; each carries the resume
    /// token (`<epoch>.<sequence>`) for --from.
    #[arg(long)]
    pub json: bool,
    /// Resume after this token (`<epoch>.<sequence>`, as printed by
    /// `watch --json`): only the changes since, or a fresh snapshot when
    /// the registrar restarted or no longer has them.
    #[arg(long, value_parser = parse_token)]
    pub from: Option<waypost_registrar_client::Token>,
    /// Stop after this many events (the first snapshot is one); at least 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this long (e.g. `30s`; 1ms to 30 days); exits 0.
    #[arg(long, value_parser = duration_in(MS, DAYS_30))]
    pub timeout: Option<Duration>,
    /// Where the registrar is.
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args)]
pub struct RegisterArgs {
    /// Service name.
    pub service: String,
    /// Endpoint id, unique within the service.
    pub id: String,
    /// Where it listens, `HOST:PORT` (`[v6]:PORT` for IPv6; port 1-65535).
    #[arg(value_parser = parse_target)]
    pub target: (String, u16),
    /// Transport: tcp, udp, http, https, grpc.
    #[arg(long, default_value = "tcp")]
    pub protocol: Protocol,
    /// Owning cluster [default: the registrar's own, --cluster-name].
    #[arg(long)]
    pub cluster: Option<String>,
    /// Owning node.
    #[arg(long, default_value = "")]
    pub node: String,
    /// A label `KEY=VALUE`; repeat for more.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Register it as not serving.
    #[arg(long)]
    pub unhealthy: bool,
    /// Return once the backend committed it (`durable`) or once the
    /// registrar queued it (`optimistic`); default: the registrar's.
    #[arg(long, value_parser = parse_ack)]
    pub ack: Option<Ack>,
    /// Stay running: heartbeat the node every --heartbeat-every, register
    /// again if the registry forgot the endpoint, and deregister it on
    /// Ctrl-C or SIGTERM. Needs --node.
    #[arg(long, requires = "node")]
    pub keep_alive: bool,
    /// With --keep-alive: time between heartbeats (100ms to 1h); keep it
    /// well under the backend's lease or silence timeout (30s by default).
    #[arg(long, default_value = "10s", value_parser = duration_in(100 * MS, HOUR), requires = "keep_alive")]
    pub heartbeat_every: Duration,
    /// Where the registrar is.
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args)]
pub struct DeregisterArgs {
    /// Service name.
    pub service: String,
    /// Endpoint id.
    pub id: String,
    /// As for `register`.
    #[arg(long, value_parser = parse_ack)]
    pub ack: Option<Ack>,
    /// Where the registrar is.
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    /// The backend.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// This registrar's cluster.
    #[arg(long, default_value = "default")]
    pub cluster_name: String,
    /// How often backends without a native watch are polled (10ms to 1h).
    #[arg(long, default_value = "5s", value_parser = duration_in(10 * MS, HOUR))]
    pub sync_interval: Duration,
    /// Liveness: a node silent this long (no heartbeat, no write) has its
    /// endpoints marked unhealthy (100ms to 30 days). On etcd it is the
    /// TTL of the node's lease: its endpoints are deleted when it lapses.
    #[arg(long, default_value = "30s", value_parser = duration_in(100 * MS, DAYS_30))]
    pub suspect_after: Duration,
    /// Liveness: a node silent this long has its endpoints removed (at
    /// least --suspect-after, at most 30 days).
    #[arg(long, default_value = "5m", value_parser = duration_in(100 * MS, DAYS_30))]
    pub remove_after: Duration,
    /// Liveness: how often each replica sweeps for silent nodes (10ms to
    /// 1h); every replica may sweep, sweeps never mark a live node.
    #[arg(long, default_value = "10s", value_parser = duration_in(10 * MS, HOUR))]
    pub liveness_sweep_interval: Duration,
    /// How often the write queue is flushed (1ms to 1h).
    #[arg(long, default_value = "100ms", value_parser = duration_in(MS, HOUR))]
    pub write_batch_interval: Duration,
    /// Flush as soon as this many writes are queued (1 to 10000000).
    #[arg(long, default_value = "50", value_parser = count_in(1, 10_000_000))]
    pub write_batch_ops: usize,
    /// Most writes queued for the backend; one more is refused with
    /// RESOURCE_EXHAUSTED (1 to 10000000).
    #[arg(long, default_value = "10000", value_parser = count_in(1, 10_000_000))]
    pub write_queue_capacity: usize,
    /// When writes are acknowledged unless a request says otherwise:
    /// `optimistic` (queued and broadcast) or `durable` (committed by the
    /// backend).
    #[arg(long, default_value = "optimistic", value_parser = parse_ack)]
    pub ack: Ack,
    /// How often the backend is probed (reachable, writable) (10ms to 1h).
    #[arg(long, default_value = "5s", value_parser = duration_in(10 * MS, HOUR))]
    pub probe_interval: Duration,
    /// Longest drain of the write queue at shutdown (0s to 1h); keep it
    /// below the orchestrator's grace period.
    #[arg(long, default_value = "20s", value_parser = duration_in(Duration::ZERO, HOUR))]
    pub drain_timeout: Duration,
    /// How often the registrar PINGs each agent connection over HTTP/2
    /// (1s to 1h).
    #[arg(long, default_value = "30s", value_parser = duration_in(SECOND, HOUR))]
    pub http2_keepalive_interval: Duration,
    /// Close a connection (and its streams) whose peer has not answered a
    /// PING within this long (1s to 1h): a vanished agent is dropped within
    /// interval + timeout.
    #[arg(long, default_value = "10s", value_parser = duration_in(SECOND, HOUR))]
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive on accepted connections: idle time before the first
    /// probe (1s to 1h).
    #[arg(long, default_value = "60s", value_parser = duration_in(SECOND, HOUR))]
    pub tcp_keepalive: Duration,
    /// Exit at once when the backend cannot be opened or a TLS file does
    /// not exist yet, instead of running not ready, retrying and waiting.
    #[arg(long)]
    pub fail_fast: bool,
    /// gRPC address. Default `127.0.0.1:9443` without TLS, `0.0.0.0:9443`
    /// with it; plaintext on a non-loopback address needs --insecure.
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// Allow plaintext gRPC on a non-loopback address: anyone who can reach
    /// the port may then write any endpoint. Also allows the HTTP API,
    /// DNS and, without TLS, xDS (plaintext, unauthenticated, read-only)
    /// on one.
    #[arg(long)]
    pub insecure: bool,
    /// Largest request message, in bytes (1024 to 268435456); larger ones
    /// are refused before they are read.
    #[arg(long, default_value = "65536", value_parser = count_in(1024, 256 * 1024 * 1024))]
    pub max_request_bytes: usize,
    /// Health and metrics address (plaintext, unauthenticated). Loopback
    /// by default; give `0.0.0.0:8081` where probes and scrapers come from
    /// other hosts (the pod IP in Kubernetes).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub health_addr: SocketAddr,
    /// The HTTP/JSON API's address (`/v1/services`, `/v1/watch`, writes and
    /// heartbeats; Consul's `/v1/health/service/<name>` and
    /// `/v1/catalog/services`; `/services`); off unless given (Consul's
    /// agent uses `127.0.0.1:8500`). Secured as the gRPC port: mTLS and
    /// authorization with TLS; without TLS, a non-loopback address needs
    /// --insecure.
    #[cfg(feature = "http-api")]
    #[arg(long)]
    pub http_api_addr: Option<SocketAddr>,
    /// Accepted and ignored: the HTTP API is off unless --http-api-addr
    /// is given.
    #[cfg(feature = "http-api")]
    #[arg(long, hide = true, conflicts_with = "http_api_addr")]
    pub no_http_api: bool,
    /// The DNS responder's address (UDP and TCP); off unless given
    /// (Consul's agent uses `127.0.0.1:8600`). A non-loopback address needs
    /// --insecure.
    #[cfg(feature = "dns")]
    #[arg(long)]
    pub dns_addr: Option<SocketAddr>,
    /// The domain the DNS responder answers for
    /// (`<service>.<domain>`, `<service>.<cluster>.<domain>`).
    #[cfg(feature = "dns")]
    #[arg(long, default_value = waypost_registrar_server::DEFAULT_DNS_DOMAIN)]
    pub dns_domain: String,
    /// The TTL of DNS records (0s to 5s, whole seconds).
    #[cfg(feature = "dns")]
    #[arg(long, default_value = "5s", value_parser = duration_in(Duration::ZERO, waypost_registrar_server::MAX_DNS_TTL))]
    pub dns_ttl: Duration,
    /// Accepted and ignored: DNS is off unless --dns-addr is given.
    #[cfg(feature = "dns")]
    #[arg(long, hide = true, conflicts_with = "dns_addr")]
    pub no_dns: bool,
    /// The xDS server's address (aggregated discovery, state of the world
    /// and delta, for proxyless gRPC clients and Envoy); off unless given.
    /// Secured as the gRPC port: mTLS and authorization with TLS; without
    /// TLS, a non-loopback address needs --insecure.
    #[cfg(feature = "xds")]
    #[arg(long)]
    pub xds_addr: Option<SocketAddr>,
    /// Serve a live dashboard at /ui on the health address. Off by default:
    /// the health port is plaintext and unauthenticated, so the dashboard
    /// shows every endpoint to anyone who can reach it.
    #[arg(long)]
    pub ui: bool,
    /// Authorize agents by SPIFFE ID in this trust domain (needs TLS): by
    /// default an agent may write only endpoints of its own node in this
    /// registrar's cluster; see --authz-policy.
    #[arg(long, env = "REGISTRAR_TRUST_DOMAIN")]
    pub trust_domain: Option<String>,
    /// The SPIFFE ID of an agent; `{trust_domain}` and `{node}` are
    /// replaced.
    #[arg(long, default_value = waypost_registrar_server::DEFAULT_ID_PATTERN)]
    pub spiffe_id_pattern: String,
    /// A SPIFFE ID that may write endpoints of any node (an operator);
    /// repeat for more.
    #[arg(long = "admin-id")]
    pub admin_ids: Vec<String>,
    /// An authorization policy (TOML) mapping SPIFFE IDs to what they may
    /// read and write; replaces --spiffe-id-pattern and --admin-id. Needs
    /// --trust-domain.
    #[arg(long, requires = "trust_domain", conflicts_with = "admin_ids")]
    pub authz_policy: Option<PathBuf>,
    /// With TLS and no --trust-domain: let any certificate of the CA write
    /// any endpoint (refused otherwise).
    #[arg(long, conflicts_with = "trust_domain")]
    pub allow_any_certificate: bool,
    /// Test hook: a background task panics after this long, to check that
    /// a dead task makes the registrar not ready and exit non-zero.
    #[arg(long, hide = true, value_parser = duration_in(Duration::ZERO, HOUR))]
    pub test_panic_after: Option<Duration>,
    /// TLS, from the server's side.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
}

impl ServeArgs {
    /// The gRPC address: the flag's, or the default for the transport.
    pub fn grpc_addr(&self, tls: bool) -> SocketAddr {
        self.grpc_addr.unwrap_or_else(|| {
            let ip = if tls {
                std::net::Ipv4Addr::UNSPECIFIED
            } else {
                std::net::Ipv4Addr::LOCALHOST
            };
            SocketAddr::from((ip, 9443))
        })
    }

    /// The registrar's settings from the flags.
    pub fn registrar_config(&self) -> RegistrarConfig {
        let mut cfg = RegistrarConfig::new(self.cluster_name.clone())
            .with_write_batch_interval(self.write_batch_interval)
            .with_write_queue_capacity(self.write_queue_capacity)
            .with_ack(self.ack)
            .with_probe_interval(self.probe_interval)
            .with_drain_timeout(self.drain_timeout);
        cfg.write_batch_ops = self.write_batch_ops;
        cfg
    }

    /// The liveness settings (`--suspect-after`, `--remove-after`,
    /// `--liveness-sweep-interval`), checked together.
    pub fn liveness(&self) -> Result<LivenessConfig, String> {
        if self.remove_after < self.suspect_after {
            return Err(format!(
                "--remove-after ({}) is shorter than --suspect-after ({})",
                show(self.remove_after),
                show(self.suspect_after)
            ));
        }
        Ok(LivenessConfig::default()
            .with_thresholds(self.suspect_after, self.remove_after)
            .with_sweep_interval(self.liveness_sweep_interval))
    }
}
