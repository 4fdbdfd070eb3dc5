//! The change log's head under contention: 3, 10 and 50 writers (each a
//! registry of its own, as clusters sharing one table are), each
//! committing a batch every 100 ms. Run with
//! `cargo bench -p waypost-dynamodb --bench contention` (with `-- model`,
//! the counting model alone: a few seconds).
//!
//! Two measurements, each against one writer alone in the same run:
//!
//! - **The counting model** ([`model`]): DynamoDB's per-item transaction
//!   rules on a simulated clock (no server), for heads held 5, 10 and
//!   20 ms by a committing transaction, 60 simulated seconds a run, with
//!   the crate's own retry policy.
//! - **moto** on loopback, through a proxy that passes one request at a
//!   time (moto does not isolate concurrent transactions): 10 s a run, a
//!   fresh table each. moto serves every request in turn, so what it
//!   measures beyond a few writers is moto's own throughput, not
//!   DynamoDB's; the model is the estimate for the service.
//!
//! For each run: batches committed per second, lost races per committed
//! batch, commit latency (p50 and p99, from the first tick whose changes a
//! batch carries, so a writer's batches waiting behind its own count), and
//! how many batches gave up with `Conflict` (the registry's caller saw
//! it) and, in the model, how many of those a `Coalescing` queue in front
//! (as in a registrar) refused after its own retries (a caller of the
//! registrar saw it). Lines
//! starting `RATIO` compare p99 against the lone writer's.

#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../../tests/it/common/mod.rs"]
mod common;
mod model;
#[path = "../common/rng.rs"]
mod rng;

use std::sync::Arc;
use std::time::{Duration, Instant};

use waypost::{Batch, Endpoint, ErrorKind, Op};
use waypost_dynamodb::{DynamoDbRegistry, WatchMode};

/// The batch interval.
const INTERVAL: Duration = Duration::from_millis(100);
/// Writer counts measured (after one alone, the baseline).
const WRITERS: [usize; 3] = [3, 10, 50];
/// Heads of the log measured in the model.
const HEADS: [u32; 4] = [1, 8, 32, 64];

/// A latency percentile of `v` (sorted here), in milliseconds.
fn percentile(v: &mut [u64], p: f64, unit: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i] as f64 / unit
}

/// What one run counted, as printed.
struct Row {
    committed: u64,
    lost: u64,
    conflicts: u64,
    /// Writes refused with `Conflict` by the Coalescing queue in front
    /// (the model only).
    refused: Option<u64>,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Row {
    fn print(&self, what: &str, writers: usize) {
        println!(
            "{what}: {writers:>2} writers: {:.0} batches/s committed, {:.2} lost races per batch, \
             commit latency p50 {:.0} ms, p99 {:.0} ms ({:.1} intervals), {} batches saw Conflict{}",
            self.committed as f64 / self.seconds,
            self.lost as f64 / self.committed.max(1) as f64,
            self.p50_ms,
            self.p99_ms,
            self.p99_ms / INTERVAL.as_secs_f64() / 1000.0,
            self.conflicts,
            match self.refused {
                Some(n) => format!(", {n} refused by the Coalescing queue"),
                None => String::new(),
            },
        );
    }
}

fn model_row(writers: usize, heads: u32, hold_ms: u64) -> Row {
    let seconds = 60;
    let mut c = model::run(&model::Run {
        writers,
        heads,
        interval: INTERVAL.as_micros() as u64,
        seconds,
        server: model::Server {
            one_way: 1_000,
            hold: hold_ms * 1_000,
            answer: 1_000,
        },
        seed: 0x5eed_0000 + writers as u64,
    });
    Row {
        committed: c.committed,
        lost: c.lost,
        conflicts: c.conflicts,
        refused: Some(c.refused),
        seconds: seconds as f64,
        p50_ms: percentile(&mut c.latencies, 0.50, 1000.0),
        p99_ms: percentile(&mut c.latencies, 0.99, 1000.0),
    }
}

fn model_runs() {
    println!(
        "model: one way 1 ms, a cancellation or a read answered in 1 ms, the retry policy of the crate \
         (at most {} transactions a batch)",
        waypost_dynamodb::CHANGELOG_ATTEMPTS
    );
    for (heads, hold) in HEADS
        .iter()
        .flat_map(|k| [5, 10, 20].map(|hold| (*k, hold)))
    {
        let what = format!("model, {heads} head(s) held {hold} ms");
        let alone = model_row(1, heads, hold);
        alone.print(&what, 1);
        for writers in WRITERS {
            let row = model_row(writers, heads, hold);
            row.print(&what, writers);
            println!(
                "RATIO {what}: {writers} writers' p99 / one writer's: {:.1}",
                row.p99_ms / alone.p99_ms
            );
        }
    }
}

/// `writers` registries on a fresh table of `moto` (through a serial
/// proxy), each committing two endpoints every [`INTERVAL`] for `run`.
async fn moto_row(
    moto: &waypost_fixtures::MotoServer,
    writers: usize,
    heads: u32,
    run: Duration,
) -> Row {
    let cfg = common::config(moto.url())
        .with_watch(WatchMode::ChangeLog)
        .with_changelog_heads(heads);
    assert!(DynamoDbRegistry::create_table_if_missing(&cfg, false)
        .await
        .unwrap());
    let proxy = common::RecordingProxy::start_serial(moto.url()).await;
    // The proxy queues every writer's requests behind each other, so at 50
    // writers one request can wait longer than the default operation
    // timeout: that wait is what this run measures, not an outage.
    let cfg = cfg
        .with_endpoint_url(&proxy.url)
        .with_operation_timeout(Duration::from_secs(600));
    let mut regs = Vec::new();
    for _ in 0..writers {
        regs.push(Arc::new(
            DynamoDbRegistry::connect(cfg.clone()).await.unwrap(),
        ));
    }
    let start = tokio::time::Instant::now();
    let end = start + run;
    let tasks: Vec<_> = regs
        .into_iter()
        .enumerate()
        .map(|(w, reg)| {
            tokio::spawn(async move {
                let (mut latencies, mut conflicts, mut committed) = (Vec::new(), 0u64, 0u64);
                // Each writer's ticks at a phase of its own.
                let mut due = start + INTERVAL.mul_f64(w as f64 / writers as f64);
                let mut j = 0u16;
                while due < end {
                    tokio::time::sleep_until(due).await;
                    let began = tokio::time::Instant::now();
                    j = j.wrapping_add(1);
                    let ops = (0..2)
                        .map(|k| {
                            Op::Register(Endpoint::new(
                                "contention",
                                format!("w{w}-{k}"),
                                "10.0.0.1",
                                j,
                            ))
                        })
                        .collect();
                    match reg.apply(ops).await {
                        Ok(()) => {
                            committed += 1;
                            latencies.push(due.elapsed().as_micros() as u64);
                        }
                        Err(e) if e.kind() == ErrorKind::Conflict => conflicts += 1,
                        Err(e) => panic!("writer {w}: {e}"),
                    }
                    // The next batch carries the changes of the first tick
                    // after this one began.
                    due += INTERVAL;
                    while due <= began {
                        due += INTERVAL;
                    }
                }
                (latencies, conflicts, committed)
            })
        })
        .collect();
    let (mut latencies, mut conflicts, mut committed) = (Vec::new(), 0, 0);
    for t in tasks {
        let (l, c, n) = t.await.unwrap();
        latencies.extend(l);
        conflicts += c;
        committed += n;
    }
    let seconds = start.elapsed().as_secs_f64();
    let sent = proxy.count(common::TRANSACT_TARGET) as u64;
    Row {
        committed,
        lost: sent.saturating_sub(committed),
        conflicts,
        refused: None,
        seconds,
        p50_ms: percentile(&mut latencies, 0.50, 1000.0),
        p99_ms: percentile(&mut latencies, 0.99, 1000.0),
    }
}

async fn moto_runs() {
    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let run = Duration::from_secs(10);
    for heads in [1, 32] {
        let what = &format!("moto, serial, {heads} head(s)");
        let alone = moto_row(&moto, 1, heads, run).await;
        alone.print(what, 1);
        for writers in WRITERS {
            let row = moto_row(&moto, writers, heads, run).await;
            row.print(what, writers);
            println!(
                "RATIO {what}: {writers} writers' p99 / one writer's: {:.1}",
                row.p99_ms / alone.p99_ms
            );
        }
    }
}

fn main() {
    let started = Instant::now();
    model_runs();
    if std::env::args().skip(1).any(|a| a == "model") {
        println!(
            "contention bench (model): {:.0} s",
            started.elapsed().as_secs_f64()
        );
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(moto_runs());
    println!("contention bench: {:.0} s", started.elapsed().as_secs_f64());
}
