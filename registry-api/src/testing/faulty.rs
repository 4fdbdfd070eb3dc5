//! [`Faulty`]: a wrapper that injects faults into any registry.

use std::time::Duration;

use futures::StreamExt;

use crate::error::{Error, Result};
use crate::model::{Endpoint, EndpointKey, Op, Version};
use crate::snapshot::Snapshot;
use crate::traits::{Batch, EventStream, Registry, Watch};

/// A wrapper that injects faults into any registry, for testing combinators
/// and consumers: failing writes, a backend that is down, watch streams
/// cut at will, and a record of the versions watches were resumed from.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use waypost::{ErrorKind, Registry, testing::Faulty, memory::MemoryRegistry};
/// let reg = Faulty::new(MemoryRegistry::new());
/// reg.fail_writes(1);
/// let ep = waypost::testing::ep("s", "a", 1);
/// assert_eq!(reg.register(ep.clone()).await.unwrap_err().kind(), ErrorKind::Unavailable);
/// reg.register(ep).await.unwrap();
/// # });
/// ```
pub struct Faulty<R> {
    inner: R,
    state: std::sync::Mutex<FaultState>,
    cut: tokio::sync::watch::Sender<u64>,
    held: tokio::sync::watch::Sender<bool>,
    latency: std::sync::Mutex<Duration>,
}

#[derive(Default)]
struct FaultState {
    fail_writes: usize,
    down: bool,
    refuse: Option<Error>,
    panic_writes: bool,
    poison: Vec<(EndpointKey, Error)>,
    max_ok_batch: Option<usize>,
    watch_froms: Vec<Option<Version>>,
    batches: Vec<usize>,
    write_calls: usize,
}

impl<R> Faulty<R> {
    /// Wrap `inner` with no faults.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            state: std::sync::Mutex::new(FaultState::default()),
            cut: tokio::sync::watch::channel(0).0,
            held: tokio::sync::watch::channel(false).0,
            latency: std::sync::Mutex::new(Duration::ZERO),
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `n` write calls fail with `Unavailable`.
    pub fn fail_writes(&self, n: usize) {
        self.st().fail_writes = n;
    }

    /// While set, every write (and `probe`) fails with `error`: a backend
    /// that refuses writes for good (read-only, corrupt, table gone).
    pub fn refuse_writes(&self, error: Option<Error>) {
        self.st().refuse = error;
    }

    /// While set, every write panics (a bug in a backend): for testing that
    /// a task dying of it is noticed.
    pub fn panic_writes(&self, on: bool) {
        self.st().panic_writes = on;
    }

    /// Every write that touches `key` fails with `error` (a poison op).
    pub fn poison(&self, key: EndpointKey, error: Error) {
        self.st().poison.push((key, error));
    }

    /// Batches of more than `n` ops fail with `Unavailable` (a chunk too
    /// large to commit before the backend's timeout); `None` lifts it.
    pub fn fail_batches_over(&self, n: Option<usize>) {
        self.st().max_ok_batch = n;
    }

    /// While down, every call fails with `Unavailable`, open watch streams
    /// are cut and new ones fail at once.
    pub fn set_down(&self, down: bool) {
        self.st().down = down;
        if down {
            self.cut_streams();
        }
    }

    /// End every open watch stream with an `Unavailable` error.
    pub fn cut_streams(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// While `hold` is set, watch streams (open ones included) send nothing
    /// until it is cleared: a backend whose first snapshot is slow to come.
    /// Writes and reads go through meanwhile.
    pub fn hold_watches(&self, hold: bool) {
        self.held.send_replace(hold);
    }

    /// Every call sleeps this long first (a slow backend).
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    /// The `from` argument of every `watch` call so far.
    pub fn watch_froms(&self) -> Vec<Option<Version>> {
        self.st().watch_froms.clone()
    }

    /// The size of every `apply` call that reached the inner registry.
    pub fn batches(&self) -> Vec<usize> {
        self.st().batches.clone()
    }

    /// How many write calls (register, deregister, apply) were made.
    pub fn write_calls(&self) -> usize {
        self.st().write_calls
    }

    /// The wrapped registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    async fn gate(&self, write: bool) -> Result<()> {
        self.gate_ops(write, &[]).await
    }

    /// The faults a call meets; `ops` are the writes it carries.
    async fn gate_ops(&self, write: bool, ops: &[Op]) -> Result<()> {
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut st = self.st();
        if write {
            st.write_calls += 1;
        }
        if st.down {
            return Err(Error::unavailable("injected: backend down"));
        }
        if !write {
            return Ok(());
        }
        if st.panic_writes {
            drop(st);
            panic!("injected: the backend panicked while writing");
        }
        if let Some(e) = &st.refuse {
            return Err(e.clone());
        }
        if st.fail_writes > 0 {
            st.fail_writes -= 1;
            return Err(Error::unavailable("injected: write failed"));
        }
        if let Some((_, e)) = st
            .poison
            .iter()
            .find(|(k, _)| ops.iter().any(|op| op.key() == *k))
        {
            return Err(e.clone());
        }
        if st.max_ok_batch.is_some_and(|n| ops.len() > n) {
            return Err(Error::unavailable(format!(
                "injected: a batch of {} ops timed out",
                ops.len()
            )));
        }
        Ok(())
    }
}

impl<R: Registry> std::fmt::Display for Faulty<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

impl<R: Registry> std::fmt::Debug for Faulty<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty")
            .field("inner", &self.inner)
            .finish()
    }
}

crate::forward! {
    impl[R: Registry] Registry for Faulty<R> {
        forward to inner: capabilities;
        async fn register(&self, endpoint: Endpoint) -> Result<()> {
            self.gate_ops(true, &[Op::Register(endpoint.clone())])
                .await?;
            self.inner.register(endpoint).await
        }
        async fn deregister(&self, key: &EndpointKey) -> Result<()> {
            self.gate_ops(true, &[Op::Deregister(key.clone())]).await?;
            self.inner.deregister(key).await
        }
        async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
            self.gate(false).await?;
            self.inner.list(service).await
        }
        async fn list_shared(&self, service: &str) -> Result<std::sync::Arc<[Endpoint]>> {
            self.gate(false).await?;
            self.inner.list_shared(service).await
        }
        async fn snapshot(&self) -> Result<Snapshot> {
            self.gate(false).await?;
            self.inner.snapshot().await
        }
        async fn probe(&self) -> Result<()> {
            if let Some(e) = &self.st().refuse {
                return Err(e.clone());
            }
            self.gate(false).await?;
            self.inner.probe().await
        }
    }
}

crate::forward! {
    impl[R: Batch] Batch for Faulty<R> {
        forward to inner: max_batch;
        async fn apply(&self, ops: Vec<Op>) -> Result<()> {
            self.gate_ops(true, &ops).await?;
            let n = ops.len();
            self.inner.apply(ops).await?;
            self.st().batches.push(n);
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl<R: crate::Heartbeat> crate::Heartbeat for Faulty<R> {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.gate(false).await?;
        self.inner.heartbeat(node).await
    }
}

impl<R: Watch> Watch for Faulty<R> {
    fn watch(&self, from: Option<Version>) -> EventStream {
        let down = {
            let mut st = self.st();
            st.watch_froms.push(from);
            st.down
        };
        if down {
            let err = Error::unavailable("injected: backend down");
            return futures::stream::once(async move { Err(err) }).boxed();
        }
        let mut cut = self.cut.subscribe();
        cut.borrow_and_update();
        let until = async move {
            let _ = cut.changed().await;
        };
        let tail =
            futures::stream::once(async { Err(Error::unavailable("injected: watch stream cut")) });
        let held = self.held.subscribe();
        self.inner
            .watch(from)
            .then(move |item| {
                let mut held = held.clone();
                async move {
                    // The sender lives in `self`; if it is gone, so is the hold.
                    let _ = held.wait_for(|h| !*h).await;
                    item
                }
            })
            .take_until(until)
            .chain(tail)
            .boxed()
    }
}
