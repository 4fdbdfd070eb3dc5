//! Replay protection, bounded answers and bounded clocks, on the pure
//! state machine: real frames captured from one node and replayed to
//! another, with simulated time (no sleeps) and every datagram delivered
//! at once, so each step is deterministic.

use std::net::SocketAddr;
use std::time::Duration;

use waypost::{Endpoint, EndpointKey, ErrorKind};
use waypost_gossip::sim::{micros, Delivery, Identity, NodeStart, Sim, SimConfig, TickOrder};
use waypost_gossip::wire::{self, AeMessage, FrameHeader, FrameKey, Kind};
use waypost_gossip::{Entry, GossipConfig, Machine, NodeId, Stamp};

const KEY: &[u8] = b"replay-test-key";
/// Simulated wall clock: a real UNIX time, so counters and timestamps have
/// their real size.
const T0: Duration = Duration::from_secs(1_764_000_000);

fn keyed() -> GossipConfig {
    // fast(): tombstones kept 5 s, clocks at most 2 s apart.
    GossipConfig::fast().with_auth_key(KEY.to_vec())
}

fn addr(i: usize) -> SocketAddr {
    format!("127.0.0.1:{}", 31_000 + i).parse().unwrap()
}

/// Node `i` of these tests: `127.0.0.1:31000 + i`, `n42`, seeded by its
/// index and the time it starts at.
fn identity(start: &NodeStart) -> Identity {
    let i = start.index;
    Identity {
        addr: addr(i),
        name: NodeId::new(format!("n{i}")),
        seed: (i as u64 + 1) * 7919 + micros(start.now),
    }
}

/// Every datagram delivered at once and recorded, 10 ms steps, from T0.
fn new_net(config: GossipConfig) -> Sim {
    let config = SimConfig::new(config)
        .with_start(T0)
        .with_step(Duration::from_millis(10))
        .with_delivery(Delivery::Instant)
        .with_tick_order(TickOrder::ByIndex)
        .with_identities(identity)
        .with_record(true);
    Sim::new(config).unwrap()
}

fn joined(net: &mut Sim) {
    assert!(
        net.run_until(Duration::from_secs(20), Sim::members_complete),
        "membership did not complete"
    );
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
    let mut net = new_net(keyed());
    let a = net.add(None);
    let e = ep("zombie");
    let key = e.key();
    net.register(a, e.clone()).unwrap();
    // b joins late: it gets the endpoint by an anti-entropy push.
    let b = net.add(Some(a));
    joined(&mut net);
    assert!(net.run_until(Duration::from_secs(10), |n| n
        .node(b)
        .endpoint(&key)
        .is_some()));
    let pushes: Vec<_> = net
        .log()
        .iter()
        .filter(|s| s.from == a && s.to == b && s.kind() == Some(Kind::Push))
        .cloned()
        .collect();
    assert!(!pushes.is_empty(), "no push from a to b was captured");

    // Deregister; the tombstone spreads and, after the TTL, b collects it.
    // (Only b is waited for: with two nodes and instant delivery, the
    // anti-entropy exchange can hand a collected tombstone back to the
    // node that collected it first.)
    net.deregister(a, &key);
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .node(b)
        .entry(&key)
        .is_some_and(|t| t.is_tombstone())));
    assert!(net.run_until(Duration::from_secs(30), |n| n.node(b).entry(&key).is_none()));
    assert!(net.node(b).stats().tombstones_collected >= 1);

    // Replayed to b, from a's address and from a spoofed one: dropped.
    let before = net.node(b).stats();
    for p in &pushes {
        assert!(net.inject(b, net.addr(a), &p.data).is_empty());
        assert!(net.inject(b, spoofed(), &p.data).is_empty());
    }
    let after = net.node(b).stats();
    assert_eq!(
        after.stale + after.replays - before.stale - before.replays,
        2 * pushes.len() as u64
    );
    assert!(net.node(b).entry(&key).is_none());
    assert!(net.node(a).endpoint(&key).is_none());

    // b restarts: its replay windows are gone, the captured counters are
    // new to it. They are stale all the same.
    net.restart(b, a);
    joined(&mut net);
    let stale_before = net.node(b).stats().stale;
    for p in &pushes {
        net.inject(b, net.addr(a), &p.data);
        assert!(net.node(b).endpoint(&key).is_none());
    }
    assert_eq!(
        net.node(b).stats().stale - stale_before,
        pushes.len() as u64
    );
}

#[test]
fn a_replayed_digest_or_want_gets_no_answer() {
    let mut net = new_net(keyed());
    let a = net.add(None);
    for i in 0..20 {
        net.register(a, ep(&format!("e{i}"))).unwrap();
    }
    let b = net.add(Some(a));
    joined(&mut net);
    assert!(
        net.run_until(Duration::from_secs(10), |n| n.node(b).endpoints().len()
            == 20)
    );
    let of_kind = |net: &Sim, from: usize, to: usize, kind: Kind| {
        net.log()
            .iter()
            .rev()
            .find(|s| s.from == from && s.to == to && s.kind() == Some(kind))
            .cloned()
    };
    // A digest from b to a (b's catch-up exchange), and a's want back.
    let digest = of_kind(&net, b, a, Kind::Digest).expect("a digest from b to a");
    let want = of_kind(&net, a, b, Kind::Want).expect("a want from a to b");

    let before_a = net.node(a).stats();
    let before_b = net.node(b).stats();
    // From a spoofed address (the reflection attack) and from the real
    // sender's address: nothing answered, every copy counted as a replay.
    for from in [spoofed(), net.addr(b)] {
        assert_eq!(net.inject(a, from, &digest.data), vec![]);
    }
    for from in [spoofed(), net.addr(a)] {
        assert_eq!(net.inject(b, from, &want.data), vec![]);
    }
    assert_eq!(net.node(a).stats().replays - before_a.replays, 2);
    assert_eq!(net.node(b).stats().replays - before_b.replays, 2);

    // A digest captured on its way to a and replayed to b instead: the
    // authenticated destination is a, so b drops it.
    let misdirected = net.node(b).stats().misdirected;
    assert_eq!(net.inject(b, spoofed(), &digest.data), vec![]);
    assert_eq!(net.node(b).stats().misdirected, misdirected + 1);
}

#[test]
fn answers_to_an_unconfirmed_address_are_at_most_twice_the_request() {
    let mut net = new_net(keyed());
    let a = net.add(None);
    for i in 0..40 {
        net.register(a, ep(&format!("e{i}")).with_label("pad", "x".repeat(200)))
            .unwrap();
    }
    // A fresh, valid digest that claims to have nothing: the answer would
    // push all 40 entries (about 10 KB) to wherever it says it came from.
    let empty = AeMessage::Digest {
        lo: 0,
        hi: u64::MAX,
        items: vec![],
    };
    let counter = micros(net.now());
    let request = sealed(&empty, net.addr(a), counter);
    let answers = net.inject(a, spoofed(), &request);
    let bytes: usize = answers.iter().map(|(_, d)| d.len()).sum();
    assert!(
        bytes <= 2 * request.len(),
        "{bytes} bytes answered to a {}-byte request",
        request.len()
    );
    assert!(net.node(a).stats().answers_capped >= 1);

    // The same request from a member's address is answered in full.
    let b = net.add(Some(a));
    joined(&mut net);
    // Framed as b (the test holds the key), with a counter b has not used.
    let header = FrameHeader {
        counter: micros(net.now()) + 500_000,
        dest: net.addr(a),
        sender: "n1",
    };
    let from_b = wire::seal(
        Kind::Digest,
        &empty.encode().unwrap(),
        Some((&FrameKey::new(KEY), &header)),
    )
    .unwrap();
    let answers = net.inject(a, net.addr(b), &from_b);
    let pushed: usize = answers
        .iter()
        .filter(|(_, d)| d[2] == Kind::Push as u8)
        .map(|(_, d)| d.len())
        .sum();
    assert!(pushed > 8_000, "only {pushed} bytes pushed to a member");
}

#[test]
fn entries_stamped_too_far_ahead_are_refused_and_leave_the_clock() {
    let mut net = new_net(keyed());
    let a = net.add(None);
    net.flush();
    let skew = micros(keyed().max_clock_skew);
    let now = micros(net.now());
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
    let clock = net.node(a).replica().clock();
    let mut counter = now;
    for (id, ts) in [("max", u64::MAX), ("ahead", now + skew + 1)] {
        counter += 1;
        let push = AeMessage::Push {
            entries: vec![stamped(id, ts)],
        };
        net.inject(a, spoofed(), &sealed(&push, net.addr(a), counter));
        assert!(net.node(a).entry(&EndpointKey::new("replay", id)).is_none());
        assert_eq!(net.node(a).replica().clock(), clock, "{id} moved the clock");
    }
    assert_eq!(net.node(a).stats().entries_refused, 2);
    // A local write after them is stamped from the local clock.
    net.register(a, ep("local")).unwrap();
    let ts = net.node(a).entry(&ep("local").key()).unwrap().stamp.ts;
    assert!(ts <= now + 1_000, "local write stamped {ts}, now {now}");
    // Exactly at the bound is accepted.
    let push = AeMessage::Push {
        entries: vec![stamped("edge", now + skew)],
    };
    net.inject(a, spoofed(), &sealed(&push, net.addr(a), counter + 1));
    assert!(net
        .node(a)
        .entry(&EndpointKey::new("replay", "edge"))
        .is_some());
    assert_eq!(net.node(a).stats().entries_refused, 2);
}

#[test]
fn a_keyed_cluster_works_and_drops_nothing_of_its_own() {
    let mut net = new_net(keyed());
    let a = net.add(None);
    let b = net.add(Some(a));
    let c = net.add(Some(b));
    joined(&mut net);
    net.register(c, ep("c")).unwrap();
    net.register(a, ep("a")).unwrap();
    assert!(net.run_until(Duration::from_secs(10), |n| n
        .alive()
        .all(|(_, m)| m.endpoints().len() == 2)));
    net.run_until(Duration::from_secs(5), |_| false);
    for (_, m) in net.alive() {
        let s = m.stats();
        assert_eq!(
            (s.replays, s.stale, s.skewed, s.misdirected, s.auth_failures),
            (0, 0, 0, 0, 0),
            "{s:?}"
        );
    }
    assert!(net.unaddressed().is_empty());
}

#[test]
fn a_node_whose_clock_is_too_far_ahead_is_not_heard() {
    let mut net = new_net(keyed());
    let a = net.add(None);
    net.flush();
    let skew = keyed().max_clock_skew;
    // A node whose clock runs skew + 1 s ahead announces itself to a.
    let mut fast = Machine::new(
        &keyed(),
        addr(9),
        NodeId::new("fast"),
        3,
        net.now() + skew + Duration::from_secs(1),
    )
    .unwrap();
    fast.join(net.addr(a), net.now() + skew + Duration::from_secs(1));
    for (to, data) in fast.take_outbox() {
        assert_eq!(to, net.addr(a));
        assert!(net.inject(a, addr(9), &data).is_empty());
    }
    assert!(net.node(a).stats().skewed >= 1);
    assert!(net.node(a).members().is_empty());
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
    let addr = addr(0);
    let err = Machine::new(&long, addr, NodeId::new("n".repeat(256)), 1, T0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}
