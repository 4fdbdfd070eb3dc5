//! The chaos soak: two `registrar serve` replicas over one backend (a
//! SQLite file, etcd, DynamoDB on moto), a fleet writing through them
//! (agents on `RegistrarClient`, durable and optimistic; plain gRPC and
//! HTTP writers, durable or optimistic at random), and a seeded random
//! schedule of faults mixed in time: replicas killed (SIGKILL), drained
//! (SIGTERM) and paused (SIGSTOP), the backend killed (etcd) or paused,
//! agents' connections cut or black-holed by a loopback proxy. Then
//! everything heals, the fleet stops, and the soak checks, within a
//! bounded quiet period: every durable acknowledgement holds, every
//! endpoint an agent holds is there, nothing deregistered came back, and
//! both replicas, the backend and every agent's cache hold the same.
//! Liveness through it all: both replicas' views are sampled during the
//! faults and never show a heartbeating agent's endpoint unhealthy; at the
//! end a node that registered once and fell silent is marked on both.
//!
//! ```sh
//! # short, as CI runs it (about a minute per backend, fixed seeds)
//! cargo test -p waypost-registrar --all-features --test it soak:: -- --nocapture
//! # long: 10 minutes per backend, a seed of your choice
//! SOAK_SECONDS=600 SOAK_SEED=42 cargo test -p waypost-registrar --all-features \
//!     --test it soak:: -- --ignored --nocapture
//! ```

mod cluster;
mod fleet;
mod liveness;

mod watchers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{watch, Mutex};
use waypost::{Endpoint, Registry, Snapshot};
use waypost_registrar_client::{Ack, ClientConfig, RegistrarClient, RpcClient};

use cluster::{Backend, Replica};
use fleet::{same, Kind, Ledger, Writer};

/// A fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillReplica(usize),
    DrainReplica(usize),
    PauseReplica(usize),
    CutAgents(usize),
    BlackHoleAgents(usize),
    KillBackend,
    PauseBackend,
}

impl Fault {
    /// What it acts on: two faults of one target never overlap.
    fn target(self) -> Option<usize> {
        match self {
            Fault::KillReplica(i)
            | Fault::DrainReplica(i)
            | Fault::PauseReplica(i)
            | Fault::CutAgents(i)
            | Fault::BlackHoleAgents(i) => Some(i),
            Fault::KillBackend | Fault::PauseBackend => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::KillReplica(_) => "SIGKILL a replica, restart it",
            Fault::DrainReplica(_) => "SIGTERM a replica (drain), restart it",
            Fault::PauseReplica(_) => "SIGSTOP a replica, SIGCONT it",
            Fault::CutAgents(_) => "cut the agents' connections to a replica",
            Fault::BlackHoleAgents(_) => "black-hole the agents' connections to a replica",
            Fault::KillBackend => "SIGKILL the backend, restart it",
            Fault::PauseBackend => "SIGSTOP the backend, SIGCONT it",
        }
    }
}

#[derive(Debug)]
struct Step {
    at: Duration,
    fault: Fault,
    lasting: Duration,
}

/// The schedule for `seconds` from `seed`: a fault every 0.5–3 s, each
/// lasting 0.2–3 s, faults of different targets overlapping.
fn schedule(seed: u64, seconds: u64, backend: &Backend) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    for i in 0..2 {
        faults.extend([
            Fault::KillReplica(i),
            Fault::DrainReplica(i),
            Fault::PauseReplica(i),
            Fault::CutAgents(i),
            Fault::BlackHoleAgents(i),
        ]);
    }
    if backend.can_restart() {
        faults.push(Fault::KillBackend);
    }
    if backend.pid().is_some() {
        faults.push(Fault::PauseBackend);
    }
    let mut steps = Vec::new();
    let mut at = Duration::from_millis(rng.random_range(500..2000));
    while at < Duration::from_secs(seconds) {
        let fault = faults[rng.random_range(0..faults.len())];
        let lasting = Duration::from_millis(rng.random_range(200..3000));
        steps.push(Step { at, fault, lasting });
        at += Duration::from_millis(rng.random_range(500..3000));
    }
    steps
}

/// The replicas and the backend, as the faults find them.
struct World {
    backend: Backend,
    replicas: Vec<Replica>,
    busy: Vec<bool>,
    backend_busy: bool,
    done: BTreeMap<Fault, u32>,
    skipped: u32,
    drains_not_clean: u32,
}

/// Apply `fault` for `lasting`, unless its target is already under one.
async fn apply(world: &Mutex<World>, fault: Fault, lasting: Duration) {
    {
        let mut w = world.lock().await;
        let busy = match fault.target() {
            Some(i) => std::mem::replace(&mut w.busy[i], true),
            None => std::mem::replace(&mut w.backend_busy, true),
        };
        if busy {
            w.skipped += 1;
            return;
        }
        let w = &mut *w;
        match fault {
            Fault::KillReplica(i) => w.replicas[i].kill().await,
            Fault::DrainReplica(i) => {
                if !w.replicas[i].terminate().await {
                    w.drains_not_clean += 1;
                }
            }
            Fault::PauseReplica(i) => w.replicas[i].pause(),
            Fault::CutAgents(i) => w.replicas[i].proxy.cut(),
            Fault::BlackHoleAgents(i) => w.replicas[i].proxy.black_hole(),
            Fault::KillBackend => w.backend.kill(),
            Fault::PauseBackend => {
                if let Some(pid) = w.backend.pid() {
                    cluster::signal(pid, "STOP");
                }
            }
        }
    }
    tokio::time::sleep(lasting).await;
    let mut w = world.lock().await;
    let w = &mut *w;
    match fault {
        Fault::KillReplica(i) | Fault::DrainReplica(i) => w.replicas[i].spawn(&w.backend).await,
        Fault::PauseReplica(i) => w.replicas[i].resume(),
        Fault::CutAgents(_) => {}
        Fault::BlackHoleAgents(i) => w.replicas[i].proxy.heal(),
        Fault::KillBackend => w.backend.restart(),
        Fault::PauseBackend => {
            if let Some(pid) = w.backend.pid() {
                cluster::signal(pid, "CONT");
            }
        }
    }
    match fault.target() {
        Some(i) => w.busy[i] = false,
        None => w.backend_busy = false,
    }
    *w.done.entry(fault).or_default() += 1;
}

/// What the final check found.
#[derive(Debug, Default)]
struct Findings {
    lost: Vec<String>,
    phantom: Vec<String>,
    unequal: Vec<String>,
}

impl Findings {
    fn ok(&self) -> bool {
        self.lost.is_empty() && self.phantom.is_empty() && self.unequal.is_empty()
    }
}

fn describe(e: Option<&Endpoint>) -> String {
    e.map_or("absent".into(), |e| {
        format!("{}:{} ({})", e.address, e.port, e.health)
    })
}

/// Check the backend's final state against the ledger and the agents,
/// and every view against the backend.
async fn check(
    backend: &Snapshot,
    views: &[(String, Snapshot)],
    ledger: &BTreeMap<waypost::EndpointKey, fleet::KeyLog>,
    writers: &[Writer],
) -> Findings {
    let mut f = Findings::default();
    for (key, log) in ledger {
        let now = backend.get(key);
        let fits = |s: &Option<Endpoint>| match (s, now) {
            (None, None) => true,
            (Some(a), Some(b)) => same(a, b),
            _ => false,
        };
        let allowed = match &log.acked {
            Some(acked) => fits(acked) || log.later.iter().any(fits),
            // Never durably acknowledged: absent (as it started) or any
            // state written.
            None => now.is_none() || log.later.iter().any(fits),
        };
        if allowed {
            continue;
        }
        let what = format!(
            "{key}: {} in the backend; last durable ack {}, {} unacknowledged writes since",
            describe(now),
            log.acked
                .as_ref()
                .map_or("none".into(), |a| describe(a.as_ref())),
            log.later.len()
        );
        match now {
            None => f.lost.push(what),
            Some(_) => f.phantom.push(what),
        }
    }
    for w in writers {
        let Some(agent) = &w.agent else { continue };
        let owned: BTreeMap<_, _> = agent.owned().into_iter().map(|e| (e.key(), e)).collect();
        for key in Writer::keys(&w.name) {
            let ok = match (owned.get(&key), backend.get(&key)) {
                (None, None) => true,
                (Some(a), Some(b)) => same(a, b),
                _ => false,
            };
            if !ok {
                let what = format!(
                    "{key}: agent {} holds {}, the backend {}",
                    w.name,
                    describe(owned.get(&key)),
                    describe(backend.get(&key))
                );
                match owned.get(&key) {
                    Some(_) => f.lost.push(what),
                    None => f.phantom.push(what),
                }
            }
        }
    }
    for (name, view) in views {
        if !view.same_endpoints(backend) {
            f.unequal.push(format!(
                "{name}: {} endpoints, the backend {}",
                view.len(),
                backend.len()
            ));
        }
    }
    f
}

/// Soaks, and the liveness tests beside them, run one at a time (each
/// starts two registrars; a soak also a fleet).
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// Run the soak on `backend` for `seconds` of faults from `seed`.
async fn soak(backend: Backend, seconds: u64, seed: u64) {
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let name = backend.name();
    println!(
        "soak[{name}]: seed {seed}, {seconds} s of faults (SOAK_SEED={seed} repeats the schedule)"
    );
    let steps = schedule(seed, seconds, &backend);
    for s in &steps {
        println!(
            "soak[{name}]: at {:>6.1} s for {:>4.1} s: {:?}",
            s.at.as_secs_f64(),
            s.lasting.as_secs_f64(),
            s.fault
        );
    }
    let mut replicas = Vec::new();
    for i in 0..2 {
        let log = dir.path().join(format!("replica-{i}.log"));
        replicas.push(Replica::start_with(&backend, log, watchers::flags()).await);
    }
    let ledger = Arc::new(Ledger::default());
    let (stop_tx, stop) = watch::channel(false);
    let kinds = [
        Kind::Agent { durable: true },
        Kind::Agent { durable: false },
        Kind::Grpc,
        Kind::Http,
    ];
    let mut writers = Vec::new();
    for (n, kind) in kinds.iter().cycle().take(8).enumerate() {
        let r = &replicas[n % 2];
        writers.push(Writer::start(
            format!("w{n}"),
            *kind,
            r.url(),
            r.http,
            seed ^ (n as u64 + 1),
            Arc::clone(&ledger),
            stop.clone(),
        ));
    }
    let agents: Vec<(String, Arc<RegistrarClient>)> = writers
        .iter()
        .filter_map(|w| Some((w.name.clone(), Arc::clone(w.agent.as_ref()?))))
        .collect();
    let sampler = watchers::Sampler::start(
        watchers::readers(&replicas),
        agents.iter().map(|(n, _)| n.clone()).collect(),
        stop.clone(),
    );
    let world = Arc::new(Mutex::new(World {
        backend,
        replicas,
        busy: vec![false; 2],
        backend_busy: false,
        done: BTreeMap::new(),
        skipped: 0,
        drains_not_clean: 0,
    }));
    let begin = tokio::time::Instant::now();
    let mut faults = Vec::new();
    for s in steps {
        tokio::time::sleep_until(begin + s.at).await;
        let world = Arc::clone(&world);
        faults.push(tokio::spawn(async move {
            apply(&world, s.fault, s.lasting).await
        }));
    }
    tokio::time::sleep_until(begin + Duration::from_secs(seconds)).await;
    for f in faults {
        tokio::time::timeout(Duration::from_secs(120), f)
            .await
            .expect("a fault did not heal")
            .unwrap();
    }
    // Healed (every fault undoes itself): the fleet stops writing.
    stop_tx.send_replace(true);
    for w in &mut writers {
        w.stop().await;
    }
    let (unhealthy, samples) = sampler.finish().await;
    // The agents go on heartbeating (a `RegistrarClient` whose process
    // lives re-asserts its endpoints, which counts as a sign of life, so
    // the silent node at the end is one that no live agent owns).
    let beating = agents.iter().map(|(n, a)| {
        let a: Arc<dyn waypost::Heartbeat> = a.clone();
        (n.clone(), a)
    });
    let _beats = watchers::Beats::start(beating.collect(), Duration::from_secs(1));
    let counts = ledger.counts();
    let log = ledger.take();
    let w = world.lock().await;
    let readers = watchers::readers(&w.replicas);
    // Quiesce: everything converges within the limit, or the soak fails
    // with what differed last.
    let limit = Duration::from_secs(120);
    let quiet = Instant::now();
    let findings = loop {
        let Some(backend) = w.backend.snapshot().await else {
            assert!(
                quiet.elapsed() < limit,
                "soak[{name}]: the backend did not answer a read within {limit:?} of healing"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let mut views = Vec::new();
        for (name, r) in &readers {
            if let Ok(s) = r.cache().snapshot().await {
                views.push((name.clone(), s));
            }
        }
        for wr in &writers {
            if let Some(a) = &wr.agent {
                if let Ok(s) = a.cache().snapshot().await {
                    views.push((format!("agent {}", wr.name), s));
                }
            }
        }
        let found = check(&backend, &views, &log, &writers).await;
        let all_views = views.len() == readers.len() + 4;
        if (found.ok() && all_views) || quiet.elapsed() > limit {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let converged = quiet.elapsed();
    for (fault, n) in &w.done {
        println!("soak[{name}]: {n:>3} × {} ({fault:?})", fault.name());
    }
    println!(
        "soak[{name}]: {} faults skipped (target already faulted); {} drains not clean",
        w.skipped, w.drains_not_clean
    );
    println!(
        "soak[{name}]: writes: {} durably acknowledged, {} optimistically, {} failed or unanswered; {} keys",
        counts.durable,
        counts.optimistic,
        counts.failed,
        log.len()
    );
    println!(
        "soak[{name}]: {} lost, {} phantom, {} views unequal; converged {:.1} s after healing; {:.0} s in all",
        findings.lost.len(),
        findings.phantom.len(),
        findings.unequal.len(),
        converged.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    if !findings.ok() {
        for line in findings
            .lost
            .iter()
            .chain(&findings.phantom)
            .chain(&findings.unequal)
        {
            println!("soak[{name}]:   {line}");
        }
        for i in 0..2 {
            let path = dir.path().join(format!("replica-{i}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            println!("soak[{name}]: replica {i}'s last log lines:");
            for l in tail.iter().rev() {
                println!("    {l}");
            }
        }
        panic!("soak[{name}] found a loss, a phantom or unequal views (seed {seed})");
    }
    assert!(counts.durable > 0, "no write was durably acknowledged");
    println!(
        "soak[{name}]: {samples} views of the replicas sampled during the faults; {} showed a live node unhealthy",
        unhealthy.len()
    );
    assert!(
        samples > 0,
        "no replica's view was sampled during the faults"
    );
    assert!(
        unhealthy.is_empty(),
        "soak[{name}]: live agents' endpoints reported unhealthy:\n{}",
        unhealthy.join("\n")
    );
    // A node that registers once and falls silent: its registration is
    // its last sign of life.
    let silent = watchers::silent_endpoint("silent-agent");
    let cfg = ClientConfig::new(
        format!("http://{}", w.replicas[0].grpc),
        "soak",
        "silent-agent",
    )
    .with_ack(Ack::Durable);
    RpcClient::connect(cfg)
        .unwrap()
        .register(silent.clone())
        .await
        .unwrap();
    #[cfg(feature = "etcd")]
    let marks = !matches!(w.backend, Backend::Etcd(_));
    #[cfg(not(feature = "etcd"))]
    let marks = true;
    let silent_since = Instant::now();
    watchers::silent_marked_on_all(&readers, &silent, marks).await;
    println!(
        "soak[{name}]: the silent node {} on both replicas {:.1} s after its last write",
        if marks { "marked" } else { "dropped" },
        silent_since.elapsed().as_secs_f64()
    );
}

fn seconds(short: u64) -> u64 {
    std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(short)
}

fn seed(fixed: u64) -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(fixed)
}

fn random_seed() -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random())
}

async fn on_sqlite(seconds: u64, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    soak(
        Backend::Sqlite(dir.path().join("registry.db")),
        seconds,
        seed,
    )
    .await;
}

#[cfg(feature = "etcd")]
async fn on_etcd(seconds: u64, seed: u64) {
    let etcd = waypost_fixtures::EtcdServer::start_process().unwrap();
    soak(Backend::Etcd(etcd), seconds, seed).await;
}

#[cfg(feature = "dynamodb")]
async fn on_dynamodb(seconds: u64, seed: u64) {
    let moto = waypost_fixtures::MotoServer::start_process().unwrap();
    soak(Backend::DynamoDb(moto, "soak".into()), seconds, seed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_on_sqlite() {
    on_sqlite(seconds(45), seed(3101)).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_on_etcd() {
    on_etcd(seconds(45), seed(3102)).await;
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_on_dynamodb() {
    on_dynamodb(seconds(45), seed(3103)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "10 minutes: SOAK_SECONDS=600 … soak:: -- --ignored"]
async fn long_on_sqlite() {
    on_sqlite(seconds(600), random_seed()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "10 minutes: SOAK_SECONDS=600 … soak:: -- --ignored"]
async fn long_on_etcd() {
    on_etcd(seconds(600), random_seed()).await;
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "10 minutes: SOAK_SECONDS=600 … soak:: -- --ignored"]
async fn long_on_dynamodb() {
    on_dynamodb(seconds(600), random_seed()).await;
}
