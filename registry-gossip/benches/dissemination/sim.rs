//! The simulated network: N `Machine`s, lossless, 1–5 ms of delay,
//! simulated time in 5 ms steps. Datagrams in flight and the nodes' timer
//! deadlines are both in binary heaps, so a step costs what happens in it,
//! not a scan of every node.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use registry_api::{Endpoint, EndpointKey};
use registry_gossip::{GossipConfig, Machine, NodeId};

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

pub struct Sim {
    pub nodes: Vec<Machine>,
    addrs: Vec<SocketAddr>,
    index: HashMap<SocketAddr, usize>,
    pub now: Duration,
    flight: BinaryHeap<Reverse<InFlight>>,
    /// `(deadline, node)`; stale entries are skipped when popped.
    deadlines: BinaryHeap<Reverse<(Duration, usize)>>,
    seq: u64,
    pub rng: SmallRng,
    config: GossipConfig,
    /// Seeds the nodes' own randomness.
    seed: u64,
    /// Wall time spent inside `handle_datagram`, and how many calls.
    pub recv_time: Duration,
    pub recv_calls: u64,
}

impl Sim {
    pub fn new(seed: u64, config: GossipConfig) -> Sim {
        Sim {
            nodes: Vec::new(),
            addrs: Vec::new(),
            index: HashMap::new(),
            now: Duration::ZERO,
            flight: BinaryHeap::new(),
            deadlines: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
            config,
            seed,
            recv_time: Duration::ZERO,
            recv_calls: 0,
        }
    }

    /// Add a node; it joins through node `via` (if any).
    pub fn add(&mut self, via: Option<usize>) {
        let i = self.nodes.len();
        let addr = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 7000));
        let mut m = Machine::new(
            &self.config,
            addr,
            NodeId::new(format!("n{i:04}")),
            self.seed
                .wrapping_mul(0x9e37_79b9)
                .wrapping_add(0xb0b0 + i as u64),
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

    /// Move node `i`'s outbox into the network and note its next deadline.
    pub fn collect(&mut self, i: usize) {
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
        if let Some(d) = self.nodes[i].next_deadline() {
            self.deadlines.push(Reverse((d, i)));
        }
    }

    pub fn step(&mut self) {
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
        while self.deadlines.peek().is_some_and(|d| d.0 .0 <= now) {
            let Reverse((_, i)) = self.deadlines.pop().unwrap();
            if self.nodes[i].next_deadline().is_some_and(|d| d <= now) {
                self.nodes[i].tick(now);
                self.collect(i);
            }
        }
    }

    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    pub fn bytes_out(&self) -> u64 {
        self.nodes.iter().map(|m| m.stats().bytes_out).sum()
    }

    pub fn members_complete(&self) -> bool {
        let n = self.nodes.len();
        self.nodes.iter().all(|m| m.num_members() == n - 1)
    }
}

pub struct Row {
    /// From the start until every node lists every other, or `None` when
    /// the bench's bound ran out first.
    pub formed: Option<Duration>,
    /// From the write until every node holds it.
    pub spread: Duration,
    /// From a late joiner's start until it and every node list each
    /// other, or `None` when the bound ran out.
    pub late_join: Option<Duration>,
    pub interval: Duration,
    /// Bytes sent per node while forming (from the start until formed).
    pub form_bytes_per_node: f64,
    /// Bytes sent per node while the write spread.
    pub bytes_per_node: f64,
    /// Idle traffic per node per second, measured after settling.
    pub idle_per_node_s: f64,
    pub wall: Duration,
    pub datagrams: u64,
    pub recv_time: Duration,
    pub sums: Sums,
}

/// What the receive path dropped over the whole run, summed over nodes.
pub struct Sums {
    pub replays: u64,
    pub stale: u64,
    pub skewed: u64,
    pub misdirected: u64,
    pub answers_capped: u64,
    pub entries_refused: u64,
    pub members_received: u64,
}

/// One cluster of `n`: every node starts within the first gossip interval
/// and joins through node 0 (one seed, as on loopback); the clock runs
/// until every node lists every other (bounded by `form_limit` simulated);
/// after 10 s of settling, a 10 s idle window; then one node registers one
/// endpoint and the clock runs until every node holds it; 2 s later one
/// more node joins through a random member and the clock runs until the
/// membership is complete again.
pub fn measure(
    n: usize,
    seed: u64,
    config: GossipConfig,
    form_limit: Duration,
    wall_limit: Duration,
) -> Result<Row, String> {
    let started = Instant::now();
    let interval = config.gossip_interval;
    let mut sim = Sim::new(seed, config);
    // Start times spread over one gossip interval, so the nodes' timers
    // are not in phase (foca does not jitter them).
    let mut starts: Vec<Duration> = (1..n)
        .map(|_| Duration::from_micros(sim.rng.random_range(0..interval.as_micros() as u64)))
        .collect();
    starts.sort();
    let start = sim.now;
    sim.add(None);
    let mut next = 0;
    while (next < starts.len() || !sim.members_complete()) && sim.now < start + form_limit {
        while next < starts.len() && start + starts[next] <= sim.now {
            sim.add(Some(0));
            next += 1;
        }
        sim.step();
        if started.elapsed() > wall_limit {
            let full = sim
                .nodes
                .iter()
                .filter(|m| m.num_members() == n - 1)
                .count();
            let least = sim
                .nodes
                .iter()
                .map(Machine::num_members)
                .min()
                .unwrap_or(0);
            return Err(format!(
                "N = {n}: stopped at the bench's wall bound ({wall_limit:?}) after {:.2?} simulated ({:.1} rounds): {full} of {n} nodes list every other, the least knows {least}",
                sim.now - start,
                (sim.now - start).as_secs_f64() / interval.as_secs_f64()
            ));
        }
    }
    let formed = sim.members_complete().then(|| sim.now - start);
    let form_bytes = sim.bytes_out();
    eprintln!(
        "N = {n}: membership {} at {:.2?} simulated, {:.1?} wall",
        if formed.is_some() {
            "complete"
        } else {
            "NOT complete"
        },
        sim.now - start,
        started.elapsed()
    );
    sim.run_for(Duration::from_secs(10));

    let idle_window = Duration::from_secs(10);
    let before = sim.bytes_out();
    sim.run_for(idle_window);
    let idle_rate = (sim.bytes_out() - before) as f64 / idle_window.as_secs_f64();

    let key = EndpointKey::new("payments", "pod-a");
    let endpoint = Endpoint::new("payments", "pod-a", "10.1.0.7", 8080);
    let writer = n / 2;
    let t0 = sim.now;
    let before = sim.bytes_out();
    sim.nodes[writer].register(endpoint, t0).unwrap();
    sim.collect(writer);
    let limit = t0 + Duration::from_secs(120);
    while !sim.nodes.iter().all(|m| m.endpoint(&key).is_some()) {
        assert!(sim.now < limit, "N = {n}: the registration did not spread");
        sim.step();
    }
    let spread = sim.now - t0;
    let bytes = (sim.bytes_out() - before) as f64;

    // One more node joins the formed cluster through a random member.
    sim.run_for(Duration::from_secs(2));
    let via = sim.rng.random_range(0..n);
    let t1 = sim.now;
    sim.add(Some(via));
    let limit = t1 + form_limit;
    while !sim.members_complete() && sim.now < limit {
        sim.step();
    }
    let late_join = sim.members_complete().then(|| sim.now - t1);
    let sum = |f: fn(&registry_gossip::Stats) -> u64| -> u64 {
        sim.nodes.iter().map(|m| f(&m.stats())).sum()
    };
    let sums = Sums {
        replays: sum(|s| s.replays),
        stale: sum(|s| s.stale),
        skewed: sum(|s| s.skewed),
        misdirected: sum(|s| s.misdirected),
        answers_capped: sum(|s| s.answers_capped),
        entries_refused: sum(|s| s.entries_refused),
        members_received: sum(|s| s.members_received),
    };
    Ok(Row {
        formed,
        spread,
        late_join,
        interval,
        form_bytes_per_node: form_bytes as f64 / n as f64,
        bytes_per_node: bytes / n as f64,
        idle_per_node_s: idle_rate / n as f64,
        wall: started.elapsed(),
        datagrams: sim.recv_calls,
        recv_time: sim.recv_time,
        sums,
    })
}
