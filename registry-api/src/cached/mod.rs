//! [`CachedRegistry`]: local-first reads from a snapshot kept by a watch
//! (a reflector: a read-only [`Store`] plus the task that keeps it).

mod store;
mod writer;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

pub use store::Store;
pub use writer::UpstreamFilter;
use writer::Writer;

use crate::backend::{check_count, check_duration, resume_with_backoff, Hub};
use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::model::{Endpoint, EndpointKey, Op, Version};
use crate::snapshot::{Event, Snapshot};
use crate::traits::{Batch, EventStream, Heartbeat, Registry, Watch};

/// Settings of [`CachedRegistry`].
#[non_exhaustive]
#[derive(Clone)]
pub struct CachedConfig {
    /// First delay before watching again after the watch ended. Default
    /// 200 ms; 1 ms to 1 h.
    pub reconnect_min: Duration,
    /// Longest delay between two watches (exponential, factor 2, with
    /// jitter). Default 30 s; `reconnect_min` to 1 h.
    pub reconnect_max: Duration,
    /// Deltas kept so local watchers can resume. Default 4096.
    pub history: usize,
    /// Events buffered per local watcher before it is cut off. Default 1024.
    pub buffer: usize,
    /// After a write succeeds, wait up to this long for the cache to show
    /// it, so a caller reads its own writes. Zero turns the wait off.
    /// Default 5 s; the wait is skipped while the watch is down, and holds
    /// before the first snapshot (the write is then in it).
    pub write_wait: Duration,
    /// Number the cache's events with its own counter (starting at the
    /// clock in microseconds) instead of the inner registry's versions.
    /// Needed when changes are applied with [`LocalWrites::apply`] beside the
    /// inner registry's: local watchers then resume on one sequence.
    /// Default false.
    pub local_versions: bool,
    /// Prefix of the metric names: `<prefix>_cache_age_seconds` (gauge, set
    /// by [`Store::record_metrics`]) and `<prefix>_stream_reconnects_total`
    /// (the watch reported a failure or ended). Default `registry`.
    pub metrics_prefix: String,
    /// What of the inner registry's news reaches the cache (default: all).
    pub filter: Option<Arc<dyn UpstreamFilter>>,
}

impl Default for CachedConfig {
    fn default() -> Self {
        Self {
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(30),
            history: 4096,
            buffer: Hub::DEFAULT_BUFFER,
            write_wait: Duration::from_secs(5),
            local_versions: false,
            metrics_prefix: "registry".to_string(),
            filter: None,
        }
    }
}

impl fmt::Debug for CachedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedConfig")
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("history", &self.history)
            .field("buffer", &self.buffer)
            .field("write_wait", &self.write_wait)
            .field("local_versions", &self.local_versions)
            .field("metrics_prefix", &self.metrics_prefix)
            .field("filter", &self.filter.is_some())
            .finish()
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
    /// Set `metrics_prefix`.
    pub fn with_metrics_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.metrics_prefix = prefix.into();
        self
    }
    /// Set `filter`.
    pub fn with_filter(mut self, filter: Arc<dyn UpstreamFilter>) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Check every setting: reconnect delays 1 ms to 1 h (`reconnect_max`
    /// at least `reconnect_min`), `history` and `buffer` 1 to 10 000 000,
    /// `write_wait` at most 1 h, a metric prefix that is a name.
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
        crate::backend::check_name("metrics_prefix", &self.metrics_prefix, true)
    }
}

/// Changes made beside a cache's inner registry (an optimistic write not
/// yet echoed), published to the cache's state and watchers at once.
/// Handed out once, with the cache, by
/// [`CachedRegistry::with_local_writes`].
#[derive(Clone)]
pub struct LocalWrites(Writer);

impl LocalWrites {
    /// Apply a change made here (not from the inner registry): what it
    /// changes is published, renumbered with the cache's own versions when
    /// configured. Returns the events published (none before the first
    /// snapshot, none when it changes nothing).
    pub fn apply(&self, ev: Event) -> Vec<Event> {
        self.0.apply(ev)
    }

    /// [`LocalWrites::apply`], only if `keep()` says so, asked while no
    /// change from the inner registry can be applied: what `keep` reads
    /// (say, whether the inner registry has echoed a write yet) cannot
    /// change between the question and the publication.
    pub fn apply_if(&self, ev: Event, keep: impl FnOnce() -> bool) -> Vec<Event> {
        self.0.apply_if(ev, keep)
    }
}

/// Serves reads from memory, kept current by one watch on the inner
/// registry.
///
/// - Reads (`list`, `snapshot`, and [`CachedRegistry::store`]) come from a
///   snapshot swapped atomically: they never wait for the task that keeps
///   it and never see half an update. Until the first snapshot has arrived
///   they go to the inner registry.
/// - The watch is followed with [`resume_with_backoff`]: when it reports a
///   failure or ends, the cache keeps serving the last-known-good data
///   ([`Store::cache_age`] says for how long) and watches again from the
///   last version it applied, with exponential backoff and jitter. A fresh
///   snapshot from the inner registry is applied as its difference, so
///   local watchers still see each change once.
/// - Local watchers ([`Watch`]) are fed from the cache: one upstream watch
///   for any number of them; one too slow is cut off and resubscribes.
/// - A batch the inner registry applies atomically reaches the cache event
///   by event: the capabilities say `isolated_reads: false`.
/// - Writes go to the inner registry; then the call waits (up to
///   [`CachedConfig::write_wait`]) until the watch has brought the write
///   into the cache, so a caller reads its own writes.
/// - [`CachedRegistry::resync`] reads the inner registry's whole state
///   again.
///
/// The task starts in [`CachedRegistry::new`], which must be called inside
/// a Tokio runtime; it stops when the `CachedRegistry` is dropped.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use waypost::{Endpoint, Registry, cached::CachedRegistry, memory::MemoryRegistry};
/// let cached = CachedRegistry::new(MemoryRegistry::new());
/// cached.register(Endpoint::new("api", "a", "127.0.0.1", 80)).await?;
/// cached.wait_until_ready().await;
/// assert_eq!(cached.store().list("api").map(|l| l.len()), Some(1));
/// assert_eq!(cached.to_string(), "Cached(Memory)");
/// # Ok::<(), waypost::Error>(()) });
/// ```
pub struct CachedRegistry<R> {
    inner: Arc<R>,
    store: Store,
    writer: Writer,
    write_wait: Duration,
    /// Generation of the last resync asked for.
    resync: tokio::sync::watch::Sender<u64>,
    /// Generation of the last resync done (its snapshot applied).
    resynced: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
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

    /// Cache `inner` with `config`, and the one handle that applies
    /// changes made beside it ([`LocalWrites`]): only the creator of the
    /// cache holds it, so nobody reading the cache can inject changes.
    pub fn with_local_writes(inner: R, config: CachedConfig) -> Result<(Self, LocalWrites)> {
        let cache = Self::with_config(inner, config)?;
        let local = LocalWrites(cache.writer.clone());
        Ok((cache, local))
    }

    fn start(inner: R, config: CachedConfig) -> Self {
        let inner = Arc::new(inner);
        let hub = Arc::new(Hub::pending(config.buffer, config.history));
        let store = Store::new(Arc::clone(&hub), &config.metrics_prefix);
        let writer = Writer::new(hub, config.local_versions, config.filter.clone());
        let resync = tokio::sync::watch::channel(0).0;
        let resynced = tokio::sync::watch::channel(0).0;
        let task = tokio::spawn(sync_loop(
            Arc::clone(&inner),
            store.clone(),
            writer.clone(),
            config.clone(),
            resync.subscribe(),
            resynced.clone(),
        ));
        Self {
            inner,
            store,
            writer,
            write_wait: config.write_wait,
            resync,
            resynced,
            task,
        }
    }

    /// The inner registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The read side: cheap to clone, never waits.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// How stale the cache may be: see [`Store::cache_age`].
    pub fn cache_age(&self) -> Option<Duration> {
        self.store.cache_age()
    }

    /// Whether the first snapshot has arrived (reads are local from then on).
    pub fn is_ready(&self) -> bool {
        self.store.is_ready()
    }

    /// Wait until the first snapshot has arrived.
    pub async fn wait_until_ready(&self) {
        self.store.wait_until_ready().await;
    }

    /// Throw away what the cache believes and read the inner registry's
    /// whole state again: the watch restarts without a resume point, the
    /// [`UpstreamFilter`] is reset, and the fresh snapshot replaces the
    /// cached one (local watchers get the difference). Returns once the
    /// fresh snapshot is applied, which may take as long as the inner
    /// registry is unreachable; wrap it in a timeout to bound it.
    pub async fn resync(&self) {
        let mut want = 0;
        self.resync.send_modify(|g| {
            *g += 1;
            want = *g;
        });
        let mut done = self.resynced.subscribe();
        let _ = done.wait_for(|g| *g >= want).await;
    }

    /// Whether the task that keeps the cache is running (false once it
    /// ended, which only a panic makes happen while the cache lives).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// After a successful write, wait for the cache to reflect `ops`' net
    /// effect (bounded; skipped while disconnected or before the first
    /// snapshot).
    async fn await_own_writes(&self, ops: &[Op]) {
        // Before the first snapshot the wait holds too: a watch opened after
        // the write returns then starts from a state that has it. Only a
        // watch known to be down skips the wait.
        if self.write_wait.is_zero() || self.store.is_lost() {
            return;
        }
        let mut want: BTreeMap<EndpointKey, Option<&Endpoint>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Register(e) => want.insert(e.key(), Some(e)),
                Op::Deregister(k) => want.insert(k.clone(), None),
            };
        }
        let reflected = |snap: &Snapshot| want.iter().all(|(k, v)| snap.get(k) == *v);
        if !self.store.wait_until(reflected, self.write_wait).await {
            tracing::debug!(registry = %self, "write not yet visible in the cache");
        }
    }
}

impl<R> Drop for CachedRegistry<R> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Follow the inner registry's watch into the store, restarting from a
/// snapshot when a resync is asked for.
async fn sync_loop<R: Registry + Watch>(
    inner: Arc<R>,
    store: Store,
    writer: Writer,
    cfg: CachedConfig,
    mut resync: tokio::sync::watch::Receiver<u64>,
    resynced: tokio::sync::watch::Sender<u64>,
) {
    let follow = |from| {
        resume_with_backoff(
            Arc::clone(&inner),
            from,
            cfg.reconnect_min,
            cfg.reconnect_max,
        )
    };
    let reconnects = format!("{}_stream_reconnects_total", cfg.metrics_prefix);
    let mut events = follow(None);
    let mut wanted = 0;
    loop {
        tokio::select! {
            item = events.next() => match item {
                Some(Ok(ev)) => {
                    store.set_lost(false);
                    let fresh = matches!(ev, Event::Snapshot(_));
                    writer.apply_upstream(ev);
                    if fresh {
                        resynced.send_if_modified(|g| {
                            let modified = *g < wanted;
                            *g = (*g).max(wanted);
                            modified
                        });
                    }
                }
                Some(Err(e)) => {
                    store.set_lost(true);
                    metrics::counter!(reconnects.clone()).increment(1);
                    tracing::warn!(registry = %inner, error = %e, "the cache's watch failed; serving last-known-good data");
                }
                // `resume_with_backoff` never ends.
                None => return,
            },
            changed = resync.changed() => {
                if changed.is_err() {
                    return;
                }
                wanted = *resync.borrow_and_update();
                writer.reset_filter();
                events = follow(None);
            }
        }
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
            .field("hub", &self.store.hub)
            .finish()
    }
}

crate::forward! {
    impl[R: Registry + Watch] Registry for CachedRegistry<R> {
        forward to inner: probe;
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
            match self.store.list(service) {
                Some(list) => Ok(list),
                None => self.inner.list(service).await,
            }
        }
        async fn list_shared(&self, service: &str) -> Result<Arc<[Endpoint]>> {
            match self.store.list_shared(service) {
                Some(list) => Ok(list),
                None => self.inner.list_shared(service).await,
            }
        }
        async fn snapshot(&self) -> Result<Snapshot> {
            match self.store.snapshot() {
                Some(snap) => Ok(Snapshot::clone(&snap)),
                None => self.inner.snapshot().await,
            }
        }
        fn capabilities(&self) -> Capabilities {
            // The inner registry may apply a batch atomically, but the cache
            // receives it event by event: a read may see part of it.
            self.inner.capabilities().with_isolated_reads(false)
        }
    }
}

impl<R: Registry + Watch> Watch for CachedRegistry<R> {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.store.watch(from)
    }
}

crate::forward! {
    impl[R: Batch + Watch] Batch for CachedRegistry<R> {
        forward to inner: max_batch;
        async fn apply(&self, ops: Vec<Op>) -> Result<()> {
            self.inner.apply(ops.clone()).await?;
            self.await_own_writes(&ops).await;
            Ok(())
        }
    }
}

crate::forward! {
    impl[R: Registry + Watch + Heartbeat] Heartbeat for CachedRegistry<R> {
        forward to inner: heartbeat;
    }
}
