//! Benchmarks of the etcd backend against a real etcd on loopback (started
//! through `waypost_fixtures::EtcdServer::start()`, stopped at the end). Run
//! with `cargo bench -p waypost-etcd --bench etcd`.
//!
//! Plain timing (no criterion): each phase runs once on a prefix of its own
//! and prints its figures; lines starting `RATIO` compare against the
//! baseline measured in the same run.
//!
//! 1. 10k registrations: one `register` call per op (the baseline), vs
//!    `Batch::apply` in chunks of 128 (one `Txn` each), vs `Coalescing`.
//!    Calls are counted on the registry side (`Faulty::write_calls` and
//!    `Faulty::batches`); etcd's revision, which every write `Txn` raises
//!    by one, is read before and after as a server-side count of write
//!    requests.
//! 2. `list(service)` straight from etcd (the baseline) vs
//!    `CachedRegistry::list` over the same prefix.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use waypost::testing::{unique, Faulty};
use waypost::{cached::CachedRegistry, coalescing::Coalescing, Batch, Endpoint, Op, Registry};
use waypost_etcd::etcd_client::Client;
use waypost_etcd::{EtcdConfig, EtcdRegistry};
use waypost_fixtures::EtcdServer;

/// Registrations per write phase.
const N: usize = 10_000;
/// Endpoints per service (N / PER_SERVICE services).
const PER_SERVICE: usize = 10;
/// Ops per `Batch::apply` call: etcd's backend default `max_batch`.
const CHUNK: usize = 128;
/// Longest any one phase may take.
const PHASE_LIMIT: Duration = Duration::from_secs(240);
/// `list` calls measured straight from etcd, and through the cache.
const DIRECT_LISTS: usize = 2_000;
const CACHED_LISTS: usize = 200_000;

fn endpoints() -> Vec<Endpoint> {
    (0..N)
        .map(|i| {
            Endpoint::new(
                format!("svc-{:05}", i / PER_SERVICE),
                format!("ep-{i}"),
                "127.0.0.1",
                (i % 60_000 + 1) as u16,
            )
        })
        .collect()
}

fn config(url: &str) -> EtcdConfig {
    EtcdConfig::new([url.to_string()])
        .with_prefix(format!("/{}", unique("bench")))
        .with_request_timeout(Duration::from_secs(10))
        .with_connect_timeout(Duration::from_secs(5))
}

/// etcd's current revision (one per write `Txn` since the start).
async fn revision(client: &Client) -> i64 {
    let mut c = client.clone();
    let resp = c.get("/bench-revision-probe", None).await.unwrap();
    resp.header().unwrap().revision()
}

async fn connect(url: &str) -> EtcdRegistry {
    EtcdRegistry::connect(config(url)).await.unwrap()
}

async fn count(reg: &impl Registry) -> usize {
    reg.snapshot().await.unwrap().len()
}

struct WriteRun {
    name: &'static str,
    wall: Duration,
    calls: usize,
    txns: i64,
}

impl WriteRun {
    fn print(&self) {
        println!(
            "WRITE {:<28} {N} registrations: {:>9.4} s, {:>8.1} µs/op, {:>6} registry write calls, {:>6} etcd write Txns (revision delta)",
            self.name,
            self.wall.as_secs_f64(),
            self.wall.as_secs_f64() * 1e6 / N as f64,
            self.calls,
            self.txns,
        );
    }
}

async fn one_call_per_op(url: &str) -> WriteRun {
    let reg = Faulty::new(connect(url).await);
    let client = reg.get_ref().client().clone();
    let eps = endpoints();
    let rev0 = revision(&client).await;
    let mut lat = Vec::with_capacity(N);
    let start = Instant::now();
    for e in eps {
        let t = Instant::now();
        reg.register(e).await.unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let wall = start.elapsed();
    let txns = revision(&client).await - rev0;
    assert_eq!(count(&reg).await, N);
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "LATENCY one register call ({wall:?} in all, calls themselves {:.4} s): min {:.0} µs, p50 {:.0} µs, p90 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
        lat.iter().sum::<f64>() / 1e6,
        lat[0],
        lat[N / 2],
        lat[N * 9 / 10],
        lat[N * 99 / 100],
        lat[N - 1],
    );
    WriteRun {
        name: "one register call per op",
        wall,
        calls: reg.write_calls(),
        txns,
    }
}

async fn batch_apply(url: &str) -> WriteRun {
    let reg = Faulty::new(connect(url).await);
    assert_eq!(reg.max_batch(), CHUNK, "etcd's default max_batch");
    let client = reg.get_ref().client().clone();
    let ops: Vec<Op> = endpoints().into_iter().map(Op::Register).collect();
    let rev0 = revision(&client).await;
    let start = Instant::now();
    for chunk in ops.chunks(CHUNK) {
        reg.apply(chunk.to_vec()).await.unwrap();
    }
    let wall = start.elapsed();
    let txns = revision(&client).await - rev0;
    assert_eq!(count(&reg).await, N);
    assert!(reg.batches().iter().all(|b| *b <= CHUNK));
    WriteRun {
        name: "Batch::apply, chunks of 128",
        wall,
        calls: reg.write_calls(),
        txns,
    }
}

async fn coalescing(url: &str) -> (WriteRun, Vec<usize>) {
    let reg = Coalescing::new(Faulty::new(connect(url).await));
    let client = reg.get_ref().get_ref().client().clone();
    let eps = endpoints();
    let rev0 = revision(&client).await;
    let start = Instant::now();
    for e in eps {
        reg.register(e).await.unwrap();
    }
    reg.flush().await;
    let wall = start.elapsed();
    let txns = revision(&client).await - rev0;
    assert_eq!(count(reg.get_ref()).await, N);
    let batches = reg.get_ref().batches();
    let run = WriteRun {
        name: "Coalescing (defaults)",
        wall,
        calls: reg.get_ref().write_calls(),
        txns,
    };
    reg.shutdown().await;
    (run, batches)
}

/// Per-call latencies of `calls` `list` calls over the services, in µs:
/// (mean, p50, p99).
async fn time_lists(reg: &impl Registry, calls: usize) -> (f64, f64, f64) {
    time_reads(reg, calls, false).await
}

/// As [`time_lists`], with `list_shared` when `shared`.
async fn time_reads(reg: &impl Registry, calls: usize, shared: bool) -> (f64, f64, f64) {
    let services = N / PER_SERVICE;
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls {
        let svc = format!("svc-{:05}", (i * 7919) % services);
        let t = Instant::now();
        let got = if shared {
            reg.list_shared(&svc).await.unwrap().len()
        } else {
            reg.list(&svc).await.unwrap().len()
        };
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(got, PER_SERVICE);
    }
    let mean = lat.iter().sum::<f64>() / calls as f64;
    lat.sort_by(|a, b| a.total_cmp(b));
    (mean, lat[calls / 2], lat[calls * 99 / 100])
}

async fn lists(url: &str) {
    let reg = connect(url).await;
    let ops: Vec<Op> = endpoints().into_iter().map(Op::Register).collect();
    for chunk in ops.chunks(reg.max_batch()) {
        reg.apply(chunk.to_vec()).await.unwrap();
    }
    // Warm the connection, then the baseline: a range read per call.
    time_lists(&reg, 100).await;
    let (d_mean, d_p50, d_p99) = time_lists(&reg, DIRECT_LISTS).await;
    let cached = CachedRegistry::new(reg);
    let ready = Instant::now();
    cached.wait_until_ready().await;
    let ready = ready.elapsed();
    let (c_mean, c_p50, c_p99) = time_lists(&cached, CACHED_LISTS).await;
    let (s_mean, s_p50, s_p99) = time_reads(&cached, CACHED_LISTS, true).await;
    println!(
        "LIST direct from etcd, {DIRECT_LISTS} calls (10 endpoints per service, {N} in the prefix): mean {d_mean:.1} µs, p50 {d_p50:.1} µs, p99 {d_p99:.1} µs"
    );
    println!(
        "LIST CachedRegistry::list, {CACHED_LISTS} calls: mean {c_mean:.2} µs, p50 {c_p50:.2} µs, p99 {c_p99:.2} µs (cache filled in {ready:?})"
    );
    println!(
        "LIST CachedRegistry::list_shared, {CACHED_LISTS} calls: mean {s_mean:.2} µs, p50 {s_p50:.2} µs, p99 {s_p99:.2} µs"
    );
    println!(
        "RATIO list direct/cached: mean {:.0}x, p50 {:.0}x, p99 {:.0}x",
        d_mean / c_mean,
        d_p50 / c_p50,
        d_p99 / c_p99
    );
    println!(
        "RATIO list direct/cached list_shared: mean {:.0}x, p50 {:.0}x, p99 {:.0}x",
        d_mean / s_mean,
        d_p50 / s_p50,
        d_p99 / s_p99
    );
}

async fn phase<T>(name: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(PHASE_LIMIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("phase {name} took longer than {PHASE_LIMIT:?}"),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let server = EtcdServer::start().expect("etcd (apt-get install etcd-server)");
    println!(
        "SETUP etcd {:?} at {} (fixture waypost_fixtures::EtcdServer)",
        server.provision(),
        server.endpoint()
    );
    let url = server.endpoint().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let per_op = phase("one call per op", one_call_per_op(&url)).await;
        per_op.print();
        let batched = phase("Batch::apply", batch_apply(&url)).await;
        batched.print();
        let (coal, batches) = phase("Coalescing", coalescing(&url)).await;
        coal.print();
        let max = batches.iter().max().copied().unwrap_or(0);
        println!(
            "BATCHES Coalescing applied {} batches: mean {:.1} ops, largest {max}",
            batches.len(),
            N as f64 / batches.len().max(1) as f64,
        );
        for run in [&batched, &coal] {
            println!(
                "RATIO {} vs one call per op: wall time {:.1}x faster ({:.3} s vs {:.3} s), registry write calls {:.0}x fewer ({} vs {}), etcd write Txns {:.0}x fewer ({} vs {})",
                run.name,
                per_op.wall.as_secs_f64() / run.wall.as_secs_f64(),
                run.wall.as_secs_f64(),
                per_op.wall.as_secs_f64(),
                per_op.calls as f64 / run.calls as f64,
                run.calls,
                per_op.calls,
                per_op.txns as f64 / run.txns as f64,
                run.txns,
                per_op.txns,
            );
        }
        phase("list", lists(&url)).await;
    });
    drop(rt);
    drop(server);
    println!("DONE etcd stopped");
}
