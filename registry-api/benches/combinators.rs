//! Benchmarks of the combinators. Run with
//! `cargo bench -p waypost --bench combinators`.
//!
//! Each group measures against a baseline in the same run and prints the
//! ratio: list at 1k vs 100k endpoints, list idle vs under 10k writes/s,
//! diff of 100k snapshots, and Coalescing vs one call per op against a
//! backend that takes 1 ms per call.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use waypost::testing::Faulty;
use waypost::{
    backend::diff,
    cached::CachedRegistry,
    coalescing::{Coalescing, CoalescingConfig},
    memory::MemoryRegistry,
    Endpoint, Op, Registry, Snapshot, Version,
};

const PER_SERVICE: usize = 10;

fn endpoints(total: usize) -> Vec<Endpoint> {
    (0..total)
        .map(|i| {
            Endpoint::new(
                format!("svc-{:06}", i / PER_SERVICE),
                format!("ep-{i}"),
                "127.0.0.1",
                (i % 60_000 + 1) as u16,
            )
            .with_node(format!("node-{}", i % 100))
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn cached_with(total: usize) -> CachedRegistry<MemoryRegistry> {
    let mem = MemoryRegistry::new();
    let ops: Vec<Op> = endpoints(total).into_iter().map(Op::Register).collect();
    for chunk in ops.chunks(5_000) {
        waypost::Batch::apply(&mem, chunk.to_vec()).await.unwrap();
    }
    let cached = CachedRegistry::new(mem);
    cached.wait_until_ready().await;
    cached
}

/// Service names asked for, built once so the loop measures the list only.
fn names() -> Vec<String> {
    (0..100).map(|i| format!("svc-{i:06}")).collect()
}

/// Mean time per call of `read` (which returns the list's length), measured
/// by criterion, returned for ratios.
fn time_reads(c: &mut Criterion, name: &str, mut read: impl FnMut(&str) -> usize) -> f64 {
    let names = names();
    let mut total = Duration::ZERO;
    let mut calls = 0u64;
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for i in 0..iters {
                let got = read(&names[i as usize % names.len()]);
                assert_eq!(got, PER_SERVICE);
            }
            let el = start.elapsed();
            total += el;
            calls += iters;
            el
        })
    });
    total.as_secs_f64() / calls as f64
}

/// `CachedRegistry::list` (a copy of each endpoint) through the trait.
fn time_list(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    reg: &CachedRegistry<MemoryRegistry>,
) -> f64 {
    time_reads(c, name, |svc| rt.block_on(reg.list(svc)).unwrap().len())
}

fn bench_cached_list(c: &mut Criterion) {
    let rt = runtime();
    let small = rt.block_on(cached_with(1_000));
    let big = rt.block_on(cached_with(100_000));
    let t_small = time_list(c, &rt, "cached_list/1k_total", &small);
    let t_big = time_list(c, &rt, "cached_list/100k_total", &big);
    println!(
        "RATIO cached list 100k/1k total endpoints: {:.2} ({:.0} ns vs {:.0} ns per call)",
        t_big / t_small,
        t_big * 1e9,
        t_small * 1e9
    );

    // Shared lists: the same allocation for every reader until the service
    // changes, through the trait (an async call) and from the store.
    let t_shared = time_reads(c, "cached_list_shared/100k_total", |svc| {
        rt.block_on(big.list_shared(svc)).unwrap().len()
    });
    let t_store = time_reads(c, "store_list_shared/100k_total", |svc| {
        big.store().list_shared(svc).map_or(0, |l| l.len())
    });
    println!(
        "RATIO cached list_shared/list, 100k total: {:.3} ({:.0} ns vs {:.0} ns per call); \
         Store::list_shared (no async call) {:.0} ns, {:.3} of list",
        t_shared / t_big,
        t_shared * 1e9,
        t_big * 1e9,
        t_store * 1e9,
        t_store / t_big
    );

    // The same list while the backend takes 10k writes/s that the cache follows.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        let inner = big.get_ref().clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let mut i = 0u64;
            let mut written = 0u64;
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..10 {
                    i += 1;
                    let ep = Endpoint::new(
                        format!("churn-{}", i % 1000),
                        "x",
                        "127.0.0.1",
                        (i % 60_000 + 1) as u16,
                    );
                    inner.register(ep).await.unwrap();
                    written += 1;
                }
            }
            written as f64 / start.elapsed().as_secs_f64()
        })
    };
    let t_busy = time_list(
        c,
        &rt,
        "cached_list/100k_total_under_10k_writes_per_s",
        &big,
    );
    let t_busy_shared = time_reads(
        c,
        "cached_list_shared/100k_total_under_10k_writes_per_s",
        |svc| rt.block_on(big.list_shared(svc)).unwrap().len(),
    );
    stop.store(true, Ordering::Relaxed);
    let rate = rt.block_on(writer).unwrap();
    println!(
        "RATIO cached list under writes/idle: {:.2} ({:.0} ns vs {:.0} ns per call; writer achieved {:.0} writes/s)",
        t_busy / t_big,
        t_busy * 1e9,
        t_big * 1e9,
        rate
    );
    println!(
        "RATIO cached list_shared under writes/idle: {:.2} ({:.0} ns vs {:.0} ns per call)",
        t_busy_shared / t_shared,
        t_busy_shared * 1e9,
        t_shared * 1e9,
    );
}

fn bench_diff(c: &mut Criterion) {
    let base = Snapshot::from_endpoints(Version(1), endpoints(100_000));
    // Built independently: no shared structure, a key-by-key comparison.
    let mut changed = endpoints(100_000);
    for e in changed.iter_mut().step_by(1000) {
        e.port = e.port.wrapping_add(1).max(1);
    }
    let other = Snapshot::from_endpoints(Version(2), changed);
    // Derived from `base`: shared structure is skipped.
    let mut derived = base.clone();
    for e in endpoints(100_000).into_iter().step_by(1000) {
        let port = e.port.wrapping_add(1).max(1);
        derived = derived.with_endpoint(Endpoint { port, ..e });
    }
    assert_eq!(diff(&base, &other).len(), 100);
    assert_eq!(diff(&base, &derived).len(), 100);
    assert_eq!(field_by_field(&base, &other), 100);
    let mut g = c.benchmark_group("diff_100k_100_changes");
    let mean = |g: &mut criterion::BenchmarkGroup<'_, _>, name: &str, f: &dyn Fn() -> usize| {
        let mut total = Duration::ZERO;
        let mut calls = 0u32;
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    assert_eq!(f(), 100);
                }
                let el = start.elapsed();
                total += el;
                calls += iters as u32;
                el
            })
        });
        total.as_secs_f64() / f64::from(calls)
    };
    let t_naive = mean(&mut g, "field_by_field_baseline", &|| {
        field_by_field(&base, &other)
    });
    let t_indep = mean(&mut g, "independent", &|| diff(&base, &other).len());
    let t_derived = mean(&mut g, "derived", &|| diff(&base, &derived).len());
    g.finish();
    println!(
        "RATIO diff of independent 100k snapshots / field-by-field merge: {:.3} ({:.2} ms vs {:.2} ms); derived: {:.0} us",
        t_indep / t_naive,
        t_indep * 1e3,
        t_naive * 1e3,
        t_derived * 1e6
    );
}

/// The baseline: both snapshots walked in key order, keys and endpoints
/// compared field by field (what `diff` did for independent snapshots
/// before fingerprints); returns how many keys differ.
fn field_by_field(old: &Snapshot, new: &Snapshot) -> usize {
    use std::cmp::Ordering;
    let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
    let mut changed = 0;
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => match (&x.service, &x.id).cmp(&(&y.service, &y.id)) {
                Ordering::Less => {
                    changed += 1;
                    a.next();
                }
                Ordering::Greater => {
                    changed += 1;
                    b.next();
                }
                Ordering::Equal => {
                    changed += usize::from(x != y);
                    a.next();
                    b.next();
                }
            },
            (Some(_), None) => {
                changed += 1;
                a.next();
            }
            (None, Some(_)) => {
                changed += 1;
                b.next();
            }
            (None, None) => return changed,
        }
    }
}

fn bench_coalescing(_c: &mut Criterion) {
    let rt = runtime();
    let n = 500usize;
    let ops: Vec<Endpoint> = (0..n)
        .map(|i| Endpoint::new("svc", format!("e{i}"), "127.0.0.1", (i + 1) as u16))
        .collect();

    // Baseline: one backend call per op.
    let direct = Faulty::new(MemoryRegistry::new());
    direct.set_latency(Duration::from_millis(1));
    let start = Instant::now();
    rt.block_on(async {
        for e in &ops {
            direct.register(e.clone()).await.unwrap();
        }
    });
    let t_direct = start.elapsed();

    // Coalescing, same ops, same 1 ms per backend call.
    let inner = Faulty::new(MemoryRegistry::new());
    inner.set_latency(Duration::from_millis(1));
    let t_coalesced = rt.block_on(async {
        let reg = Coalescing::with_config(inner, CoalescingConfig::default()).unwrap();
        let start = Instant::now();
        for e in &ops {
            reg.register(e.clone()).await.unwrap();
        }
        reg.flush().await;
        let el = start.elapsed();
        let calls = reg.get_ref().write_calls();
        assert_eq!(reg.get_ref().get_ref().list("svc").await.unwrap().len(), n);
        (el, calls)
    });
    println!(
        "RATIO coalescing vs one call per op, {n} ops, 1 ms per backend call: wall time {:.1}x faster ({:?} vs {:?}), backend calls {} vs {} ({:.0}x fewer)",
        t_direct.as_secs_f64() / t_coalesced.0.as_secs_f64(),
        t_coalesced.0,
        t_direct,
        t_coalesced.1,
        direct.write_calls(),
        direct.write_calls() as f64 / t_coalesced.1 as f64
    );
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_cached_list, bench_diff, bench_coalescing
}
criterion_main!(benches);
