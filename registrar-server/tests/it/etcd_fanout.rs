//! Side by side: what users would run without the registrar,
//! each of 1,000 watchers holding its own etcd watch (an `EtcdRegistry`
//! of its own: one connection, one watch), against the same 1,000 watchers
//! on one registrar over the same etcd. The same writer (an `EtcdRegistry`
//! registering one new endpoint per change, straight into etcd) in both.
//! Printed: delivery latency (write → one watcher, write → every
//! watcher, p50/p99), etcd's CPU time and RSS (read from `/proc`, so etcd
//! runs as a local process), its established client connections, and this
//! process's CPU time (the watchers, and in the second run the registrar).
//! Bounded: every phase has a deadline; everything on loopback.
//!
//! ```sh
//! cargo test --release -p waypost-registrar-server --features etcd --test it etcd_fanout:: -- --ignored --nocapture
//! ```
//!
//! `FANOUT_WATCHERS`, `FANOUT_CHANGES` and `FANOUT_RATE` (changes/s)
//! change the defaults (1,000, 1,000, 200).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use waypost::stack::{stack, StackConfig};
use waypost::{Endpoint, Event, Registry, Watch};
use waypost_etcd::{EtcdConfig, EtcdRegistry};
use waypost_fixtures::EtcdServer;
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use waypost_registrar_client::proto::registrar::v1::WatchEndpointsRequest;
use waypost_registrar_server::{Backend, Opening, RegistrarConfig};

/// Every phase ends by this deadline, finished or not.
const PHASE_LIMIT: Duration = Duration::from_secs(180);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time (user + system) of process `pid` so far, in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parens.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

/// Established TCP connections whose local port is `port` (the server
/// side of the connections to it), from `/proc/net/tcp{,6}`.
fn connections_to(port: u16) -> usize {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| {
            t.lines()
                .skip(1)
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 3 && f[1].ends_with(&hex) && f[3] == "01"
                })
                .count()
        })
        .sum()
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i] as f64 / 1000.0
}

/// When each change was written and when each watcher saw it, in µs
/// since the start.
struct Clock {
    start: Instant,
    written: Vec<AtomicU64>,
    ready: AtomicUsize,
}

impl Clock {
    fn new(changes: usize) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            written: (0..changes).map(|_| AtomicU64::new(0)).collect(),
            ready: AtomicUsize::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
}

fn change_of(id: &str) -> Option<usize> {
    id.strip_prefix('c')?.parse().ok()
}

/// What one watcher saw: `(change, µs)`, each change once.
type Seen = Vec<(usize, u64)>;

fn record(seen: &mut Seen, have: &mut [bool], clock: &Clock, id: &str) {
    if let Some(i) = change_of(id).filter(|i| *i < have.len()) {
        if !have[i] {
            have[i] = true;
            seen.push((i, clock.now()));
        }
    }
}

/// A watcher with an `EtcdRegistry` (connection and watch) of its own.
async fn direct_watcher(cfg: EtcdConfig, clock: Arc<Clock>, changes: usize) -> Seen {
    let reg = EtcdRegistry::connect(cfg).await.unwrap();
    let mut events = reg.watch(None);
    let (mut seen, mut have) = (Vec::with_capacity(changes), vec![false; changes]);
    let deadline = tokio::time::Instant::now() + PHASE_LIMIT;
    let mut first = true;
    while seen.len() < changes {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, events.next()).await else {
            break;
        };
        match ev {
            Ok(Event::Snapshot(s)) => {
                if first {
                    first = false;
                    clock.ready.fetch_add(1, Ordering::SeqCst);
                }
                for e in s.iter() {
                    record(&mut seen, &mut have, &clock, &e.id);
                }
            }
            Ok(Event::Added { endpoint, .. }) | Ok(Event::Updated { endpoint, .. }) => {
                record(&mut seen, &mut have, &clock, &endpoint.id)
            }
            Ok(Event::Removed { .. }) => {}
            Err(e) => panic!("direct watcher: {e}"),
        }
    }
    drop(reg);
    seen
}

/// A watcher on the registrar: one gRPC connection, `WatchEndpoints`.
async fn registrar_watcher(url: String, clock: Arc<Clock>, changes: usize) -> Seen {
    // 1,000 connections at once can overflow the listen backlog: retry
    // as an agent would (bounded).
    let mut tries = 0;
    let mut stream = loop {
        let opened = async {
            Grpc::connect(url.clone())
                .await
                .map_err(|e| e.to_string())?
                .watch_endpoints(WatchEndpointsRequest::default())
                .await
                .map_err(|e| e.to_string())
        };
        match opened.await {
            Ok(s) => break s.into_inner(),
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("watcher: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100 * tries)).await;
            }
            Err(e) => panic!("watcher: {e}"),
        }
    };
    let (mut seen, mut have) = (Vec::with_capacity(changes), vec![false; changes]);
    let deadline = tokio::time::Instant::now() + PHASE_LIMIT;
    let mut first = true;
    while seen.len() < changes {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await else {
            break;
        };
        let ev = ev.unwrap();
        if ev.r#type == EventType::FullSnapshot as i32 {
            if first && ev.snapshot_last {
                first = false;
                clock.ready.fetch_add(1, Ordering::SeqCst);
            }
            for e in &ev.snapshot_endpoints {
                record(&mut seen, &mut have, &clock, &e.id);
            }
        } else if let Some(e) = &ev.endpoint {
            if ev.r#type != EventType::EndpointRemoved as i32 {
                record(&mut seen, &mut have, &clock, &e.id);
            }
        }
    }
    seen
}

/// Register `changes` new endpoints at `rate` per second, straight into
/// etcd.
async fn write(cfg: EtcdConfig, clock: &Clock, changes: usize, rate: usize) {
    let writer = EtcdRegistry::connect(cfg).await.unwrap();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    for i in 0..changes {
        tick.tick().await;
        clock.written[i].store(clock.now(), Ordering::SeqCst);
        writer
            .register(Endpoint::new("fanout", format!("c{i}"), "10.0.0.1", 8080))
            .await
            .unwrap();
    }
}

struct Figures {
    one: (f64, f64),
    every: (f64, f64),
    complete: usize,
    etcd_cpu: f64,
    /// etcd's RSS before the watchers connected, and once every change
    /// was delivered.
    etcd_rss: (f64, f64),
    etcd_conns: usize,
    own_cpu: f64,
}

impl Figures {
    fn print(&self, name: &str, watchers: usize, changes: usize) {
        println!(
            "RESULT {name:<9} watchers={watchers} changes={changes} \
             write->one p50={:.2}ms p99={:.2}ms write->every p50={:.2}ms p99={:.2}ms \
             complete={}/{changes} etcd-cpu={:.2}s etcd-rss={:.0}->{:.0}MiB etcd-connections={} \
             this-process-cpu={:.2}s",
            self.one.0,
            self.one.1,
            self.every.0,
            self.every.1,
            self.complete,
            self.etcd_cpu,
            self.etcd_rss.0,
            self.etcd_rss.1,
            self.etcd_conns,
            self.own_cpu,
        );
    }
}

/// Start the watchers, wait until each holds its first snapshot, write,
/// collect, and measure.
async fn run<F, Fut>(
    etcd_pid: &str,
    etcd_port: u16,
    writer: EtcdConfig,
    watchers: usize,
    changes: usize,
    rate: usize,
    watcher: F,
) -> Figures
where
    F: Fn(Arc<Clock>) -> Fut,
    Fut: std::future::Future<Output = Seen> + Send + 'static,
{
    let clock = Clock::new(changes);
    let cpu0 = (cpu_seconds(etcd_pid), cpu_seconds("self"));
    let rss0 = rss_mib(etcd_pid);
    let tasks: Vec<_> = (0..watchers)
        .map(|_| tokio::spawn(watcher(Arc::clone(&clock))))
        .collect();
    let deadline = Instant::now() + PHASE_LIMIT;
    while clock.ready.load(Ordering::SeqCst) < watchers {
        assert!(
            Instant::now() < deadline,
            "only {} of {watchers} watchers ready",
            clock.ready.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let etcd_conns = connections_to(etcd_port);
    write(writer, &clock, changes, rate).await;
    let mut every = vec![0u64; changes];
    let mut got = vec![0usize; changes];
    let mut one = Vec::with_capacity(watchers * changes);
    for t in tasks {
        for (i, at) in t.await.unwrap() {
            let lat = at.saturating_sub(clock.written[i].load(Ordering::SeqCst));
            one.push(lat);
            every[i] = every[i].max(lat);
            got[i] += 1;
        }
    }
    let complete = got.iter().filter(|n| **n == watchers).count();
    let mut every: Vec<u64> = every
        .into_iter()
        .zip(&got)
        .filter(|(_, n)| **n == watchers)
        .map(|(l, _)| l)
        .collect();
    one.sort_unstable();
    every.sort_unstable();
    Figures {
        one: (percentile(&one, 0.5), percentile(&one, 0.99)),
        every: (percentile(&every, 0.5), percentile(&every, 0.99)),
        complete,
        etcd_cpu: cpu_seconds(etcd_pid) - cpu0.0,
        etcd_rss: (rss0, rss_mib(etcd_pid)),
        etcd_conns,
        own_cpu: cpu_seconds("self") - cpu0.1,
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
async fn watchers_on_etcd_directly_vs_on_the_registrar() {
    let watchers = env_or("FANOUT_WATCHERS", 1000);
    let changes = env_or("FANOUT_CHANGES", 1000);
    let rate = env_or("FANOUT_RATE", 200);
    let etcd = tokio::task::spawn_blocking(EtcdServer::start_process)
        .await
        .unwrap()
        .unwrap();
    let pid = etcd.pid().unwrap().to_string();
    let port: u16 = etcd.endpoint().rsplit(':').next().unwrap().parse().unwrap();
    let cfg = |prefix: &str| EtcdConfig::new(vec![etcd.endpoint().to_string()]).with_prefix(prefix);
    println!(
        "etcd pid {pid} at {}; idle RSS {:.0} MiB; {watchers} watchers, {changes} changes at \
         {rate}/s; load average {}",
        etcd.endpoint(),
        rss_mib(&pid),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    // First (so that etcd's memory grown by the 1,000 connections does not
    // count against it) one registrar over etcd, the watchers on it.
    let via_cfg = cfg("/fanout-registrar");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let backend_cfg = via_cfg.clone();
    let server = tokio::spawn(Opening::new(RegistrarConfig::new("default")).serve(
        move || {
            let cfg = backend_cfg.clone();
            async move {
                let b: Arc<dyn Backend> =
                    stack(EtcdRegistry::connect(cfg).await?, &StackConfig::default())?;
                Ok(b)
            }
        },
        grpc,
        health,
        async move {
            let _ = stopped.await;
        },
    ));
    // The registrar takes calls once its backend is open: wait for that,
    // so that the watchers' burst of connections meets a serving registrar.
    let deadline = Instant::now() + PHASE_LIMIT;
    loop {
        use waypost_registrar_client::proto::registrar::v1::ListAllEndpointsRequest;
        let listed = async {
            Grpc::connect(url.clone())
                .await
                .ok()?
                .list_all_endpoints(ListAllEndpointsRequest {})
                .await
                .ok()
        };
        if listed.await.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the registrar did not open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let via = run(&pid, port, via_cfg, watchers, changes, rate, |clock| {
        registrar_watcher(url.clone(), clock, changes)
    })
    .await;
    via.print("registrar", watchers, changes);
    // Then each watcher with its own etcd connection and watch.
    let direct_cfg = cfg("/fanout-direct");
    let direct = run(
        &pid,
        port,
        direct_cfg.clone(),
        watchers,
        changes,
        rate,
        |clock| direct_watcher(direct_cfg.clone(), clock, changes),
    )
    .await;
    direct.print("direct", watchers, changes);

    println!(
        "RATIO registrar/direct write->every p99={:.2} p50={:.2} write->one p99={:.2} \
         etcd-cpu={:.3} etcd-connections={:.4} etcd-rss-growth={:.3}",
        via.every.1 / direct.every.1,
        via.every.0 / direct.every.0,
        via.one.1 / direct.one.1,
        via.etcd_cpu / direct.etcd_cpu,
        via.etcd_conns as f64 / direct.etcd_conns as f64,
        (via.etcd_rss.1 - via.etcd_rss.0) / (direct.etcd_rss.1 - direct.etcd_rss.0),
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .expect("the registrar did not stop")
        .unwrap()
        .unwrap();
    assert_eq!(direct.complete, changes, "direct watchers missed changes");
    assert_eq!(via.complete, changes, "registrar watchers missed changes");
}
