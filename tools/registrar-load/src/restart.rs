//! Phase 5 of `registrar-load` (`--phases restart`): a registrar restart
//! under `--agents` agents. The agents are `RegistrarClient`s, as a node's
//! are, in a child process; the registrar (this process) holds 1,000
//! endpoints in a `MemoryRegistry` that outlives it. Once every agent's
//! stream is open, the registrar is stopped as on SIGTERM (its streams
//! end) and a new one starts on the same port over the same backend, a
//! new epoch: each agent reconnects by its own backoff (200 ms, doubling,
//! jittered) and gets a fresh snapshot. Printed: how long until every
//! stream is back (and the first), the snapshot messages and bytes that
//! took, and the new registrar's CPU time meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use registrar_server::{Backend, RegistrarConfig};
use registry_api::{backend::backoff, memory::MemoryRegistry, Endpoint, Registry};
use registry_registrar::{ClientConfig, RegistrarClient};

use crate::light::LightAgent;
use crate::procs::cpu_seconds;
use crate::{start_on, Args};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Endpoints in the registry each reconnecting agent gets in its snapshot.
const ENDPOINTS: usize = 1_000;
/// The longest wait for all agents, before and after the restart.
const LIMIT: Duration = Duration::from_secs(300);

/// Wait until `streams()` is `want`, at most [`LIMIT`]; when the first was
/// open and when all were.
async fn all_open(
    streams: impl Fn() -> usize,
    want: usize,
    from: Instant,
) -> Res<(Duration, Duration)> {
    let mut first = None;
    loop {
        let open = streams();
        if open > 0 && first.is_none() {
            first = Some(from.elapsed());
        }
        if open >= want {
            return Ok((first.unwrap_or_default(), from.elapsed()));
        }
        if from.elapsed() > LIMIT {
            return Err(format!("{open} of {want} streams open after {LIMIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) async fn phase(args: &Args) -> Res<()> {
    let memory = Arc::new(MemoryRegistry::new());
    for i in 0..ENDPOINTS {
        let e = Endpoint::new(
            format!("svc-{}", i % 50),
            format!("ep-{i}"),
            "10.1.0.1",
            8080,
        );
        memory
            .register(e.with_node(format!("node-{}", i % 100)))
            .await?;
    }
    let backend = || Arc::clone(&memory) as Arc<dyn Backend>;
    let cfg = || RegistrarConfig::new("load").with_agent_buffer(65_536);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let first = start_on(backend(), cfg(), listener).await?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--restart-client", &first.url()])
        .args(["--agents", &args.agents.to_string()])
        .args(args.light_agents.then_some("--light-agents"))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let (_, opened) = all_open(
        || first.registrar.watch_stats().streams,
        args.agents,
        Instant::now(),
    )
    .await?;
    println!(
        "restart: {} agents ({}) on {ENDPOINTS} endpoints, all streams open after {:.1} s",
        args.agents,
        if args.light_agents {
            "light: bare HTTP/2, RegistrarClient's backoff"
        } else {
            "RegistrarClient"
        },
        opened.as_secs_f64()
    );

    let stopping = Instant::now();
    crate::shut_down(first, Duration::from_secs(60)).await?;
    let stopped = stopping.elapsed();
    // The same port again (the old listener is closed; a socket of the
    // old connections in TIME_WAIT does not stop a new bind).
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) if stopping.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(format!("cannot bind {addr} again: {e}").into()),
        }
    };
    let cpu = cpu_seconds();
    let started = Instant::now();
    let second = start_on(backend(), cfg(), listener).await?;
    let (first_back, all_back) = all_open(
        || second.registrar.watch_stats().streams,
        args.agents,
        started,
    )
    .await?;
    let cpu = cpu_seconds() - cpu;
    let stats = second.registrar.watch_stats();
    println!(
        "restart: the registrar drained in {:.2} s; on the new one the first agent was back after {} ms, all {} after {:.2} s; {} snapshot messages ({:.1} MiB) sent meanwhile; its CPU {:.2} s ({:.0} µs per agent back)",
        stopped.as_secs_f64(),
        first_back.as_millis(),
        args.agents,
        all_back.as_secs_f64(),
        stats.snapshot_chunks,
        stats.snapshot_bytes as f64 / f64::from(1 << 20),
        cpu,
        cpu / args.agents as f64 * 1e6
    );
    let _ = child.kill().await;
    Ok(())
}

/// The child: `agents` `RegistrarClient`s against `url` (with `light`,
/// [`LightAgent`]s that reconnect as a `RegistrarClient` does), held
/// until the parent kills this process (at most [`LIMIT`] twice over).
pub(crate) async fn client(url: &str, agents: usize, light: bool) -> Res<()> {
    if light {
        for i in 0..agents {
            tokio::spawn(light_agent(url.to_owned(), i));
        }
        tokio::time::sleep(LIMIT * 2).await;
        return Ok(());
    }
    let mut clients = Vec::with_capacity(agents);
    for i in 0..agents {
        let cfg = ClientConfig::new(url, "load", format!("agent-{i}"));
        clients.push(RegistrarClient::connect(cfg)?);
    }
    tokio::time::sleep(LIMIT * 2).await;
    drop(clients);
    Ok(())
}

/// Light agent `i`: a watch on `url`, opened again whenever it ends, with
/// `RegistrarClient`'s default backoff between tries (the toolkit's
/// [`backoff`]: from 200 ms, doubling to 30 s, jittered), reset once a
/// snapshot is read.
async fn light_agent(url: String, i: usize) {
    let node = format!("agent-{i}");
    let (min, max) = ClientConfig::new(&url, "load", &node).reconnect;
    let mut delays = backoff(min, max);
    loop {
        if let Ok(mut agent) = LightAgent::open(&url, &node).await {
            delays = backoff(min, max);
            while agent.next_event().await.is_ok() {}
        }
        tokio::time::sleep(delays.next().unwrap_or(max)).await;
    }
}
