//! The four traits a backend implements. All are object-safe, so
//! `Arc<dyn Registry>` works, and all are forwarded through `Arc<T>` and
//! `Box<T>`.

use std::fmt::{Debug, Display};
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::model::{Endpoint, EndpointKey, Op, Version};
use crate::snapshot::{Event, Snapshot};

/// The service name the default [`Registry::probe`] lists.
pub const PROBE_SERVICE: &str = "registry-probe";

/// A stream of watch events, `'static` so it can be moved into a task.
pub type EventStream = BoxStream<'static, Result<Event>>;

/// Read and write endpoints.
///
/// Semantics every backend passes in the conformance suite:
/// `register` is an upsert; deregistering an unknown key is not an error;
/// `list` of an unknown service is empty; concurrent writers don't lose each
/// other's keys. Every write validates its input first
/// ([`Endpoint::validate`]) and stores nothing when it is
/// invalid.
///
/// `Display` shows the backend and the chain of combinators around it,
/// e.g. `Cached(Coalescing(Memory))`.
#[async_trait]
pub trait Registry: Display + Debug + Send + Sync + 'static {
    /// Insert or replace `endpoint`.
    async fn register(&self, endpoint: Endpoint) -> Result<()>;
    /// Remove the endpoint with `key`; no error if it does not exist.
    async fn deregister(&self, key: &EndpointKey) -> Result<()>;
    /// The endpoints of `service`, ordered by id; empty if unknown.
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>>;
    /// [`Registry::list`] without the copy: registries that keep the state
    /// in memory ([`crate::cached::CachedRegistry`], the registrar client)
    /// hand every caller the same allocation until the service changes,
    /// so a read costs a lookup and a reference count instead of cloning
    /// each endpoint. The default wraps [`Registry::list`]; combinators
    /// forward it to what they wrap.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::sync::Arc;
    /// use waypost::{cached::CachedRegistry, memory::MemoryRegistry, Endpoint, Registry};
    /// let cached = CachedRegistry::new(MemoryRegistry::new());
    /// cached.register(Endpoint::new("api", "a", "10.0.0.1", 80)).await?;
    /// cached.wait_until_ready().await;
    /// let one = cached.list_shared("api").await?;
    /// let two = cached.list_shared("api").await?;
    /// assert_eq!(one.len(), 1);
    /// assert!(Arc::ptr_eq(&one, &two));
    /// # Ok::<(), waypost::Error>(())
    /// # }).unwrap();
    /// ```
    async fn list_shared(&self, service: &str) -> Result<Arc<[Endpoint]>> {
        self.list(service).await.map(Arc::from)
    }
    /// Every endpoint, at one version.
    async fn snapshot(&self) -> Result<Snapshot>;
    /// What this backend does natively.
    fn capabilities(&self) -> Capabilities;
    /// Check, without changing anything anyone can see, that the backend
    /// answers and would accept writes: `Ok` when it does; otherwise the
    /// error a write would meet, with its usual kind (`Unavailable` when it
    /// cannot be reached, `Unauthorized` when writes are not allowed,
    /// `Internal` for a corrupt store, `NotFound` for a missing table or
    /// namespace). Servers call it before they report ready and while they
    /// wait for a backend to come back.
    ///
    /// The default only reads (`list` of a service no one registers,
    /// [`PROBE_SERVICE`]); backends override it with a
    /// cheap write check where their API has one, and document what they
    /// probe.
    async fn probe(&self) -> Result<()> {
        self.list(PROBE_SERVICE).await.map(drop)
    }
}

/// Follow every change.
pub trait Watch: Send + Sync + 'static {
    /// A stream that starts with [`Event::Snapshot`], unless it can resume
    /// from `from` (then only the changes with a version after it). When the
    /// source lost history (compaction, a gap, a slow consumer), it sends a
    /// fresh `Snapshot` and goes on.
    ///
    /// An `Err` item reports a failure (the backend is unreachable, the
    /// change feed was lost). After it the stream either ends, and the
    /// consumer resumes with `watch(Some(last_version))`, or goes on
    /// retrying by itself, possibly reporting more `Err` items; then its
    /// next `Ok` item is a fresh `Snapshot` of the whole state, so the
    /// consumer learns both that the source is healthy again and what it
    /// holds now. Sources never hide a failure by retrying silently.
    fn watch(&self, from: Option<Version>) -> EventStream;
}

/// Several writes in one call.
///
/// The rule every backend follows ([`crate::backend::check_batch`]): a
/// batch of more than [`Batch::max_batch`] ops, or with an invalid op, is
/// refused with [`crate::Error::InvalidInput`] (naming `ops`, or the op as
/// `ops[i].…`) and nothing is written. A valid batch within the limit is
/// applied in order (a later op on the same key wins), all-or-nothing when
/// [`Capabilities::atomic_writes`] is set, and seen whole by readers when
/// [`Capabilities::isolated_reads`] is set. To write more than
/// `max_batch` ops, split them, or queue them with
/// [`crate::coalescing::Coalescing`].
#[async_trait]
pub trait Batch: Registry {
    /// Apply `ops` in order.
    async fn apply(&self, ops: Vec<Op>) -> Result<()>;
    /// The most ops one [`Batch::apply`] call takes
    /// ([`Capabilities::max_batch`]).
    fn max_batch(&self) -> usize {
        self.capabilities().max_batch
    }
}

/// The liveness signal of a node that owns endpoints.
#[async_trait]
pub trait Heartbeat: Send + Sync + 'static {
    /// Record that `node` is alive. Revives its endpoints if they were
    /// marked unhealthy.
    async fn heartbeat(&self, node: &str) -> Result<()>;
}

macro_rules! forward_pointers {
    ($($ptr:ident),*) => {$(
        crate::forward! {
            impl[T: Registry + ?Sized] Registry for $ptr<T> {
                forward to *: register, deregister, list, list_shared, snapshot, capabilities, probe;
            }
        }
        crate::forward! {
            impl[T: Watch + ?Sized] Watch for $ptr<T> {
                forward to *: watch;
            }
        }
        crate::forward! {
            impl[T: Batch + ?Sized] Batch for $ptr<T> {
                forward to *: apply, max_batch;
            }
        }
        crate::forward! {
            impl[T: Heartbeat + ?Sized] Heartbeat for $ptr<T> {
                forward to *: heartbeat;
            }
        }
    )*};
}

forward_pointers!(Arc, Box);
