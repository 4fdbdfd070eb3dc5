//! [`SharedLiveness`]: liveness kept in the backend, for backends that
//! have no leases of their own (DynamoDB, Cloud Map), so that every
//! process sharing the backend judges every node by the same record.
//!
//! A backend stores one record per node ([`NodeRecord`]: a count of its
//! recorded heartbeats, the wall time of the last one for people to read,
//! and the keys liveness marked unhealthy) and implements
//! [`NodeTable`]: a handful of requests, two of them conditional on a
//! record's heartbeat still being the one a sweep read. [`SharedLiveness`]
//! does the rest, the same way for every such backend:
//!
//! - **Heartbeats are coalesced.** A node's record is written at most once
//!   per `suspect_after / 3` by one process, however often the node
//!   heartbeats; a write of an endpoint owned by a node counts as its
//!   heartbeat, and its record is written *before* the endpoint (so a
//!   sweep that read the old record cannot overwrite the new endpoint).
//! - **Silence is timed on the sweeper's own clock.** Each process
//!   remembers, per node, the heartbeat count it last saw in the record and
//!   when, on its own monotonic clock, it saw the count change
//!   ([`Silence`]); a node is silent when its count has not changed for
//!   `suspect_after` of that time. No decision compares the wall clocks of
//!   two processes, or two readings across a step of one clock: a process
//!   whose clock is off, or steps, judges exactly as the others do. A
//!   process that has just started, or sees a node for the first time,
//!   gives it a full `suspect_after` from then.
//! - **Sweeps are safe with any number of sweepers.** Marking a node's
//!   endpoints unhealthy and removing them are conditional on its record
//!   still holding the heartbeat (count and wall time) the sweep read: a
//!   heartbeat that lands in between wins, and of two sweepers only one
//!   changes anything.
//! - **Self-preservation judges the shared view:** the share of all the
//!   nodes in the backend that are silent, not of those one process heard.
//! - Endpoints whose node has no record yet (written before the record
//!   existed, or by a tool) get a record, and a full `suspect_after` of
//!   grace, at the first sweep that finds them.
//!
//! Times are wall-clock milliseconds of the process that writes them;
//! processes whose clocks disagree by a share of `suspect_after` judge
//! nodes that much earlier or later.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use super::silence::{Observed, Silence};
use crate::error::{Error, Result};
use crate::liveness::{self_preservation_holds, LivenessConfig, SweepReport};
use crate::model::{Endpoint, EndpointKey, Health, Op};
use crate::snapshot::Snapshot;

/// One node's liveness record, as a backend stores it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node, as its endpoints carry it in [`Endpoint::node`].
    pub node: String,
    /// How many heartbeats were recorded: one more at every recorded
    /// heartbeat (0 in a record written by a release that did not count
    /// them). Liveness is judged by its changes, never by `beat_ms`.
    pub beats: u64,
    /// The wall time of the last recorded heartbeat, in milliseconds since
    /// the Unix epoch, by the clock of the process that recorded it: for
    /// people, and for the garbage collection of forgotten records.
    pub beat_ms: u64,
    /// The endpoints liveness marked unhealthy (empty: none), revived when
    /// the node is heard from again.
    pub marked: Vec<EndpointKey>,
}

impl NodeRecord {
    /// A record of `node` last heard from at `beat_ms`, no heartbeat
    /// counted, nothing marked.
    pub fn new(node: impl Into<String>, beat_ms: u64) -> Self {
        Self {
            node: node.into(),
            beats: 0,
            beat_ms,
            marked: Vec::new(),
        }
    }

    /// Set the count of recorded heartbeats.
    pub fn with_beats(mut self, beats: u64) -> Self {
        self.beats = beats;
        self
    }

    /// What changes at every recorded heartbeat: the count, and the wall
    /// time (which alone changes when a release that does not count
    /// heartbeats records one).
    pub fn heard(&self) -> (u64, u64) {
        (self.beats, self.beat_ms)
    }

    /// Set the keys liveness marked unhealthy.
    pub fn with_marked(mut self, marked: Vec<EndpointKey>) -> Self {
        self.marked = marked;
        self
    }
}

/// The requests a backend answers so that [`SharedLiveness`] can keep its
/// nodes' records. Every write of endpoints here goes through the
/// backend's ordinary write path (its change log, where it has one).
#[async_trait]
pub trait NodeTable: Send + Sync + fmt::Display {
    /// Every endpoint (a sweep reads them once).
    async fn endpoints(&self) -> Result<Snapshot>;

    /// The endpoints of `service`.
    async fn service_endpoints(&self, service: &str) -> Result<Vec<Endpoint>>;

    /// Every node record.
    async fn node_records(&self) -> Result<Vec<NodeRecord>>;

    /// Record a heartbeat of `node`: `beats` one more than before (1 in a
    /// new record) and `beat_ms` set to `at_ms`, whatever it held (the
    /// wall clock of another writer may be ahead); `marked` is kept. With
    /// `create`, a missing record is created. The record as it was before
    /// (`None`: there was none; then, without `create`, nothing was
    /// written).
    async fn touch(&self, node: &str, at_ms: u64, create: bool) -> Result<Option<NodeRecord>>;

    /// Create the record of `node` at `at_ms` (no heartbeat counted)
    /// unless one exists.
    async fn admit(&self, node: &str, at_ms: u64) -> Result<()>;

    /// Write `endpoints` (unhealthy copies) and add their keys to the
    /// record's `marked`, on condition that the record still holds
    /// `seen.beats` and `seen.beat_ms`. `false`: it does not, and nothing
    /// was written.
    async fn mark(&self, seen: &NodeRecord, endpoints: Vec<Endpoint>) -> Result<bool>;

    /// Write `endpoints` (healthy copies of marked ones) and clear the
    /// record's `marked`.
    async fn revive(&self, node: &str, endpoints: Vec<Endpoint>) -> Result<()>;

    /// Delete `keys` and the record, on condition that the record still
    /// holds `seen.beats` and `seen.beat_ms`. `false`: it does not, and
    /// nothing was deleted.
    async fn remove(&self, seen: &NodeRecord, keys: Vec<EndpointKey>) -> Result<bool>;
}

/// Wall-clock milliseconds since the Unix epoch: what records show people
/// (liveness never decides on it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Most nodes whose last record write one process remembers (for
/// coalescing); past it, the oldest are forgotten (and written again at
/// their next heartbeat).
const REMEMBERED: usize = 100_000;

/// Liveness kept in a [`NodeTable`]; see the module documentation. A
/// backend holds one, calls [`SharedLiveness::heartbeat`] from its
/// [`crate::Heartbeat`] impl and [`SharedLiveness::seen`] before it writes
/// endpoints, and runs [`SharedLiveness::sweep`] every
/// [`SharedLiveness::sweep_interval`].
#[derive(Debug)]
pub struct SharedLiveness {
    cfg: Mutex<LivenessConfig>,
    /// When this process last wrote each node's record.
    written: Mutex<HashMap<String, Instant>>,
    /// Each node's silence, as this process sees it.
    silence: Mutex<Silence<(u64, u64)>>,
}

impl SharedLiveness {
    /// Liveness with `cfg` (checked first).
    pub fn new(cfg: LivenessConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg: Mutex::new(cfg),
            written: Mutex::new(HashMap::new()),
            silence: Mutex::new(Silence::new()),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> LivenessConfig {
        lock(&self.cfg).clone()
    }

    /// Replace the settings (checked first); the next sweep uses them.
    pub fn set_config(&self, cfg: LivenessConfig) -> Result<()> {
        cfg.validate()?;
        *lock(&self.cfg) = cfg;
        Ok(())
    }

    /// Time until the next sweep.
    pub fn sweep_interval(&self) -> Duration {
        lock(&self.cfg).sweep_interval
    }

    /// How long one process lets a node's record age before it writes it
    /// again: a third of `suspect_after`.
    pub fn write_every(&self) -> Duration {
        lock(&self.cfg).suspect_after / 3
    }

    /// Whether this process wrote `node`'s record within
    /// [`SharedLiveness::write_every`] of `now`.
    fn fresh(&self, node: &str, now: Instant) -> bool {
        let every = self.write_every();
        lock(&self.written)
            .get(node)
            .is_some_and(|at| now.saturating_duration_since(*at) < every)
    }

    /// This process recorded a heartbeat of `node` at `at` (monotonic) and
    /// `at_ms` (wall), over the record `before`.
    fn wrote(&self, node: &str, before: Option<&NodeRecord>, at: Instant, at_ms: u64) {
        let beats = before.map_or(0, |b| b.beats).saturating_add(1);
        lock(&self.silence).wrote(node, (beats, at_ms), at);
        let mut w = lock(&self.written);
        if w.len() >= REMEMBERED && !w.contains_key(node) {
            let every = self.write_every();
            w.retain(|_, t| at.saturating_duration_since(*t) < every);
            if w.len() >= REMEMBERED {
                if let Some(oldest) = w.iter().min_by_key(|(_, t)| **t).map(|(n, _)| n.clone()) {
                    w.remove(&oldest);
                }
            }
        }
        w.insert(node.to_string(), at);
    }

    fn forget(&self, node: &str) {
        lock(&self.written).remove(node);
        lock(&self.silence).forget(node);
    }

    /// A heartbeat of `node`: its record is written unless this process
    /// wrote it within [`SharedLiveness::write_every`]; endpoints liveness
    /// had marked unhealthy are revived. `NotFound` for a node with neither
    /// a record nor an endpoint (never registered, or removed as dead): it
    /// should register again.
    pub async fn heartbeat<T: NodeTable + ?Sized>(&self, table: &T, node: &str) -> Result<()> {
        crate::backend::check_name("node", node, true)?;
        let (now, wall) = (Instant::now(), now_ms());
        if self.fresh(node, now) {
            return Ok(());
        }
        let before = match table.touch(node, wall, false).await? {
            Some(before) => before,
            None => {
                let snap = table.endpoints().await?;
                if !snap.iter().any(|e| e.node == node) {
                    return Err(Error::not_found(format!(
                        "node {node:?}: no endpoint of this node is registered \
                         (never registered, or removed as dead); register again"
                    )));
                }
                match table.touch(node, wall, true).await? {
                    Some(before) => before,
                    None => {
                        self.wrote(node, None, now, wall);
                        return Ok(());
                    }
                }
            }
        };
        self.wrote(node, Some(&before), now, wall);
        if !before.marked.is_empty() {
            self.revive_marked(table, &before).await?;
        }
        Ok(())
    }

    /// Note that the nodes owning endpoints in `ops` are alive, before the
    /// ops are written: each record not written by this process within
    /// [`SharedLiveness::write_every`] is written (created if missing).
    pub async fn seen<T: NodeTable + ?Sized>(&self, table: &T, ops: &[Op]) -> Result<()> {
        let mut nodes: Vec<&str> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Register(e) if !e.node.is_empty() => Some(e.node.as_str()),
                _ => None,
            })
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        let keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        self.seen_nodes(table, nodes, &keys).await
    }

    /// [`SharedLiveness::seen`] for the registration of one endpoint.
    pub async fn seen_endpoint<T: NodeTable + ?Sized>(
        &self,
        table: &T,
        endpoint: &Endpoint,
    ) -> Result<()> {
        if endpoint.node.is_empty() {
            return Ok(());
        }
        self.seen_nodes(table, vec![endpoint.node.as_str()], &[endpoint.key()])
            .await
    }

    async fn seen_nodes<T: NodeTable + ?Sized>(
        &self,
        table: &T,
        nodes: Vec<&str>,
        rewritten: &[EndpointKey],
    ) -> Result<()> {
        let (now, wall) = (Instant::now(), now_ms());
        for node in nodes {
            if self.fresh(node, now) {
                continue;
            }
            let before = table.touch(node, wall, true).await?;
            self.wrote(node, before.as_ref(), now, wall);
            // A node writing its endpoints again is back: what liveness
            // marked and the node does not write now is revived too.
            if let Some(before) = before.filter(|b| !b.marked.is_empty()) {
                let rest = NodeRecord {
                    marked: before
                        .marked
                        .into_iter()
                        .filter(|k| !rewritten.contains(k))
                        .collect(),
                    ..before
                };
                self.revive_marked(table, &rest).await?;
            }
        }
        Ok(())
    }

    /// Bring back `rec.marked` that are still unhealthy.
    async fn revive_marked<T: NodeTable + ?Sized>(
        &self,
        table: &T,
        rec: &NodeRecord,
    ) -> Result<()> {
        let mut by_service: BTreeMap<&str, Vec<&EndpointKey>> = BTreeMap::new();
        for k in &rec.marked {
            by_service.entry(k.service.as_str()).or_default().push(k);
        }
        let mut back = Vec::new();
        for (service, keys) in by_service {
            for e in table.service_endpoints(service).await? {
                if e.health == Health::Unhealthy && e.node == rec.node && keys.contains(&&e.key()) {
                    back.push(e.with_health(Health::Healthy));
                }
            }
        }
        let n = back.len();
        table.revive(&rec.node, back).await?;
        tracing::info!(registry = %table, node = %rec.node, revived = n, "node is back; its endpoints are healthy again");
        Ok(())
    }

    /// One sweep of every node in the backend, as described in the module
    /// documentation, timed on this process's monotonic clock.
    pub async fn sweep<T: NodeTable + ?Sized>(&self, table: &T) -> Result<SweepReport> {
        self.sweep_with(table, Instant::now).await
    }

    /// [`SharedLiveness::sweep`] as if the records were read at `now` on
    /// this process's monotonic clock: for tests that move time.
    pub async fn sweep_at<T: NodeTable + ?Sized>(
        &self,
        table: &T,
        now: Instant,
    ) -> Result<SweepReport> {
        self.sweep_with(table, || now).await
    }

    async fn sweep_with<T: NodeTable + ?Sized>(
        &self,
        table: &T,
        clock: impl FnOnce() -> Instant,
    ) -> Result<SweepReport> {
        let cfg = self.config();
        let records = table.node_records().await?;
        // A change is seen when the read that shows it has ended: taking
        // the time after the read never starts a silence before the
        // heartbeat that ended the last one.
        let now = clock();
        let snap = table.endpoints().await?;
        let mut owned: BTreeMap<&str, Vec<&Endpoint>> = BTreeMap::new();
        for e in snap.iter().filter(|e| !e.node.is_empty()) {
            owned.entry(e.node.as_str()).or_default().push(e);
        }
        let known: HashMap<&str, &NodeRecord> =
            records.iter().map(|r| (r.node.as_str(), r)).collect();
        let wall = now_ms();
        for node in owned.keys().filter(|n| !known.contains_key(*n)) {
            table.admit(node, wall).await?;
        }
        let judged: Vec<(&NodeRecord, Observed)> = {
            let mut silence = lock(&self.silence);
            silence.retain(|n| known.contains_key(n));
            records
                .iter()
                .map(|r| (r, silence.observe(&r.node, r.heard(), now)))
                .collect()
        };
        let mut suspects = Vec::new();
        let mut dead = Vec::new();
        let mut back = Vec::new();
        for (rec, seen) in judged {
            let eps = owned.get(rec.node.as_str());
            if seen.silent_for >= cfg.remove_after {
                dead.push(rec);
            } else if seen.silent_for >= cfg.suspect_after {
                let healthy: Vec<Endpoint> = eps
                    .into_iter()
                    .flatten()
                    .filter(|e| e.health == Health::Healthy)
                    .map(|e| Endpoint::clone(e).with_health(Health::Unhealthy))
                    .collect();
                if !healthy.is_empty() {
                    suspects.push((rec, healthy));
                }
            } else if seen.heard && !rec.marked.is_empty() {
                back.push(rec);
            }
        }
        // Records of nodes without endpoints are forgotten quietly: they
        // count towards neither the silent share nor the total.
        let silent_owners = suspects.len()
            + dead
                .iter()
                .filter(|r| owned.contains_key(r.node.as_str()))
                .count();
        let owners_total = owned.len();
        if self_preservation_holds(&cfg, silent_owners, owners_total, table) {
            return Ok(SweepReport::held());
        }
        let mut report = SweepReport::default();
        for (rec, eps) in suspects {
            if table.mark(rec, eps).await? {
                tracing::info!(registry = %table, node = %rec.node, "node silent; its endpoints are now unhealthy");
                report.suspected.push(rec.node.clone());
            }
        }
        for rec in dead {
            let keys: Vec<EndpointKey> = owned
                .get(rec.node.as_str())
                .into_iter()
                .flatten()
                .map(|e| e.key())
                .collect();
            let owner = !keys.is_empty();
            if table.remove(rec, keys).await? {
                self.forget(&rec.node);
                if owner {
                    tracing::info!(registry = %table, node = %rec.node, "node silent too long; its endpoints are removed");
                    report.removed.push(rec.node.clone());
                }
            }
        }
        for rec in back {
            self.revive_marked(table, rec).await?;
        }
        Ok(report)
    }
}

/// Sweep `table` every [`SharedLiveness::sweep_interval`] until either is
/// dropped; the task a backend spawns next to its `SharedLiveness`.
pub async fn sweep_loop<T: NodeTable + ?Sized>(table: Weak<T>, liveness: Weak<SharedLiveness>) {
    loop {
        let Some(every) = liveness.upgrade().map(|l| l.sweep_interval()) else {
            return;
        };
        tokio::time::sleep(crate::backend::spread(every, 0.1)).await;
        let (Some(table), Some(liveness)) = (table.upgrade(), liveness.upgrade()) else {
            return;
        };
        if let Err(e) = liveness.sweep(&*table).await {
            tracing::warn!(registry = %table, error = %e, "liveness sweep failed");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
#[path = "shared_liveness_tests.rs"]
mod tests;
