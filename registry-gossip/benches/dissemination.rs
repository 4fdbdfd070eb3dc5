//! How fast one registration reaches every node, in simulation.
//!
//! N `Machine`s with the default configuration (gossip every 200 ms,
//! probes every 1 s, anti-entropy every 30 s) on a simulated lossless
//! network with 1–5 ms of delay; time is simulated, so the figures do not
//! depend on the machine running the bench. For each N the cluster forms,
//! settles, idles for a measured window (the background SWIM traffic),
//! then one node registers one endpoint and the clock runs until every
//! node holds it.
//!
//! N = 16, 64, 256 and 512 (1024 did not finish within a couple of
//! minutes, most of it in forming the membership; `GOSSIP_BENCH_SIZES=1024`
//! runs it anyway). `GOSSIP_BENCH_NO_UDP=1` skips the loopback part.
//! `GOSSIP_BENCH_KEYED=1` gives the simulated nodes a shared key, so every
//! datagram is sealed and checked (tag, and whatever else the receive path
//! checks); compare its `COST` lines with an unkeyed run for the per-datagram
//! price of authentication.
//!
//! Printed per N: gossip rounds (simulated time / gossip interval) and
//! simulated time until all hold it, rounds / log2(N), and bytes sent per
//! node in that window against the idle traffic of a window as long. A
//! `DROPS` line sums what the receive path dropped over the run (replays,
//! stale or skewed datagrams, answers capped for unconfirmed addresses). A
//! `COST` line gives the datagrams handled in the whole run (forming,
//! settling, idling, spreading) and the wall time spent inside
//! `Machine::handle_datagram` per datagram (opening and checking the
//! frame, foca, merging, sealing the answers): the receive path a
//! per-datagram check adds to, without the simulation's own overhead.
//!
//! Then, on loopback UDP at N = 16 and 64, `GossipRegistry` (default
//! timings) side by side with the `chitchat` crate (gossip interval 200 ms,
//! the same as ours): wall time from one write on one node until every
//! node holds it, and bytes sent per node in that time (all traffic; for
//! chitchat counted through a wrapper around its UDP transport).

#![allow(clippy::unwrap_used, missing_docs)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use registry_api::{Endpoint, EndpointKey, Registry};
use registry_gossip::{GossipConfig, GossipRegistry, Machine, NodeId};

const STEP: Duration = Duration::from_millis(5);
const MAX_DELAY_MS: u64 = 5;

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Duration,
    seq: u64,
    to: usize,
    from: usize,
    data: Vec<u8>,
}

struct Sim {
    nodes: Vec<Machine>,
    addrs: Vec<SocketAddr>,
    index: HashMap<SocketAddr, usize>,
    now: Duration,
    flight: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    rng: SmallRng,
    config: GossipConfig,
    /// Wall time spent inside `handle_datagram`, and how many calls.
    recv_time: Duration,
    recv_calls: u64,
}

impl Sim {
    fn new(seed: u64, config: GossipConfig) -> Sim {
        Sim {
            nodes: Vec::new(),
            addrs: Vec::new(),
            index: HashMap::new(),
            now: Duration::ZERO,
            flight: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
            config,
            recv_time: Duration::ZERO,
            recv_calls: 0,
        }
    }

    fn add(&mut self, via: Option<usize>) {
        let i = self.nodes.len();
        let addr = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 7000));
        let mut m = Machine::new(
            &self.config,
            addr,
            NodeId::new(format!("n{i:04}")),
            0xb0b0 + i as u64,
            self.now,
        )
        .unwrap();
        if let Some(v) = via {
            m.join(self.addrs[v], self.now);
        }
        self.nodes.push(m);
        self.addrs.push(addr);
        self.index.insert(addr, i);
        self.collect(i);
    }

    fn collect(&mut self, i: usize) {
        for (to, data) in self.nodes[i].take_outbox() {
            let Some(&j) = self.index.get(&to) else {
                continue;
            };
            let delay = Duration::from_millis(self.rng.random_range(1..=MAX_DELAY_MS));
            self.seq += 1;
            self.flight.push(Reverse(InFlight {
                at: self.now + delay,
                seq: self.seq,
                to: j,
                from: i,
                data,
            }));
        }
    }

    fn step(&mut self) {
        self.now += STEP;
        let now = self.now;
        while self.flight.peek().is_some_and(|f| f.0.at <= now) {
            let Reverse(f) = self.flight.pop().unwrap();
            let from = self.addrs[f.from];
            let t = Instant::now();
            self.nodes[f.to].handle_datagram(from, &f.data, now);
            self.recv_time += t.elapsed();
            self.recv_calls += 1;
            self.collect(f.to);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].next_deadline().is_some_and(|d| d <= now) {
                self.nodes[i].tick(now);
                self.collect(i);
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    fn bytes_out(&self) -> u64 {
        self.nodes.iter().map(|m| m.stats().bytes_out).sum()
    }

    fn members_complete(&self) -> bool {
        let n = self.nodes.len();
        self.nodes.iter().all(|m| m.members().len() == n - 1)
    }
}

struct Row {
    n: usize,
    rounds: f64,
    time: Duration,
    bytes_per_node: f64,
    idle_bytes_per_node: f64,
    formed_at: Duration,
    wall: Duration,
    datagrams: u64,
    recv_time: Duration,
}

/// Whether the simulated nodes share a key (`GOSSIP_BENCH_KEYED=1`).
fn keyed() -> bool {
    std::env::var_os("GOSSIP_BENCH_KEYED").is_some_and(|v| v != "0")
}

fn measure(n: usize) -> Row {
    let started = Instant::now();
    let mut config = GossipConfig::new();
    if keyed() {
        config = config.with_auth_key(b"bench-shared-key".to_vec());
    }
    let interval = config.gossip_interval;
    let mut sim = Sim::new(n as u64, config);
    sim.add(None);
    for _ in 1..n {
        let via = sim.rng.random_range(0..sim.nodes.len());
        sim.add(Some(via));
        sim.run_for(Duration::from_millis(10));
    }
    let limit = sim.now + Duration::from_secs(300);
    while !sim.members_complete() && sim.now < limit {
        sim.run_for(Duration::from_millis(100));
    }
    eprintln!(
        "N = {n}: membership {} at {:.1?} simulated, {:.1?} wall",
        if sim.members_complete() {
            "complete"
        } else {
            "NOT complete"
        },
        sim.now,
        started.elapsed()
    );
    let formed_at = sim.now;
    // Let membership updates finish spreading before measuring anything.
    sim.run_for(Duration::from_secs(20));

    // Idle background traffic: SWIM probes and acks.
    let idle_window = Duration::from_secs(10);
    let before = sim.bytes_out();
    sim.run_for(idle_window);
    let idle_rate = (sim.bytes_out() - before) as f64 / idle_window.as_secs_f64();

    let key = EndpointKey::new("payments", "pod-a");
    let endpoint = Endpoint::new("payments", "pod-a", "10.1.0.7", 8080);
    let writer = n / 2;
    let start = sim.now;
    let before = sim.bytes_out();
    sim.nodes[writer].register(endpoint, start).unwrap();
    sim.collect(writer);
    let limit = start + Duration::from_secs(120);
    while !sim.nodes.iter().all(|m| m.endpoint(&key).is_some()) {
        assert!(sim.now < limit, "N = {n}: the registration did not spread");
        sim.step();
    }
    let time = sim.now - start;
    let bytes = (sim.bytes_out() - before) as f64;
    // What the receive path dropped over the whole run (all 0 unkeyed
    // except the answer cap): legitimate traffic should lose little.
    let sum = |f: fn(&registry_gossip::Stats) -> u64| -> u64 {
        sim.nodes.iter().map(|m| f(&m.stats())).sum()
    };
    println!(
        "DROPS N={n} keyed={} replays={} stale={} skewed={} misdirected={} answers_capped={} entries_refused={}",
        keyed(),
        sum(|s| s.replays),
        sum(|s| s.stale),
        sum(|s| s.skewed),
        sum(|s| s.misdirected),
        sum(|s| s.answers_capped),
        sum(|s| s.entries_refused),
    );
    Row {
        n,
        rounds: time.as_secs_f64() / interval.as_secs_f64(),
        time,
        bytes_per_node: bytes / n as f64,
        idle_bytes_per_node: idle_rate * time.as_secs_f64() / n as f64,
        formed_at,
        wall: started.elapsed(),
        datagrams: sim.recv_calls,
        recv_time: sim.recv_time,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter is not supported.
    let sizes: Vec<usize> = std::env::var("GOSSIP_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().parse().unwrap()).collect())
        .unwrap_or_else(|| vec![16, 64, 256, 512]);
    println!(
        "{:>5} {:>7} {:>9} {:>8} {:>14} {:>9} {:>14} {:>17} {:>9} {:>9}",
        "N",
        "log2N",
        "rounds",
        "sim time",
        "rounds/log2N",
        "bcast tx",
        "bytes/node",
        "idle bytes/node",
        "formed",
        "wall"
    );
    for n in sizes {
        if n == 0 {
            continue;
        }
        let r = measure(n);
        let log2 = (r.n as f64).log2();
        println!(
            "{:>5} {:>7.1} {:>9.1} {:>8} {:>14.2} {:>9} {:>14.0} {:>17.0} {:>9} {:>9}",
            r.n,
            log2,
            r.rounds,
            format!("{:.2?}", r.time),
            r.rounds / log2,
            registry_gossip::dissemination_count(r.n),
            r.bytes_per_node,
            r.idle_bytes_per_node,
            format!("{:.1?}", r.formed_at),
            format!("{:.1?}", r.wall),
        );
        println!(
            "RATIO N={} rounds/log2N={:.2} bytes/node={:.0} idle-same-window={:.0} ratio={:.2}",
            r.n,
            r.rounds / log2,
            r.bytes_per_node,
            r.idle_bytes_per_node,
            r.bytes_per_node / r.idle_bytes_per_node.max(1.0)
        );
        println!(
            "COST N={} keyed={} datagrams={} in-handle_datagram={:.2?} us/datagram={:.3}",
            r.n,
            keyed(),
            r.datagrams,
            r.recv_time,
            r.recv_time.as_secs_f64() * 1e6 / r.datagrams.max(1) as f64
        );
    }
    if std::env::var_os("GOSSIP_BENCH_NO_UDP").is_none() {
        loopback();
    }
}

// ------------------------------------------------------- loopback UDP side by side

/// Bytes handed to the socket by chitchat, counted through its transport.
struct Counting {
    bytes: Arc<AtomicU64>,
}

struct CountingSocket {
    inner: Box<dyn chitchat::transport::Socket>,
    bytes: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl chitchat::transport::Transport for Counting {
    async fn open(&self, addr: SocketAddr) -> anyhow::Result<Box<dyn chitchat::transport::Socket>> {
        let inner = chitchat::transport::UdpTransport.open(addr).await?;
        Ok(Box::new(CountingSocket {
            inner,
            bytes: self.bytes.clone(),
        }))
    }
}

#[async_trait::async_trait]
impl chitchat::transport::Socket for CountingSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: chitchat::ChitchatEnvelope,
    ) -> anyhow::Result<chitchat::transport::SendOutcome> {
        let out = self.inner.send(to, envelope).await?;
        self.bytes
            .fetch_add(out.num_bytes_sent as u64, AtomicOrdering::Relaxed);
        Ok(out)
    }

    async fn recv(&mut self) -> anyhow::Result<chitchat::transport::RecvOutcome> {
        self.inner.recv().await
    }
}

const POLL: Duration = Duration::from_millis(2);
const UDP_LIMIT: Duration = Duration::from_secs(60);

struct UdpRow {
    time: Duration,
    bytes_per_node: f64,
    formed: Duration,
}

/// registry-gossip's tokio driver, default timings, on 127.0.0.1.
async fn gossip_udp(n: usize) -> UdpRow {
    let started = Instant::now();
    let first = GossipRegistry::start(GossipConfig::new().with_node_name("g0000"))
        .await
        .unwrap();
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for i in 1..n {
        let config = GossipConfig::new()
            .with_node_name(format!("g{i:04}"))
            .with_seeds([seed]);
        nodes.push(GossipRegistry::start(config).await.unwrap());
    }
    while !nodes.iter().all(|g| g.members().len() == n - 1) {
        assert!(
            started.elapsed() < UDP_LIMIT,
            "gossip N = {n}: no full membership"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let formed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bytes = |nodes: &[GossipRegistry]| nodes.iter().map(|g| g.stats().bytes_out).sum::<u64>();
    let before = bytes(&nodes);
    let t0 = Instant::now();
    nodes[n / 2]
        .register(Endpoint::new("payments", "pod-a", "10.1.0.7", 8080))
        .await
        .unwrap();
    let key = EndpointKey::new("payments", "pod-a");
    while !nodes
        .iter()
        .all(|g| g.with_machine(|m| m.endpoint(&key).is_some()))
    {
        assert!(t0.elapsed() < UDP_LIMIT, "gossip N = {n}: did not converge");
        tokio::time::sleep(POLL).await;
    }
    let time = t0.elapsed();
    let sent = bytes(&nodes) - before;
    drop(nodes);
    UdpRow {
        time,
        bytes_per_node: sent as f64 / n as f64,
        formed,
    }
}

/// chitchat with the same gossip interval (200 ms) on 127.0.0.1.
async fn chitchat_udp(n: usize) -> UdpRow {
    let started = Instant::now();
    let bytes = Arc::new(AtomicU64::new(0));
    let transport = Counting {
        bytes: bytes.clone(),
    };
    let mut handles = Vec::new();
    let mut ids = Vec::new();
    let mut seed = None;
    for i in 0..n {
        let listen = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let id = chitchat::ChitchatId::new(format!("c{i:04}"), 0, listen);
        let config = chitchat::ChitchatConfig {
            chitchat_id: id.clone(),
            cluster_id: "bench".to_string(),
            gossip_interval: Duration::from_millis(200),
            listen_addr: listen,
            seed_nodes: seed.iter().map(|s: &SocketAddr| s.to_string()).collect(),
            failure_detector_config: chitchat::FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V1,
        };
        handles.push(
            chitchat::spawn_chitchat(config, Vec::new(), &transport)
                .await
                .unwrap(),
        );
        seed.get_or_insert(listen);
        ids.push(id);
    }
    loop {
        let mut complete = true;
        for h in &handles {
            if h.with_chitchat(|c| c.node_states().len()).await < n {
                complete = false;
                break;
            }
        }
        if complete {
            break;
        }
        assert!(
            started.elapsed() < UDP_LIMIT,
            "chitchat N = {n}: no full membership"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let formed = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writer = ids[n / 2].clone();
    let before = bytes.load(AtomicOrdering::Relaxed);
    let t0 = Instant::now();
    handles[n / 2]
        .with_chitchat(|c| c.self_node_state().set("payments/pod-a", "10.1.0.7:8080"))
        .await;
    loop {
        let mut all = true;
        for h in &handles {
            let seen = h
                .with_chitchat(|c| {
                    c.node_state(&writer)
                        .is_some_and(|s| s.get("payments/pod-a").is_some())
                })
                .await;
            if !seen {
                all = false;
                break;
            }
        }
        if all {
            break;
        }
        assert!(
            t0.elapsed() < UDP_LIMIT,
            "chitchat N = {n}: did not converge"
        );
        tokio::time::sleep(POLL).await;
    }
    let time = t0.elapsed();
    let sent = bytes.load(AtomicOrdering::Relaxed) - before;
    for h in handles {
        h.shutdown().await.unwrap();
    }
    UdpRow {
        time,
        bytes_per_node: sent as f64 / n as f64,
        formed,
    }
}

fn loopback() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!();
    println!("loopback UDP, gossip interval 200 ms for both; one key set on one node, until all nodes hold it");
    println!(
        "{:>5} {:>16} {:>13} {:>13} {:>16} {:>13} {:>13} {:>11} {:>11}",
        "N",
        "system",
        "converge",
        "bytes/node",
        "system",
        "converge",
        "bytes/node",
        "time ratio",
        "bytes ratio"
    );
    for n in [16, 64] {
        let g = rt.block_on(gossip_udp(n));
        let c = rt.block_on(chitchat_udp(n));
        println!(
            "{:>5} {:>16} {:>13} {:>13.0} {:>16} {:>13} {:>13.0} {:>11.2} {:>11.2}",
            n,
            "registry-gossip",
            format!("{:.1?}", g.time),
            g.bytes_per_node,
            "chitchat",
            format!("{:.1?}", c.time),
            c.bytes_per_node,
            g.time.as_secs_f64() / c.time.as_secs_f64(),
            g.bytes_per_node / c.bytes_per_node.max(1.0),
        );
        println!(
            "RATIO N={n} gossip/chitchat time={:.2} bytes={:.2} (membership formed in {:.1?} / {:.1?})",
            g.time.as_secs_f64() / c.time.as_secs_f64(),
            g.bytes_per_node / c.bytes_per_node.max(1.0),
            g.formed,
            c.formed
        );
    }
}
