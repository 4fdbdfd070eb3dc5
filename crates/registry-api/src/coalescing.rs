//! [`Coalescing`]: write batching in front of any [`Batch`] backend.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use backon::BackoffBuilder;
use futures::future::join_all;
use tokio::sync::{oneshot, watch, Notify};

use crate::error::{Error, Result};
use crate::model::{Capabilities, Endpoint, EndpointKey, Op, Version};
use crate::snapshot::Snapshot;
use crate::traits::{validate_ops, Batch, EventStream, Heartbeat, Registry, Watch};

/// Settings of [`Coalescing`]. The defaults are the registrar document's.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct CoalescingConfig {
    /// Flush at least this often while ops are queued. Default 100 ms.
    pub flush_interval: Duration,
    /// Flush as soon as this many ops are queued. Default 50.
    pub flush_ops: usize,
    /// Most ops queued or in flight; one more is refused with
    /// [`Error::Overloaded`]. Default 10 000.
    pub capacity: usize,
    /// First retry delay after a retryable backend error. Default 50 ms.
    pub retry_min: Duration,
    /// Longest retry delay (exponential, factor 2, with jitter). Default 5 s.
    pub retry_max: Duration,
}

impl Default for CoalescingConfig {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_millis(100),
            flush_ops: 50,
            capacity: 10_000,
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_secs(5),
        }
    }
}

impl CoalescingConfig {
    /// Set `flush_interval`.
    pub fn with_flush_interval(mut self, d: Duration) -> Self {
        self.flush_interval = d;
        self
    }
    /// Set `flush_ops` (at least 1).
    pub fn with_flush_ops(mut self, n: usize) -> Self {
        self.flush_ops = n.max(1);
        self
    }
    /// Set `capacity` (at least 1).
    pub fn with_capacity(mut self, n: usize) -> Self {
        self.capacity = n.max(1);
        self
    }
    /// Set the retry delays.
    pub fn with_retry(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min;
        self.retry_max = max.max(min);
        self
    }
}

/// Batches writes: ops are queued, merged to their net effect per key, and
/// applied with [`Batch::apply`] in chunks of the backend's `max_batch()`
/// every `flush_interval` or as soon as `flush_ops` are queued.
///
/// - `register`, `deregister` and `apply` return once the ops are queued
///   (validated first). [`Coalescing::submit`] returns a [`WriteTicket`] that
///   resolves when its ops are durable.
/// - Net effect within a flush: register then deregister is a deregister,
///   deregister then register a register, two registers the later one.
/// - Per-key order holds across flushes: one flusher applies flushes in
///   order and a flush is only done when all its chunks are.
/// - Retryable errors (the backend is down, throttled) are retried with
///   exponential backoff and jitter, without limit: ops stay queued through
///   an outage. A full queue answers [`Error::Overloaded`] at once and
///   nothing already queued is lost. A non-retryable error fails the ops of
///   that chunk: their tickets get the error and it is logged.
/// - [`flush`](Coalescing::flush) and [`shutdown`](Coalescing::shutdown)
///   drain everything queued before them. Dropping a `Coalescing` lets its
///   flusher drain the queue in the background.
///
/// Reads, watches and heartbeats go straight to the inner registry. Must be
/// created inside a Tokio runtime.
///
/// Metrics: `registrar_write_batch_size` (histogram, ops per backend call),
/// `registrar_write_queue_depth` (gauge).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use registry_api::{Coalescing, Endpoint, MemoryRegistry, Registry};
/// let reg = Coalescing::new(MemoryRegistry::new());
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 80)).await?; // queued
/// reg.flush().await;                                                 // applied
/// assert_eq!(reg.get_ref().list("api").await?.len(), 1);
/// assert_eq!(reg.to_string(), "Coalescing(Memory)");
/// # Ok::<(), registry_api::Error>(()) });
/// ```
pub struct Coalescing<B> {
    inner: Arc<B>,
    shared: Arc<Shared>,
    flusher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    /// Highest sequence number that is finished (applied or failed).
    done: watch::Sender<u64>,
    cfg: CoalescingConfig,
}

struct Queue {
    pending: VecDeque<Pending>,
    in_flight: usize,
    next_seq: u64,
    flush_now: bool,
    closed: bool,
}

struct Pending {
    seq: u64,
    op: Op,
    ticket: Option<oneshot::Sender<Result<()>>>,
}

/// Resolves when the ops of one [`Coalescing::submit`] call are applied by
/// the backend, or failed for good.
#[must_use = "a ticket does nothing unless awaited"]
pub struct WriteTicket {
    receivers: Vec<oneshot::Receiver<Result<()>>>,
}

impl WriteTicket {
    /// Wait until every op is durable; the first error if any failed.
    pub async fn durable(self) -> Result<()> {
        for r in join_all(self.receivers).await {
            r.map_err(|_| Error::internal("coalescing flusher stopped before applying the op"))??;
        }
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: Batch> Coalescing<B> {
    /// Batch writes to `inner` with the default settings.
    pub fn new(inner: B) -> Self {
        Self::with_config(inner, CoalescingConfig::default())
    }

    /// Batch writes to `inner` with `cfg`.
    pub fn with_config(inner: B, cfg: CoalescingConfig) -> Self {
        let inner = Arc::new(inner);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                in_flight: 0,
                next_seq: 0,
                flush_now: false,
                closed: false,
            }),
            wake: Notify::new(),
            done: watch::channel(0).0,
            cfg,
        });
        let flusher = tokio::spawn(flush_loop(Arc::clone(&inner), Arc::clone(&shared)));
        Self {
            inner,
            shared,
            flusher: Mutex::new(Some(flusher)),
        }
    }

    /// The inner registry.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Ops queued or being applied.
    pub fn queue_depth(&self) -> usize {
        let q = self.shared.lock();
        q.pending.len() + q.in_flight
    }

    /// Queue `ops` (validated first) and get a ticket for their durability.
    /// All of them are queued or none: a queue without room for all answers
    /// [`Error::Overloaded`].
    pub fn submit(&self, ops: Vec<Op>) -> Result<WriteTicket> {
        validate_ops(&ops)?;
        self.enqueue(ops)
    }

    /// Queue already validated ops.
    fn enqueue(&self, ops: Vec<Op>) -> Result<WriteTicket> {
        let mut receivers = Vec::with_capacity(ops.len());
        let mut q = self.shared.lock();
        if q.closed {
            return Err(Error::unavailable("the coalescing writer is shut down"));
        }
        let depth = q.pending.len() + q.in_flight;
        let cap = self.shared.cfg.capacity;
        if depth + ops.len() > cap {
            return Err(Error::overloaded(format!(
                "write queue full: {depth} of {cap} ops queued, {} more refused",
                ops.len()
            )));
        }
        for op in ops {
            let (tx, rx) = oneshot::channel();
            q.next_seq += 1;
            let seq = q.next_seq;
            q.pending.push_back(Pending {
                seq,
                op,
                ticket: Some(tx),
            });
            receivers.push(rx);
        }
        let depth = q.pending.len() + q.in_flight;
        metrics::gauge!("registrar_write_queue_depth").set(depth as f64);
        if q.pending.len() >= self.shared.cfg.flush_ops {
            self.shared.wake.notify_one();
        }
        Ok(WriteTicket { receivers })
    }

    /// Apply everything queued so far now, and wait until it is done.
    pub async fn flush(&self) {
        let target = {
            let mut q = self.shared.lock();
            q.flush_now = true;
            q.next_seq
        };
        self.shared.wake.notify_one();
        let mut done = self.shared.done.subscribe();
        let _ = done.wait_for(|d| *d >= target).await;
    }

    /// Refuse new writes, drain the queue, and stop the flusher. Waits for
    /// the backend as long as it takes; wrap in a timeout to bound it.
    pub async fn shutdown(&self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        let handle = self
            .flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            if let Err(e) = h.await {
                tracing::error!(error = %e, "coalescing flusher failed");
            }
        }
    }
}

impl<B> Drop for Coalescing<B> {
    fn drop(&mut self) {
        // The flusher drains what is queued, then stops.
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// Merge a flush to its net effect per key, keeping the position of each
/// key's first op; every ticket follows its key's final op.
fn net_effect(batch: Vec<Pending>) -> Vec<(Op, Vec<oneshot::Sender<Result<()>>>)> {
    let mut out: Vec<(Op, Vec<oneshot::Sender<Result<()>>>)> = Vec::with_capacity(batch.len());
    let mut index: HashMap<EndpointKey, usize> = HashMap::with_capacity(batch.len());
    for p in batch {
        let key = p.op.key();
        match index.get(&key) {
            Some(&i) => {
                out[i].0 = p.op;
                out[i].1.extend(p.ticket);
            }
            None => {
                index.insert(key, out.len());
                out.push((p.op, p.ticket.into_iter().collect()));
            }
        }
    }
    out
}

async fn flush_loop<B: Batch>(inner: Arc<B>, shared: Arc<Shared>) {
    let cfg = shared.cfg.clone();
    let retry = backon::ExponentialBuilder::default()
        .with_min_delay(cfg.retry_min)
        .with_max_delay(cfg.retry_max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    let mut ticker = tokio::time::interval(cfg.flush_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (batch, closed) = {
            let mut q = shared.lock();
            // Woken by the interval, the op threshold, flush() or shutdown:
            // everything queued goes.
            q.flush_now = false;
            let batch: Vec<Pending> = q.pending.drain(..).collect();
            q.in_flight = batch.len();
            (batch, q.closed)
        };
        if batch.is_empty() {
            if closed {
                return;
            }
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shared.wake.notified() => {}
            }
            continue;
        }
        let last_seq = batch.last().map(|p| p.seq).unwrap_or(0);
        let merged = net_effect(batch);
        let max = inner.max_batch().max(1);
        let mut merged = merged.into_iter().peekable();
        while merged.peek().is_some() {
            let chunk: Vec<_> = merged.by_ref().take(max).collect();
            let (ops, tickets): (Vec<Op>, Vec<_>) = chunk.into_iter().unzip();
            metrics::histogram!("registrar_write_batch_size").record(ops.len() as f64);
            let result = apply_with_retry(&*inner, ops, &retry).await;
            for t in tickets.into_iter().flatten() {
                let _ = t.send(result.clone());
            }
        }
        let depth = {
            let mut q = shared.lock();
            q.in_flight = 0;
            q.pending.len()
        };
        metrics::gauge!("registrar_write_queue_depth").set(depth as f64);
        shared.done.send_replace(last_seq);
        if depth < cfg.flush_ops && !closed {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shared.wake.notified() => {}
            }
        }
    }
}

async fn apply_with_retry<B: Batch>(
    inner: &B,
    ops: Vec<Op>,
    retry: &backon::ExponentialBuilder,
) -> Result<()> {
    let mut delays = retry.build();
    loop {
        match inner.apply(ops.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_retryable() => {
                let delay = delays.next().unwrap_or(Duration::from_secs(5));
                tracing::warn!(registry = %inner, error = %e, ?delay, ops = ops.len(), "write batch failed; will retry");
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                tracing::error!(registry = %inner, error = %e, ops = ops.len(), "write batch failed for good");
                return Err(e);
            }
        }
    }
}

impl<B: Registry> fmt::Display for Coalescing<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Coalescing({})", self.inner)
    }
}

impl<B: Registry> fmt::Debug for Coalescing<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = self.shared.lock();
        f.debug_struct("Coalescing")
            .field("inner", &self.inner)
            .field("queued", &q.pending.len())
            .field("in_flight", &q.in_flight)
            .field("config", &self.shared.cfg)
            .finish()
    }
}

#[async_trait]
impl<B: Batch> Registry for Coalescing<B> {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        self.enqueue(vec![Op::Register(endpoint)]).map(drop)
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.enqueue(vec![Op::Deregister(key.clone())]).map(drop)
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.inner.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_atomic_batch(false)
            .with_max_batch(self.shared.cfg.capacity)
    }
}

#[async_trait]
impl<B: Batch> Batch for Coalescing<B> {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.submit(ops).map(drop)
    }
    fn max_batch(&self) -> usize {
        self.shared.cfg.capacity
    }
}

impl<B: Batch + Watch> Watch for Coalescing<B> {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.inner.watch(from)
    }
}

#[async_trait]
impl<B: Batch + Heartbeat> Heartbeat for Coalescing<B> {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.inner.heartbeat(node).await
    }
}
