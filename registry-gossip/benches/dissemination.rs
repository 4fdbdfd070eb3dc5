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
//! simulated (a run that ran out counts as infinitely slow) and at 150 s
//! of wall time per run (`GOSSIP_BENCH_WALL_LIMIT_S`; a `NOT-FORMED` line
//! then says how far it got), so the whole bench stays under 10 minutes.
//! Five seeded runs per N (`GOSSIP_BENCH_SIM_RUNS`), one at 4,096; median
//! and worst. Each N runs in a fresh process of this bench (so the
//! allocator's state after the smaller sizes does not slow the larger). A `DROPS` line sums what the receive path dropped; a
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

use waypost_gossip::GossipConfig;

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

/// Median and worst (largest) of `v`.
fn med_worst(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[v.len() - 1])
}

/// Set in the child process that simulates one size.
const ONE_SIZE: &str = "GOSSIP_BENCH_ONE_SIZE";

/// Simulate `n` nodes `runs` times (once at 4,096 and above) and print
/// the row, the ratios and the counters.
fn simulate(n: usize, runs: usize, wall_limit: Duration) {
    let mut rows = Vec::new();
    let mut stopped = None;
    for run in 0..if n >= 4096 { 1 } else { runs.max(1) } {
        let mut config = GossipConfig::new();
        if keyed() {
            config = config.with_auth_key(b"bench-shared-key".to_vec());
        }
        let seed = n as u64 * 1000 + run as u64;
        match sim::measure(n, seed, config, Duration::from_secs(60), wall_limit) {
            Ok(r) => rows.push(r),
            Err(e) => {
                stopped = Some(e);
                break;
            }
        }
    }
    if let Some(e) = stopped {
        println!("NOT-FORMED {e}");
        return;
    }
    let interval = rows[0].interval.as_secs_f64();
    let rounds = |d: Duration| d.as_secs_f64() / interval;
    // A run whose membership did not form counts as infinitely slow.
    let form = med_worst(
        rows.iter()
            .map(|r| r.formed.map_or(f64::INFINITY, rounds))
            .collect(),
    );
    let join = med_worst(
        rows.iter()
            .map(|r| r.late_join.map_or(f64::INFINITY, rounds))
            .collect(),
    );
    let key = med_worst(rows.iter().map(|r| rounds(r.spread)).collect());
    let form_b = med_worst(rows.iter().map(|r| r.form_bytes_per_node).collect());
    let idle = med_worst(rows.iter().map(|r| r.idle_per_node_s).collect());
    let key_b = med_worst(rows.iter().map(|r| r.bytes_per_node).collect());
    let wall = med_worst(rows.iter().map(|r| r.wall.as_secs_f64()).collect());
    let goal = 2.0 * (n as f64).log2() + 4.0;
    let pair = |p: (f64, f64), prec: usize| format!("{:.*} / {:.*}", prec, p.0, prec, p.1);
    println!(
        "{:>5} {:>5.0} {:>13} {:>13} {:>15} {:>13} {:>13} {:>8} {:>15} {:>9}",
        n,
        goal,
        pair(form, 1),
        pair(join, 1),
        pair(form_b, 0),
        pair(idle, 0),
        pair(key, 1),
        waypost_gossip::dissemination_count(n),
        pair(key_b, 0),
        format!("{:.1}s", wall.1),
    );
    println!(
        "RATIO N={n} runs={} form-rounds median={:.1} worst={:.1} join-rounds worst={:.1} key-rounds median={:.1} worst={:.1} goal={goal:.0} worst/goal form={:.2} join={:.2} key={:.2} idle-bytes/s/node median={:.0}",
        rows.len(),
        form.0,
        form.1,
        join.1,
        key.0,
        key.1,
        form.1 / goal,
        join.1 / goal,
        key.1 / goal,
        idle.0,
    );
    let sum = |f: &dyn Fn(&sim::Sums) -> u64| rows.iter().map(|r| f(&r.sums)).sum::<u64>();
    println!(
        "DROPS N={n} keyed={} replays={} stale={} skewed={} misdirected={} answers_capped={} entries_refused={} members_received={}",
        keyed(),
        sum(&|s| s.replays),
        sum(&|s| s.stale),
        sum(&|s| s.skewed),
        sum(&|s| s.misdirected),
        sum(&|s| s.answers_capped),
        sum(&|s| s.entries_refused),
        sum(&|s| s.members_received),
    );
    let datagrams: u64 = rows.iter().map(|r| r.datagrams).sum();
    let recv: Duration = rows.iter().map(|r| r.recv_time).sum();
    println!(
        "COST N={n} keyed={} datagrams={datagrams} in-handle_datagram={recv:.2?} us/datagram={:.3}",
        keyed(),
        recv.as_secs_f64() * 1e6 / datagrams.max(1) as f64
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter is not supported.
    let runs: usize = std::env::var("GOSSIP_BENCH_SIM_RUNS")
        .ok()
        .map_or(5, |s| s.parse().unwrap());
    let wall_limit = Duration::from_secs(
        std::env::var("GOSSIP_BENCH_WALL_LIMIT_S")
            .ok()
            .map_or(150, |s| s.parse().unwrap()),
    );
    if let Some(n) = std::env::var(ONE_SIZE).ok().and_then(|n| n.parse().ok()) {
        simulate(n, runs, wall_limit);
        return;
    }
    println!("simulation, {runs} seeded runs per N (one at 4096), median / worst; each N in a process of its own");
    println!(
        "{:>5} {:>5} {:>13} {:>13} {:>15} {:>13} {:>13} {:>8} {:>15} {:>9}",
        "N",
        "goal",
        "form rounds",
        "join rounds",
        "form B/node",
        "idle B/s/n",
        "key rounds",
        "bcast tx",
        "key B/node",
        "wall/run"
    );
    for n in sizes("GOSSIP_BENCH_SIZES", &[16, 64, 256, 1024, 4096]) {
        if n < 2 {
            continue;
        }
        // Each size in a fresh process: after the smaller sizes the
        // allocator's state made 1,024 nodes about 1.3x slower than alone.
        let child = std::env::current_exe().and_then(|exe| {
            std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env(ONE_SIZE, n.to_string())
                .status()
        });
        match child {
            Ok(status) if status.success() => {}
            other => println!("FAILED N={n}: the simulation's process ended with {other:?}"),
        }
    }
    if std::env::var_os("GOSSIP_BENCH_NO_UDP").is_none() {
        let runs = std::env::var("GOSSIP_BENCH_RUNS")
            .ok()
            .map_or(5, |s| s.parse().unwrap());
        loopback::compare(&sizes("GOSSIP_BENCH_UDP_SIZES", &[16, 64, 128]), runs);
    }
}
