//! Phases 5 and 6 of `registrar-load` (`--phases restart,failover`):
//! `--agents` agents come back to a registrar of another epoch, which
//! cannot resume them by version.
//!
//! - **restart**: the registrar is stopped as on SIGTERM (its streams end)
//!   and a new one starts on the same port over the same backend.
//! - **failover**: two registrars over one backend; the agents reach the
//!   first through a load balancer (a TCP proxy in the agents' process),
//!   the first stops, and the proxy sends them to the second, which has
//!   been following the backend all along.
//!
//! The registry holds `--endpoints` endpoints in 20-endpoint services, in
//! a `MemoryRegistry` that outlives the registrars; `--changed` percent of
//! the services gain an endpoint while the agents are away. Each phase
//! runs twice in the same process: with `RegistrarClient` agents, which
//! say what they hold and get only the services that differ (resume by
//! content; with `--light-agents`, bare HTTP/2 readers that send the same
//! summary), and with bare HTTP/2 readers that say nothing (`light.rs`),
//! which get a full snapshot each, as agents without a summary do: the
//! baseline. Printed per run: how long until every stream was back, the
//! snapshot bytes sent, and the new registrar's CPU per returning agent
//! (this process's CPU; the agents and the proxy are in a child); then
//! the ratios of the two.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use waypost::{backend::backoff, memory::MemoryRegistry, Endpoint, Registry};
use waypost::{Snapshot, Version};
use waypost_fixtures::proxy::CutProxy;
use waypost_registrar_client::{endpoint_from_proto, Digests};
use waypost_registrar_client::{ClientConfig, RegistrarClient, RpcClient};
use waypost_registrar_server::{Backend, RegistrarConfig};

use crate::light::{Held, LightAgent};
use crate::procs::cpu_seconds;
use crate::{start_on, Args, Server};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The longest wait for all agents, before and after the move.
const LIMIT: Duration = Duration::from_secs(300);
/// Endpoints per service.
const PER_SERVICE: usize = 20;

/// How the agents come to a registrar of another epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Move {
    Restart,
    Failover,
}

impl Move {
    fn name(self) -> &'static str {
        match self {
            Move::Restart => "restart",
            Move::Failover => "failover",
        }
    }
}

/// The agents of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `RegistrarClient`s: they resume by content.
    Clients,
    /// Light agents that say nothing of what they hold: each is sent a
    /// full snapshot (the baseline).
    Full,
    /// Light agents that resume by content, sending the summary of what
    /// they were sent.
    LightByContent,
}

/// What the agents' return cost the new registrar.
struct Figures {
    all_back: Duration,
    chunks: u64,
    bytes: u64,
    /// From the new registrar's start (restart) or the move (failover)
    /// until every agent is back.
    cpu: f64,
    /// Of that, starting the new registrar (restart): loading the state.
    start_cpu: f64,
}

/// Wait until `done()`, at most [`LIMIT`]; how long that took.
async fn until(what: &str, done: impl Fn() -> bool, from: Instant) -> Res<Duration> {
    loop {
        if done() {
            return Ok(from.elapsed());
        }
        if from.elapsed() > LIMIT {
            return Err(format!("{what}: not after {LIMIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every agent's stream open on `server`, with its snapshot sent.
fn all_served(server: &Server, agents: usize) -> bool {
    let stats = server.registrar.watch_stats();
    stats.streams >= agents && stats.pending_endpoints == 0
}

fn service(i: usize, services: usize) -> String {
    format!("svc-{:05}", i % services)
}

async fn registry(endpoints: usize) -> Res<(Arc<MemoryRegistry>, usize)> {
    let memory = Arc::new(MemoryRegistry::new());
    let services = endpoints.div_ceil(PER_SERVICE).max(1);
    let ops: Vec<waypost::Op> = (0..endpoints)
        .map(|i| {
            let e = Endpoint::new(service(i, services), format!("ep-{i}"), "10.1.0.1", 8080);
            waypost::Op::Register(e.with_node(format!("node-{}", i % 100)))
        })
        .collect();
    for batch in ops.chunks(1000) {
        waypost::Batch::apply(memory.as_ref(), batch.to_vec()).await?;
    }
    Ok((memory, services))
}

/// The agents' process, and its stdout (one line once they are ready).
struct Agents {
    child: Child,
    _out: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Agents {
    async fn spawn(args: &Args, target: SocketAddr, kind: Kind) -> Res<Agents> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--restart-client", &target.to_string()])
            .args(["--agents", &args.agents.to_string()])
            .args((kind != Kind::Clients).then_some("--light-agents"))
            .args((kind == Kind::LightByContent).then_some("--restart-summary"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("the agents' stdout")?;
        let mut out = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(LIMIT, out.next_line()).await??;
        if line.as_deref() != Some("ready") {
            return Err(format!("the agents' process said {line:?}, not ready").into());
        }
        Ok(Agents { child, _out: out })
    }

    /// Tell the agents' load balancer to send them to `addr`.
    async fn retarget(&mut self, addr: SocketAddr) -> Res<()> {
        let stdin = self.child.stdin.as_mut().ok_or("the agents' stdin")?;
        stdin
            .write_all(format!("retarget {addr}\n").as_bytes())
            .await?;
        stdin.flush().await?;
        Ok(())
    }
}

/// One run: the agents of `kind` on a first registrar, moved as `how`
/// says to a new one.
async fn run(args: &Args, how: Move, kind: Kind) -> Res<Figures> {
    let (memory, services) = registry(args.endpoints).await?;
    let backend = || Arc::clone(&memory) as Arc<dyn Backend>;
    let cfg = || RegistrarConfig::new("load").with_agent_buffer(65_536);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let first = start_on(backend(), cfg(), listener).await?;
    let second = match how {
        Move::Failover => {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            Some(start_on(backend(), cfg(), l).await?)
        }
        Move::Restart => None,
    };
    let mut agents = Agents::spawn(args, addr, kind).await?;
    until(
        "every agent's first snapshot",
        || all_served(&first, args.agents),
        Instant::now(),
    )
    .await?;

    crate::shut_down(first, Duration::from_secs(60)).await?;
    // While the agents are away, some services change.
    let changed = ((services as f64) * args.changed / 100.0).round() as usize;
    for s in 0..changed.min(services) {
        let e = Endpoint::new(
            service(s, services),
            format!("ep-new-{s}"),
            "10.1.0.2",
            8080,
        );
        memory.register(e.with_node("node-0")).await?;
    }
    let mut start_cpu = 0.0;
    let (second, started, cpu, before) = match second {
        Some(second) => {
            // The second registrar has the changes before the agents come.
            let rpc = RpcClient::connect(ClientConfig::new(second.url(), "load", "check"))?;
            let want = memory.snapshot().await?;
            let from = Instant::now();
            loop {
                if rpc.snapshot().await?.same_endpoints(&want) {
                    break;
                }
                if from.elapsed() > LIMIT {
                    return Err("the second registrar never had the changes".into());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let before = second.registrar.watch_stats();
            let cpu = cpu_seconds();
            let started = Instant::now();
            agents.retarget(second.addr).await?;
            (second, started, cpu, before)
        }
        None => {
            let listener = rebind(addr).await?;
            let cpu = cpu_seconds();
            let started = Instant::now();
            let second = start_on(backend(), cfg(), listener).await?;
            start_cpu = cpu_seconds() - cpu;
            let before = second.registrar.watch_stats();
            (second, started, cpu, before)
        }
    };
    let all_back = until(
        "every agent back",
        || all_served(&second, args.agents),
        started,
    )
    .await?;
    let cpu = cpu_seconds() - cpu;
    let stats = second.registrar.watch_stats();
    let _ = agents.child.kill().await;
    Ok(Figures {
        all_back,
        chunks: stats.snapshot_chunks - before.snapshot_chunks,
        bytes: stats.snapshot_bytes - before.snapshot_bytes,
        cpu,
        start_cpu,
    })
}

/// `addr` bound again once the old listener is closed (a socket of the
/// old connections in TIME_WAIT does not stop a new bind).
async fn rebind(addr: SocketAddr) -> Res<tokio::net::TcpListener> {
    let from = Instant::now();
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(_) if from.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("cannot bind {addr} again: {e}").into()),
        }
    }
}

pub(crate) async fn phase(args: &Args, how: Move) -> Res<()> {
    let name = how.name();
    let mut figures = Vec::new();
    let by_content = match args.light_agents {
        true => (Kind::LightByContent, "resumed by content (light agents)"),
        false => (Kind::Clients, "resumed by content"),
    };
    for (kind, label) in [(Kind::Full, "full snapshots"), by_content] {
        let f = run(args, how, kind).await?;
        println!(
            "{name}: {} agents on {} endpoints, {}% of the services changed, {label}: all back after {:.2} s; {} snapshot messages, {:.2} KiB per agent; the new registrar's CPU {:.0} µs per agent ({:.0} µs without its start, {:.2} s)",
            args.agents,
            args.endpoints,
            args.changed,
            f.all_back.as_secs_f64(),
            f.chunks,
            f.bytes as f64 / args.agents as f64 / 1024.0,
            f.cpu / args.agents as f64 * 1e6,
            (f.cpu - f.start_cpu) / args.agents as f64 * 1e6,
            f.start_cpu,
        );
        figures.push(f);
    }
    let (full, content) = (&figures[0], &figures[1]);
    let after_start = |f: &Figures| (f.cpu - f.start_cpu).max(f64::EPSILON);
    println!(
        "{name}: resumed by content / full snapshots: bytes {:.3} %, CPU {:.1} % ({:.1} % without the start)",
        content.bytes as f64 / full.bytes.max(1) as f64 * 100.0,
        content.cpu / full.cpu.max(f64::EPSILON) * 100.0,
        after_start(content) / after_start(full) * 100.0,
    );
    Ok(())
}

/// The child: `agents` agents of `kind` through a proxy to `target`
/// ([`LightAgent`]s reconnect as a `RegistrarClient` does); prints
/// `ready` once every `RegistrarClient` holds its first snapshot, moves
/// the proxy to the address of each `retarget <addr>` line on stdin, and
/// ends when stdin does (at most [`LIMIT`] twice over).
pub(crate) async fn client(target: &str, agents: usize, kind: Kind) -> Res<()> {
    let proxy = CutProxy::start(target.parse()?).await?;
    let url = proxy.url();
    let mut clients = Vec::with_capacity(agents);
    match kind {
        Kind::Full => {
            for i in 0..agents {
                tokio::spawn(light_agent(url.clone(), i, None, None));
            }
        }
        Kind::LightByContent => {
            // The first agent's snapshot gives the summary they all send.
            let (first, held) = first_summary(&url).await?;
            let held = Arc::new(held);
            let mut first = Some(first);
            for i in 0..agents {
                let held = Some(Arc::clone(&held));
                tokio::spawn(light_agent(url.clone(), i, first.take(), held));
            }
        }
        Kind::Clients => {
            for i in 0..agents {
                let cfg = ClientConfig::new(&url, "load", format!("agent-{i}"));
                clients.push(RegistrarClient::connect(cfg)?);
            }
            for c in &clients {
                tokio::time::timeout(LIMIT, c.cache().wait_until_ready()).await?;
            }
        }
    }
    println!("ready");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let _ = tokio::time::timeout(LIMIT * 2, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(addr) = line.strip_prefix("retarget ") {
                match addr.parse() {
                    Ok(addr) => proxy.retarget(addr),
                    Err(e) => eprintln!("registrar-load agents: {addr:?}: {e}"),
                }
            }
        }
    })
    .await;
    drop(clients);
    Ok(())
}

/// The first light agent, open at `url`, and the summary of what it was
/// sent, as a `RegistrarClient` holding that would send it (every agent
/// is sent the same).
async fn first_summary(url: &str) -> Res<(LightAgent, Held)> {
    let mut sent = Vec::new();
    let mut bad = None;
    let agent = LightAgent::open_with(url, "agent-0", None, |event| {
        for p in &event.snapshot_endpoints {
            match endpoint_from_proto(p.clone(), "snapshot_endpoints.") {
                Ok(e) => sent.push(e),
                Err(e) => bad = Some(e),
            }
        }
    })
    .await
    .map_err(|e| format!("the first agent's watch: {e}"))?;
    if let Some(e) = bad {
        return Err(format!("the registrar sent an endpoint that does not read: {e}").into());
    }
    let snap = Snapshot::from_endpoints(Version(0), sent);
    let digests = Digests::new();
    let services = digests
        .held(&snap)
        .ok_or("the summary is larger than an agent sends")?;
    Ok((agent, (services, digests.total(&snap))))
}

/// Light agent `i`: a watch on `url`, opened again whenever it ends, with
/// `RegistrarClient`'s default backoff between tries (the toolkit's
/// [`backoff`]: from 200 ms, doubling to 30 s, jittered), reset once a
/// snapshot is read; `open` when it is open already. Once it has read a
/// snapshot it says it holds `held` when there is one (what it was sent).
async fn light_agent(url: String, i: usize, mut open: Option<LightAgent>, held: Option<Arc<Held>>) {
    let node = format!("agent-{i}");
    let (min, max) = ClientConfig::new(&url, "load", &node).reconnect;
    let mut delays = backoff(min, max);
    let mut holds = open.as_ref().and(held.as_deref());
    loop {
        let agent = match open.take() {
            Some(agent) => Ok(agent),
            None => LightAgent::open_with(&url, &node, holds, |_| ()).await,
        };
        if let Ok(mut agent) = agent {
            holds = held.as_deref();
            delays = backoff(min, max);
            while agent.next_event().await.is_ok() {}
        }
        tokio::time::sleep(delays.next().unwrap_or(max)).await;
    }
}
