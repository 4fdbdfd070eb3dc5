//! [`Registrar`]: the state agents are served from and the write path.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use waypost::{
    cached::{CachedConfig, CachedRegistry},
    coalescing::{Coalescing, CoalescingConfig},
    Endpoint, EndpointKey, Op, Registry, Result, Version,
};
use waypost_registrar_client::{Overlay, Token};

mod monitor;

use crate::engine::config::{Ack, RegistrarConfig};
use crate::engine::refusals::{Refusal, Refusals};
use crate::engine::status::Status;
use crate::engine::streams::{StreamCounters, WatchStats};
use crate::engine::sync::SyncMetered;

use crate::engine::open::Backend;
use crate::metrics::names;

/// The registrar once it exists (the health port answers before the
/// backend is open).
pub(crate) type Slot = Arc<OnceLock<Arc<Registrar>>>;

/// The registrar's state: one backend connection for the whole cluster.
///
/// - Writes are validated and, unless writes are refused (see [`Status`]),
///   queued in [`Coalescing`] (100 ms / 50 ops) for the backend. In
///   optimistic mode ([`Ack::Optimistic`], the default) they are broadcast
///   to agents at once and acknowledged; a write the backend then refuses
///   is undone in the broadcast state by an event that carries the refusal
///   (agents learn it on their stream). In durable mode the call returns
///   once the backend committed the write, or with its refusal.
/// - The state is a [`CachedRegistry`] over the backend's watch (native or
///   polling), numbered with this registrar's own versions; together with
///   the epoch (the start time in microseconds) they form the tokens agents
///   resume from.
/// - A monitor task probes the backend, follows the write queue's status
///   and the background tasks, and keeps [`Status`] true (see
///   `docs/registrar/health.md`).
/// - Replicas are independent: each keeps its own state from the shared
///   backend, which is also how endpoints of other clusters arrive.
pub struct Registrar {
    cfg: RegistrarConfig,
    epoch: u64,
    backend: Arc<dyn Backend>,
    state: CachedRegistry<Arc<dyn Backend>>,
    /// Writes broadcast before the backend has them.
    overlay: Overlay,
    writer: Coalescing<Arc<dyn Backend>>,
    status: Arc<Status>,
    closing: tokio::sync::watch::Sender<bool>,
    refusals: Refusals,
    /// Clusters seen by `registrar_endpoint_count` (published as 0 when gone).
    counted: Mutex<BTreeMap<String, usize>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// What the agents' streams hold.
    streams: Arc<StreamCounters>,
    /// The last heartbeat this replica accepted, by node.
    heartbeats: Mutex<BTreeMap<String, SystemTime>>,
}

/// Nodes whose heartbeats are remembered; beyond it, those not heard
/// from for an hour are forgotten.
const MAX_HEARTBEAT_NODES: usize = 10_000;

impl Registrar {
    /// A registrar over `backend`, with its own [`Status`]. Must be called
    /// inside a Tokio runtime. Fails when `cfg` is out of range
    /// ([`RegistrarConfig::validate`]).
    pub fn new(backend: Arc<dyn Backend>, cfg: RegistrarConfig) -> Result<Arc<Self>> {
        Self::with_status(backend, cfg, Arc::new(Status::default()))
    }

    /// A registrar over `backend` reporting to `status` (which a server may
    /// have been reporting the backend's opening to).
    ///
    /// The backend is wrapped in [`SyncMetered`], which reports the watch's
    /// failures to `status` and records `registrar_sync_duration_seconds`
    /// and `registrar_sync_errors_total` for native watches
    /// ([`waypost::polling::Polling`] records them for the others).
    pub fn with_status(
        backend: Arc<dyn Backend>,
        cfg: RegistrarConfig,
        status: Arc<Status>,
    ) -> Result<Arc<Self>> {
        cfg.validate()?;
        let backend: Arc<dyn Backend> = Arc::new(SyncMetered::new(backend, Arc::clone(&status)));
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let (state, overlay) = Overlay::cache(
            Arc::clone(&backend),
            CachedConfig::default()
                .with_write_wait(Duration::ZERO)
                .with_history(cfg.history)
                .with_buffer(cfg.agent_buffer)
                .with_metrics_prefix(names::PREFIX),
        )?;
        let writer = Coalescing::with_config(
            Arc::clone(&backend),
            CoalescingConfig::default()
                .with_flush_interval(cfg.write_batch_interval)
                .with_flush_ops(cfg.write_batch_ops)
                .with_capacity(cfg.write_queue_capacity)
                .with_metrics_prefix(names::PREFIX),
        )?;
        let this = Arc::new(Self {
            cfg,
            epoch,
            backend,
            state,
            overlay,
            writer,
            status,
            closing: tokio::sync::watch::channel(false).0,
            refusals: Refusals::default(),
            counted: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(Vec::new()),
            streams: Arc::default(),
            heartbeats: Mutex::new(BTreeMap::new()),
        });
        let tasks = vec![
            tokio::spawn(count_endpoints(Arc::downgrade(&this))),
            tokio::spawn(Self::monitor(Arc::downgrade(&this))),
        ];
        *this.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        Ok(this)
    }

    /// The settings.
    pub fn config(&self) -> &RegistrarConfig {
        &self.cfg
    }

    /// This run's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The token of the current state.
    pub fn token(&self) -> Token {
        Token {
            epoch: self.epoch,
            version: self.state.store().version(),
        }
    }

    /// The state agents are served from.
    pub fn state(&self) -> &CachedRegistry<Arc<dyn Backend>> {
        &self.state
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Counters of the agents' `WatchEndpoints` streams: how many are open
    /// and how much of their first snapshots they encoded (see
    /// `docs/registrar/streams.md`).
    pub fn watch_stats(&self) -> WatchStats {
        self.streams.stats()
    }

    /// The counters behind [`Registrar::watch_stats`], kept by the streams.
    pub(crate) fn stream_counters(&self) -> &Arc<StreamCounters> {
        &self.streams
    }

    /// The registrar's health.
    pub fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// Whether it is ready (what `/readyz` says).
    pub fn is_ready(&self) -> bool {
        matches!(
            self.status.readiness(),
            crate::engine::status::Readiness::Ready(_)
        )
    }

    /// Writes queued for the backend.
    pub fn queue_depth(&self) -> usize {
        self.writer.queue_depth()
    }

    /// The version to resume from for an agent's `last_version`: `None`
    /// (a full snapshot) when it is empty, unparsable or of another epoch.
    pub fn resume_from(&self, last_version: &str) -> Option<Version> {
        match last_version.parse::<Token>() {
            Ok(t) if t.epoch == self.epoch => Some(t.version),
            _ => None,
        }
    }

    /// The refusal the event at `version` carries to agents, if any.
    pub fn refusal_at(&self, version: Version) -> Option<Refusal> {
        self.refusals.get(version)
    }

    /// Accept one write, acknowledged as `ack` says (`None`: the configured
    /// default). Refused with `Unavailable` while the backend refuses
    /// writes or the registrar is failing.
    pub async fn write(self: &Arc<Self>, op: Op, ack: Option<Ack>) -> Result<Token> {
        op.validate()?;
        if let Some(e) = self.status.write_refusal() {
            return Err(e);
        }
        match ack.unwrap_or(self.cfg.ack) {
            Ack::Optimistic => self.write_optimistic(op),
            Ack::Durable => self.write_durable(op).await,
        }
    }

    fn write_optimistic(self: &Arc<Self>, op: Op) -> Result<Token> {
        let key = op.key();
        let before = self
            .state
            .store()
            .snapshot()
            .and_then(|s| s.get(&key).cloned());
        self.overlay.apply(std::slice::from_ref(&op));
        let undo = match before {
            Some(ep) => Op::Register(ep),
            None => Op::Deregister(key),
        };
        match self.writer.submit(vec![op.clone()]) {
            Ok(ticket) => {
                let this = Arc::clone(self);
                tokio::spawn(async move {
                    if let Err(error) = ticket.durable().await {
                        this.refused(Refusal { op, error }, undo).await;
                    }
                });
                Ok(self.token())
            }
            Err(e) => {
                // The caller gets the error: nothing to tell agents.
                self.overlay.undo(&[undo]);
                Err(e)
            }
        }
    }

    async fn write_durable(self: &Arc<Self>, op: Op) -> Result<Token> {
        let ops = [op];
        // Held from before the commit, so that an echo arriving before the
        // commit returns ends the hold (a hold taken after it would outlive
        // the echo, and hide the key's next changes for the whole hold).
        self.overlay.hold(&ops);
        let committed = match self.writer.submit(ops.to_vec()) {
            Ok(ticket) => ticket.durable().await,
            Err(e) => {
                self.overlay.release(&ops);
                return Err(e);
            }
        };
        match committed {
            Ok(()) => {
                // Read your writes: the state shows it before the echo.
                self.overlay.confirm(&ops);
                Ok(self.token())
            }
            Err(e) => {
                // News of the key held back during the commit: read it again.
                self.overlay.release(&ops);
                let this = Arc::clone(self);
                let key = ops[0].key();
                tokio::spawn(async move { this.resync_key(&key).await });
                Err(e)
            }
        }
    }

    /// The backend refused an acknowledged write: undo its broadcast with
    /// an event that tells agents why, then make sure the state shows the
    /// backend's truth for the key.
    async fn refused(&self, refusal: Refusal, undo: Op) {
        let key = refusal.op.key();
        tracing::error!(%key, error = %refusal.error, "the backend refused an acknowledged write; undoing its broadcast and telling agents");
        let recorded = {
            // No stream encodes the undo event before its refusal is kept.
            let _undoing = self.refusals.undoing();
            let events = self.overlay.undo(std::slice::from_ref(&undo));
            events.last().map(|ev| {
                self.refusals.record(ev.version(), refusal.clone());
            })
        };
        if recorded.is_none() {
            tracing::warn!(%key, "the undo changed nothing visible; agents learn the refusal only from the log");
        }
        if refusal.error.is_request_fault() {
            self.resync_key(&key).await;
        } else {
            // The backend refuses writes as such (or the queue was stopped):
            // the monitor heals with a full re-read.
            self.status.backend_failed(&refusal.error);
            self.status.request_resync();
        }
    }

    /// Put the backend's value of `key` into the state; on failure, ask for
    /// a full re-read.
    async fn resync_key(&self, key: &EndpointKey) {
        let read = tokio::time::timeout(self.cfg.probe_timeout, self.backend.list(&key.service));
        match read.await {
            Ok(Ok(eps)) => {
                let op = match eps.into_iter().find(|e| e.has_key(key)) {
                    Some(e) => Op::Register(e),
                    None => Op::Deregister(key.clone()),
                };
                self.overlay.undo(&[op]);
            }
            Ok(Err(e)) => {
                tracing::warn!(%key, error = %e, "could not re-read a refused write; re-reading everything");
                self.status.request_resync();
            }
            Err(_) => {
                tracing::warn!(%key, "re-reading a refused write timed out; re-reading everything");
                self.status.request_resync();
            }
        }
    }

    /// End every stream and face that waits on [`Registrar::closing`].
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Resolves once the registrar is shutting down (agent streams end then).
    pub fn closing(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// The endpoint stored under `key` now (from the state once it is
    /// ready, before that from the backend); `None` when there is none.
    pub async fn current(&self, key: &EndpointKey) -> Result<Option<Endpoint>> {
        if let Some(snap) = self.state.store().snapshot() {
            return Ok(snap.get(key).cloned());
        }
        let eps = self.backend.list(&key.service).await?;
        Ok(eps.into_iter().find(|e| e.has_key(key)))
    }

    /// Publish the gauges computed from the state:
    /// `registrar_endpoint_count{cluster}` (0 for clusters gone since),
    /// `registrar_write_queue_depth` and the status gauges. Called every
    /// 5 s and on each scrape.
    pub fn publish_gauges(&self) {
        metrics::gauge!(names::WRITE_QUEUE_DEPTH).set(self.queue_depth() as f64);
        self.status.publish_gauges();
        let Some(snap) = self.state.store().snapshot() else {
            return;
        };
        let mut seen = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts: BTreeMap<String, usize> = seen.keys().map(|k| (k.clone(), 0)).collect();
        counts.entry(self.cfg.cluster_name.clone()).or_default();
        for e in snap.iter() {
            *counts.entry(e.cluster.clone()).or_default() += 1;
        }
        for (cluster, n) in &counts {
            metrics::gauge!(names::ENDPOINT_COUNT, "cluster" => cluster.clone()).set(*n as f64);
        }
        *seen = counts;
    }

    /// Record a node's heartbeat with the backend. `NotFound` when neither
    /// the backend nor the state knows an endpoint of the node: the agent
    /// should register again.
    pub async fn heartbeat(&self, node: &str) -> Result<()> {
        waypost::backend::check_name("node_name", node, true)?;
        let result = self.heartbeat_backend(node).await;
        if result.is_ok() {
            self.heard_from(node);
        }
        result
    }

    /// When this replica last accepted a heartbeat of each node (other
    /// replicas' heartbeats are not seen here).
    pub fn heartbeats(&self) -> BTreeMap<String, SystemTime> {
        self.heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn heard_from(&self, node: &str) {
        let mut beats = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        remember(&mut beats, node, SystemTime::now(), MAX_HEARTBEAT_NODES);
    }

    async fn heartbeat_backend(&self, node: &str) -> Result<()> {
        match self.backend.heartbeat(node).await {
            // The node's registrations may still be on their way to the
            // backend (acknowledged, queued): its endpoints are in the
            // state, and the write will count as its sign of life.
            Err(e) if e.kind() == waypost::ErrorKind::NotFound => {
                let pending = self
                    .state
                    .store()
                    .snapshot()
                    .is_some_and(|s| s.iter().any(|ep| ep.node == node));
                if pending {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Refuse new writes and drain the queue to the backend for at most
    /// [`RegistrarConfig::drain_timeout`]. What could not be written is
    /// logged by key (durable callers get the error); returns those keys.
    pub async fn drain(&self) -> Vec<EndpointKey> {
        let report = self.writer.shutdown_within(self.cfg.drain_timeout).await;
        for key in &report.unwritten {
            tracing::error!(%key, "not written to the backend before the drain deadline");
        }
        if !report.unwritten.is_empty() {
            tracing::error!(
                count = report.unwritten.len(),
                timeout = ?self.cfg.drain_timeout,
                "shutting down with writes the backend has not confirmed"
            );
        }
        report.unwritten
    }

    /// Whether the write queue and the state's sync task run.
    pub(crate) fn tasks_running(&self) -> std::result::Result<(), &'static str> {
        if !self.writer.is_running() && !*self.closing.borrow() {
            return Err("the write queue's flusher task ended");
        }
        if !self.state.is_running() {
            return Err("the task that keeps the state from the backend ended");
        }
        Ok(())
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        for t in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar")
            .field("cluster", &self.cfg.cluster_name)
            .field("epoch", &self.epoch)
            .field("backend", &self.backend.to_string())
            .field("queued", &self.queue_depth())
            .finish()
    }
}

/// Publish the state's gauges every few seconds.
async fn count_endpoints(this: std::sync::Weak<Registrar>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let Some(this) = this.upgrade() else { return };
        this.publish_gauges();
    }
}

/// Record `node`'s heartbeat at `now` in `beats`, which holds at most
/// `max` nodes: when full, nodes not heard from for an hour are forgotten;
/// if none is, the new node is not recorded (known ones still are).
fn remember(beats: &mut BTreeMap<String, SystemTime>, node: &str, now: SystemTime, max: usize) {
    if beats.len() >= max && !beats.contains_key(node) {
        let hour = Duration::from_secs(3600);
        beats.retain(|_, at| now.duration_since(*at).unwrap_or_default() < hour);
    }
    if beats.len() < max || beats.contains_key(node) {
        beats.insert(node.to_string(), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_heartbeats_are_bounded_and_the_stale_ones_go_first() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let later = t0 + Duration::from_secs(7200);
        let mut beats = BTreeMap::new();
        remember(&mut beats, "old", t0, 2);
        remember(&mut beats, "recent", later, 2);
        // Full: the node unheard for two hours makes room.
        remember(&mut beats, "new", later, 2);
        assert_eq!(
            beats.keys().collect::<Vec<_>>(),
            ["new", "recent"],
            "{beats:?}"
        );
        // Full of recent nodes: a known one is updated, a new one is not
        // recorded.
        let last = later + Duration::from_secs(1);
        remember(&mut beats, "recent", last, 2);
        remember(&mut beats, "another", last, 2);
        assert_eq!(beats.len(), 2);
        assert_eq!(beats.get("recent"), Some(&last));
        assert!(!beats.contains_key("another"));
    }
}
