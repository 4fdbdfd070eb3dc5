//! Membership formation and one registration reaching every node: in
//! simulation for N = 16 … 4,096, and on loopback UDP side by side with
//! the `chitchat` crate at N = 16, 64 and 128.
//!
//! **Simulation** (`sim`). N `Machine`s with the default configuration
//! (gossip every 200 ms, probes and membership sync every 1 s,
//! anti-entropy every 30 s) on a simulated lossless network with 1–5 ms of
//! delay; time is simulated, so the figures do not depend on the machine
//! running the bench (only the wall column does). Every node starts
//! within the first gossip interval and joins through node 0. Printed per N: rounds (simulated time /
//! gossip interval) until every node lists every other, against the goal
//! 2·log2 N + 4; bytes sent per node while forming; after 10 s of
//! settling, the idle traffic per node per second; then one node registers
//! one endpoint: rounds until every node holds it and bytes per node in
//! that window; then one more node joins through a random member: rounds
//! until the membership is complete again. Forming is bounded at 60 s
//! simulated (a row says `NOT` when it ran out) and at 240 s of wall time
//! per N (`GOSSIP_BENCH_WALL_LIMIT_S`; a `NOT-FORMED` line then says how
//! far it got), so the whole bench stays under 10 minutes. A `DROPS` line sums what the receive path dropped; a
//! `COST` line the datagrams handled and the wall time inside
//! `Machine::handle_datagram` per datagram.
//!
//! `GOSSIP_BENCH_SIZES=16,64` picks the simulated sizes (default 16, 64,
//! 256, 1024, 4096); `GOSSIP_BENCH_KEYED=1` gives the simulated nodes a
//! shared key (every datagram sealed and checked).
//!
//! **Loopback** (`loopback`). `GossipRegistry` with default timings and
//! chitchat 0.13 (gossip interval 200 ms, protocol V1, default failure
//! detector), every node seeded with the first, all in this process on
//! 127.0.0.1, one system at a time, alternating, 5 runs each
//! (`GOSSIP_BENCH_RUNS`): time until every node lists every other, then
//! (after 1 s) idle bytes per second per node over 2 s, then one key set on
//! one node and the wall time until every node holds it (polled every
//! 2 ms) with the bytes sent per node in that time (`Stats::bytes_out` for
//! ours, a counting wrapper around chitchat's UDP transport). Median and
//! worst, and `RATIO` lines (ours / chitchat). `GOSSIP_BENCH_UDP_SIZES`
//! picks the sizes (default 16, 64, 128); `GOSSIP_BENCH_NO_UDP=1` skips it.

#![allow(clippy::unwrap_used, missing_docs)]

#[path = "dissemination/loopback.rs"]
mod loopback;
#[path = "dissemination/sim.rs"]
mod sim;

use std::time::Duration;

use registry_gossip::GossipConfig;

/// Whether the simulated nodes share a key (`GOSSIP_BENCH_KEYED=1`).
fn keyed() -> bool {
    std::env::var_os("GOSSIP_BENCH_KEYED").is_some_and(|v| v != "0")
}

fn sizes(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().parse().unwrap()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter is not supported.
    println!(
        "{:>5} {:>5} {:>11} {:>11} {:>13} {:>12} {:>12} {:>10} {:>12} {:>9} {:>9}",
        "N",
        "goal",
        "form rounds",
        "join rounds",
        "form B/node",
        "idle B/s/n",
        "key rounds",
        "bcast tx",
        "key B/node",
        "formed",
        "wall"
    );
    let wall_limit = Duration::from_secs(
        std::env::var("GOSSIP_BENCH_WALL_LIMIT_S")
            .ok()
            .map_or(240, |s| s.parse().unwrap()),
    );
    for n in sizes("GOSSIP_BENCH_SIZES", &[16, 64, 256, 1024, 4096]) {
        if n < 2 {
            continue;
        }
        let mut config = GossipConfig::new();
        if keyed() {
            config = config.with_auth_key(b"bench-shared-key".to_vec());
        }
        let r = match sim::measure(n, config, Duration::from_secs(60), wall_limit) {
            Ok(r) => r,
            Err(stopped) => {
                println!("NOT-FORMED {stopped}");
                continue;
            }
        };
        let log2 = (r.n as f64).log2();
        let goal = 2.0 * log2 + 4.0;
        let rounds = |d: Duration| d.as_secs_f64() / r.interval.as_secs_f64();
        let form_rounds = r.formed.map(rounds);
        let join_rounds = r.late_join.map(rounds);
        let show = |x: Option<f64>| x.map_or("NOT".to_string(), |f| format!("{f:.1}"));
        println!(
            "{:>5} {:>5.0} {:>11} {:>11} {:>13.0} {:>12.0} {:>12.1} {:>10} {:>12.0} {:>9} {:>9}",
            r.n,
            goal,
            show(form_rounds),
            show(join_rounds),
            r.form_bytes_per_node,
            r.idle_per_node_s,
            rounds(r.spread),
            registry_gossip::dissemination_count(r.n),
            r.bytes_per_node,
            r.formed.map_or("NOT".to_string(), |f| format!("{f:.2?}")),
            format!("{:.1?}", r.wall),
        );
        println!(
            "RATIO N={} form-rounds={} join-rounds={} key-rounds={:.1} goal={:.0} form/goal={} key/goal={:.2} key-bytes/node={:.0} idle-bytes/s/node={:.0}",
            r.n,
            show(form_rounds),
            show(join_rounds),
            rounds(r.spread),
            goal,
            form_rounds.map_or("NOT".to_string(), |f| format!("{:.2}", f / goal)),
            rounds(r.spread) / goal,
            r.bytes_per_node,
            r.idle_per_node_s,
        );
        let s = &r.sums;
        println!(
            "DROPS N={} keyed={} replays={} stale={} skewed={} misdirected={} answers_capped={} entries_refused={} members_received={}",
            r.n,
            keyed(),
            s.replays,
            s.stale,
            s.skewed,
            s.misdirected,
            s.answers_capped,
            s.entries_refused,
            s.members_received,
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
        let runs = std::env::var("GOSSIP_BENCH_RUNS")
            .ok()
            .map_or(5, |s| s.parse().unwrap());
        loopback::compare(&sizes("GOSSIP_BENCH_UDP_SIZES", &[16, 64, 128]), runs);
    }
}
