//! [`Store`]: the read side of a [`super::CachedRegistry`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::backend::Hub;
use crate::model::{Endpoint, EndpointKey, Version};
use crate::snapshot::Snapshot;
use crate::traits::EventStream;

/// The cache's state, read without waiting: cheap to clone, every clone
/// sees the same state. Reads never wait for the task that keeps it, and
/// never see half of an update.
#[derive(Clone)]
pub struct Store {
    pub(super) hub: Arc<Hub>,
    /// `None` while the watch delivers; since when it did not otherwise.
    pub(super) lost_at: Arc<Mutex<Option<Instant>>>,
    pub(super) age_metric: Arc<str>,
}

impl Store {
    pub(super) fn new(hub: Arc<Hub>, prefix: &str) -> Self {
        Self {
            hub,
            lost_at: Arc::new(Mutex::new(None)),
            age_metric: Arc::from(format!("{prefix}_cache_age_seconds")),
        }
    }

    pub(super) fn set_lost(&self, lost: bool) {
        let mut at = self.lost_at.lock().unwrap_or_else(|p| p.into_inner());
        match (lost, at.is_some()) {
            (true, false) => *at = Some(Instant::now()),
            (false, true) => *at = None,
            _ => {}
        }
    }

    /// Whether the watch has reported a failure and not delivered since.
    pub(super) fn is_lost(&self) -> bool {
        self.lost_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Whether the first snapshot has arrived.
    pub fn is_ready(&self) -> bool {
        self.hub.is_ready()
    }

    /// Wait until the first snapshot has arrived.
    pub async fn wait_until_ready(&self) {
        let mut w = self.hub.subscribe(None);
        let _ = w.next().await;
    }

    /// The state; `None` before the first snapshot.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.is_ready().then(|| self.hub.current())
    }

    /// The endpoints of `service`; `None` before the first snapshot.
    pub fn list(&self, service: &str) -> Option<Vec<Endpoint>> {
        self.snapshot().map(|s| s.list(service))
    }

    /// The endpoints of `service`, shared with every other reader until the
    /// service changes (see [`Hub::shared_list`]); `None` before the first
    /// snapshot.
    pub fn list_shared(&self, service: &str) -> Option<Arc<[Endpoint]>> {
        self.is_ready().then(|| self.hub.shared_list(service))
    }

    /// The endpoint the removal of `key` at `version` took away, while a
    /// watcher can still be sent that removal (see
    /// [`crate::backend::Hub::removed`]).
    pub fn removed(&self, version: Version, key: &EndpointKey) -> Option<Endpoint> {
        self.hub.removed(version, key)
    }

    /// Call `observer` with every change to the state from now on (see
    /// [`crate::backend::Observer`]): how a fan-out to many readers avoids
    /// a subscription each.
    pub fn observe(&self, observer: Arc<dyn crate::backend::Observer>) {
        self.hub.observe(observer);
    }

    /// Run `f` on the state (`None` before the first snapshot) while it
    /// cannot change: what `f` sets up with an observer starts exactly
    /// after that state (see [`crate::backend::Hub::with_current`]).
    pub fn with_state<T>(&self, f: impl FnOnce(Option<&Arc<Snapshot>>) -> T) -> T {
        self.hub.with_current(f)
    }

    /// The version of the state (zero before the first snapshot).
    pub fn version(&self) -> Version {
        self.hub.current().version()
    }

    /// A stream that yields once after each change of the state (changes
    /// made between two polls yield once); read the state again with
    /// [`Store::snapshot`]. Cheaper than [`Store::watch`] for a reader that
    /// looks at the whole state on each change: nothing is queued for it.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use futures::StreamExt;
    /// use waypost::cached::CachedRegistry;
    /// use waypost::memory::MemoryRegistry;
    /// use waypost::{Endpoint, Registry};
    ///
    /// let cache = CachedRegistry::new(MemoryRegistry::new());
    /// cache.wait_until_ready().await;
    /// let mut changes = cache.store().changes();
    /// cache.register(Endpoint::new("api", "a", "10.0.0.1", 80)).await?;
    /// changes.next().await;
    /// assert_eq!(cache.store().snapshot().map(|s| s.len()), Some(1));
    /// # Ok::<(), waypost::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn changes(&self) -> tokio_stream::wrappers::WatchStream<()> {
        self.hub.changes()
    }

    /// A stream of the state from `from` (see [`crate::Watch`]): local
    /// watchers share the cache's one upstream watch; one too slow is cut
    /// off and resubscribes.
    pub fn watch(&self, from: Option<Version>) -> EventStream {
        self.hub.subscribe(from)
    }

    /// How stale the state may be: `None` before the first snapshot, zero
    /// while the watch delivers, otherwise the time since it reported a
    /// failure or ended.
    pub fn cache_age(&self) -> Option<Duration> {
        if !self.hub.is_ready() {
            return None;
        }
        let at = self.lost_at.lock().unwrap_or_else(|p| p.into_inner());
        Some(at.map(|t| t.elapsed()).unwrap_or_default())
    }

    /// Set the gauge `<prefix>_cache_age_seconds` (call it before a
    /// scrape).
    pub fn record_metrics(&self) {
        if let Some(age) = self.cache_age() {
            metrics::gauge!(self.age_metric.to_string()).set(age.as_secs_f64());
        }
    }

    /// Wait until `cond` holds for the state, at most `limit`; whether it
    /// held.
    pub async fn wait_until(&self, cond: impl FnMut(&Snapshot) -> bool, limit: Duration) -> bool {
        self.hub.wait_until(cond, limit).await
    }
}
