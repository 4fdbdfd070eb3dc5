//! [`MemoryRegistry`]: the complete in-memory reference backend.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::history::History;
use crate::model::{Capabilities, Endpoint, EndpointKey, Event, Health, Op, Version};
use crate::snapshot::Snapshot;
use crate::traits::{validate_ops, Batch, EventStream, Heartbeat, Registry, Watch};

/// Default number of changes kept for resuming watches.
pub const DEFAULT_HISTORY: usize = 4096;

/// An in-memory registry implementing all four traits.
///
/// Every change gets the next [`Version`]; the last `history` changes are
/// kept so that `watch(Some(v))` can resume without a snapshot. Batches are
/// atomic: a watcher or snapshot sees all of a batch or none of it. A
/// heartbeat revives the node's unhealthy endpoints; marking them unhealthy
/// is the job of [`crate::Liveness`].
///
/// ```
/// # tokio_test_block_on(async {
/// use registry_api::{Endpoint, MemoryRegistry, Registry};
/// let reg = MemoryRegistry::new();
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 8080)).await?;
/// assert_eq!(reg.list("api").await?.len(), 1);
/// # Ok::<(), registry_api::Error>(()) });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryRegistry {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    tx: broadcast::Sender<Event>,
    max_batch: usize,
}

struct State {
    snap: Snapshot,
    history: History,
}

impl Default for MemoryRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRegistry {
    /// An empty registry keeping [`DEFAULT_HISTORY`] changes.
    pub fn new() -> Self {
        Self::with_history(DEFAULT_HISTORY)
    }

    /// An empty registry keeping the last `history` changes for resuming
    /// watches (at least 1).
    pub fn with_history(history: usize) -> Self {
        let history_len = history.max(1);
        let (tx, _) = broadcast::channel(history_len.clamp(16, 65_536));
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    snap: Snapshot::empty(Version::ZERO),
                    history: History::new(history_len, Version::ZERO),
                }),
                tx,
                max_batch: 10_000,
            }),
        }
    }

    /// Set the largest batch [`Batch::apply`] takes (default 10 000).
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.max_batch = max_batch.max(1);
        }
        self
    }

    /// The version of the latest change.
    pub fn version(&self) -> Version {
        self.lock().snap.version()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Apply already validated ops under one lock, emitting one event per
    /// real change.
    fn commit(&self, ops: impl IntoIterator<Item = Op>) {
        let mut st = self.lock();
        for op in ops {
            let next = st.snap.version().next();
            let event = match op {
                Op::Register(ep) => match st.snap.get(&ep.key()) {
                    Some(old) if *old == ep => continue,
                    Some(_) => Event::Updated {
                        version: next,
                        endpoint: ep,
                    },
                    None => Event::Added {
                        version: next,
                        endpoint: ep,
                    },
                },
                Op::Deregister(key) => {
                    if !st.snap.contains(&key) {
                        continue;
                    }
                    Event::Removed { version: next, key }
                }
            };
            st.snap.apply(&event);
            st.history.push(event.clone());
            // No receivers is fine.
            let _ = self.shared.tx.send(event);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-written:
        // every change is computed before it is stored.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Display for MemoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Memory")
    }
}

impl fmt::Debug for MemoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("MemoryRegistry")
            .field("version", &st.snap.version())
            .field("endpoints", &st.snap.len())
            .finish()
    }
}

#[async_trait]
impl Registry for MemoryRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        self.commit([Op::Register(endpoint)]);
        Ok(())
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.commit([Op::Deregister(key.clone())]);
        Ok(())
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        Ok(self.lock().snap.list(service))
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        Ok(self.lock().snap.clone())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_atomic_batch(true)
            .with_max_batch(self.shared.max_batch)
    }
}

#[async_trait]
impl Batch for MemoryRegistry {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        if ops.len() > self.shared.max_batch {
            return Err(crate::Error::invalid(
                "ops",
                format!(
                    "{} ops, more than max_batch {}",
                    ops.len(),
                    self.shared.max_batch
                ),
            ));
        }
        self.commit(ops);
        Ok(())
    }
}

#[async_trait]
impl Heartbeat for MemoryRegistry {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        let revive: Vec<Op> = {
            let st = self.lock();
            st.snap
                .iter()
                .filter(|e| e.node == node && e.health == Health::Unhealthy)
                .map(|e| Op::Register(e.clone().with_health(Health::Healthy)))
                .collect()
        };
        self.commit(revive);
        Ok(())
    }
}

impl Watch for MemoryRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        let (initial, rx) = {
            let st = self.lock();
            // Subscribing under the lock: no change can fall between the
            // initial events and the live ones.
            (st.history.since(from, &st.snap), self.shared.tx.subscribe())
        };
        let last = initial
            .last()
            .map(Event::version)
            .or(from)
            .unwrap_or(Version::ZERO);
        // A weak handle: dropping the registry ends its watches.
        let shared = Arc::downgrade(&self.shared);
        let live = stream::unfold((rx, last), move |(mut rx, last)| {
            let shared = shared.clone();
            async move {
                loop {
                    match rx.recv().await {
                        Ok(ev) if ev.version() <= last => continue,
                        Ok(ev) => {
                            let v = ev.version();
                            return Some((Ok(ev), (rx, v)));
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            // This watcher fell behind the channel: resync.
                            let snap = shared.upgrade()?.lock().snap.clone();
                            let v = snap.version();
                            return Some((Ok(Event::Snapshot(snap)), (rx, v)));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        stream::iter(initial.into_iter().map(Ok))
            .chain(live)
            .boxed()
    }
}
