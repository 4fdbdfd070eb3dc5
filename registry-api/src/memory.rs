//! [`MemoryRegistry`]: the complete in-memory reference backend.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::backend::{check_batch, Hub};
use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::model::{Endpoint, EndpointKey, Health, Op, Version};
use crate::snapshot::{Event, Snapshot};
use crate::traits::{Batch, EventStream, Heartbeat, Registry, Watch};

/// Default number of changes kept for resuming watches.
pub const DEFAULT_HISTORY: usize = 4096;

/// An in-memory registry implementing all four traits.
///
/// Every change gets the next [`Version`]; the last `history` changes are
/// kept so that `watch(Some(v))` can resume without a snapshot. Batches are
/// atomic: a watcher or snapshot sees all of a batch or none of it. Watches
/// are fed by a [`Hub`]: a watcher that falls more than its buffer behind
/// is cut off with `Overloaded` and resubscribes. A heartbeat revives the
/// node's unhealthy endpoints, and is `NotFound` for a node that owns no
/// endpoint; marking them unhealthy is the job of
/// [`crate::liveness::Liveness`].
///
/// ```
/// # tokio_test_block_on(async {
/// use waypost::{Endpoint, Registry, memory::MemoryRegistry};
/// let reg = MemoryRegistry::new();
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 8080)).await?;
/// assert_eq!(reg.list("api").await?.len(), 1);
/// # Ok::<(), waypost::Error>(()) });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryRegistry {
    shared: Arc<Shared>,
}

struct Shared {
    hub: Arc<Hub>,
    /// One writer at a time: a batch is computed against the state it is
    /// published on.
    write: Mutex<()>,
    max_batch: usize,
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
        Self {
            shared: Arc::new(Shared {
                hub: Arc::new(Hub::new(Hub::DEFAULT_BUFFER, history.max(1))),
                write: Mutex::new(()),
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
        self.shared.hub.current().version()
    }

    /// Apply already validated ops and publish their changes in one step,
    /// one event per real change.
    fn commit(&self, ops: impl IntoIterator<Item = Op>) {
        let _one_writer = self.shared.write.lock().unwrap_or_else(|p| p.into_inner());
        let mut snap = Snapshot::clone(&self.shared.hub.current());
        let mut events = Vec::new();
        for op in ops {
            let next = snap.version().next();
            let event = match op {
                Op::Register(ep) => match snap.get(&ep.key()) {
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
                    if !snap.contains(&key) {
                        continue;
                    }
                    Event::Removed { version: next, key }
                }
            };
            snap.apply(&event);
            events.push(event);
        }
        if !events.is_empty() {
            self.shared.hub.publish(events);
        }
    }
}

impl fmt::Display for MemoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Memory")
    }
}

impl fmt::Debug for MemoryRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snap = self.shared.hub.current();
        f.debug_struct("MemoryRegistry")
            .field("version", &snap.version())
            .field("endpoints", &snap.len())
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
        Ok(self.shared.hub.current().list(service))
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot::clone(&self.shared.hub.current()))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_atomic_writes(true)
            .with_isolated_reads(true)
            .with_max_batch(self.shared.max_batch)
    }
}

#[async_trait]
impl Batch for MemoryRegistry {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, self.shared.max_batch)?;
        self.commit(ops);
        Ok(())
    }
}

#[async_trait]
impl Heartbeat for MemoryRegistry {
    /// Revive `node`'s endpoints marked unhealthy; `NotFound` when no
    /// endpoint belongs to `node` (it should register them again).
    async fn heartbeat(&self, node: &str) -> Result<()> {
        let snap = self.shared.hub.current();
        let mut owned = snap.iter().filter(|e| e.node == node).peekable();
        if owned.peek().is_none() {
            return Err(Error::not_found(format!(
                "node {node:?}: no endpoint of this node is registered"
            )));
        }
        let revive: Vec<Op> = owned
            .filter(|e| e.health == Health::Unhealthy)
            .map(|e| Op::Register(e.clone().with_health(Health::Healthy)))
            .collect();
        self.commit(revive);
        Ok(())
    }
}

impl Watch for MemoryRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.shared.hub.subscribe(from)
    }
}

/// MemoryRegistry implements all four traits: [`crate::stack::stack`] wraps it as its capabilities call
/// for.
impl crate::stack::IntoStack for MemoryRegistry {
    fn into_stack(
        self,
        cfg: &crate::stack::StackConfig,
    ) -> crate::Result<std::sync::Arc<dyn crate::stack::Stack>> {
        crate::stack::by_capabilities(self, cfg)
    }
}
