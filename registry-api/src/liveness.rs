//! [`Liveness`]: heartbeats, unhealthy marking and removal for any registry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::model::{Endpoint, Health, Op};
use crate::settings::check_duration;
use crate::traits::{Batch, Heartbeat, Registry, Watch};

/// Settings of [`Liveness`]: unhealthy after 30 s of silence, removed
/// after 5 minutes.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct LivenessConfig {
    /// Silence after which a node's endpoints are marked unhealthy.
    /// Default 30 s.
    pub suspect_after: Duration,
    /// Silence after which a node's endpoints are removed. Default 5 min.
    pub remove_after: Duration,
    /// Time between two sweeps. Default 10 s.
    pub sweep_interval: Duration,
    /// Self-preservation: a sweep that would mark or remove more than this
    /// share of all known nodes holds off. Default 0.15.
    pub max_sweep_share: f64,
    /// Self-preservation only applies when at least this many nodes would
    /// be affected, so a single dead node is always handled. Default 2.
    pub hold_min_nodes: usize,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            suspect_after: Duration::from_secs(30),
            remove_after: Duration::from_secs(300),
            sweep_interval: Duration::from_secs(10),
            max_sweep_share: 0.15,
            hold_min_nodes: 2,
        }
    }
}

impl LivenessConfig {
    /// Set both thresholds.
    pub fn with_thresholds(mut self, suspect_after: Duration, remove_after: Duration) -> Self {
        self.suspect_after = suspect_after;
        self.remove_after = remove_after.max(suspect_after);
        self
    }
    /// Set `sweep_interval`.
    pub fn with_sweep_interval(mut self, d: Duration) -> Self {
        self.sweep_interval = d;
        self
    }
    /// Set the self-preservation share (0.0 to 1.0; 1.0 turns it off).
    pub fn with_max_sweep_share(mut self, share: f64) -> Self {
        self.max_sweep_share = share.clamp(0.0, 1.0);
        self
    }

    /// Check every setting: `suspect_after` 1 ms to 30 days,
    /// `remove_after` from `suspect_after` to 30 days, `sweep_interval`
    /// 1 ms to 30 days, `max_sweep_share` 0 to 1.
    pub fn validate(&self) -> Result<()> {
        let ms = Duration::from_millis;
        let month = Duration::from_secs(30 * 24 * 3600);
        check_duration("suspect_after", self.suspect_after, ms(1), month)?;
        check_duration("remove_after", self.remove_after, self.suspect_after, month)?;
        check_duration("sweep_interval", self.sweep_interval, ms(1), month)?;
        if !(0.0..=1.0).contains(&self.max_sweep_share) {
            return Err(crate::Error::invalid(
                "max_sweep_share",
                format!("{} is out of range: allowed 0 to 1", self.max_sweep_share),
            ));
        }
        Ok(())
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Nodes whose endpoints were marked unhealthy.
    pub suspected: Vec<String>,
    /// Nodes whose endpoints were removed.
    pub removed: Vec<String>,
    /// Set when self-preservation held the sweep off: nothing was changed.
    pub held: bool,
}

impl SweepReport {
    /// The report of a sweep that self-preservation held off.
    pub(crate) fn held() -> Self {
        Self {
            held: true,
            ..Self::default()
        }
    }
}

/// Heartbeats for any registry.
///
/// Every node that owns endpoints (`Endpoint::node`) or heartbeats is
/// tracked. A node silent for `suspect_after` has its endpoints marked
/// [`Health::Unhealthy`]; silent for `remove_after` they are deregistered
/// and the node is forgotten. A heartbeat (or a registration by the node)
/// makes it alive again and marks its endpoints healthy; after removal a
/// heartbeat is `NotFound`, and the owner registers its endpoints again.
///
/// A node seen for the first time by a sweep (its endpoints were there
/// before this `Liveness` started) gets a full `suspect_after` of grace.
///
/// Self-preservation: a registry cut off from the network sees every node
/// go silent at once. When one sweep would mark or remove more than
/// `max_sweep_share` of the known nodes (and at least `hold_min_nodes`), it
/// changes nothing, logs why, and sets the gauge
/// `registry_liveness_self_preservation` to 1 (and counts
/// `registry_liveness_sweeps_held_total`).
///
/// The sweeper starts in [`Liveness::new`] (inside a Tokio runtime) and
/// stops when the `Liveness` is dropped; [`Liveness::sweep`] runs one sweep
/// by hand.
pub struct Liveness<R> {
    inner: Arc<R>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    cfg: LivenessConfig,
    state: Mutex<Nodes>,
}

#[derive(Default)]
struct Nodes {
    last_seen: HashMap<String, Instant>,
    /// Nodes whose endpoints this sweeper marked unhealthy.
    marked: HashSet<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Nodes> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<R: Registry> Liveness<R> {
    /// Track liveness over `inner` with the default settings.
    pub fn new(inner: R) -> Self {
        Self::start(inner, LivenessConfig::default())
    }

    /// Track liveness over `inner` with `cfg`, checked first
    /// ([`LivenessConfig::validate`]).
    pub fn with_config(inner: R, cfg: LivenessConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self::start(inner, cfg))
    }

    fn start(inner: R, cfg: LivenessConfig) -> Self {
        let inner = Arc::new(inner);
        let shared = Arc::new(Shared {
            cfg,
            state: Mutex::new(Nodes::default()),
        });
        let task = tokio::spawn(sweep_loop(Arc::clone(&inner), Arc::downgrade(&shared)));
        Self {
            inner,
            shared,
            task,
        }
    }

    /// The inner registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Whether the sweeper task is running (false once it ended, which
    /// only a panic makes happen while the `Liveness` lives).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Run one sweep now.
    pub async fn sweep(&self) -> Result<SweepReport> {
        sweep(&*self.inner, &self.shared).await
    }

    /// Nodes currently tracked, with how long each has been silent.
    pub fn nodes(&self) -> BTreeMap<String, Duration> {
        let now = Instant::now();
        self.shared
            .lock()
            .last_seen
            .iter()
            .map(|(n, t)| (n.clone(), now.saturating_duration_since(*t)))
            .collect()
    }

    fn seen(&self, node: &str) -> bool {
        let mut st = self.shared.lock();
        st.last_seen.insert(node.to_string(), Instant::now());
        st.marked.remove(node)
    }
}

impl<R> Drop for Liveness<R> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn sweep_loop<R: Registry>(inner: Arc<R>, shared: Weak<Shared>) {
    let interval = match shared.upgrade() {
        Some(s) => s.cfg.sweep_interval,
        None => return,
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Err(e) = sweep(&*inner, &shared).await {
            tracing::warn!(registry = %inner, error = %e, "liveness sweep failed");
        }
    }
}

/// Whether a sweep of `registry` that would mark or remove `affected` of
/// `total` nodes holds off (self-preservation; see
/// [`LivenessConfig::max_sweep_share`]): logged, and shown in
/// `registry_liveness_self_preservation` and
/// `registry_liveness_sweeps_held_total`.
pub(crate) fn self_preservation_holds(
    cfg: &LivenessConfig,
    affected: usize,
    total: usize,
    registry: &(impl fmt::Display + ?Sized),
) -> bool {
    let holds = affected >= cfg.hold_min_nodes.max(1)
        && affected as f64 > cfg.max_sweep_share * total as f64;
    if holds {
        tracing::warn!(
            %registry,
            affected,
            total,
            share = cfg.max_sweep_share,
            "self-preservation: {affected} of {total} nodes are silent at once; \
             holding off (are they cut off from the network?)"
        );
        metrics::counter!("registry_liveness_sweeps_held_total").increment(1);
    }
    metrics::gauge!("registry_liveness_self_preservation").set(if holds { 1.0 } else { 0.0 });
    holds
}

async fn sweep<R: Registry + ?Sized>(inner: &R, shared: &Shared) -> Result<SweepReport> {
    let cfg = &shared.cfg;
    let snap = inner.snapshot().await?;
    let now = Instant::now();
    let mut owned: BTreeMap<&str, Vec<&Endpoint>> = BTreeMap::new();
    for e in snap.iter().filter(|e| !e.node.is_empty()) {
        owned.entry(e.node.as_str()).or_default().push(e);
    }
    let (suspects, dead, total) = {
        let mut st = shared.lock();
        for node in owned.keys() {
            st.last_seen.entry((*node).to_string()).or_insert(now);
        }
        let mut suspects = Vec::new();
        let mut dead = Vec::new();
        for (node, eps) in &owned {
            let silent = st
                .last_seen
                .get(*node)
                .map(|t| now.saturating_duration_since(*t))
                .unwrap_or_default();
            if silent >= cfg.remove_after {
                dead.push((*node).to_string());
            } else if silent >= cfg.suspect_after && eps.iter().any(|e| e.health == Health::Healthy)
            {
                suspects.push((*node).to_string());
            }
        }
        (suspects, dead, st.last_seen.len())
    };
    let affected = suspects.len() + dead.len();
    if self_preservation_holds(cfg, affected, total, inner) {
        return Ok(SweepReport::held());
    }
    for node in &suspects {
        for e in owned.get(node.as_str()).into_iter().flatten() {
            if e.health == Health::Healthy {
                inner
                    .register(Endpoint::clone(e).with_health(Health::Unhealthy))
                    .await?;
            }
        }
        tracing::info!(registry = %inner, node, "node silent; its endpoints are now unhealthy");
        shared.lock().marked.insert(node.clone());
    }
    for node in &dead {
        for e in owned.get(node.as_str()).into_iter().flatten() {
            inner.deregister(&e.key()).await?;
        }
        tracing::info!(registry = %inner, node, "node silent too long; its endpoints are removed");
        let mut st = shared.lock();
        st.last_seen.remove(node);
        st.marked.remove(node);
    }
    Ok(SweepReport {
        suspected: suspects,
        removed: dead,
        held: false,
    })
}

impl<R: Registry> fmt::Display for Liveness<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Liveness({})", self.inner)
    }
}

impl<R: Registry> fmt::Debug for Liveness<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Liveness")
            .field("inner", &self.inner)
            .field("config", &self.shared.cfg)
            .field("nodes", &self.shared.lock().last_seen.len())
            .finish()
    }
}

crate::forward! {
    impl[R: Registry] Registry for Liveness<R> {
        forward to inner: deregister, list, list_shared, snapshot, probe;
        async fn register(&self, endpoint: Endpoint) -> Result<()> {
            if !endpoint.node.is_empty() {
                self.seen(&endpoint.node);
            }
            self.inner.register(endpoint).await
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities().with_native_liveness(true)
        }
    }
}

#[async_trait]
impl<R: Registry> Heartbeat for Liveness<R> {
    /// Record that `node` is alive and revive the endpoints this sweeper
    /// marked unhealthy. `NotFound` for a node that owns no endpoint (never
    /// registered, or removed after `remove_after`): it should register
    /// its endpoints again.
    async fn heartbeat(&self, node: &str) -> Result<()> {
        crate::validate::check_name("node", node, true)?;
        let tracked = self.shared.lock().last_seen.contains_key(node);
        if !tracked {
            let snap = self.inner.snapshot().await?;
            if !snap.iter().any(|e| e.node == node) {
                return Err(crate::Error::not_found(format!(
                    "node {node:?}: no endpoint of this node is registered"
                )));
            }
        }
        if self.seen(node) {
            // This sweeper marked the node's endpoints unhealthy: revive them.
            let snap = self.inner.snapshot().await?;
            for e in snap
                .iter()
                .filter(|e| e.node == node && e.health == Health::Unhealthy)
            {
                self.inner
                    .register(e.clone().with_health(Health::Healthy))
                    .await?;
            }
        }
        Ok(())
    }
}

crate::forward! {
    impl[R: Batch] Batch for Liveness<R> {
        forward to inner: max_batch;
        async fn apply(&self, ops: Vec<Op>) -> Result<()> {
            // The batch rule before the sweeper notes any node as seen.
            crate::validate::check_batch(&ops, self.inner.max_batch())?;
            for op in &ops {
                if let Op::Register(e) = op {
                    if !e.node.is_empty() {
                        self.seen(&e.node);
                    }
                }
            }
            self.inner.apply(ops).await
        }
    }
}

crate::forward! {
    impl[R: Registry + Watch] Watch for Liveness<R> {
        forward to inner: watch;
    }
}
