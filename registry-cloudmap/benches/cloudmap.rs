//! Benchmarks of the Cloud Map backend's polling against `moto_server` on
//! loopback (started through `waypost_fixtures::MotoServer::start()`,
//! stopped at the end). Run with
//! `cargo bench -p waypost-cloudmap --bench cloudmap`.
//!
//! Plain timing (no criterion): one namespace of 100 services × 10
//! instances, then `snapshot()` cycles (what `Polling` runs every interval)
//! with revision skipping off (the baseline: every service's instances are
//! read every cycle) and on (a `DiscoverInstancesRevision` per service;
//! instances are read only when it changed, and fully every
//! `full_poll_every`-th cycle, default 10), for both read modes. Time per
//! cycle is measured around `snapshot()`; API calls per cycle come from the
//! registry's `stats()`. Nothing changes between cycles. Lines starting
//! `RATIO` compare against the baseline measured in the same run.

#![allow(clippy::unwrap_used, missing_docs)]

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use waypost::testing::unique;
use waypost::{Batch, Endpoint, Op, Registry};
use waypost_cloudmap::aws_sdk_servicediscovery::config::{BehaviorVersion, Credentials, Region};
use waypost_cloudmap::{CloudMapConfig, CloudMapRegistry, CloudMapStats, ReadMode};
use waypost_fixtures::MotoServer;

const SERVICES: usize = 100;
const PER_SERVICE: usize = 10;
/// Cycles measured per configuration, after one warm-up cycle (cycle 0,
/// always a full read).
const CYCLES: usize = 10;
/// Longest the whole run may take.
const LIMIT: Duration = Duration::from_secs(600);

fn sdk_config() -> waypost_cloudmap::aws_sdk_servicediscovery::Config {
    waypost_cloudmap::aws_sdk_servicediscovery::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .build()
}

/// The namespace on `url`, with a client-side rate limit high enough not to
/// be what is measured (the default, 50/s, would make every cycle of ~100
/// calls take ~2 s).
fn config(url: &str, namespace: &str) -> CloudMapConfig {
    let rate = NonZeroU32::new(5000).unwrap();
    CloudMapConfig::new(namespace)
        .with_endpoint_url(url)
        .with_rate_limit(rate, rate)
        .with_operation_poll(Duration::from_millis(5), Duration::from_millis(100))
}

async fn connect(cfg: CloudMapConfig) -> CloudMapRegistry {
    CloudMapRegistry::with_sdk_config(sdk_config(), cfg)
        .await
        .unwrap()
}

fn delta(a: CloudMapStats, b: CloudMapStats) -> CloudMapStats {
    let mut d = CloudMapStats::default();
    d.requests = b.requests - a.requests;
    d.revision_calls = b.revision_calls - a.revision_calls;
    d.instance_reads = b.instance_reads - a.instance_reads;
    d.skipped_services = b.skipped_services - a.skipped_services;
    d.operation_polls = b.operation_polls - a.operation_polls;
    d
}

struct Cycle {
    time: Duration,
    stats: CloudMapStats,
}

/// One warm-up cycle, then `CYCLES` measured ones.
async fn cycles(url: &str, namespace: &str, mode: ReadMode, skip: bool) -> Vec<Cycle> {
    let reg = connect(
        config(url, namespace)
            .with_read_mode(mode)
            .with_revision_skip(skip),
    )
    .await;
    assert_eq!(
        reg.snapshot().await.unwrap().len(),
        SERVICES * PER_SERVICE,
        "warm-up"
    );
    let mut out = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let before = reg.stats();
        let start = Instant::now();
        let snap = reg.snapshot().await.unwrap();
        let time = start.elapsed();
        assert_eq!(snap.len(), SERVICES * PER_SERVICE);
        out.push(Cycle {
            time,
            stats: delta(before, reg.stats()),
        });
    }
    out
}

fn mean_ms(c: &[&Cycle]) -> f64 {
    c.iter().map(|c| c.time.as_secs_f64() * 1e3).sum::<f64>() / c.len() as f64
}

fn mean_calls(c: &[&Cycle]) -> f64 {
    c.iter().map(|c| c.stats.requests as f64).sum::<f64>() / c.len() as f64
}

fn describe(label: &str, c: &[&Cycle]) {
    let reads: u64 = c.iter().map(|c| c.stats.instance_reads).sum();
    let revs: u64 = c.iter().map(|c| c.stats.revision_calls).sum();
    let skipped: u64 = c.iter().map(|c| c.stats.skipped_services).sum();
    let n = c.len() as f64;
    println!(
        "CYCLE {label:<44} {} cycles: {:>7.1} ms/cycle, {:>6.1} API calls/cycle ({:.1} instance reads, {:.1} revision calls, {:.1} services skipped)",
        c.len(),
        mean_ms(c),
        mean_calls(c),
        reads as f64 / n,
        revs as f64 / n,
        skipped as f64 / n,
    );
}

async fn run(url: &str) {
    let namespace = unique("bench-ns");
    let setup = connect(config(url, &namespace).with_concurrency(16)).await;
    let ops: Vec<Op> = (0..SERVICES * PER_SERVICE)
        .map(|i| {
            Op::Register(Endpoint::new(
                format!("svc-{:03}", i / PER_SERVICE),
                format!("ep-{i}"),
                "127.0.0.1",
                (i + 1) as u16,
            ))
        })
        .collect();
    let start = Instant::now();
    setup.apply(ops).await.unwrap();
    println!(
        "SETUP {SERVICES} services × {PER_SERVICE} instances registered in {:.1} s ({} API calls)",
        start.elapsed().as_secs_f64(),
        setup.stats().requests
    );
    assert_eq!(
        setup.snapshot().await.unwrap().len(),
        SERVICES * PER_SERVICE
    );

    for mode in [ReadMode::Discover, ReadMode::List] {
        let off = cycles(url, &namespace, mode, false).await;
        let on = cycles(url, &namespace, mode, true).await;
        let off_all: Vec<&Cycle> = off.iter().collect();
        let on_all: Vec<&Cycle> = on.iter().collect();
        // With full_poll_every = 10 the measured cycles are 1..=10: cycle
        // 10 reads everything, the others skip.
        let on_skip: Vec<&Cycle> = on.iter().filter(|c| c.stats.instance_reads == 0).collect();
        let on_full: Vec<&Cycle> = on.iter().filter(|c| c.stats.instance_reads > 0).collect();
        describe(&format!("{mode:?}, revision skip off"), &off_all);
        describe(
            &format!("{mode:?}, revision skip on, skipping cycles"),
            &on_skip,
        );
        describe(
            &format!("{mode:?}, revision skip on, full cycles"),
            &on_full,
        );
        describe(
            &format!("{mode:?}, revision skip on, all (1 in 10 full)"),
            &on_all,
        );
        println!(
            "RATIO {mode:?} skip off / skip on, skipping cycles: time {:.2}x ({:.1} vs {:.1} ms), API calls {:.2}x ({:.1} vs {:.1}), instance reads {:.1} vs 0",
            mean_ms(&off_all) / mean_ms(&on_skip),
            mean_ms(&off_all),
            mean_ms(&on_skip),
            mean_calls(&off_all) / mean_calls(&on_skip),
            mean_calls(&off_all),
            mean_calls(&on_skip),
            off_all.iter().map(|c| c.stats.instance_reads).sum::<u64>() as f64 / off_all.len() as f64,
        );
        println!(
            "RATIO {mode:?} skip off / skip on, averaged over 10 cycles incl. the full one: time {:.2}x ({:.1} vs {:.1} ms), API calls {:.2}x ({:.1} vs {:.1})",
            mean_ms(&off_all) / mean_ms(&on_all),
            mean_ms(&off_all),
            mean_ms(&on_all),
            mean_calls(&off_all) / mean_calls(&on_all),
            mean_calls(&off_all),
            mean_calls(&on_all),
        );
    }
}

fn main() {
    let moto = MotoServer::start().expect("moto_server (pip install 'moto[server]')");
    println!(
        "SETUP moto {:?} at {} (fixture waypost_fixtures::MotoServer)",
        moto.provision(),
        moto.url()
    );
    let url = moto.url().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if tokio::time::timeout(LIMIT, run(&url)).await.is_err() {
            panic!("the Cloud Map bench took longer than {LIMIT:?}");
        }
    });
    drop(rt);
    drop(moto);
    println!("DONE moto stopped");
}
