//! Replay protection, bounded answers and bounded clocks, on the pure
//! state machine: real frames captured from one node and replayed to
//! another, with simulated time (no sleeps) and every datagram delivered
//! at once, so each step is deterministic.

use std::net::SocketAddr;
use std::time::Duration;

use registry_api::{Endpoint, EndpointKey, ErrorKind};
use registry_gossip::crdt::micros;
use registry_gossip::wire::{self, AeMessage, FrameHeader, FrameKey, Kind};
use registry_gossip::{Entry, GossipConfig, Machine, NodeId, Stamp};

const KEY: &[u8] = b"replay-test-key";
/// Simulated wall clock: a real UNIX time, so counters and timestamps have
/// their real size.
const T0: Duration = Duration::from_secs(1_764_000_000);
const STEP: Duration = Duration::from_millis(10);

fn keyed() -> GossipConfig {
    // fast(): tombstones kept 5 s, clocks at most 2 s apart.
    GossipConfig::fast().with_auth_key(KEY.to_vec())
}

/// A datagram that went over the simulated wire.
#[derive(Clone)]
struct Sent {
    from: usize,
    to: usize,
    data: Vec<u8>,
}

impl Sent {
    fn kind(&self) -> u8 {
        self.data[2]
    }
}

struct Net {
    nodes: Vec<Machine>,
    addrs: Vec<SocketAddr>,
    config: GossipConfig,
    now: Duration,
    /// Every datagram delivered, in order.
    log: Vec<Sent>,
    /// Datagrams sent to addresses that are not nodes: (to, data).
    elsewhere: Vec<(SocketAddr, Vec<u8>)>,
}

impl Net {
    fn new(config: GossipConfig) -> Net {
        Net {
            nodes: Vec::new(),
            addrs: Vec::new(),
            config,
            now: T0,
            log: Vec::new(),
            elsewhere: Vec::new(),
        }
    }

    fn addr(i: usize) -> SocketAddr {
        format!("127.0.0.1:{}", 31_000 + i).parse().unwrap()
    }

    fn machine(&self, i: usize) -> Machine {
        Machine::new(
            &self.config,
            Net::addr(i),
            NodeId::new(format!("n{i}")),
            (i as u64 + 1) * 7919 + micros(self.now),
            self.now,
        )
        .unwrap()
    }

    /// Add node `i` (the next index), joining through `via`.
    fn add(&mut self, via: Option<usize>) -> usize {
        let i = self.nodes.len();
        let mut m = self.machine(i);
        if let Some(v) = via {
            m.join(self.addrs[v], self.now);
        }
        self.nodes.push(m);
        self.addrs.push(Net::addr(i));
        i
    }

    /// Replace node `i` by a fresh run under the same name and address.
    fn restart(&mut self, i: usize, via: usize) {
        let mut m = self.machine(i);
        m.join(self.addrs[via], self.now);
        self.nodes[i] = m;
    }

    /// Deliver everything queued, at once, until the network is quiet.
    fn flush(&mut self) {
        loop {
            let mut moved = false;
            for from in 0..self.nodes.len() {
                for (to, data) in self.nodes[from].take_outbox() {
                    moved = true;
                    match self.addrs.iter().position(|a| *a == to) {
                        Some(t) => {
                            let now = self.now;
                            self.nodes[t].handle_datagram(self.addrs[from], &data, now);
                            self.log.push(Sent { from, to: t, data });
                        }
                        None => self.elsewhere.push((to, data)),
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Advance the clock one step and fire what is due.
    fn step(&mut self) {
        self.now += STEP;
        let now = self.now;
        for m in &mut self.nodes {
            if m.next_deadline().is_some_and(|d| d <= now) {
                m.tick(now);
            }
        }
        self.flush();
    }

    /// Step until `cond` holds; false when `limit` of simulated time passed
    /// first.
    fn run_until(&mut self, limit: Duration, mut cond: impl FnMut(&Net) -> bool) -> bool {
        let end = self.now + limit;
        self.flush();
        while self.now < end {
            if cond(self) {
                return true;
            }
            self.step();
        }
        cond(self)
    }

    fn joined(&mut self) {
        let n = self.nodes.len();
        assert!(
            self.run_until(Duration::from_secs(20), |net| net
                .nodes
                .iter()
                .all(|m| m.members().len() == n - 1)),
            "membership did not complete"
        );
    }

    /// Hand `data` to node `to` as if it came from `from`; returns what the
    /// node queued in answer (not delivered).
    fn inject(&mut self, to: usize, from: SocketAddr, data: &[u8]) -> Vec<(SocketAddr, Vec<u8>)> {
        self.flush();
        let now = self.now;
        self.nodes[to].handle_datagram(from, data, now);
        self.nodes[to].take_outbox()
    }
}

fn ep(id: &str) -> Endpoint {
    Endpoint::new("replay", id, "10.0.0.1", 80)
}

fn spoofed() -> SocketAddr {
    "127.0.0.1:39999".parse().unwrap()
}

/// Frame `msg` as the test's own keyed sender `tester` for node `to`.
fn sealed(msg: &AeMessage, to: SocketAddr, counter: u64) -> Vec<u8> {
    let header = FrameHeader {
        counter,
        dest: to,
        sender: "tester",
    };
    wire::seal(
        msg.kind(),
        &msg.encode().unwrap(),
        Some((&FrameKey::new(KEY), &header)),
    )
    .unwrap()
}

#[test]
fn a_replayed_push_does_not_resurrect_a_collected_endpoint() {
    let mut net = Net::new(keyed());
    let a = net.add(None);
    let e = ep("zombie");
    let key = e.key();
    net.nodes[a].register(e.clone(), T0).unwrap();
    // b joins late: it gets the endpoint by an anti-entropy push.
    let b = net.add(Some(a));
    net.joined();
    assert!(net.run_until(Duration::from_secs(10), |n| n.nodes[b]
        .endpoint(&key)
        .is_some()));
    let pushes: Vec<Sent> = net
        .log
        .iter()
        .filter(|s| s.from == a && s.to == b && s.kind() == Kind::Push as u8)
        .cloned()
        .collect();
    assert!(!pushes.is_empty(), "no push from a to b was captured");

    // Deregister; the tombstone spreads and, after the TTL, b collects it.
    // (Only b is waited for: with two nodes and instant delivery, the
    // anti-entropy exchange can hand a collected tombstone back to the
    // node that collected it first.)
    net.nodes[a].deregister(&key, net.now);
    assert!(net.run_until(Duration::from_secs(2), |n| n.nodes[b]
        .entry(&key)
        .is_some_and(|t| t.is_tombstone())));
    assert!(net.run_until(Duration::from_secs(30), |n| n.nodes[b]
        .entry(&key)
        .is_none()));
    assert!(net.nodes[b].stats().tombstones_collected >= 1);

    // Replayed to b, from a's address and from a spoofed one: dropped.
    let before = net.nodes[b].stats();
    for p in &pushes {
        assert!(net.inject(b, net.addrs[a], &p.data).is_empty());
        assert!(net.inject(b, spoofed(), &p.data).is_empty());
    }
    let after = net.nodes[b].stats();
    assert_eq!(
        after.stale + after.replays - before.stale - before.replays,
        2 * pushes.len() as u64
    );
    assert!(net.nodes[b].entry(&key).is_none());
    assert!(net.nodes[a].endpoint(&key).is_none());

    // b restarts: its replay windows are gone, the captured counters are
    // new to it. They are stale all the same.
    net.restart(b, a);
    net.joined();
    let stale_before = net.nodes[b].stats().stale;
    for p in &pushes {
        net.inject(b, net.addrs[a], &p.data);
        assert!(net.nodes[b].endpoint(&key).is_none());
    }
    assert_eq!(
        net.nodes[b].stats().stale - stale_before,
        pushes.len() as u64
    );
}

#[test]
fn a_replayed_digest_or_want_gets_no_answer() {
    let mut net = Net::new(keyed());
    let a = net.add(None);
    for i in 0..20 {
        net.nodes[a].register(ep(&format!("e{i}")), T0).unwrap();
    }
    let b = net.add(Some(a));
    net.joined();
    assert!(
        net.run_until(Duration::from_secs(10), |n| n.nodes[b].endpoints().len()
            == 20)
    );
    let of_kind = |net: &Net, from: usize, to: usize, kind: Kind| {
        net.log
            .iter()
            .rev()
            .find(|s| s.from == from && s.to == to && s.kind() == kind as u8)
            .cloned()
    };
    // A digest from b to a (b's catch-up exchange), and a's want back.
    let digest = of_kind(&net, b, a, Kind::Digest).expect("a digest from b to a");
    let want = of_kind(&net, a, b, Kind::Want).expect("a want from a to b");

    let before_a = net.nodes[a].stats();
    let before_b = net.nodes[b].stats();
    // From a spoofed address (the reflection attack) and from the real
    // sender's address: nothing answered, every copy counted as a replay.
    for from in [spoofed(), net.addrs[b]] {
        assert_eq!(net.inject(a, from, &digest.data), vec![]);
    }
    for from in [spoofed(), net.addrs[a]] {
        assert_eq!(net.inject(b, from, &want.data), vec![]);
    }
    assert_eq!(net.nodes[a].stats().replays - before_a.replays, 2);
    assert_eq!(net.nodes[b].stats().replays - before_b.replays, 2);

    // A digest captured on its way to a and replayed to b instead: the
    // authenticated destination is a, so b drops it.
    let misdirected = net.nodes[b].stats().misdirected;
    assert_eq!(net.inject(b, spoofed(), &digest.data), vec![]);
    assert_eq!(net.nodes[b].stats().misdirected, misdirected + 1);
}

#[test]
fn answers_to_an_unconfirmed_address_are_at_most_twice_the_request() {
    let mut net = Net::new(keyed());
    let a = net.add(None);
    for i in 0..40 {
        net.nodes[a]
            .register(ep(&format!("e{i}")).with_label("pad", "x".repeat(200)), T0)
            .unwrap();
    }
    // A fresh, valid digest that claims to have nothing: the answer would
    // push all 40 entries (about 10 KB) to wherever it says it came from.
    let empty = AeMessage::Digest {
        lo: 0,
        hi: u64::MAX,
        items: vec![],
    };
    let counter = micros(net.now);
    let request = sealed(&empty, net.addrs[a], counter);
    let answers = net.inject(a, spoofed(), &request);
    let bytes: usize = answers.iter().map(|(_, d)| d.len()).sum();
    assert!(
        bytes <= 2 * request.len(),
        "{bytes} bytes answered to a {}-byte request",
        request.len()
    );
    assert!(net.nodes[a].stats().answers_capped >= 1);

    // The same request from a member's address is answered in full.
    let b = net.add(Some(a));
    net.joined();
    // Framed as b (the test holds the key), with a counter b has not used.
    let header = FrameHeader {
        counter: micros(net.now) + 500_000,
        dest: net.addrs[a],
        sender: "n1",
    };
    let from_b = wire::seal(
        Kind::Digest,
        &empty.encode().unwrap(),
        Some((&FrameKey::new(KEY), &header)),
    )
    .unwrap();
    let answers = net.inject(a, net.addrs[b], &from_b);
    let pushed: usize = answers
        .iter()
        .filter(|(_, d)| d[2] == Kind::Push as u8)
        .map(|(_, d)| d.len())
        .sum();
    assert!(pushed > 8_000, "only {pushed} bytes pushed to a member");
}

#[test]
fn entries_stamped_too_far_ahead_are_refused_and_leave_the_clock() {
    let mut net = Net::new(keyed());
    let a = net.add(None);
    net.flush();
    let skew = micros(keyed().max_clock_skew);
    let now = micros(net.now);
    let stamped = |id: &str, ts: u64| {
        Entry::live(
            ep(id),
            Stamp {
                ts,
                gen: 1,
                writer: NodeId::new("tester"),
            },
        )
    };
    let clock = net.nodes[a].replica().clock();
    let mut counter = now;
    for (id, ts) in [("max", u64::MAX), ("ahead", now + skew + 1)] {
        counter += 1;
        let push = AeMessage::Push {
            entries: vec![stamped(id, ts)],
        };
        net.inject(a, spoofed(), &sealed(&push, net.addrs[a], counter));
        assert!(net.nodes[a]
            .entry(&EndpointKey::new("replay", id))
            .is_none());
        assert_eq!(
            net.nodes[a].replica().clock(),
            clock,
            "{id} moved the clock"
        );
    }
    assert_eq!(net.nodes[a].stats().entries_refused, 2);
    // A local write after them is stamped from the local clock.
    net.nodes[a].register(ep("local"), net.now).unwrap();
    let ts = net.nodes[a].entry(&ep("local").key()).unwrap().stamp.ts;
    assert!(ts <= now + 1_000, "local write stamped {ts}, now {now}");
    // Exactly at the bound is accepted.
    let push = AeMessage::Push {
        entries: vec![stamped("edge", now + skew)],
    };
    net.inject(a, spoofed(), &sealed(&push, net.addrs[a], counter + 1));
    assert!(net.nodes[a]
        .entry(&EndpointKey::new("replay", "edge"))
        .is_some());
    assert_eq!(net.nodes[a].stats().entries_refused, 2);
}

#[test]
fn a_keyed_cluster_works_and_drops_nothing_of_its_own() {
    let mut net = Net::new(keyed());
    let a = net.add(None);
    let b = net.add(Some(a));
    let c = net.add(Some(b));
    net.joined();
    net.nodes[c].register(ep("c"), net.now).unwrap();
    net.nodes[a].register(ep("a"), net.now).unwrap();
    assert!(net.run_until(Duration::from_secs(10), |n| n
        .nodes
        .iter()
        .all(|m| m.endpoints().len() == 2)));
    net.run_until(Duration::from_secs(5), |_| false);
    for m in &net.nodes {
        let s = m.stats();
        assert_eq!(
            (s.replays, s.stale, s.skewed, s.misdirected, s.auth_failures),
            (0, 0, 0, 0, 0),
            "{s:?}"
        );
    }
    assert!(net.elsewhere.is_empty());
}

#[test]
fn a_node_whose_clock_is_too_far_ahead_is_not_heard() {
    let mut net = Net::new(keyed());
    let a = net.add(None);
    net.flush();
    let skew = keyed().max_clock_skew;
    // A node whose clock runs skew + 1 s ahead announces itself to a.
    let mut fast = Machine::new(
        &keyed(),
        Net::addr(9),
        NodeId::new("fast"),
        3,
        net.now + skew + Duration::from_secs(1),
    )
    .unwrap();
    fast.join(net.addrs[a], net.now + skew + Duration::from_secs(1));
    for (to, data) in fast.take_outbox() {
        assert_eq!(to, net.addrs[a]);
        assert!(net.inject(a, Net::addr(9), &data).is_empty());
    }
    assert!(net.nodes[a].stats().skewed >= 1);
    assert!(net.nodes[a].members().is_empty());
}

#[test]
fn max_clock_skew_is_validated() {
    let too_small = keyed().with_max_clock_skew(Duration::from_micros(10));
    let too_big = keyed().with_max_clock_skew(Duration::from_secs(3));
    for bad in [too_small, too_big] {
        let err = bad.validate().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("max_clock_skew"), "{err}");
    }
    assert!(keyed().validate().is_ok());
    assert!(GossipConfig::default().validate().is_ok());
    // A name too long for the replay header.
    let long = keyed().with_node_name("n".repeat(256));
    let addr = Net::addr(0);
    let err = Machine::new(&long, addr, NodeId::new("n".repeat(256)), 1, T0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}
