//! `registrar-load`: a bounded load test of one registrar on loopback.
//! Prints figures and ratios against baselines measured in the same run.
//!
//! ```sh
//! cargo run --release -p registrar-load -- --agents 1000 --rate 1000 --seconds 5
//! ```
//!
//! Phases:
//! 1. fan-out: `--agents` agent streams (one gRPC connection each), a writer
//!    registering `--rate` endpoint changes per second for `--seconds`;
//!    time from each write to its delivery at one agent (p50/p99), and to
//!    its delivery at every agent; the registrar's memory per agent stream
//!    and the CPU time of each side. The registrar runs in this process,
//!    the agents and the writer in a child process (`fanout.rs`). With
//!    `--encoding all` (the default) it runs once with every stream
//!    encoding its own messages (the baseline), once with each message
//!    encoded once but a subscription to the state per stream, and once
//!    encoded once and read from one feed (`shared`), and prints the
//!    ratios.
//! 2. backend load: backend connections and reads per sync interval with
//!    the registrar in front of a polling backend, vs every agent polling
//!    the backend itself.
//! 3. cold start: a new agent on `--cold-endpoints` endpoints, vs reading
//!    the backend's snapshot directly.
//! 4. stuck streams: `--stuck-streams` streams that read one message and
//!    then nothing (opened by a child process, so the figure is the
//!    server's alone): the registrar's RSS growth per stream on an empty
//!    registry (the baseline), on 5,000 and on `--stuck-endpoints`
//!    endpoints, while a healthy watcher gets every change in order.
//!
//! 5. restart (only when asked for, `--phases restart`): `--agents`
//!    agents (in a child process) connected to a registrar that is stopped
//!    and started again on the same port over the same backend, on a
//!    registry of `--endpoints` endpoints of which `--changed` percent of
//!    the services change meanwhile: how long until every agent's stream
//!    is back, the snapshot bytes and the new registrar's CPU that took,
//!    for agents that resume by content (`RegistrarClient`, or with
//!    `--light-agents` light agents sending the same summary) against
//!    agents that get a full snapshot (the baseline).
//! 6. failover (only when asked for, `--phases failover`): the same, with
//!    the agents moved by a load balancer from one registrar to another
//!    over the same backend (`restart.rs`).
//!
//! `--phases stuck` (a comma list of
//! `fanout,backend,cold,stuck,restart,failover`)
//! runs only some phases. `--pin` puts the registrar on CPU 0 and its agents on
//! CPU 1 in the fan-out phase, and it prints the registrar's CPU time per
//! delivered event (and the part of it in the kernel) and per change.
//! `--light-agents` makes the agents of the fan-out phase
//! bare HTTP/2 readers (`light.rs`) instead of `RegistrarClient`s, so that
//! on a small machine the figures are the registrar's rather than its
//! agents'.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use futures::StreamExt;
use waypost::{
    memory::MemoryRegistry,
    polling::{Polling, PollingConfig},
    Batch, Capabilities, Endpoint, EventStream, Op, Registry, Result, Snapshot, Watch,
};
use waypost_fixtures::registrar::TestRegistrar;
use waypost_registrar_client::{ClientConfig, RegistrarClient, RpcClient};
use waypost_registrar_server::{Backend, RegistrarConfig};

#[derive(Parser, Debug)]
#[command(about = "Bounded load test of one registrar on loopback")]
struct Args {
    /// Agent streams.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Endpoint changes per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Length of the fan-out phase.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Endpoints for the cold-start phase.
    #[arg(long, default_value_t = 100_000)]
    cold_endpoints: usize,
    /// Sync interval of the polling phase.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    /// Streams that stop reading, for the stuck-streams phase.
    #[arg(long, default_value_t = 1000)]
    stuck_streams: usize,
    /// Endpoints for the stuck-streams phase.
    #[arg(long, default_value_t = 100_000)]
    stuck_endpoints: usize,
    /// Endpoints for the restart and failover phases.
    #[arg(long, default_value_t = 1000)]
    endpoints: usize,
    /// Restart and failover phases: the percentage of services that
    /// change while the agents are away.
    #[arg(long, default_value_t = 0.0)]
    changed: f64,
    /// Phases to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fanout,backend,cold,stuck"
    )]
    phases: Vec<String>,
    /// How the registrar encodes agent streams' messages in the fan-out
    /// phase: `shared`, `per-subscriber`, `per-stream` (the baseline),
    /// `both` (per-stream, then shared) or `all` three in turn.
    /// `floor` is no registrar at all: a minimal tokio server writing each
    /// change to each agent's socket (`floor.rs`); `floor-h2` answers the
    /// agents' `WatchEndpoints` with the `h2` crate alone, one task per
    /// connection, to light agents; `floor-shared` runs both, then
    /// `shared`, and prints the CPU per delivery of each against the
    /// others.
    #[arg(long, default_value = "all", value_parser = ["all", "both", "shared", "per-subscriber", "per-stream", "floor", "floor-h2", "floor-shared"])]
    encoding: String,
    /// Fan-out phase: send each tick's writes without waiting for the
    /// previous ones (by default the writer waits for each tick's
    /// acknowledgements, so a slow registrar slows it).
    #[arg(long)]
    open_loop: bool,
    /// Fan-out phase: pin the registrar's process to CPU 0 and the agents'
    /// and writer's to CPU 1 (with `taskset`), so the registrar's CPU time
    /// per delivery is its own, whatever the agents cost.
    #[arg(long)]
    pin: bool,
    /// Fan-out phase: the agents are bare HTTP/2 readers, one
    /// task per connection decoding each event with prost (`light.rs`),
    /// instead of `RpcClient` watches or `RegistrarClient`s; they cost
    /// less CPU per event, so their process limits a run less. Restart
    /// and failover phases: the agents that resume by content are light
    /// agents too, sending the summary of what they were sent (computed
    /// once: every agent was sent the same), so that thousands fit where
    /// hundreds of `RegistrarClient`s, each with its own copy of the
    /// registry, would not.
    #[arg(long)]
    light_agents: bool,
    /// Internal: the restart phase's light agents resume by content.
    #[arg(long, hide = true)]
    restart_summary: bool,
    /// Internal: be the agents and the writer of the fan-out phase against
    /// the server at this URL.
    #[arg(long, hide = true)]
    fanout_client: Option<String>,
    /// Internal: be the agents of the fan-out floor at this address.
    #[arg(long, hide = true)]
    floor_client: Option<String>,
    /// Internal: be the agents of the restart phase at this URL.
    #[arg(long, hide = true)]
    restart_client: Option<String>,
    /// Internal: be the stuck clients of the server at this URL.
    #[arg(long, hide = true)]
    stuck_client: Option<String>,
    /// Internal: measure stuck streams on a registry of this size.
    #[arg(long, hide = true)]
    stuck_size: Option<usize>,
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn rss_bytes() -> u64 {
    // Resident pages, from /proc (Linux); 0 elsewhere.
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// A registrar served in process on loopback.
type Server = waypost_fixtures::registrar::Running;

async fn start(backend: Arc<dyn Backend>, cfg: RegistrarConfig) -> std::io::Result<Server> {
    TestRegistrar::new(backend, cfg)
        .start()
        .await
        .map_err(std::io::Error::other)
}

/// [`start`] on the gRPC listener `grpc`.
async fn start_on(
    backend: Arc<dyn Backend>,
    cfg: RegistrarConfig,
    grpc: tokio::net::TcpListener,
) -> std::io::Result<Server> {
    TestRegistrar::new(backend, cfg)
        .listener(grpc)
        .start()
        .await
        .map_err(std::io::Error::other)
}

/// Stop serving (draining, as on SIGTERM) and wait until the listener is
/// closed, at most `limit`.
async fn shut_down(server: Server, limit: Duration) -> std::io::Result<()> {
    tokio::time::timeout(limit, server.stop_result())
        .await
        .map_err(|_| std::io::Error::other("the registrar did not stop in time"))?
        .map_err(std::io::Error::other)
}

fn pct(h: &hdrhistogram::Histogram<u64>, q: f64) -> String {
    format!("{:.2} ms", h.value_at_quantile(q) as f64 / 1000.0)
}

/// A backend that counts what it is asked, for the backend-load phase.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryRegistry,
    snapshots: AtomicUsize,
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

waypost::forward! {
    impl[] Registry for Counting {
        forward to inner: register, deregister, list, list_shared, probe;
        async fn snapshot(&self) -> Result<Snapshot> {
            self.snapshots.fetch_add(1, Ordering::Relaxed);
            self.inner.snapshot().await
        }
        fn capabilities(&self) -> Capabilities {
            // Behave like a backend without a native watch (DynamoDB without
            // a stream, Cloud Map): everyone has to poll it.
            self.inner.capabilities().with_native_watch(false)
        }
    }
}

waypost::forward! {
    impl[] Batch for Counting {
        forward to inner: apply, max_batch;
    }
}

waypost::forward! {
    impl[] Heartbeat for Counting {
        forward to inner: heartbeat;
    }
}

/// Phase 2: backend reads per sync interval, registrar vs direct polling.
async fn backend_load(args: &Args) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let window = args.sync_interval * 3;
    let agents = args.agents;

    // Direct: every agent polls the backend itself.
    let direct = Arc::new(Counting::default());
    let mut watches: Vec<(Polling<Arc<Counting>>, EventStream)> = Vec::new();
    for _ in 0..agents {
        let p = Polling::with_config(
            Arc::clone(&direct),
            PollingConfig::default().with_interval(args.sync_interval),
        )
        .map_err(std::io::Error::other)?;
        let w = p.watch(None);
        watches.push((p, w));
    }
    let before = direct.snapshots.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let direct_reads = direct.snapshots.load(Ordering::Relaxed) - before;
    drop(watches);

    // Through the registrar: one backend client, agents on gRPC streams.
    let shared = Arc::new(Counting::default());
    let backend: Arc<dyn Backend> = Arc::new(
        Polling::with_config(
            Arc::clone(&shared),
            PollingConfig::default().with_interval(args.sync_interval),
        )
        .map_err(std::io::Error::other)?,
    );
    let server = start(backend, RegistrarConfig::new("load")).await?;
    let mut streams = Vec::new();
    for i in 0..agents {
        let raw = RpcClient::connect(ClientConfig::new(
            server.url(),
            "load",
            format!("agent-{i}"),
        ))?;
        let mut w = raw.watch(None);
        let _ = w.next().await;
        streams.push((raw, w));
    }
    let before = shared.snapshots.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let registrar_reads = shared.snapshots.load(Ordering::Relaxed) - before;
    let per = |n: usize| n as f64 / (window.as_secs_f64() / args.sync_interval.as_secs_f64());
    println!(
        "backend: {agents} agents, sync every {:?}: backend connections 1 vs {agents}; backend snapshot reads per sync {:.1} vs {:.1} when each agent polls directly ({:.0}x fewer)",
        args.sync_interval,
        per(registrar_reads),
        per(direct_reads),
        direct_reads as f64 / registrar_reads.max(1) as f64
    );
    Ok(())
}

/// Phase 3: cold start of an agent on many endpoints.
async fn cold_start(args: &Args) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mem = MemoryRegistry::new();
    for chunk in endpoints(args.cold_endpoints).chunks(5000) {
        mem.apply(chunk.to_vec()).await?;
    }
    let server = start(Arc::new(mem), RegistrarConfig::new("load")).await?;
    server.registrar.state().wait_until_ready().await;
    // Baseline: one plain ListAllEndpoints call (the proxy path).
    let raw = RpcClient::connect(ClientConfig::new(server.url(), "load", "proxy"))?;
    let t = Instant::now();
    let direct = raw.snapshot().await?.len();
    let direct_time = t.elapsed();
    let t = Instant::now();
    let agent = RegistrarClient::connect(ClientConfig::new(server.url(), "load", "cold"))?;
    agent.cache().wait_until_ready().await;
    let cold = t.elapsed();
    let n = agent.snapshot().await?.len();
    println!(
        "cold start: an agent on {n} endpoints is ready in {:.0} ms (stream, decode, cache); one plain ListAllEndpoints call for the same {direct} endpoints takes {:.0} ms",
        cold.as_secs_f64() * 1000.0,
        direct_time.as_secs_f64() * 1000.0
    );
    Ok(())
}

fn endpoints(n: usize) -> Vec<Op> {
    (0..n)
        .map(|i| {
            Op::Register(
                Endpoint::new(
                    format!("svc-{}", i / 10),
                    format!("ep-{i}"),
                    "127.0.0.1",
                    8080,
                )
                .with_node(format!("node-{}", i % 1000)),
            )
        })
        .collect()
}

mod fanout;
mod floor;
mod light;
mod procs;
mod restart;
mod stuck;

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(url) = &args.fanout_client {
        return fanout::client(url, &args).await;
    }
    if let Some(addr) = &args.floor_client {
        return floor::client(addr, &args).await;
    }
    if let Some(url) = &args.restart_client {
        let kind = match (args.light_agents, args.restart_summary) {
            (false, _) => restart::Kind::Clients,
            (true, false) => restart::Kind::Full,
            (true, true) => restart::Kind::LightByContent,
        };
        return restart::client(url, args.agents, kind).await;
    }
    if let Some(url) = &args.stuck_client {
        return stuck::client(url, args.stuck_streams).await;
    }
    if let Some(size) = args.stuck_size {
        let per_stream = stuck::at(&args, size).await?;
        println!("per-stream-kib {per_stream:.1}");
        return Ok(());
    }
    println!("registrar-load: {args:?}");
    let run = |phase: &str| args.phases.iter().any(|p| p == phase);
    if run("fanout") {
        fanout::phase(&args).await?;
    }
    if run("backend") {
        backend_load(&args).await?;
    }
    if run("cold") {
        cold_start(&args).await?;
    }
    if run("stuck") {
        stuck::phase(&args).await?;
    }
    if run("restart") {
        restart::phase(&args, restart::Move::Restart).await?;
    }
    if run("failover") {
        restart::phase(&args, restart::Move::Failover).await?;
    }
    Ok(())
}
