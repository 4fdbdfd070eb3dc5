//! [`RegistrarClient`]: the agent's registry backend, a
//! `Registry + Watch + Heartbeat` backed by a registrar.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;
use waypost::{
    backend::check_batch,
    cached::{CachedConfig, CachedRegistry},
    Batch, Capabilities, Endpoint, EndpointKey, ErrorKind, EventStream, Heartbeat, Op, Registry,
    Result, Snapshot, Version, Watch,
};

use crate::client_state::{reconcile_loop, ClientState, KeyLocks, Refusal, Writes};
use crate::config::{Ack, ClientConfig};
use crate::overlay::Overlay;
use crate::rpc::RpcClient;

/// The most ops one [`Batch::apply`] call takes (they are sent one by one).
const MAX_BATCH: usize = 1000;

/// The agent's registry backend (`--registry-backend=registrar`).
///
/// - Reads come from a local cache fed by the registrar's `WatchEndpoints`
///   stream (before it is up, from `ListAllEndpoints`), and go on from the
///   last-known-good state while the registrar is unreachable.
/// - Writes are validated, applied to the local cache at once, then sent.
///   In optimistic mode ([`Ack::Optimistic`], the default) a write the
///   registrar cannot be reached for is kept (bounded by `max_pending`,
///   then [`waypost::Error::Overloaded`]) and re-sent when it is back; other errors
///   undo the local change and are returned. In durable mode
///   ([`Ack::Durable`]) a write returns once the backend committed it, and
///   any error (unreachable included) undoes it and is returned. A durable
///   write that met an unreachable registrar may still have been applied
///   (the answer was lost): the client then sends the key's earlier state
///   (its earlier value, or its removal when it held nothing) until the
///   registrar accepts it, so the registry ends as the caller was told.
/// - When the backend refuses a write the registrar had acknowledged, the
///   registrar undoes it and says so on the stream: this client reports it
///   ([`RegistrarClient::refusals`], the counter
///   `agent_registrar_write_refusals_total{kind}`, a log line naming the
///   key and the cause) and sends it again unless the write itself was at
///   fault.
/// - The stream reconnects with exponential backoff and jitter, resuming
///   with the registrar's epoch and version. A restarted registrar (new
///   epoch) sends a full snapshot, after which this client re-asserts every
///   endpoint it registered, so a registrar crash loses nothing the agent
///   still holds.
/// - With a [`crate::Fallback`] ([`ClientConfig::with_fallback`]), writes
///   and heartbeats go to the backend directly while no registrar has
///   answered for a while, and back through the registrar (re-asserted)
///   when one answers again.
///
/// ```no_run
/// # async fn demo() -> waypost::Result<()> {
/// use waypost::{Endpoint, Registry};
/// use waypost_registrar_client::{ClientConfig, RegistrarClient};
/// let cfg = ClientConfig::new("http://127.0.0.1:9443", "cluster-a", "node-1");
/// let reg = RegistrarClient::connect(cfg)?;
/// reg.register(Endpoint::new("api", "pod-1", "10.0.0.5", 8080).with_node("node-1")).await?;
/// let endpoints = reg.list("api").await?;
/// # Ok(()) }
/// ```
pub struct RegistrarClient {
    state: Arc<ClientState>,
    reconciler: tokio::task::JoinHandle<()>,
}

impl RegistrarClient {
    /// A client for the registrar in `cfg`. Connects lazily: this fails
    /// only for settings out of range, an address that is not a URL and
    /// TLS files that cannot be loaded; an unreachable registrar shows up
    /// as `Unavailable` errors and a cache that waits. Must be called
    /// inside a Tokio runtime.
    pub fn connect(cfg: ClientConfig) -> Result<Self> {
        let rpc = RpcClient::connect(cfg.clone())?;
        let connected = rpc.connected.subscribe();
        let stream_refusals = rpc.refusals.subscribe();
        let (cache, overlay) = Overlay::cache(
            rpc,
            CachedConfig::default()
                .with_write_wait(Duration::ZERO)
                .with_history(cfg.history)
                .with_reconnect(cfg.reconnect.0, cfg.reconnect.1)
                .with_metrics_prefix("agent_registrar"),
        )?;
        let state = Arc::new(ClientState {
            cache,
            overlay,
            writes: Writes::new(cfg.max_pending),
            keys: KeyLocks::default(),
            refusals: broadcast::channel(256).0,
            cfg,
        });
        let reconciler = tokio::spawn(reconcile_loop(
            Arc::downgrade(&state),
            connected,
            stream_refusals,
        ));
        Ok(Self { state, reconciler })
    }

    /// The local cache (age, readiness, the [`RpcClient`] under it).
    pub fn cache(&self) -> &CachedRegistry<RpcClient> {
        &self.state.cache
    }

    /// Writes waiting for the registrar to come back (or to accept them).
    pub fn pending_writes(&self) -> usize {
        self.state.writes.pending_len()
    }

    /// Endpoints this client registered and still holds.
    pub fn owned(&self) -> Vec<Endpoint> {
        self.state.writes.owned_endpoints()
    }

    /// The refusals of this client's writes, as they arrive.
    pub fn refusals(&self) -> broadcast::Receiver<Refusal> {
        self.state.refusals.subscribe()
    }

    /// Whether writes and heartbeats currently go to the fallback backend.
    pub fn is_falling_back(&self) -> bool {
        self.state.writes.falling_back()
    }

    /// Apply `op` locally, record it, send it; undo on an error returned.
    async fn write(&self, op: Op) -> Result<()> {
        let state = &self.state;
        let key = op.key();
        let _key = state.keys.lock(&key).await;
        let previous_local = state
            .cache
            .store()
            .snapshot()
            .and_then(|s| s.get(&key).cloned());
        let previous_owned = state.writes.own(&op);
        state.overlay.apply(std::slice::from_ref(&op));
        let queue = state.cfg.ack == Ack::Optimistic;
        match state.send(&op, queue).await {
            Ok(()) => Ok(()),
            Err(e) => {
                state.writes.restore(&key, previous_owned.clone());
                if e.kind() == ErrorKind::Unavailable {
                    state
                        .writes
                        .compensate(&key, previous_owned, previous_local.is_none(), &e);
                }
                let undo = match previous_local {
                    Some(ep) => Op::Register(ep),
                    None => Op::Deregister(key),
                };
                state.overlay.undo(&[undo]);
                Err(e)
            }
        }
    }
}

impl Drop for RegistrarClient {
    fn drop(&mut self) {
        self.reconciler.abort();
    }
}

impl fmt::Display for RegistrarClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.state.cache, f)
    }
}

impl fmt::Debug for RegistrarClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrarClient")
            .field("cache", &self.state.cache)
            .field("pending", &self.pending_writes())
            .field("falling_back", &self.is_falling_back())
            .finish()
    }
}

impl RegistrarClient {
    /// `endpoint`, in this agent's cluster when it names none.
    fn in_own_cluster(&self, mut endpoint: Endpoint) -> Endpoint {
        if endpoint.cluster.is_empty() {
            endpoint.cluster = self.state.cfg.cluster_name.clone();
        }
        endpoint
    }
}

#[async_trait]
impl Registry for RegistrarClient {
    /// An endpoint without a cluster belongs to this agent's
    /// (`ClientConfig::cluster_name`), as the registrar would write it.
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        let endpoint = self.in_own_cluster(endpoint);
        endpoint.validate()?;
        self.write(Op::Register(endpoint)).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.write(Op::Deregister(key.clone())).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.state.cache.list(service).await
    }
    async fn list_shared(&self, service: &str) -> Result<std::sync::Arc<[Endpoint]>> {
        self.state.cache.list_shared(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.state.cache.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_native_liveness(true)
            .with_max_batch(MAX_BATCH)
            .with_assigns_cluster(true)
    }
    async fn probe(&self) -> Result<()> {
        self.state.cache.get_ref().probe().await
    }
}

#[async_trait]
impl Batch for RegistrarClient {
    /// Not atomic: the ops are sent one by one, in order. The batch rule
    /// first ([`check_batch`]): more than `max_batch` (1,000) ops, or an
    /// invalid op, are refused naming `ops`, and nothing is sent.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, MAX_BATCH)?;
        for op in ops {
            let op = match op {
                Op::Register(e) => Op::Register(self.in_own_cluster(e)),
                deregister => deregister,
            };
            self.write(op).await?;
        }
        Ok(())
    }
}

impl Watch for RegistrarClient {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.state.cache.watch(from)
    }
}

#[async_trait]
impl Heartbeat for RegistrarClient {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        match (&self.state.cfg.fallback, self.state.writes.falling_back()) {
            (Some(f), true) => f.backend.heartbeat(node).await,
            _ => self.state.cache.get_ref().heartbeat(node).await,
        }
    }
}

/// RegistrarClient implements all four traits, with the registrar's
/// watch and liveness: [`waypost::stack::stack`] wraps it as its
/// capabilities call for.
impl waypost::stack::IntoStack for RegistrarClient {
    fn into_stack(
        self,
        cfg: &waypost::stack::StackConfig,
    ) -> waypost::Result<std::sync::Arc<dyn waypost::stack::Stack>> {
        waypost::stack::by_capabilities(self, cfg)
    }
}
