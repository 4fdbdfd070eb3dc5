//! Phase 1 of `registrar-load`: fan-out. The registrar runs in this
//! process; the agents and the writer run in a child process (the same
//! binary with `--fanout-client`), so the CPU time and memory of each side
//! are measured apart. With `--encoding all` (the default) the phase runs
//! three times, each in a fresh process: the baseline (every stream
//! encodes its own messages), then each message encoded once but every
//! stream with its own subscription to the state (`per-subscriber`), then
//! encoded once and read from one feed (`shared`), and prints the ratios;
//! `both` runs the first and the last. The
//! writer waits for each tick's acknowledgements unless `--open-loop` is
//! given, in which case it keeps up to 150 writes in flight (below the
//! server's 200 concurrent HTTP/2 streams), so the asked rate is held
//! unless acknowledgements take longer than 150 writes' worth of time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::AsyncBufReadExt;
use waypost::{memory::MemoryRegistry, Endpoint, Event, Registry, Watch};
use waypost_registrar_client::{ClientConfig, RegistrarClient, RpcClient};
use waypost_registrar_server::{RegistrarConfig, StreamEncoding};

use crate::floor::Floor;
use crate::light::LightAgent;
use crate::procs::{
    cpu_seconds, join_within, spawn_self, CpuMark, Deliveries, Figures, PINNED, REGISTRAR_CPU,
};
use crate::{now_micros, pct, rss_bytes, start, Args};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Writes in flight at most with `--open-loop`.
const MAX_IN_FLIGHT: usize = 150;

fn label(e: StreamEncoding) -> &'static str {
    match e {
        StreamEncoding::PerStream => "per-stream encoding (baseline)",
        StreamEncoding::SharedPerSubscriber => "encoded once, a subscription per stream",
        _ => "encoded once, one feed (shared)",
    }
}

/// Phase 1 with the encoding `--encoding` asks for; with `both` or `all`,
/// each in a fresh process of its own (memory the first run freed would
/// hide the second's), then the ratios against the first.
pub(crate) async fn phase(args: &Args) -> Res<()> {
    // With `--pin`, the registrar runs in a child started on its CPU, so
    // its runtime sizes itself to that one CPU.
    let pinned = std::env::var_os(PINNED).is_some();
    if args.pin && !pinned {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return Err("--pin needs two CPUs".into());
        }
        if !matches!(args.encoding.as_str(), "all" | "both" | "floor-shared") {
            run_apart(args, &args.encoding).await?;
            return Ok(());
        }
    }
    let encoding = match args.encoding.as_str() {
        "floor" | "floor-h2" => {
            let (floor, name) = match args.encoding.as_str() {
                "floor" => (Floor::Tcp, "floor: a minimal tokio server"),
                _ => (Floor::Http2, "floor: WatchEndpoints on h2 alone"),
            };
            let f = crate::floor::serve(args, floor).await?;
            print_per_delivery(name, &f, args);
            print_figures(&f);
            return Ok(());
        }
        "floor-shared" => {
            let floor = run_apart(args, "floor").await?;
            let h2 = run_apart(args, "floor-h2").await?;
            let shared = run_apart(args, "shared").await?;
            print_against("the HTTP/2 floor", &h2, "the floor", &floor, args.agents);
            print_against("the registrar", &shared, "the floor", &floor, args.agents);
            print_against(
                "the registrar",
                &shared,
                "the HTTP/2 floor",
                &h2,
                args.agents,
            );
            return Ok(());
        }
        "shared" => StreamEncoding::Shared,
        "per-subscriber" => StreamEncoding::SharedPerSubscriber,
        "per-stream" => StreamEncoding::PerStream,
        many => {
            let base = run_apart(args, "per-stream").await?;
            if many == "all" {
                let sub = run_apart(args, "per-subscriber").await?;
                print_ratio("per-stream", &base, "per-subscriber", &sub);
                let shared = run_apart(args, "shared").await?;
                print_ratio("per-stream", &base, "shared", &shared);
                print_ratio("per-subscriber", &sub, "shared", &shared);
            } else {
                let shared = run_apart(args, "shared").await?;
                print_ratio("per-stream", &base, "shared", &shared);
            }
            return Ok(());
        }
    };
    let f = serve_one(args, encoding).await?;
    print_figures(&f);
    Ok(())
}

/// The line `run_apart` reads a run's figures from.
fn print_figures(f: &Figures) {
    println!(
        "figures {} {} {} {} {} {} {} {}",
        f.changes_per_s,
        f.every_p50_ms,
        f.every_p99_ms,
        f.one_p99_ms,
        f.server_cpu_per_s,
        f.server_kernel_per_s,
        f.agents_cpu_per_s,
        f.encoded
    );
}

/// The server's CPU time per delivered event and per change of run
/// `name`.
fn print_per_delivery(name: &str, f: &Figures, args: &Args) {
    let deliveries = f.changes_per_s * args.agents as f64;
    let (per, kernel) = f.per_delivery_us(args.agents);
    println!(
        "[{name}] server CPU {:.2} s/s, agents {:.2} s/s; per delivered event {:.2} µs ({:.2} µs of it in the kernel), per change {:.1} µs ({:.0} changes/s to {} agents = {:.0} deliveries/s; write -> every agent p50 {:.2} ms, p99 {:.2} ms{})",
        f.server_cpu_per_s,
        f.agents_cpu_per_s,
        per,
        kernel,
        f.server_cpu_per_s / f.changes_per_s.max(1e-9) * 1e6,
        f.changes_per_s,
        args.agents,
        deliveries,
        f.every_p50_ms,
        f.every_p99_ms,
        if args.pin {
            "; server on CPU 0, agents and writer on CPU 1"
        } else {
            ""
        }
    );
}

/// Print the CPU per delivered event of run `f` (named `name`) against
/// that of `base` (named `base_name`): in all, in the kernel and in user
/// space, and their p99 write → every agent.
fn print_against(name: &str, f: &Figures, base_name: &str, base: &Figures, agents: usize) {
    let (all, kernel) = f.per_delivery_us(agents);
    let (base_all, base_kernel) = base.per_delivery_us(agents);
    println!(
        "fan-out against {base_name}: {name}'s CPU per delivered event is {:.2}x ({:.2} µs vs {:.2} µs; in the kernel {:.2} vs {:.2} µs, in user space {:.2} vs {:.2} µs); write -> every agent p99 {:.2} ms vs {:.2} ms",
        all / base_all.max(1e-9),
        all,
        base_all,
        kernel,
        base_kernel,
        all - kernel,
        base_all - base_kernel,
        f.every_p99_ms,
        base.every_p99_ms
    );
}

/// Print how run `b` (named `bn`) compares with the baseline `a`.
fn print_ratio(an: &str, a: &Figures, bn: &str, b: &Figures) {
    let ratio = |x: f64, y: f64| x / y.max(1e-9);
    println!(
        "fan-out ratio ({an} / {bn}): {bn} reaches {:.2}x the changes/s; write -> every agent p50 {:.2}x, p99 {:.2}x lower; registrar CPU per second {:.2}x, per change {:.2}x lower",
        b.changes_per_s / a.changes_per_s.max(1e-9),
        ratio(a.every_p50_ms, b.every_p50_ms),
        ratio(a.every_p99_ms, b.every_p99_ms),
        ratio(a.server_cpu_per_s, b.server_cpu_per_s),
        ratio(
            a.server_cpu_per_s / a.changes_per_s.max(1e-9),
            b.server_cpu_per_s / b.changes_per_s.max(1e-9)
        ),
    );
}

/// Phase 1 with `encoding` in a process of its own; its output is passed
/// on, its figures returned.
async fn run_apart(args: &Args, encoding: &str) -> Res<Figures> {
    let cpu = args.pin.then_some(REGISTRAR_CPU);
    let mut child = spawn_self(args, &["--phases", "fanout", "--encoding", encoding], cpu)?;
    let stdout = child.stdout.take().ok_or("the run's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let limit = Duration::from_secs(args.seconds + 400);
    let deadline = tokio::time::Instant::now() + limit;
    let mut figures = None;
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Err(_) => {
                return Err(format!("the {encoding} run did not finish within {limit:?}").into())
            }
            Ok(line) => line?,
        };
        let Some(line) = line else { break };
        match line.strip_prefix("figures ") {
            Some(r) => {
                let v: Vec<f64> = r.split(' ').filter_map(|x| x.parse().ok()).collect();
                if let [changes, p50, p99, one_p99, server, kernel, agents, encoded] = v.as_slice()
                {
                    figures = Some(Figures {
                        changes_per_s: *changes,
                        every_p50_ms: *p50,
                        every_p99_ms: *p99,
                        one_p99_ms: *one_p99,
                        server_cpu_per_s: *server,
                        server_kernel_per_s: *kernel,
                        agents_cpu_per_s: *agents,
                        encoded: *encoded as u64,
                    });
                }
            }
            None if line.starts_with("registrar-load: ") => {}
            None => println!("{line}"),
        }
    }
    let status = child.wait().await?;
    if !status.success() {
        return Err(format!("the {encoding} run failed: {status}").into());
    }
    figures.ok_or_else(|| format!("the {encoding} run printed no figures").into())
}

/// One registrar with `encoding`, its agents in a child process.
async fn serve_one(args: &Args, encoding: StreamEncoding) -> Res<Figures> {
    let server = start(
        Arc::new(MemoryRegistry::new()),
        RegistrarConfig::new("load")
            .with_agent_buffer(65_536)
            .with_stream_encoding(encoding),
    )
    .await?;
    server.registrar.state().wait_until_ready().await;
    let rss_before = rss_bytes();
    let agents_cpu = args.pin.then_some(REGISTRAR_CPU + 1);
    let mut child = spawn_self(args, &["--fanout-client", &server.url()], agents_cpu)?;
    println!(
        "[{}] processes: registrar {}, agents and writer {}",
        label(encoding),
        std::process::id(),
        child.id().unwrap_or(0)
    );
    let stdout = child.stdout.take().ok_or("the agents' stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // Opening 1,000 connections, the writes, 30 s for the last deliveries.
    let limit = Duration::from_secs(args.seconds + 300);
    let deadline = tokio::time::Instant::now() + limit;
    let mut figures = Figures::default();
    let (mut cpu_start, mut wall_start) = (CpuMark::now(), Instant::now());
    let name = label(encoding);
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Err(_) => return Err(format!("the agents did not finish within {limit:?}").into()),
            Ok(line) => line?,
        };
        let Some(line) = line else { break };
        if line == "streams-open" {
            let rss = rss_bytes();
            println!(
                "[{name}] streams: {} agent streams open; registrar memory {:.1} KiB per stream (RSS {} -> {} MiB, registrar process only)",
                args.agents,
                rss.saturating_sub(rss_before) as f64 / args.agents as f64 / 1024.0,
                rss_before / (1 << 20),
                rss / (1 << 20)
            );
        } else if line == "writing" {
            cpu_start = CpuMark::now();
            wall_start = Instant::now();
        } else if line == "delivered" {
            (figures.server_cpu_per_s, figures.server_kernel_per_s) =
                cpu_start.per_second(wall_start.elapsed());
            figures.encoded = server.registrar.watch_stats().messages_encoded;
        } else if let Some(r) = line.strip_prefix("result ") {
            let v: Vec<f64> = r.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [changes, p50, p99, one_p99, cpu] = v.as_slice() {
                figures.changes_per_s = *changes;
                figures.every_p50_ms = *p50;
                figures.every_p99_ms = *p99;
                figures.one_p99_ms = *one_p99;
                figures.agents_cpu_per_s = *cpu;
            }
        } else {
            println!("[{name}] {line}");
        }
    }
    let status = child.wait().await?;
    if !status.success() {
        return Err(format!("the agents' process failed: {status}").into());
    }
    println!(
        "[{name}] CPU while writing and delivering: registrar {:.2} s/s, agents and writer {:.2} s/s (of 2 cores); messages encoded by the registrar: {}",
        figures.server_cpu_per_s, figures.agents_cpu_per_s, figures.encoded
    );
    print_per_delivery(name, &figures, args);
    Ok(figures)
}

/// One agent of the fan-out's child process.
enum Agent {
    /// A node's client: `RpcClient`'s watch, decoded into events (the
    /// client kept for as long as its watch).
    Client {
        _client: Box<RpcClient>,
        watch: waypost::EventStream,
    },
    /// `--light-agents`: a bare HTTP/2 reader (`light.rs`).
    Light(Box<LightAgent>),
}

impl Agent {
    /// Agent `i`'s watch on the registrar at `url`, once its snapshot is
    /// read.
    async fn open(url: &str, i: usize, light: bool) -> Res<Self> {
        let node = format!("agent-{i}");
        if light {
            let agent = LightAgent::open(url, &node)
                .await
                .map_err(|e| format!("agent {i}: {e}"))?;
            return Ok(Agent::Light(Box::new(agent)));
        }
        let raw = RpcClient::connect(ClientConfig::new(url, "load", node))?;
        let mut w = raw.watch(None);
        match w.next().await {
            Some(Ok(Event::Snapshot(_))) => Ok(Agent::Client {
                _client: Box::new(raw),
                watch: w,
            }),
            other => Err(format!("agent {i} did not get a snapshot: {other:?}").into()),
        }
    }

    /// The labels `sent` and `seq` of the next added or updated endpoint;
    /// `None` once the stream ends.
    async fn next_change(&mut self) -> Option<(u64, u64)> {
        let w = match self {
            Agent::Light(agent) => return agent.next_change().await,
            Agent::Client { watch, .. } => watch,
        };
        while let Some(Ok(ev)) = w.next().await {
            let (Event::Added { endpoint, .. } | Event::Updated { endpoint, .. }) = ev else {
                continue;
            };
            let label = |k: &str| endpoint.labels.get(k).and_then(|s| s.parse().ok());
            if let (Some(sent), Some(seq)) = (label("sent"), label("seq")) {
                return Some((sent, seq));
            }
        }
        None
    }
}

/// The child process: `agents` streams (one gRPC connection each) and a
/// writer of `rate` changes per second for `seconds`, against `url`.
/// Prints markers for the parent and a `result` line.
pub(crate) async fn client(url: &str, args: &Args) -> Res<()> {
    let writes = (args.rate * args.seconds) as usize;
    let deliveries = Arc::new(Deliveries::new(writes));
    let one = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));

    let mut agents = Vec::with_capacity(args.agents);
    for i in 0..args.agents {
        agents.push(Agent::open(url, i, args.light_agents).await?);
    }
    println!("streams-open");

    let readers: Vec<_> = agents
        .into_iter()
        .map(|mut agent| {
            let deliveries = Arc::clone(&deliveries);
            let one = Arc::clone(&one);
            tokio::spawn(async move {
                let mut local = hdrhistogram::Histogram::<u64>::new(3).ok();
                let mut seen = 0usize;
                while let Some((sent, seq)) = agent.next_change().await {
                    let now = now_micros();
                    if let Some(h) = local.as_mut() {
                        let _ = h.record(now.saturating_sub(sent).max(1));
                    }
                    deliveries.record(seq as usize, now);
                    seen += 1;
                    if seen == deliveries.len() {
                        break;
                    }
                }
                if let (Some(h), Ok(mut all)) = (local, one.lock()) {
                    let _ = all.add(h);
                }
            })
        })
        .collect();

    let writer = RegistrarClient::connect(ClientConfig::new(url, "load", "writer"))?;
    let mut sent_at = vec![0u64; writes];
    println!("writing");
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    // Ticks of 10 ms, or longer below 100 changes/s (one change each), so
    // the asked rate is the one attempted.
    let asked = args.rate.clamp(1, u64::from(u32::MAX));
    let period = Duration::from_millis(10).max(Duration::from_secs(1) / asked as u32);
    let mut tick = tokio::time::interval(period);
    let per_tick = ((asked as f64 * period.as_secs_f64()).round() as usize).max(1);
    let mut seq = 0usize;
    // Open loop: writes in flight while the next ticks go out.
    let mut inflight = futures::stream::FuturesUnordered::new();
    while seq < writes {
        if args.open_loop {
            // Below the server's 200 concurrent HTTP/2 streams per
            // connection: past that, wait for acknowledgements.
            if inflight.len() >= MAX_IN_FLIGHT {
                if let Some(r) = inflight.next().await {
                    r?;
                }
                continue;
            }
            tokio::select! {
                _ = tick.tick() => {}
                Some(r) = inflight.next(), if !inflight.is_empty() => {
                    r?;
                    continue;
                }
            }
        } else {
            tick.tick().await;
        }
        // This tick's writes go out concurrently (distinct keys).
        for _ in 0..per_tick.min(writes - seq) {
            let t = now_micros();
            sent_at[seq] = t;
            let e = Endpoint::new("load", format!("ep-{}", seq % 500), "127.0.0.1", 8080)
                .with_label("sent", t.to_string())
                .with_label("seq", seq.to_string());
            inflight.push(writer.register(e));
            seq += 1;
        }
        if !args.open_loop {
            while let Some(r) = inflight.next().await {
                r?;
            }
        }
    }
    while let Some(r) = inflight.next().await {
        r?;
    }
    let write_time = start.elapsed();
    if !join_within(readers, Duration::from_secs(30)).await {
        println!("fan-out: some agents did not receive every change within 30 s");
    }
    let cpu_per_s = (cpu_seconds() - cpu_start) / start.elapsed().as_secs_f64();
    println!("delivered");
    let (every, complete) = deliveries.every(args.agents, |seq| sent_at[seq])?;
    let one = one.lock().map_err(|_| "poisoned")?;
    let rate = writes as f64 / write_time.as_secs_f64();
    println!(
        "fan-out: {} changes in {:.1} s ({:.0}/s) to {} agents = {:.0} deliveries/s",
        writes,
        write_time.as_secs_f64(),
        rate,
        args.agents,
        (writes * args.agents) as f64 / write_time.as_secs_f64()
    );
    println!(
        "fan-out: write -> delivery at one agent p50 {} p99 {}; write -> delivered at every agent p50 {} p99 {} ({} of {} writes reached all agents)",
        pct(&one, 0.5),
        pct(&one, 0.99),
        pct(&every, 0.5),
        pct(&every, 0.99),
        complete,
        writes
    );
    let ms = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "result {rate} {} {} {} {cpu_per_s}",
        ms(&every, 0.5),
        ms(&every, 0.99),
        ms(&one, 0.99)
    );
    Ok(())
}
