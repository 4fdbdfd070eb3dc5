//! Benchmarks of the DynamoDB backend against `moto_server` on loopback
//! (started through `waypost_fixtures::MotoServer::start()`, stopped at the
//! end). Run with `cargo bench -p waypost-dynamodb --bench dynamodb`.
//!
//! Plain timing (no criterion): 10k registrations, one `register` call per
//! op (the baseline: one `PutItem` each) vs `Coalescing` (one
//! `TransactWriteItems` of at most 100 per backend call), each on a fresh
//! table. Calls are counted on the registry side (`Faulty::write_calls`,
//! `Faulty::batches`). Lines starting `RATIO` compare against the baseline
//! measured in the same run.
//!
//! moto gets slower as a table grows (its `TransactWriteItems` most of
//! all), so each run stops after a time budget; it then reports how many
//! registrations it measured and the time per op for those, never an
//! extrapolated total. Times are also printed per window of 1000 ops, so
//! the two runs can be compared at the same table sizes. Each run has a
//! fresh moto server of its own.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use waypost::testing::{unique, Faulty};
use waypost::{coalescing::Coalescing, Endpoint, Op, Registry};
use waypost_dynamodb::{DynamoDbConfig, DynamoDbRegistry};
use waypost_fixtures::MotoServer;

/// Registrations per run.
const N: usize = 10_000;
/// Endpoints per service.
const PER_SERVICE: usize = 10;
/// The one-call-per-op run stops after this long.
const PER_OP_BUDGET: Duration = Duration::from_secs(180);
/// Latencies are reported per window of this many ops.
const WINDOW: usize = 1_000;
/// The coalesced run stops waiting after this long.
const COALESCED_BUDGET: Duration = Duration::from_secs(180);

fn endpoint(i: usize) -> Endpoint {
    Endpoint::new(
        format!("svc-{:05}", i / PER_SERVICE),
        format!("ep-{i}"),
        "127.0.0.1",
        (i % 60_000 + 1) as u16,
    )
}

async fn fresh_table(url: &str) -> DynamoDbRegistry {
    let cfg = DynamoDbConfig::new(unique("bench"))
        .with_region("us-east-1")
        .with_endpoint_url(url)
        .with_static_credentials("test", "test");
    assert!(DynamoDbRegistry::create_table_if_missing(&cfg, false)
        .await
        .unwrap());
    DynamoDbRegistry::connect(cfg).await.unwrap()
}

struct PerOp {
    done: usize,
    wall: Duration,
    calls: usize,
    windows: Vec<f64>,
}

async fn one_call_per_op(url: &str) -> PerOp {
    let reg = Faulty::new(fresh_table(url).await);
    let mut windows = Vec::new();
    let start = Instant::now();
    let mut window_start = Instant::now();
    let mut done = 0;
    while done < N {
        reg.register(endpoint(done)).await.unwrap();
        done += 1;
        if done % WINDOW == 0 {
            windows.push(window_start.elapsed().as_secs_f64() * 1e6 / WINDOW as f64);
            window_start = Instant::now();
        }
        if start.elapsed() > PER_OP_BUDGET {
            break;
        }
    }
    let wall = start.elapsed();
    assert_eq!(reg.get_ref().snapshot().await.unwrap().len(), done);
    PerOp {
        done,
        wall,
        calls: reg.write_calls(),
        windows,
    }
}

struct Coalesced {
    done: usize,
    wall: Duration,
    calls: usize,
    batches: Vec<usize>,
    windows: Vec<f64>,
}

/// All `N` registrations queued at once, one `submit` call per op (a
/// ticket each); the time at which each window of `WINDOW` ops became
/// durable is recorded. Stops waiting at `COALESCED_BUDGET` and then counts
/// the ops the backend had applied by then.
async fn coalesced(url: &str) -> Coalesced {
    let reg = Coalescing::new(Faulty::new(fresh_table(url).await));
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + COALESCED_BUDGET;
    let mut tickets: Vec<_> = (0..N)
        .map(|i| reg.submit(vec![Op::Register(endpoint(i))]).unwrap())
        .collect();
    let mut windows = Vec::new();
    let mut last = Duration::ZERO;
    let mut finished = true;
    while !tickets.is_empty() {
        let window: Vec<_> = tickets.drain(..WINDOW.min(tickets.len())).collect();
        let all = futures::future::try_join_all(window.into_iter().map(|t| t.durable()));
        match tokio::time::timeout_at(deadline, all).await {
            Ok(r) => {
                r.unwrap();
                let now = start.elapsed();
                windows.push((now - last).as_secs_f64() * 1e6 / WINDOW as f64);
                last = now;
            }
            Err(_) => {
                finished = false;
                break;
            }
        }
    }
    let wall = if finished {
        start.elapsed()
    } else {
        COALESCED_BUDGET
    };
    let batches = reg.get_ref().batches();
    let done: usize = batches.iter().sum();
    if finished {
        assert_eq!(done, N);
        assert_eq!(reg.snapshot().await.unwrap().len(), N);
    }
    // Unfinished: the flusher is left with the rest; it ends with the runtime.
    Coalesced {
        done,
        wall,
        calls: batches.len(),
        batches,
        windows,
    }
}

fn start_moto() -> MotoServer {
    let moto = MotoServer::start().expect("moto_server (pip install 'moto[server]')");
    println!(
        "SETUP moto {:?} at {} (fixture waypost_fixtures::MotoServer)",
        moto.provision(),
        moto.url()
    );
    moto
}

fn fmt_windows(w: &[f64]) -> String {
    let w: Vec<String> = w.iter().map(|w| format!("{w:.0}")).collect();
    format!("[{}]", w.join(", "))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // Baseline first; each run on a fresh server of its own (moto keeps
    // everything in memory, and one run's table must not slow the other).
    let moto = start_moto();
    let per_op = rt.block_on(one_call_per_op(moto.url()));
    drop(moto);
    let per_op_us = per_op.wall.as_secs_f64() * 1e6 / per_op.done as f64;
    if per_op.done < N {
        println!(
            "NOTE one call per op stopped after {PER_OP_BUDGET:?}: {} of {N} registrations measured",
            per_op.done
        );
    }
    println!(
        "WRITE one register call per op: {} registrations in {:.2} s, {per_op_us:.0} µs/op, {} registry write calls (PutItem), {:.2} calls/op",
        per_op.done,
        per_op.wall.as_secs_f64(),
        per_op.calls,
        per_op.calls as f64 / per_op.done as f64,
    );
    println!(
        "WINDOWS one call per op, µs/op per {WINDOW} ops in order: {}",
        fmt_windows(&per_op.windows)
    );

    let moto = start_moto();
    let coal = rt.block_on(coalesced(moto.url()));
    drop(moto);
    let coal_us = coal.wall.as_secs_f64() * 1e6 / coal.done as f64;
    if coal.done < N {
        println!(
            "NOTE Coalescing stopped after {COALESCED_BUDGET:?}: {} of {N} registrations measured",
            coal.done
        );
    }
    println!(
        "WRITE Coalescing (defaults): {} registrations durable in {:.2} s, {coal_us:.0} µs/op, {} completed registry write calls (TransactWriteItems, mean {:.1} ops, largest {}), {:.3} calls/op",
        coal.done,
        coal.wall.as_secs_f64(),
        coal.calls,
        coal.done as f64 / coal.calls.max(1) as f64,
        coal.batches.iter().max().copied().unwrap_or(0),
        coal.calls as f64 / coal.done as f64,
    );
    println!(
        "WINDOWS Coalescing, µs/op per {WINDOW} ops in order: {}",
        fmt_windows(&coal.windows)
    );
    let per_window: Vec<String> = per_op
        .windows
        .iter()
        .zip(&coal.windows)
        .map(|(p, c)| format!("{:.2}", p / c))
        .collect();
    println!(
        "RATIO one call per op / Coalescing, time per registration, window by window (same table sizes): [{}]",
        per_window.join(", ")
    );
    let calls_ratio =
        (per_op.calls as f64 / per_op.done as f64) / (coal.calls as f64 / coal.done as f64);
    if per_op.done == N && coal.done == N {
        println!(
            "RATIO one call per op / Coalescing, {N} registrations each: wall time {:.2}x ({:.2} s vs {:.2} s), requests {calls_ratio:.0}x ({} vs {})",
            per_op.wall.as_secs_f64() / coal.wall.as_secs_f64(),
            per_op.wall.as_secs_f64(),
            coal.wall.as_secs_f64(),
            per_op.calls,
            coal.calls,
        );
    } else {
        println!(
            "RATIO one call per op / Coalescing, time per registration over what each measured: {:.2}x ({per_op_us:.0} µs over {} vs {coal_us:.0} µs over {}), requests per registration {calls_ratio:.0}x ({:.2} vs {:.3})",
            per_op_us / coal_us,
            per_op.done,
            coal.done,
            per_op.calls as f64 / per_op.done as f64,
            coal.calls as f64 / coal.done as f64,
        );
    }
    drop(rt);
    println!("DONE both moto servers stopped");
}
