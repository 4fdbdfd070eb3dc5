//! Membership formation in a simulated network, counted in gossip rounds
//! (simulated time / gossip interval): a full membership forms, and a
//! late joiner is known everywhere, within 2·log2 N + 4 rounds. Round
//! counts, not wall-clock time: the figures do not depend on the machine.

use std::net::SocketAddr;
use std::time::Duration;

use waypost_gossip::sim::{Identity, Network, NodeStart, Sim, SimConfig, TickOrder};
use waypost_gossip::{GossipConfig, NodeId};

const STEP: Duration = Duration::from_millis(5);

/// Node `i` of these tests: `10.1.x.y:7000`, `f0042`, seeded by its index
/// alone.
fn identity(start: &NodeStart) -> Identity {
    let i = start.index;
    Identity {
        addr: SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 7000)),
        name: NodeId::new(format!("f{i:04}")),
        seed: 0xf00 + i as u64,
    }
}

/// A network losing `loss` of the datagrams, 1–5 ms of delay, 5 ms steps,
/// timers fired in index order.
fn new_sim(seed: u64, config: GossipConfig, loss: f64) -> Sim {
    let config = SimConfig::new(config)
        .with_seed(seed)
        .with_step(STEP)
        .with_network(Network::default().with_loss(loss))
        .with_tick_order(TickOrder::ByIndex)
        .with_identities(identity);
    Sim::new(config).unwrap()
}

/// Step until the membership is complete or `limit` has passed; returns
/// the simulated time it took.
fn until_complete(sim: &mut Sim, limit: Duration) -> Option<Duration> {
    let start = sim.now();
    sim.run_until(limit, Sim::members_complete)
        .then(|| sim.now() - start)
}

fn bound_rounds(n: usize) -> f64 {
    2.0 * (n as f64).log2() + 4.0
}

/// `n` nodes starting within the first gossip interval, all joining
/// through node 0.
fn formed(seed: u64, n: usize, config: GossipConfig, loss: f64) -> (Sim, Option<Duration>) {
    let interval = config.gossip_interval;
    let mut sim = new_sim(seed, config, loss);
    sim.boot(n, interval);
    let limit = interval.mul_f64(bound_rounds(n) * 3.0);
    let took = until_complete(&mut sim, limit).map(|_| sim.now());
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
    let took = until_complete(&mut sim, interval.mul_f64(bound_rounds(257) * 3.0))
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
        let joiner = sim.len() - 1;
        // Well before its first gossip round ends (announce, feed, then
        // the pages, a few milliseconds each way).
        let mut waited = Duration::ZERO;
        while sim.node(joiner).num_members() < 150 && waited < interval {
            sim.step();
            waited += STEP;
        }
        let pages = sim.node(joiner).stats().members_received;
        assert_eq!(
            sim.node(joiner).num_members(),
            150,
            "budget {budget}: the joiner knows {} of 150 after {waited:?}",
            sim.node(joiner).num_members()
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
    sim.run_for(Duration::from_secs(3));
    let before: Vec<_> = sim.alive().map(|(_, m)| m.stats()).collect();
    sim.run_for(Duration::from_secs(10));
    let mut equal = 0;
    for ((_, m), b) in sim.alive().zip(&before) {
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
