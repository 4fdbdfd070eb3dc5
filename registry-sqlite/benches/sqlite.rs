//! Benchmarks of the SQLite backend. Run with
//! `cargo bench -p waypost-sqlite --bench sqlite`.
//!
//! - single `register` calls vs the same registrations in one `apply`
//!   (prints the ratio of wall time, lines starting `RATIO`);
//! - `list(service)` and `snapshot()` with 100k endpoints in the file.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use waypost::{Batch, Endpoint, Op, Registry};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

/// Registrations per measured iteration in the single-vs-batched group.
const WRITES: usize = 500;
/// Endpoints in the file for the read benchmarks.
const TOTAL: usize = 100_000;
const PER_SERVICE: usize = 10;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn endpoint(service: &str, i: usize) -> Endpoint {
    Endpoint::new(
        service,
        format!("ep-{i}"),
        "127.0.0.1",
        (i % 60_000 + 1) as u16,
    )
    .with_node(format!("node-{}", i % 100))
    .with_label("zone", "zone-a")
}

async fn open(dir: &tempfile::TempDir) -> SqliteRegistry {
    SqliteRegistry::open(SqliteConfig::new(dir.path().join("bench.db")).with_sweep_interval(None))
        .await
        .unwrap()
}

/// Fresh keys for every iteration, so each registration is a real insert.
static ROUND: AtomicU64 = AtomicU64::new(0);

fn ops() -> Vec<Op> {
    let svc = format!("w-{}", ROUND.fetch_add(1, Ordering::Relaxed));
    (0..WRITES)
        .map(|i| Op::Register(endpoint(&svc, i)))
        .collect()
}

fn writes(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let reg = rt.block_on(open(&dir));
    let (mut single, mut batched) = (Duration::ZERO, Duration::ZERO);
    let (mut n_single, mut n_batched) = (0u64, 0u64);

    let mut group = c.benchmark_group(format!("sqlite/{WRITES}_registrations"));
    group.bench_function("single_register_calls", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let reg = reg.clone();
            async move {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let ops = ops();
                    let start = Instant::now();
                    for op in ops {
                        if let Op::Register(e) = op {
                            reg.register(e).await.unwrap();
                        }
                    }
                    took += start.elapsed();
                }
                took
            }
        })
    });
    // The measured totals, for the ratio (criterion's own estimates are in
    // its report).
    rt.block_on(async {
        for _ in 0..5 {
            let ops = ops();
            let start = Instant::now();
            for op in ops {
                if let Op::Register(e) = op {
                    reg.register(e).await.unwrap();
                }
            }
            single += start.elapsed();
            n_single += 1;
        }
    });
    group.bench_function("one_batch", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let reg = reg.clone();
            async move {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let ops = ops();
                    let start = Instant::now();
                    reg.apply(ops).await.unwrap();
                    took += start.elapsed();
                }
                took
            }
        })
    });
    rt.block_on(async {
        for _ in 0..5 {
            let ops = ops();
            let start = Instant::now();
            reg.apply(ops).await.unwrap();
            batched += start.elapsed();
            n_batched += 1;
        }
    });
    group.finish();
    let single = single / n_single as u32;
    let batched = batched / n_batched as u32;
    println!(
        "RATIO {WRITES} registrations: single calls {:.1} ms ({:.1} µs each), one batch {:.1} ms \
         ({:.1} µs each): batched is {:.1}x faster",
        single.as_secs_f64() * 1e3,
        single.as_secs_f64() * 1e6 / WRITES as f64,
        batched.as_secs_f64() * 1e3,
        batched.as_secs_f64() * 1e6 / WRITES as f64,
        single.as_secs_f64() / batched.as_secs_f64()
    );
    rt.block_on(reg.close());
}

fn reads(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let reg = rt.block_on(async {
        let reg = open(&dir).await;
        let start = Instant::now();
        let all: Vec<Op> = (0..TOTAL)
            .map(|i| Op::Register(endpoint(&format!("svc-{:05}", i / PER_SERVICE), i)))
            .collect();
        for chunk in all.chunks(10_000) {
            reg.apply(chunk.to_vec()).await.unwrap();
        }
        println!(
            "SETUP {TOTAL} endpoints written in batches of 10k in {:.2} s",
            start.elapsed().as_secs_f64()
        );
        reg
    });
    let mut group = c.benchmark_group(format!("sqlite/{TOTAL}_endpoints"));
    group.bench_function(format!("list_one_service_of_{PER_SERVICE}"), |b| {
        b.to_async(&rt)
            .iter(|| async { reg.list("svc-04321").await.unwrap() })
    });
    group.bench_function("snapshot", |b| {
        b.to_async(&rt).iter(|| async {
            let s = reg.snapshot().await.unwrap();
            assert_eq!(s.len(), TOTAL);
            s
        })
    });
    group.finish();
    rt.block_on(reg.close());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = writes, reads
}
criterion_main!(benches);
