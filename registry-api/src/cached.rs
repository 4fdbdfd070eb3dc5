//! [`CachedRegistry`]: local-first reads from a snapshot kept by a watch.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use backon::BackoffBuilder;
use futures::StreamExt;
use tokio::time::Instant;

use crate::error::Result;
use crate::hub::{Hub, DEFAULT_SUBSCRIBER_BUFFER};
use crate::model::{Capabilities, Endpoint, EndpointKey, Event, Op, Version};
use crate::polling::{diff, start_version, with_version};
use crate::settings::{check_count, check_duration};
use crate::snapshot::Snapshot;
use crate::traits::{Batch, EventStream, Heartbeat, Registry, Watch};

/// Settings of [`CachedRegistry`].
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct CachedConfig {
    /// First delay before reconnecting a lost stream. Default 200 ms.
    pub reconnect_min: Duration,
    /// Longest delay between reconnects (exponential, factor 2, with
    /// jitter). Default 30 s.
    pub reconnect_max: Duration,
    /// Deltas kept so local watchers can resume. Default 4096.
    pub history: usize,
    /// Events buffered per local watcher before it is cut off. Default 1024.
    pub buffer: usize,
    /// After a write succeeds, wait up to this long for the cache to show
    /// it, so a caller reads its own writes. Zero turns the wait off.
    /// Default 5 s; the wait is skipped while the stream is down.
    pub write_wait: Duration,
    /// Number the cache's events with its own counter (starting at the
    /// clock in microseconds) instead of the inner registry's versions.
    /// Needed when [`CachedRegistry::apply_local`] mixes local changes into
    /// the stream: local watchers then resume on one consistent sequence.
    /// Default false.
    pub local_versions: bool,
    /// How long a change made with [`CachedRegistry::apply_local`] wins over
    /// older news of the same key from the inner registry (until the inner
    /// registry echoes the local value). Default 30 s.
    pub local_hold: Duration,
}

impl Default for CachedConfig {
    fn default() -> Self {
        Self {
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(30),
            history: 4096,
            buffer: DEFAULT_SUBSCRIBER_BUFFER,
            write_wait: Duration::from_secs(5),
            local_versions: false,
            local_hold: Duration::from_secs(30),
        }
    }
}

impl CachedConfig {
    /// Set the reconnect delays.
    pub fn with_reconnect(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }
    /// Set `history`.
    pub fn with_history(mut self, history: usize) -> Self {
        self.history = history;
        self
    }
    /// Set `buffer`.
    pub fn with_buffer(mut self, buffer: usize) -> Self {
        self.buffer = buffer;
        self
    }
    /// Set `local_versions`.
    pub fn with_local_versions(mut self, local: bool) -> Self {
        self.local_versions = local;
        self
    }
    /// Set `write_wait`.
    pub fn with_write_wait(mut self, wait: Duration) -> Self {
        self.write_wait = wait;
        self
    }

    /// Check every setting: reconnect delays 1 ms to 1 h (`reconnect_max`
    /// at least `reconnect_min`), `history` and `buffer` 1 to 10 000 000,
    /// `write_wait` and `local_hold` at most 1 h.
    pub fn validate(&self) -> Result<()> {
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        check_duration("reconnect_min", self.reconnect_min, ms(1), hour)?;
        check_duration(
            "reconnect_max",
            self.reconnect_max,
            self.reconnect_min,
            hour,
        )?;
        check_count("history", self.history, 1, 10_000_000)?;
        check_count("buffer", self.buffer, 1, 10_000_000)?;
        check_duration("write_wait", self.write_wait, Duration::ZERO, hour)?;
        check_duration("local_hold", self.local_hold, Duration::ZERO, hour)
    }
}

/// Serves reads from memory, kept current by one watch on the inner
/// registry.
///
/// - Reads (`list`, `snapshot`) come from a snapshot swapped atomically:
///   they never wait for the writer and never see half an update. Until the
///   first snapshot has arrived they go to the inner registry.
/// - When the stream fails or ends, it reconnects with exponential backoff
///   and jitter, resuming from the last version it applied, and keeps
///   serving the last-known-good data meanwhile ([`CachedRegistry::cache_age`]
///   says for how long). If the inner registry answers with a fresh snapshot,
///   the difference is applied, so local watchers still see each change once.
/// - Local watchers ([`Watch`]) are fed from the cache through a [`Hub`]:
///   one upstream stream for any number of them.
/// - A batch the backend applies atomically reaches the cache event by
///   event, so the capabilities say `atomic_batch: false`.
/// - Writes go to the inner registry; then the call waits (up to
///   [`CachedConfig::write_wait`]) until the watch has brought the write
///   into the cache, so a caller reads its own writes.
///
/// The watch starts in [`CachedRegistry::new`], which must be called inside a
/// Tokio runtime; it stops when the `CachedRegistry` is dropped.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use registry_api::{CachedRegistry, Endpoint, MemoryRegistry, Registry};
/// let cached = CachedRegistry::new(MemoryRegistry::new());
/// cached.register(Endpoint::new("api", "a", "127.0.0.1", 80)).await?;
/// cached.wait_until_ready().await;
/// assert_eq!(cached.to_string(), "Cached(Memory)");
/// # Ok::<(), registry_api::Error>(()) });
/// ```
pub struct CachedRegistry<R> {
    inner: Arc<R>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    hub: Arc<Hub>,
    /// Held while computing and publishing a change; the local version
    /// counter when versions are local.
    publish: Mutex<Option<u64>>,
    /// Local writes not yet echoed by the inner registry, with the time
    /// their hold ends.
    held: Mutex<HashMap<EndpointKey, (Option<Endpoint>, Instant)>>,
    hold: Duration,
    write_wait: Duration,
    /// `None` while connected; when the stream was lost otherwise.
    lost_at: Mutex<Option<Instant>>,
    /// Generation of the last resync asked for ([`CachedRegistry::resync`]).
    resync: tokio::sync::watch::Sender<u64>,
    /// Generation of the last resync done (its snapshot applied).
    resynced: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    fn set_lost(&self, lost: bool) {
        let mut at = self.lost_at.lock().unwrap_or_else(|p| p.into_inner());
        match (lost, at.is_some()) {
            (true, false) => *at = Some(Instant::now()),
            (false, true) => *at = None,
            _ => {}
        }
    }

    fn age(&self) -> Option<Duration> {
        if !self.hub.is_ready() {
            return None;
        }
        let at = self.lost_at.lock().unwrap_or_else(|p| p.into_inner());
        Some(at.map(|t| t.elapsed()).unwrap_or_default())
    }
}

impl<R: Registry + Watch> CachedRegistry<R> {
    /// Cache `inner` with the default settings.
    pub fn new(inner: R) -> Self {
        Self::start(inner, CachedConfig::default())
    }

    /// Cache `inner` with `config`, checked first
    /// ([`CachedConfig::validate`]).
    pub fn with_config(inner: R, config: CachedConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::start(inner, config))
    }

    fn start(inner: R, config: CachedConfig) -> Self {
        let inner = Arc::new(inner);
        let shared = Arc::new(Shared {
            hub: Arc::new(Hub::pending(config.buffer, config.history)),
            publish: Mutex::new(config.local_versions.then(start_version)),
            held: Mutex::new(HashMap::new()),
            hold: config.local_hold,
            write_wait: config.write_wait,
            lost_at: Mutex::new(None),
            resync: tokio::sync::watch::channel(0).0,
            resynced: tokio::sync::watch::channel(0).0,
        });
        let task = tokio::spawn(sync_loop(
            Arc::clone(&inner),
            Arc::downgrade(&shared),
            config,
        ));
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

    /// How stale the cache may be: `None` before the first snapshot, zero
    /// while the stream is up, otherwise the time since it was lost.
    /// Also published as the gauge `agent_registrar_cache_age_seconds`.
    pub fn cache_age(&self) -> Option<Duration> {
        let age = self.shared.age();
        if let Some(a) = age {
            metrics::gauge!("agent_registrar_cache_age_seconds").set(a.as_secs_f64());
        }
        age
    }

    /// Throw away what the cache believes and read the inner registry's
    /// whole state again: the watch restarts without a resume point, local
    /// holds ([`CachedRegistry::apply_local`]) are dropped, and the fresh
    /// snapshot replaces the cached one (local watchers get the
    /// difference). Returns once the fresh snapshot is applied, which may
    /// take as long as the inner registry is unreachable; wrap it in a
    /// timeout to bound it.
    pub async fn resync(&self) {
        self.shared
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let mut want = 0;
        self.shared.resync.send_modify(|g| {
            *g += 1;
            want = *g;
        });
        let mut done = self.shared.resynced.subscribe();
        let _ = done.wait_for(|g| *g >= want).await;
    }

    /// Whether the task that keeps the cache is running (false once it
    /// ended, which only a panic makes happen while the cache lives).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Whether the first snapshot has arrived (reads are local from then on).
    pub fn is_ready(&self) -> bool {
        self.shared.hub.is_ready()
    }

    /// Wait until the first snapshot has arrived.
    pub async fn wait_until_ready(&self) {
        let mut w = self.shared.hub.subscribe(None);
        let _ = w.next().await;
    }

    /// Apply `ops` to the cache now, before (or without) writing them to the
    /// inner registry: an optimistic update that local watchers see at
    /// once. The inner registry's own events for the same change are later
    /// recognised as repeats and dropped. Returns the events published
    /// (none before the first snapshot). Use with
    /// [`CachedConfig::local_versions`].
    pub fn apply_local(&self, ops: &[Op]) -> Vec<Event> {
        let until = Instant::now() + self.shared.hold;
        {
            let mut held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
            for op in ops {
                let desired = match op {
                    Op::Register(e) => Some(e.clone()),
                    Op::Deregister(_) => None,
                };
                held.insert(op.key(), (desired, until));
            }
        }
        self.publish_local(ops)
    }

    /// Take back local changes: the holds of `ops`' keys end and `ops` are
    /// applied at once without a hold, so the inner registry's later news
    /// of those keys is taken as it comes. Returns the events published.
    pub fn undo_local(&self, ops: &[Op]) -> Vec<Event> {
        {
            let mut held = self.shared.held.lock().unwrap_or_else(|p| p.into_inner());
            for op in ops {
                held.remove(&op.key());
            }
        }
        self.publish_local(ops)
    }

    /// Apply `ops` to the cache as local changes and publish them.
    fn publish_local(&self, ops: &[Op]) -> Vec<Event> {
        let mut out = Vec::new();
        for op in ops {
            let version = self.shared.hub.current().version();
            let ev = match op {
                Op::Register(endpoint) => Event::Added {
                    version,
                    endpoint: endpoint.clone(),
                },
                Op::Deregister(key) => Event::Removed {
                    version,
                    key: key.clone(),
                },
            };
            out.extend(self.shared.apply(ev, false));
        }
        out
    }

    /// The hub that fans the cache out to local watchers.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.shared.hub
    }

    /// The cached state, without waiting; `None` before the first snapshot.
    pub fn cached(&self) -> Option<Arc<Snapshot>> {
        self.is_ready().then(|| self.shared.hub.current())
    }
}

impl<R: Registry + Watch> CachedRegistry<R> {
    /// After a successful write, wait for the cache to reflect `ops`' net
    /// effect (bounded; skipped while disconnected or before the first
    /// snapshot).
    async fn await_own_writes(&self, ops: &[Op]) {
        if self.shared.write_wait.is_zero() || self.shared.age() != Some(Duration::ZERO) {
            return;
        }
        let mut want: std::collections::BTreeMap<EndpointKey, Option<&Endpoint>> =
            std::collections::BTreeMap::new();
        for op in ops {
            match op {
                Op::Register(e) => want.insert(e.key(), Some(e)),
                Op::Deregister(k) => want.insert(k.clone(), None),
            };
        }
        let reflected = |snap: &Snapshot| want.iter().all(|(k, v)| snap.get(k) == *v);
        if !self
            .shared
            .hub
            .wait_until(reflected, self.shared.write_wait)
            .await
        {
            tracing::debug!(registry = %self, "write not yet visible in the cache");
        }
    }
}

impl<R> Drop for CachedRegistry<R> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn sync_loop<R: Registry + Watch>(inner: Arc<R>, shared: Weak<Shared>, cfg: CachedConfig) {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(cfg.reconnect_min)
        .with_max_delay(cfg.reconnect_max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    let mut delays = builder.build();
    let mut last: Option<Version> = None;
    let mut resync = match shared.upgrade() {
        Some(s) => s.resync.subscribe(),
        None => return,
    };
    loop {
        // A resync asked for (and not yet done) starts from a snapshot.
        let wanted = *resync.borrow_and_update();
        let from = if wanted > done_generation(&shared) {
            None
        } else {
            last
        };
        let mut stream = inner.watch(from);
        let mut reason = String::from("stream ended");
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                changed = resync.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    reason = String::from("a resync was asked for");
                    break;
                }
            };
            let Some(item) = item else { break };
            let Some(shared) = shared.upgrade() else {
                return;
            };
            match item {
                Ok(ev) => {
                    shared.set_lost(false);
                    delays = builder.build();
                    last = Some(ev.version());
                    let fresh = matches!(ev, Event::Snapshot(_));
                    shared.apply(ev, true);
                    if fresh {
                        shared.resynced.send_if_modified(|g| {
                            let modified = *g < wanted;
                            *g = (*g).max(wanted);
                            modified
                        });
                    }
                }
                Err(e) => {
                    // The source reports a failure; it may go on retrying by
                    // itself (its next item is then a fresh snapshot) or end.
                    shared.set_lost(true);
                    metrics::counter!("agent_registrar_stream_reconnects_total").increment(1);
                    tracing::warn!(registry = %inner, error = %e, "the watch reports a failure; serving last-known-good data");
                    reason = e.to_string();
                }
            }
        }
        {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            if *resync.borrow() > *strong.resynced.borrow() {
                continue;
            }
            strong.set_lost(true);
        }
        metrics::counter!("agent_registrar_stream_reconnects_total").increment(1);
        let delay = delays.next().unwrap_or(cfg.reconnect_max);
        tracing::warn!(registry = %inner, %reason, ?delay, resume_from = ?last, "cache lost its watch; serving last-known-good data");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            changed = resync.changed() => if changed.is_err() { return },
        }
    }
}

fn done_generation(shared: &Weak<Shared>) -> u64 {
    shared.upgrade().map_or(0, |s| *s.resynced.borrow())
}

/// The events that bring `current` to what `ev` says, dropping what is
/// already true: repeats vanish, an upsert of a missing key is an add, and a
/// snapshot after the first becomes the deltas between the two.
fn effective(current: &Snapshot, ev: Event) -> Vec<Event> {
    match ev {
        Event::Snapshot(fresh) => diff(current, &fresh),
        Event::Added { version, endpoint } | Event::Updated { version, endpoint } => {
            match current.get(&endpoint.key()) {
                Some(old) if *old == endpoint => Vec::new(),
                Some(_) => vec![Event::Updated { version, endpoint }],
                None => vec![Event::Added { version, endpoint }],
            }
        }
        Event::Removed { version, key } => {
            if current.contains(&key) {
                vec![Event::Removed { version, key }]
            } else {
                Vec::new()
            }
        }
    }
}

impl Shared {
    /// Keep local writes over older upstream news: an upstream event on a
    /// key with a local write not yet echoed is dropped unless it carries
    /// the local value (which ends the hold) or the hold expired; a snapshot
    /// is patched with the held values.
    fn filter_upstream(&self, ev: Event) -> Option<Event> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_empty() {
            return Some(ev);
        }
        let now = Instant::now();
        held.retain(|_, (_, until)| *until > now);
        match ev {
            Event::Snapshot(fresh) => {
                let mut patched = fresh;
                held.retain(|key, (desired, _)| {
                    if patched.get(key) == desired.as_ref() {
                        return false;
                    }
                    patched = match desired {
                        Some(e) => patched.with_endpoint(e.clone()),
                        None => patched.without(key),
                    };
                    true
                });
                Some(Event::Snapshot(patched))
            }
            delta => {
                let Some(key) = delta.key() else {
                    return Some(delta);
                };
                let Some((desired, _)) = held.get(&key) else {
                    return Some(delta);
                };
                let value = match &delta {
                    Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                        Some(endpoint)
                    }
                    _ => None,
                };
                if value == desired.as_ref() {
                    held.remove(&key);
                    Some(delta)
                } else {
                    None
                }
            }
        }
    }

    /// Apply one event to the cache and publish what changed, renumbered
    /// with local versions when configured. One writer at a time.
    fn apply(&self, ev: Event, upstream: bool) -> Vec<Event> {
        let mut local = self.publish.lock().unwrap_or_else(|p| p.into_inner());
        let ev = if upstream && self.hub.is_ready() {
            match self.filter_upstream(ev) {
                Some(ev) => ev,
                None => return Vec::new(),
            }
        } else {
            ev
        };
        if !self.hub.is_ready() {
            let Event::Snapshot(snap) = ev else {
                return Vec::new();
            };
            let snap = match local.as_mut() {
                Some(n) => snap.at_version(Version(*n)),
                None => snap,
            };
            let first = vec![Event::Snapshot(snap)];
            self.hub.publish(first.clone());
            return first;
        }
        let mut events = effective(&self.hub.current(), ev);
        if let Some(n) = local.as_mut() {
            for e in events.iter_mut() {
                *n += 1;
                *e = with_version(e.clone(), Version(*n));
            }
        }
        if !events.is_empty() {
            self.hub.publish(events.clone());
        }
        events
    }
}

impl<R: Registry> fmt::Display for CachedRegistry<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cached({})", self.inner)
    }
}

impl<R: Registry> fmt::Debug for CachedRegistry<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedRegistry")
            .field("inner", &self.inner)
            .field("hub", &self.shared.hub)
            .finish()
    }
}

#[async_trait]
impl<R: Registry + Watch> Registry for CachedRegistry<R> {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.inner.register(endpoint.clone()).await?;
        self.await_own_writes(&[Op::Register(endpoint)]).await;
        Ok(())
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.inner.deregister(key).await?;
        self.await_own_writes(&[Op::Deregister(key.clone())]).await;
        Ok(())
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        match self.cached() {
            Some(snap) => Ok(snap.list(service)),
            None => self.inner.list(service).await,
        }
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        match self.cached() {
            Some(snap) => Ok(Snapshot::clone(&snap)),
            None => self.inner.snapshot().await,
        }
    }
    fn capabilities(&self) -> Capabilities {
        // The backend applies a batch atomically, but the cache receives it
        // event by event: a read may see part of it.
        self.inner.capabilities().with_atomic_batch(false)
    }
    async fn probe(&self) -> Result<()> {
        self.inner.probe().await
    }
}

impl<R: Registry + Watch> Watch for CachedRegistry<R> {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.shared.hub.subscribe(from)
    }
}

#[async_trait]
impl<R: Batch + Watch> Batch for CachedRegistry<R> {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.inner.apply(ops.clone()).await?;
        self.await_own_writes(&ops).await;
        Ok(())
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
}

#[async_trait]
impl<R: Registry + Watch + Heartbeat> Heartbeat for CachedRegistry<R> {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.inner.heartbeat(node).await
    }
}
