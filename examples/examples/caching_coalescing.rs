//! What `Coalescing` and `CachedRegistry` buy, measured.
//!
//! Run with `cargo run --example caching_coalescing`. It opens a SQLite
//! registry in a temporary directory, wraps it in a counter that also waits
//! 1 ms per call (standing in for the network round trip of a remote
//! backend such as etcd or DynamoDB), and runs the same work three ways:
//! straight to the backend, through `Coalescing` (writes), through
//! `CachedRegistry` (reads), and through both stacked as
//! `Cached(Coalescing(backend))`. It prints backend calls and wall time for
//! each, and finishes in a few seconds.

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use waypost::{
    cached::CachedRegistry, coalescing::Coalescing, Batch, Endpoint, EndpointKey, Op, Registry,
    Snapshot, Watch,
};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

/// Simulated network round trip added to every backend call.
const RTT: Duration = Duration::from_millis(1);
/// Concurrent writers.
const WRITES: usize = 200;
/// Reads of one service.
const READS: usize = 200;

/// Counts the calls that reach the backend, and delays each by [`RTT`].
struct Counted<R> {
    inner: R,
    name: &'static str,
    calls: AtomicU64,
    ops: AtomicU64,
}

impl<R> Counted<R> {
    fn new(inner: R, name: &'static str) -> Self {
        Self {
            inner,
            name,
            calls: AtomicU64::new(0),
            ops: AtomicU64::new(0),
        }
    }

    async fn call(&self, ops: u64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(ops, Ordering::Relaxed);
        tokio::time::sleep(RTT).await;
    }

    /// (calls, ops) so far, and reset.
    fn take(&self) -> (u64, u64) {
        (
            self.calls.swap(0, Ordering::Relaxed),
            self.ops.swap(0, Ordering::Relaxed),
        )
    }
}

/// A short name, so the chains print on one line.
impl<R> fmt::Display for Counted<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counted({})", self.name)
    }
}

impl<R: fmt::Debug> fmt::Debug for Counted<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Counted").field(&self.inner).finish()
    }
}

waypost::forward! {
    impl[R: Registry + fmt::Debug] Registry for Counted<R> {
        forward to inner: capabilities, probe;
        async fn register(&self, endpoint: Endpoint) -> waypost::Result<()> {
            self.call(1).await;
            self.inner.register(endpoint).await
        }
        async fn deregister(&self, key: &EndpointKey) -> waypost::Result<()> {
            self.call(1).await;
            self.inner.deregister(key).await
        }
        async fn list(&self, service: &str) -> waypost::Result<Vec<Endpoint>> {
            self.call(0).await;
            self.inner.list(service).await
        }
        async fn list_shared(&self, service: &str) -> waypost::Result<Arc<[Endpoint]>> {
            self.call(0).await;
            self.inner.list_shared(service).await
        }
        async fn snapshot(&self) -> waypost::Result<Snapshot> {
            self.call(0).await;
            self.inner.snapshot().await
        }
    }
}

waypost::forward! {
    impl[R: Batch + fmt::Debug] Batch for Counted<R> {
        forward to inner: max_batch;
        async fn apply(&self, ops: Vec<Op>) -> waypost::Result<()> {
            self.call(ops.len() as u64).await;
            self.inner.apply(ops).await
        }
    }
}

waypost::forward! {
    impl[R: Watch] Watch for Counted<R> {
        // One long-lived stream; not counted as a call.
        forward to inner: watch;
    }
}

fn endpoint(round: &str, i: usize) -> Endpoint {
    Endpoint::new(
        "payments",
        format!("{round}-{i:03}"),
        "127.0.0.1",
        10_000 + i as u16,
    )
}

fn row(what: &str, counted: &Counted<SqliteRegistry>, took: Duration) {
    let (calls, ops) = counted.take();
    println!(
        "  {what:<50} {calls:>4} backend calls ({ops:>3} writes) {:>7.1} ms",
        took.as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("registry.db");
    let backend = Arc::new(Counted::new(
        SqliteRegistry::open(SqliteConfig::new(&path)).await?,
        "Sqlite",
    ));
    println!(
        "backend: {} wrapped as {backend}: counts calls, adds {RTT:?} per call \
         (a simulated network round trip)\n",
        backend.inner
    );

    println!("1. {WRITES} registrations from {WRITES} concurrent tasks");
    let t = Instant::now();
    join_all((0..WRITES).map(|i| backend.register(endpoint("direct", i))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    row("direct", &backend, t.elapsed());

    let coalescing = Coalescing::new(Arc::clone(&backend));
    let t = Instant::now();
    join_all((0..WRITES).map(|i| coalescing.register(endpoint("coalesced", i))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let queued = t.elapsed();
    coalescing.flush().await;
    row(&coalescing.to_string(), &backend, t.elapsed());
    println!(
        "  -> all {WRITES} calls returned in {queued:.1?} (queued); a flush every 100 ms \
         or 50 ops applied them as a few batches\n"
    );

    println!("2. {READS} reads of list(\"payments\")");
    let t = Instant::now();
    for _ in 0..READS {
        backend.list("payments").await?;
    }
    row("direct", &backend, t.elapsed());

    let cached = CachedRegistry::new(Arc::clone(&backend));
    cached.wait_until_ready().await; // the first snapshot, through the watch
    backend.take();
    let t = Instant::now();
    let mut n = 0;
    for _ in 0..READS {
        n = cached.list("payments").await?.len();
    }
    row(&cached.to_string(), &backend, t.elapsed());
    println!(
        "  -> {n} endpoints per read, served from memory; cache age {:?}\n",
        cached.cache_age().unwrap_or_default()
    );
    drop(cached);

    println!("3. both: {WRITES} concurrent registrations, then {READS} reads");
    let stack = CachedRegistry::new(Coalescing::new(Arc::clone(&backend)));
    stack.wait_until_ready().await;
    backend.take();
    let t = Instant::now();
    join_all((0..WRITES).map(|i| stack.register(endpoint("stacked", i))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    row(&format!("{stack}: writes"), &backend, t.elapsed());
    let t = Instant::now();
    for _ in 0..READS {
        n = stack.list("payments").await?.len();
    }
    row(&format!("{stack}: reads"), &backend, t.elapsed());
    println!(
        "  -> each write call returned once its write was in the cache (read your \
         writes: {n} endpoints now); the backend saw a few batches and no reads"
    );
    println!(
        "\nOrder: Cached outside Coalescing. Cached answers reads from memory and \
         waits for each write's echo on its watch; Coalescing, inside, batches the \
         writes of all callers before they reach the backend."
    );
    Ok(())
}
