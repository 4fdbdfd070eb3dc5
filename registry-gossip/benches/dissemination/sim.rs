//! The simulated measurement: N `Machine`s in `waypost_gossip::sim`
//! with its defaults (a lossless network with 1–5 ms of delay, simulated
//! time in 5 ms steps, timers fired earliest deadline first, so a step
//! costs what happens in it, not a scan of every node).

use std::time::{Duration, Instant};

use rand::RngExt;
use waypost::{Endpoint, EndpointKey};
use waypost_gossip::sim::{Sim, SimConfig};
use waypost_gossip::GossipConfig;

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
    let mut sim = Sim::new(SimConfig::new(config).with_seed(seed)).unwrap();
    let start = sim.now();
    // Start times spread over one gossip interval, so the nodes' timers
    // are not in phase (foca does not jitter them).
    sim.boot(n, interval);
    while !sim.members_complete() && sim.now() < start + form_limit {
        sim.step();
        if started.elapsed() > wall_limit {
            let full = sim
                .alive()
                .filter(|(_, m)| m.num_members() == n - 1)
                .count();
            let least = sim.alive().map(|(_, m)| m.num_members()).min().unwrap_or(0);
            return Err(format!(
                "N = {n}: stopped at the bench's wall bound ({wall_limit:?}) after {:.2?} simulated ({:.1} rounds): {full} of {n} nodes list every other, the least knows {least}",
                sim.now() - start,
                (sim.now() - start).as_secs_f64() / interval.as_secs_f64()
            ));
        }
    }
    let formed = sim.members_complete().then(|| sim.now() - start);
    let form_bytes = sim.bytes_out();
    eprintln!(
        "N = {n}: membership {} at {:.2?} simulated, {:.1?} wall",
        if formed.is_some() {
            "complete"
        } else {
            "NOT complete"
        },
        sim.now() - start,
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
    let t0 = sim.now();
    let before = sim.bytes_out();
    sim.register(writer, endpoint).unwrap();
    let limit = t0 + Duration::from_secs(120);
    while !sim.alive().all(|(_, m)| m.endpoint(&key).is_some()) {
        assert!(
            sim.now() < limit,
            "N = {n}: the registration did not spread"
        );
        sim.step();
    }
    let spread = sim.now() - t0;
    let bytes = (sim.bytes_out() - before) as f64;

    // One more node joins the formed cluster through a random member.
    sim.run_for(Duration::from_secs(2));
    let via = sim.rng().random_range(0..n);
    let t1 = sim.now();
    sim.add(Some(via));
    let limit = t1 + form_limit;
    while !sim.members_complete() && sim.now() < limit {
        sim.step();
    }
    let late_join = sim.members_complete().then(|| sim.now() - t1);
    let sum = |f: fn(&waypost_gossip::Stats) -> u64| -> u64 {
        sim.alive().map(|(_, m)| f(&m.stats())).sum()
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
        datagrams: sim.delivered(),
        recv_time: sim.handle_time(),
        sums,
    })
}
