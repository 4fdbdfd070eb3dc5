//! [`Coalescing`]: write batching in front of any [`Batch`] backend.

mod config;
mod flush;

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;

pub use config::CoalescingConfig;

use crate::backend::validate_ops;
use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::model::{Endpoint, EndpointKey, Op};
use crate::traits::{Batch, Heartbeat, Registry, Watch};

/// Batches writes: ops are queued, merged to their net effect per key, and
/// applied with [`Batch::apply`] in chunks of the backend's `max_batch()`
/// every `flush_interval` or as soon as `flush_ops` are queued.
///
/// - `register`, `deregister` and `apply` return once the ops are queued
///   (validated first). [`Coalescing::submit`] returns a [`WriteTicket`] that
///   resolves when its ops are applied, or with the error that refused them.
/// - Net effect within a flush: register then deregister is a deregister,
///   deregister then register a register, two registers the later one.
/// - Per-key order holds across flushes: one flusher applies flushes in
///   order and a flush is only done when all its chunks are.
/// - Transient errors (the backend is down, throttled) are retried with
///   exponential backoff and jitter, without limit: ops stay queued through
///   an outage, and [`Coalescing::status`] says since when it fails. A
///   chunk that keeps failing is split in two, so one chunk too large to
///   commit in time cannot stall the queue. A full queue answers
///   [`Error::Overloaded`] at once and nothing already queued is lost.
/// - A refused op fails alone: when the backend refuses a chunk because of
///   its content (`InvalidInput`, or `Conflict` after `conflict_retries`),
///   the chunk is split until the op at fault is alone; its tickets get the
///   error, every other op is applied. A backend that refuses writes as
///   such (`NotFound`, `Unauthorized`, `Internal`) fails the whole chunk.
/// - [`flush`](Coalescing::flush) and [`shutdown`](Coalescing::shutdown)
///   drain everything queued before them;
///   [`shutdown_within`](Coalescing::shutdown_within) gives up at a
///   deadline and reports what it could not write. Dropping a `Coalescing`
///   lets its flusher drain the queue in the background.
///
/// Reads, watches and heartbeats go straight to the inner registry. Must be
/// created inside a Tokio runtime.
///
/// Metrics (prefix from [`CoalescingConfig::metrics_prefix`], `registry` by
/// default): `registry_write_batch_size` (histogram, ops per backend call),
/// `registry_write_queue_depth` (gauge), `registry_write_errors_total{kind}`
/// (failed backend calls).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use waypost::{Endpoint, Registry, coalescing::Coalescing, memory::MemoryRegistry};
/// let reg = Coalescing::new(MemoryRegistry::new());
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 80)).await?; // queued
/// reg.flush().await;                                                 // applied
/// assert_eq!(reg.get_ref().list("api").await?.len(), 1);
/// assert_eq!(reg.to_string(), "Coalescing(Memory)");
/// # Ok::<(), waypost::Error>(()) });
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
    names: config::Names,
    status: watch::Sender<WriterStatus>,
    /// Set by `shutdown_within`: nothing is attempted after it.
    deadline: Mutex<Option<Instant>>,
    /// Keys given up at the deadline.
    abandoned: Mutex<Vec<EndpointKey>>,
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

/// How the backend has been answering the writer.
#[derive(Debug, Clone, Default)]
pub struct WriterStatus {
    /// Since when every backend call failed (transient or a refusal of the
    /// backend); `None` while calls succeed.
    pub failing_since: Option<Instant>,
    /// The error of the last failed call while failing.
    pub last_error: Option<Error>,
}

/// What [`Coalescing::shutdown_within`] could not write.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    /// Keys whose ops were given up at the deadline (their tickets failed
    /// with `Unavailable`). Empty when everything was written or refused.
    pub unwritten: Vec<EndpointKey>,
}

/// Resolves when the ops of one [`Coalescing::submit`] call are applied by
/// the backend, or failed for good.
#[must_use = "a ticket does nothing unless awaited"]
pub struct WriteTicket {
    receivers: Vec<oneshot::Receiver<Result<()>>>,
}

impl WriteTicket {
    /// Wait until every op is applied; the first error if any failed.
    pub async fn durable(self) -> Result<()> {
        for r in join_all(self.receivers).await {
            r.map_err(|_| {
                Error::internal("the write queue's flusher stopped before applying the op")
            })??;
        }
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deadline(&self) -> Option<Instant> {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn past_deadline(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    fn abandon(&self, keys: impl IntoIterator<Item = EndpointKey>) {
        let mut a = self.abandoned.lock().unwrap_or_else(|p| p.into_inner());
        a.extend(keys);
    }

    fn record_success(&self) {
        self.status.send_if_modified(|s| {
            let changed = s.failing_since.is_some();
            *s = WriterStatus::default();
            changed
        });
    }

    fn record_failure(&self, e: &Error) {
        self.status.send_modify(|s| {
            s.failing_since.get_or_insert_with(Instant::now);
            s.last_error = Some(e.clone());
        });
    }
}

impl<B: Batch> Coalescing<B> {
    /// Batch writes to `inner` with the default settings.
    pub fn new(inner: B) -> Self {
        Self::start(inner, CoalescingConfig::default())
    }

    /// Batch writes to `inner` with `cfg`, checked first
    /// ([`CoalescingConfig::validate`]).
    pub fn with_config(inner: B, cfg: CoalescingConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self::start(inner, cfg))
    }

    fn start(inner: B, cfg: CoalescingConfig) -> Self {
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
            names: config::Names::new(&cfg.metrics_prefix),
            cfg,
            status: watch::channel(WriterStatus::default()).0,
            deadline: Mutex::new(None),
            abandoned: Mutex::new(Vec::new()),
        });
        let flusher = tokio::spawn(flush::flush_loop(Arc::clone(&inner), Arc::clone(&shared)));
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

    /// The settings.
    pub fn config(&self) -> &CoalescingConfig {
        &self.shared.cfg
    }

    /// Ops queued or being applied.
    pub fn queue_depth(&self) -> usize {
        let q = self.shared.lock();
        q.pending.len() + q.in_flight
    }

    /// How the backend has been answering; changes are signalled.
    pub fn status(&self) -> watch::Receiver<WriterStatus> {
        self.shared.status.subscribe()
    }

    /// Whether the flusher is running (false once it ended, after a
    /// shutdown or because it panicked).
    pub fn is_running(&self) -> bool {
        self.flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|h| !h.is_finished())
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
        if !self.is_running() {
            return Err(Error::unavailable(
                "the write queue is stopped (shut down, or its flusher task ended)",
            ));
        }
        let mut receivers = Vec::with_capacity(ops.len());
        let mut q = self.shared.lock();
        if q.closed {
            return Err(Error::unavailable("the write queue is shut down"));
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
        metrics::gauge!(self.shared.names.queue_depth.clone()).set(depth as f64);
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
    /// the backend as long as it takes; see
    /// [`shutdown_within`](Coalescing::shutdown_within) for a bound.
    pub async fn shutdown(&self) {
        self.close();
        if let Some(h) = self.take_flusher() {
            if let Err(e) = h.await {
                tracing::error!(error = %e, "the write queue's flusher failed");
            }
        }
    }

    /// Refuse new writes and drain the queue for at most `limit`. What is
    /// not written by then is given up: its tickets fail with
    /// `Unavailable`, and its keys are in the report (an op the backend was
    /// applying at the deadline may or may not have been written).
    pub async fn shutdown_within(&self, limit: Duration) -> DrainReport {
        let deadline = Instant::now() + limit;
        *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(deadline);
        self.close();
        if let Some(mut h) = self.take_flusher() {
            let grace = deadline + flush::ABORT_GRACE;
            match tokio::time::timeout_at(grace, &mut h).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "the write queue's flusher failed"),
                Err(_) => {
                    tracing::error!("the write queue's flusher did not stop at the deadline");
                    h.abort();
                }
            }
        }
        // Whatever the flusher never took (it died or was stopped).
        let left: Vec<Pending> = self.shared.lock().pending.drain(..).collect();
        let err = Error::unavailable("not written: the write queue was stopped before it");
        self.shared.abandon(left.iter().map(|p| p.op.key()));
        for p in left {
            if let Some(t) = p.ticket {
                let _ = t.send(Err(err.clone()));
            }
        }
        let unwritten = std::mem::take(
            &mut *self
                .shared
                .abandoned
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        DrainReport { unwritten }
    }

    fn close(&self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }

    fn take_flusher(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl<B> Drop for Coalescing<B> {
    fn drop(&mut self) {
        // The flusher drains what is queued, then stops.
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
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

crate::forward! {
    impl[B: Batch] Registry for Coalescing<B> {
        forward to inner: list, list_shared, snapshot, probe;
        async fn register(&self, endpoint: Endpoint) -> Result<()> {
            endpoint.validate()?;
            self.enqueue(vec![Op::Register(endpoint)]).map(drop)
        }
        async fn deregister(&self, key: &EndpointKey) -> Result<()> {
            self.enqueue(vec![Op::Deregister(key.clone())]).map(drop)
        }
        fn capabilities(&self) -> Capabilities {
            self.inner
                .capabilities()
                .with_atomic_writes(false)
                .with_isolated_reads(false)
                .with_max_batch(self.shared.cfg.capacity)
        }
    }
}

#[async_trait]
impl<B: Batch> Batch for Coalescing<B> {
    /// The batch rule first: more than `max_batch` (the queue's capacity)
    /// ops can never fit, so they are `InvalidInput`, like an invalid op;
    /// a batch that fits but finds the queue too full is `Overloaded`.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        crate::backend::check_batch(&ops, self.shared.cfg.capacity)?;
        self.enqueue(ops).map(drop)
    }
    fn max_batch(&self) -> usize {
        self.shared.cfg.capacity
    }
}

crate::forward! {
    impl[B: Batch + Watch] Watch for Coalescing<B> {
        forward to inner: watch;
    }
}

crate::forward! {
    impl[B: Batch + Heartbeat] Heartbeat for Coalescing<B> {
        forward to inner: heartbeat;
    }
}
