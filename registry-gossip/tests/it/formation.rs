//! Membership formation in a simulated network, counted in gossip rounds
//! (simulated time / gossip interval): a full membership forms, and a
//! late joiner is known everywhere, within 2·log2 N + 4 rounds. Round
//! counts, not wall-clock time: the figures do not depend on the machine.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use registry_gossip::{GossipConfig, Machine, NodeId};

const STEP: Duration = Duration::from_millis(5);

/// A datagram in flight: delivery time, sequence, to, from, bytes.
type InFlight = (Duration, u64, usize, usize, Vec<u8>);

struct Sim {
    nodes: Vec<Machine>,
    addrs: Vec<SocketAddr>,
    index: HashMap<SocketAddr, usize>,
    now: Duration,
    flight: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    rng: SmallRng,
    config: GossipConfig,
    loss: f64,
}

impl Sim {
    fn new(seed: u64, config: GossipConfig, loss: f64) -> Sim {
        Sim {
            nodes: Vec::new(),
            addrs: Vec::new(),
            index: HashMap::new(),
            now: Duration::ZERO,
            flight: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
            config,
            loss,
        }
    }

    fn add(&mut self, via: Option<usize>) {
        let i = self.nodes.len();
        let addr = SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 7000));
        let mut m = Machine::new(
            &self.config,
            addr,
            NodeId::new(format!("f{i:04}")),
            0xf00 + i as u64,
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
            if self.loss > 0.0 && self.rng.random_bool(self.loss) {
                continue;
            }
            let delay = Duration::from_millis(self.rng.random_range(1..=5));
            self.seq += 1;
            self.flight
                .push(Reverse((self.now + delay, self.seq, j, i, data)));
        }
    }

    fn step(&mut self) {
        self.now += STEP;
        let now = self.now;
        while self.flight.peek().is_some_and(|f| f.0 .0 <= now) {
            let Reverse((_, _, to, from, data)) = self.flight.pop().unwrap();
            self.nodes[to].handle_datagram(self.addrs[from], &data, now);
            self.collect(to);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].next_deadline().is_some_and(|d| d <= now) {
                self.nodes[i].tick(now);
                self.collect(i);
            }
        }
    }

    fn complete(&self) -> bool {
        let n = self.nodes.len();
        self.nodes.iter().all(|m| m.num_members() == n - 1)
    }

    /// Step until the membership is complete or `limit` has passed;
    /// returns the simulated time it took.
    fn until_complete(&mut self, limit: Duration) -> Option<Duration> {
        let start = self.now;
        while !self.complete() {
            if self.now - start > limit {
                return None;
            }
            self.step();
        }
        Some(self.now - start)
    }
}

fn bound_rounds(n: usize) -> f64 {
    2.0 * (n as f64).log2() + 4.0
}

/// `n` nodes starting within the first gossip interval, all joining
/// through node 0.
fn formed(seed: u64, n: usize, config: GossipConfig, loss: f64) -> (Sim, Option<Duration>) {
    let interval = config.gossip_interval;
    let mut sim = Sim::new(seed, config, loss);
    let mut starts: Vec<Duration> = (1..n)
        .map(|_| Duration::from_micros(sim.rng.random_range(0..interval.as_micros() as u64)))
        .collect();
    starts.sort();
    sim.add(None);
    for at in starts {
        while sim.now < at {
            sim.step();
        }
        sim.add(Some(0));
    }
    let limit = interval.mul_f64(bound_rounds(n) * 3.0);
    let took = sim.until_complete(limit).map(|_| sim.now);
    (sim, took)
}

#[test]
fn membership_of_256_forms_within_the_round_bound() {
    let config = GossipConfig::new();
    let interval = config.gossip_interval;
    let (mut sim, took) = formed(7, 256, config, 0.0);
    let took = took.expect("membership of 256 did not form at all");
    let rounds = took.as_secs_f64() / interval.as_secs_f64();
    eprintln!("256 nodes formed in {rounds:.1} rounds");
    assert!(
        rounds <= bound_rounds(256),
        "formed in {rounds:.1} rounds, bound {:.0}",
        bound_rounds(256)
    );

    // A late joiner through a random member: known to all, and knowing
    // all, within the bound too.
    sim.add(Some(100));
    let took = sim
        .until_complete(interval.mul_f64(bound_rounds(257) * 3.0))
        .expect("the late joiner was not learned by all");
    let rounds = took.as_secs_f64() / interval.as_secs_f64();
    eprintln!("late joiner known to all in {rounds:.1} rounds");
    assert!(
        rounds <= bound_rounds(257),
        "late joiner: {rounds:.1} rounds"
    );
}

#[test]
fn membership_forms_within_the_round_bound_with_loss() {
    let config = GossipConfig::new();
    let interval = config.gossip_interval;
    let (_, took) = formed(11, 64, config, 0.1);
    let took = took.expect("membership of 64 did not form with 10% loss");
    let rounds = took.as_secs_f64() / interval.as_secs_f64();
    assert!(
        rounds <= bound_rounds(64),
        "formed in {rounds:.1} rounds with 10% loss, bound {:.0}",
        bound_rounds(64)
    );
}

/// The joiner gets its seed's whole view at once (a SWIM feed alone holds
/// about 40 identities), even when the answer takes many pages: with the
/// smallest budget each pull is answered with one datagram and the joiner
/// pulls again from where it stopped.
#[test]
fn a_joiner_pulls_the_whole_view_in_pages() {
    for budget in [64 * 1024, 1] {
        let config = GossipConfig::new().with_anti_entropy_budget(budget);
        let interval = config.gossip_interval;
        let (mut sim, took) = formed(3, 150, config, 0.0);
        assert!(took.is_some(), "budget {budget}: no membership");
        sim.add(Some(42));
        let joiner = sim.nodes.len() - 1;
        // Well before its first gossip round ends (announce, feed, then
        // the pages, a few milliseconds each way).
        let mut waited = Duration::ZERO;
        while sim.nodes[joiner].num_members() < 150 && waited < interval {
            sim.step();
            waited += STEP;
        }
        let pages = sim.nodes[joiner].stats().members_received;
        assert_eq!(
            sim.nodes[joiner].num_members(),
            150,
            "budget {budget}: the joiner knows {} of 150 after {waited:?}",
            sim.nodes[joiner].num_members()
        );
        assert!(
            pages >= 150,
            "budget {budget}: only {pages} identities received"
        );
    }
}

/// Once the views agree the sync is only the digest: no member lists go
/// out while the cluster idles, yet the digests keep being compared.
#[test]
fn agreeing_views_exchange_only_digests() {
    let config = GossipConfig::new();
    let (mut sim, took) = formed(5, 32, config, 0.0);
    assert!(took.is_some(), "no membership");
    // Let the views settle, then idle.
    for _ in 0..(3000 / 5) {
        sim.step();
    }
    let before: Vec<_> = sim.nodes.iter().map(Machine::stats).collect();
    for _ in 0..(10_000 / 5) {
        sim.step();
    }
    let mut equal = 0;
    for (m, b) in sim.nodes.iter().zip(&before) {
        let s = m.stats();
        assert_eq!(
            s.members_received,
            b.members_received,
            "{}: member lists were sent while idle",
            m.node()
        );
        equal += s.member_syncs_equal - b.member_syncs_equal;
    }
    // About one digest per node per probe period (1 s) over 10 s.
    assert!(
        equal >= 32 * 5,
        "only {equal} digests compared equal in 10 s"
    );
}
