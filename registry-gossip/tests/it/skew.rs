//! Causality under clock skew, on the pure state machine: nodes whose
//! clocks run ahead of (or behind) the others' by a set amount, in
//! simulated time over a network with 1–5 ms of delay, every run
//! repeatable from its seed.
//!
//! Within `max_clock_skew` (60 s by default), a write made after a node has
//! seen another write wins over it on every node, however far ahead the
//! other writer's clock ran. Beyond it, without a key an entry is refused
//! (`entries_refused`) until the receiver's clock is within the skew of
//! its stamp, then arrives by anti-entropy; with a key the nodes drop each
//! other's datagrams (`skewed` one way, `stale` the other) and do not see
//! each other at all.

use std::time::Duration;

use waypost::{Endpoint, EndpointKey};
use waypost_gossip::sim::{micros, ClockSkew, Identity, NodeStart, Sim, SimConfig};
use waypost_gossip::{Entry, GossipConfig, NodeId, NAME_PORT, NAME_SERVICE};

/// Simulated wall clock: a real UNIX time, so that a clock behind it does
/// not reach zero and timestamps have their real size.
const T0: Duration = Duration::from_secs(1_764_000_000);
/// How long a condition is waited for, in simulated time.
const LIMIT: Duration = Duration::from_secs(30);
const KEY: &[u8] = b"skew-test-key";
/// The skewed node's lead over the others in the within-skew cases.
const LEAD: Duration = Duration::from_secs(60);

/// Fast timings (anti-entropy every second), `max_clock_skew` at its
/// default of 60 s, tombstones kept an hour (the skew must stay below
/// half of the TTL).
fn config() -> GossipConfig {
    GossipConfig::fast()
        .with_max_clock_skew(GossipConfig::default().max_clock_skew)
        .with_tombstone_ttl(Duration::from_secs(3600))
}

fn keyed() -> GossipConfig {
    config().with_auth_key(KEY.to_vec())
}

/// Nodes `a`, `b`, `c`, … at `127.0.0.1:32000 + i`.
fn identity(start: &NodeStart) -> Identity {
    let i = start.index;
    Identity {
        addr: format!("127.0.0.1:{}", 32_000 + i).parse().unwrap(),
        name: NodeId::new(["a", "b", "c", "d"][i]),
        seed: start.sim_seed * 100 + i as u64,
    }
}

/// From T0 in 10 ms steps, over the default network (1–5 ms of delay).
fn sim_config(config: GossipConfig, seed: u64) -> SimConfig {
    SimConfig::new(config)
        .with_seed(seed)
        .with_start(T0)
        .with_step(Duration::from_millis(10))
        .with_identities(identity)
}

/// Nodes `a` (index 0) and `b` (1) on the clocks given, `c` (2) on the
/// simulation's; `b` and `c` join through `a`.
fn cluster(config: GossipConfig, seed: u64, a: ClockSkew, b: ClockSkew) -> Sim {
    let mut sim = Sim::new(sim_config(config, seed)).unwrap();
    let first = sim.add_with_clock(None, a);
    sim.add_with_clock(Some(first), b);
    sim.add(Some(first));
    sim
}

/// The name binding `leader` to `actor`, owned by `node` (what
/// `register_name` writes).
fn binding(actor: &str, node: &str) -> Endpoint {
    Endpoint::new(NAME_SERVICE, "leader", actor, NAME_PORT)
        .with_node(node)
        .with_label("kind", "actor-name")
}

fn leader() -> EndpointKey {
    EndpointKey::new(NAME_SERVICE, "leader")
}

/// Whether every running node holds `entry` as the register of its key.
fn all_hold(sim: &Sim, entry: &Entry) -> bool {
    sim.alive()
        .all(|(_, m)| m.entry(&entry.key).as_ref() == Some(entry))
}

/// `a` registers `leader`, then (when `deregister`) deregisters it; once
/// `b` has seen the last of these writes, `b` registers `leader` too. Every
/// node ends with `b`'s registration and keeps it; nothing was refused or
/// dropped.
fn second_registration_wins(
    config: GossipConfig,
    seed: u64,
    clocks: (ClockSkew, ClockSkew),
    deregister: bool,
) {
    let case = format!("seed {seed}, clocks {clocks:?}, deregister {deregister}");
    let mut sim = cluster(config.clone(), seed, clocks.0, clocks.1);
    let (a, b) = (0, 1);
    assert!(
        sim.run_until(LIMIT, Sim::members_complete),
        "{case}: no membership"
    );

    let key = leader();
    sim.register(a, binding("actor-a", "a")).unwrap();
    let first = sim.node(a).entry(&key).unwrap();
    assert!(
        sim.run_until(LIMIT, |s| all_hold(s, &first)),
        "{case}: a's registration did not spread"
    );
    if deregister {
        sim.deregister(a, &key);
    }
    let last = sim.node(a).entry(&key).unwrap();
    assert_eq!(last.is_tombstone(), deregister, "{case}");
    assert!(
        sim.run_until(LIMIT, |s| s.node(b).entry(&key).as_ref() == Some(&last)),
        "{case}: b did not see a's last write"
    );
    // The clocks are skewed: what b saw was stamped about a minute ahead of
    // b's clock.
    let lead = last.stamp.ts.saturating_sub(micros(sim.clock(b)));
    assert!(
        lead > micros(LEAD - Duration::from_secs(1)),
        "{case}: a's stamp leads b's clock by {lead} us only"
    );

    let second = binding("actor-b", "b");
    sim.register(b, second.clone()).unwrap();
    let written = sim.node(b).entry(&key).unwrap();
    assert_eq!(written.value.as_ref(), Some(&second), "{case}");
    assert!(
        written.stamp.ts > last.stamp.ts,
        "{case}: b stamped {:?} after {:?}",
        written.stamp,
        last.stamp
    );
    assert!(
        sim.run_until(LIMIT, |s| all_hold(s, &written)),
        "{case}: b's registration did not win everywhere"
    );

    // It stays: three anti-entropy rounds later nothing has changed.
    sim.run_for(config.anti_entropy_interval * 3);
    for (i, m) in sim.alive() {
        assert_eq!(m.entry(&key).as_ref(), Some(&written), "{case}: node {i}");
        let s = m.stats();
        assert_eq!(
            (s.entries_refused, s.skewed, s.stale),
            (0, 0, 0),
            "{case}: node {i}: {s:?}"
        );
    }
    assert_eq!(sim.node(b).owned(), vec![key], "{case}");
    assert!(sim.node(a).owned().is_empty(), "{case}");
}

/// `a` runs a minute ahead, or `b` a minute behind: either way `a`'s
/// writes are stamped a minute ahead of `b`'s clock.
fn skewed_clocks() -> [(ClockSkew, ClockSkew); 2] {
    [
        (ClockSkew::Ahead(LEAD), ClockSkew::None),
        (ClockSkew::None, ClockSkew::Behind(LEAD)),
    ]
}

#[test]
fn a_registration_after_the_tombstone_of_a_clock_a_minute_ahead_wins_everywhere() {
    for (seed, clocks) in (1..).zip(skewed_clocks()) {
        second_registration_wins(config(), seed, clocks, true);
    }
}

#[test]
fn a_registration_after_the_registration_of_a_clock_a_minute_ahead_wins_everywhere() {
    for (seed, clocks) in (1..).zip(skewed_clocks()) {
        second_registration_wins(config(), seed, clocks, false);
    }
}

#[test]
fn keyed_a_registration_after_the_writes_of_a_clock_a_minute_ahead_wins_everywhere() {
    // With a key, a datagram's counter is checked against the receiver's
    // clock both ways, and the time in transit counts: clocks a minute
    // apart need a skew above a minute.
    let config = keyed().with_max_clock_skew(Duration::from_secs(90));
    for (seed, clocks) in (1..).zip(skewed_clocks()) {
        second_registration_wins(config.clone(), seed, clocks, true);
        second_registration_wins(config.clone(), seed + 10, clocks, false);
    }
}

// ------------------------------------------------------ beyond the skew

/// How far beyond `max_clock_skew` the skewed node's clock runs.
const EXCESS: Duration = Duration::from_secs(1);

#[test]
fn beyond_the_skew_an_entry_is_refused_until_the_receivers_clock_is_within_it() {
    let skew = config().max_clock_skew;
    let mut sim = cluster(
        config(),
        5,
        ClockSkew::Ahead(skew + EXCESS),
        ClockSkew::None,
    );
    let (a, b, c) = (0, 1, 2);
    // Without a key, SWIM does not look at clocks: the membership forms.
    assert!(sim.run_until(LIMIT, Sim::members_complete));

    let key = leader();
    let written_at = sim.now();
    sim.register(a, binding("actor-a", "a")).unwrap();
    let first = sim.node(a).entry(&key).unwrap();
    // Refused on arrival: stamped EXCESS beyond what b and c accept.
    assert!(sim.run_until(LIMIT, |s| [b, c].iter().all(|&i| s
        .node(i)
        .stats()
        .entries_refused
        >= 1)));
    assert!(sim.now() < written_at + EXCESS);
    for i in [b, c] {
        assert!(sim.node(i).entry(&key).is_none(), "node {i}");
        assert!(
            sim.node(i).replica().clock() < first.stamp.ts,
            "node {i}: the clock moved"
        );
    }
    // Taken by anti-entropy once the receivers' clocks are within the skew
    // of its stamp, and not before.
    assert!(sim.run_until(LIMIT, |s| all_hold(s, &first)));
    assert!(sim.now() >= written_at + EXCESS);
    for i in [b, c] {
        assert!(sim.node(i).stats().entries_repaired >= 1, "node {i}");
    }

    // A write after seeing a's tombstone still wins everywhere; seeing it
    // takes as long.
    let deleted_at = sim.now();
    sim.deregister(a, &key);
    let gone = sim.node(a).entry(&key).unwrap();
    assert!(sim.run_until(LIMIT, |s| s.node(b).entry(&key).as_ref() == Some(&gone)));
    assert!(sim.now() >= deleted_at + EXCESS);
    sim.register(b, binding("actor-b", "b")).unwrap();
    let second = sim.node(b).entry(&key).unwrap();
    assert!(second.stamp.ts > gone.stamp.ts);
    assert!(sim.run_until(LIMIT, |s| all_hold(s, &second)));
    for (i, m) in sim.alive() {
        assert_eq!(m.num_members(), 2, "node {i}");
    }
}

#[test]
fn beyond_the_skew_a_registration_made_before_the_entry_was_accepted_loses_to_it() {
    let skew = config().max_clock_skew;
    let mut sim = cluster(
        config(),
        6,
        ClockSkew::Ahead(skew + EXCESS),
        ClockSkew::None,
    );
    let (a, b) = (0, 1);
    assert!(sim.run_until(LIMIT, Sim::members_complete));

    let key = leader();
    sim.register(a, binding("actor-a", "a")).unwrap();
    let first = sim.node(a).entry(&key).unwrap();
    assert!(sim.run_until(LIMIT, |s| s.node(b).stats().entries_refused >= 1));
    // b has not seen a's registration: its own is concurrent with it, and
    // a's stamp, a minute and more ahead, orders it first.
    assert!(sim.node(b).entry(&key).is_none());
    sim.register(b, binding("actor-b", "b")).unwrap();
    let second = sim.node(b).entry(&key).unwrap();
    assert!(second.stamp.ts < first.stamp.ts);
    assert!(sim.run_until(LIMIT, |s| all_hold(s, &first)));
    assert!(sim.node(b).owned().is_empty());
    assert_eq!(sim.node(a).owned(), vec![key]);
}

/// `a` (index 0) on `clock`, `b` (1) and `c` (2) on the simulation's, all
/// keyed; `b` joins through `a` and `a` through `b` (so each sends to the
/// other), `c` through `b`.
fn keyed_apart(seed: u64, clock: ClockSkew) -> Sim {
    let mut sim = Sim::new(sim_config(keyed(), seed)).unwrap();
    let a = sim.add_with_clock(None, clock);
    let b = sim.add(Some(a));
    sim.add(Some(b));
    let to = sim.addr(b);
    sim.with_node(a, |m, now| m.join(to, now));
    sim
}

#[test]
fn keyed_beyond_the_skew_the_nodes_drop_each_others_datagrams() {
    let skew = keyed().max_clock_skew;
    let mut sim = keyed_apart(7, ClockSkew::Ahead(skew + EXCESS));
    let (a, b, c) = (0, 1, 2);
    let key = leader();
    sim.register(a, binding("actor-a", "a")).unwrap();
    sim.register(b, binding("actor-b", "b")).unwrap();
    let (mine, theirs) = (
        sim.node(a).entry(&key).unwrap(),
        sim.node(b).entry(&key).unwrap(),
    );
    // b and c find each other; a's datagrams are ahead of their clocks
    // (`skewed`), theirs behind a's (`stale`).
    assert!(
        sim.run_until(LIMIT, |s| {
            s.node(b).num_members() == 1
                && s.node(c).num_members() == 1
                && s.node(b).stats().skewed >= 1
                && s.node(a).stats().stale >= 1
                && s.node(c).entry(&key).as_ref() == Some(&theirs)
        }),
        "{:?}",
        sim.alive()
            .map(|(i, m)| (i, m.num_members(), m.stats()))
            .collect::<Vec<_>>()
    );
    // And that lasts: ten seconds later nobody has heard the other side.
    sim.run_for(Duration::from_secs(10));
    assert_eq!(sim.node(a).num_members(), 0);
    for i in [b, c] {
        let m = sim.node(i);
        assert!(!m.is_member(&NodeId::new("a")), "node {i}");
        assert_eq!(m.entry(&key).as_ref(), Some(&theirs), "node {i}");
        assert_eq!(m.stats().stale, 0, "node {i}");
        // Nothing got as far as the entry check.
        assert_eq!(m.stats().entries_refused, 0, "node {i}");
    }
    assert_eq!(sim.node(a).entry(&key).as_ref(), Some(&mine));
    assert_eq!(sim.node(a).stats().skewed, 0);
}

#[test]
fn keyed_clocks_exactly_the_skew_apart_leave_the_node_ahead_hearing_nobody() {
    // The others' datagrams spend time in transit, so they arrive more than
    // max_clock_skew behind the clock of a node exactly that far ahead.
    let skew = keyed().max_clock_skew;
    let mut sim = keyed_apart(8, ClockSkew::Ahead(skew));
    let (a, b, c) = (0, 1, 2);
    assert!(sim.run_until(LIMIT, |s| s.node(a).stats().stale >= 1
        && s.node(b).num_members() >= 1
        && s.node(c).num_members() >= 1));
    sim.run_for(Duration::from_secs(10));
    assert_eq!(sim.node(a).num_members(), 0);
    // Its own datagrams are within the skew of b's and c's clocks.
    for i in [b, c] {
        assert_eq!(sim.node(i).stats().skewed, 0, "node {i}");
    }
}
