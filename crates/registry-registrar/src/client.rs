//! The agent side: a `Registry + Watch + Heartbeat` backed by a registrar.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use registry_api::{
    validate_ops, Batch, CachedConfig, CachedRegistry, Capabilities, Endpoint, EndpointKey, Error,
    Event, EventStream, Heartbeat, Op, Registry, Result, Snapshot, Version, Watch,
};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::convert::{
    endpoint_from_proto, endpoint_to_proto, error_from_status, key_from_parts, Token,
};
use crate::proto::registrar::v1::endpoint_event::EventType;
use crate::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use crate::proto::registrar::v1::{
    EndpointEvent, HeartbeatRequest, ListAllEndpointsRequest, RegisterEndpointRequest,
    UnregisterEndpointRequest, WatchEndpointsRequest,
};
use crate::tls::{self, TlsFiles};

/// Settings of [`RegistrarClient`].
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The registrar's address, e.g. `http://127.0.0.1:9443`.
    pub address: String,
    /// This agent's cluster, sent with every watch.
    pub cluster_name: String,
    /// This agent's node, sent with every watch.
    pub node_name: String,
    /// Timeout of one unary call. Default 10 s.
    pub request_timeout: Duration,
    /// Timeout of connecting. Default 5 s.
    pub connect_timeout: Duration,
    /// First and longest delay between stream reconnects (exponential with
    /// jitter). Default 200 ms and 30 s.
    pub reconnect: (Duration, Duration),
    /// Most writes kept for re-sending while the registrar is unreachable;
    /// one more answers [`Error::Overloaded`]. Default 10 000.
    pub max_pending: usize,
    /// How often queued writes are retried while the registrar is
    /// unreachable. Default 1 s.
    pub retry_interval: Duration,
    /// Changes the local cache keeps so local watchers can resume. Default
    /// 4096.
    pub history: usize,
    /// mTLS: the registrar's CA bundle and this agent's certificate and
    /// key, re-read when the files change. `None` (the default): plaintext.
    pub tls: Option<TlsFiles>,
}

impl ClientConfig {
    /// Settings for the registrar at `address`, as agent `node_name` of
    /// `cluster_name`.
    pub fn new(
        address: impl Into<String>,
        cluster_name: impl Into<String>,
        node_name: impl Into<String>,
    ) -> Self {
        Self {
            address: address.into(),
            cluster_name: cluster_name.into(),
            node_name: node_name.into(),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            reconnect: (Duration::from_millis(200), Duration::from_secs(30)),
            max_pending: 10_000,
            retry_interval: Duration::from_secs(1),
            history: 4096,
            tls: None,
        }
    }

    /// Use mTLS with these files (`http://` or `https://` addresses alike
    /// are then reached over TLS).
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Set the timeouts of connecting and of one unary call.
    pub fn with_timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Set the reconnect delays.
    pub fn with_reconnect(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect = (min, max.max(min));
        self
    }

    /// Set `max_pending`.
    pub fn with_max_pending(mut self, n: usize) -> Self {
        self.max_pending = n;
        self
    }

    /// Set `history`.
    pub fn with_history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// Set `retry_interval`.
    pub fn with_retry_interval(mut self, d: Duration) -> Self {
        self.retry_interval = d;
        self
    }
}

/// The plain RPC client: every call goes to the registrar.
pub struct Raw {
    grpc: Grpc<Channel>,
    cfg: ClientConfig,
    /// The epoch of the last snapshot received.
    epoch: Arc<watch::Sender<Option<u64>>>,
    /// Counts streams that delivered their first event.
    connected: Arc<watch::Sender<u64>>,
}

impl Raw {
    /// A plain client for the registrar in `cfg` (no cache): every call is
    /// an RPC. Connects lazily; fails only for an address that is not a URL
    /// and for TLS files that cannot be loaded.
    pub fn connect(cfg: ClientConfig) -> Result<Self> {
        let channel = match &cfg.tls {
            None => {
                if cfg.address.starts_with("https://") {
                    return Err(Error::invalid(
                        "address",
                        format!("{}: https needs TLS files (a CA bundle)", cfg.address),
                    ));
                }
                TonicEndpoint::from_shared(cfg.address.clone())
                    .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?
                    .connect_timeout(cfg.connect_timeout)
                    .tcp_nodelay(true)
                    .connect_lazy()
            }
            Some(files) => tls_channel(&cfg, files)?,
        };
        let grpc = Grpc::new(channel)
            .max_decoding_message_size(256 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        Ok(Raw {
            grpc,
            cfg,
            epoch: Arc::new(watch::channel(None).0),
            connected: Arc::new(watch::channel(0).0),
        })
    }

    /// The registrar's address.
    pub fn address(&self) -> &str {
        &self.cfg.address
    }

    /// The generated gRPC client on this client's channel (exact status
    /// codes, the operator CLI).
    pub fn grpc(&self) -> Grpc<Channel> {
        self.grpc.clone()
    }

    fn err(&self, s: &tonic::Status) -> Error {
        error_from_status(s, &self.cfg.address)
    }

    async fn call<T, F>(&self, what: &str, fut: F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.cfg.request_timeout, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(self.err(&status)),
            Err(_) => Err(Error::unavailable(format!(
                "registrar {}: {what} timed out after {:?}",
                self.cfg.address, self.cfg.request_timeout
            ))),
        }
    }

    async fn list_all(&self) -> Result<Snapshot> {
        let mut grpc = self.grpc.clone();
        let resp = self
            .call(
                "ListAllEndpoints",
                grpc.list_all_endpoints(ListAllEndpointsRequest {}),
            )
            .await?;
        let token: Token = resp.version.parse()?;
        let eps = resp
            .endpoints
            .into_iter()
            .enumerate()
            .map(|(i, p)| endpoint_from_proto(p, &format!("endpoints[{i}].")))
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot::from_endpoints(token.version, eps))
    }
}

/// A channel whose connections are TLS with `files` (rustls, certificates
/// re-read on change). tonic is given the address as `http://` and the TLS
/// is done by this connector, so that a rotated certificate is used by the
/// next connection without rebuilding the channel.
fn tls_channel(cfg: &ClientConfig, files: &TlsFiles) -> Result<Channel> {
    let uri: tonic::codegen::http::Uri = cfg
        .address
        .parse()
        .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?;
    let host = uri
        .host()
        .ok_or_else(|| Error::invalid("address", format!("{:?}: no host", cfg.address)))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    let server_name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls::client_config(files)?));
    let plain = format!("http://{}:{port}", uri.host().unwrap_or(host.as_str()));
    let endpoint = TonicEndpoint::from_shared(plain)
        .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?
        .connect_timeout(cfg.connect_timeout);
    let target = (host, port);
    let svc = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        let (host, port) = target.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(svc))
}

impl fmt::Display for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registrar({})", self.cfg.address)
    }
}

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Raw").field("config", &self.cfg).finish()
    }
}

#[async_trait]
impl Registry for Raw {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        let mut grpc = self.grpc.clone();
        let req = RegisterEndpointRequest {
            endpoint: Some(endpoint_to_proto(&endpoint)),
        };
        self.call("RegisterEndpoint", grpc.register_endpoint(req))
            .await?;
        Ok(())
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        let mut grpc = self.grpc.clone();
        let req = UnregisterEndpointRequest {
            service_name: key.service.clone(),
            id: key.id.clone(),
        };
        self.call("UnregisterEndpoint", grpc.unregister_endpoint(req))
            .await?;
        Ok(())
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        Ok(self.list_all().await?.list(service))
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.list_all().await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_native_liveness(true)
    }
}

#[async_trait]
impl Heartbeat for Raw {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        registry_api::check_name("node", node, true)?;
        let mut grpc = self.grpc.clone();
        let req = HeartbeatRequest {
            node_name: node.to_string(),
        };
        self.call("Heartbeat", grpc.heartbeat(req)).await?;
        Ok(())
    }
}

/// Turns the registrar's events into ours, assembling chunked snapshots.
struct Decoder {
    buffered: Vec<Endpoint>,
    epoch: Arc<watch::Sender<Option<u64>>>,
    connected: Arc<watch::Sender<u64>>,
    announced: bool,
}

impl Decoder {
    fn decode(&mut self, ev: EndpointEvent) -> Result<Option<Event>> {
        let token: Token = ev.version.parse()?;
        let out = match EventType::try_from(ev.r#type) {
            Ok(EventType::FullSnapshot) => {
                for (i, p) in ev.snapshot_endpoints.into_iter().enumerate() {
                    self.buffered.push(endpoint_from_proto(
                        p,
                        &format!("snapshot_endpoints[{i}]."),
                    )?);
                }
                if !ev.snapshot_last {
                    return Ok(None);
                }
                self.epoch.send_replace(Some(token.epoch));
                let eps = std::mem::take(&mut self.buffered);
                Event::Snapshot(Snapshot::from_endpoints(token.version, eps))
            }
            Ok(kind) => {
                if *self.epoch.borrow() != Some(token.epoch) {
                    return Err(Error::internal(format!(
                        "registrar sent version {token} of another epoch without a snapshot"
                    )));
                }
                let p = ev.endpoint.ok_or_else(|| {
                    Error::internal("registrar sent an event without an endpoint")
                })?;
                match kind {
                    EventType::EndpointRemoved => Event::Removed {
                        version: token.version,
                        key: key_from_parts(p.service_name, p.id)?,
                    },
                    EventType::EndpointAdded => Event::Added {
                        version: token.version,
                        endpoint: endpoint_from_proto(p, "endpoint.")?,
                    },
                    _ => Event::Updated {
                        version: token.version,
                        endpoint: endpoint_from_proto(p, "endpoint.")?,
                    },
                }
            }
            Err(_) => {
                return Err(Error::internal(format!(
                    "registrar sent unknown event type {}",
                    ev.r#type
                )))
            }
        };
        if !self.announced {
            self.announced = true;
            self.connected.send_modify(|n| *n += 1);
        }
        Ok(Some(out))
    }
}

impl Watch for Raw {
    fn watch(&self, from: Option<Version>) -> EventStream {
        let last_version = match (from, *self.epoch.borrow()) {
            (Some(version), Some(epoch)) => Token { epoch, version }.to_string(),
            _ => String::new(),
        };
        let req = WatchEndpointsRequest {
            cluster_name: self.cfg.cluster_name.clone(),
            node_name: self.cfg.node_name.clone(),
            last_version,
        };
        let mut grpc = self.grpc.clone();
        let addr = self.cfg.address.clone();
        let mut decoder = Decoder {
            buffered: Vec::new(),
            epoch: Arc::clone(&self.epoch),
            connected: Arc::clone(&self.connected),
            announced: false,
        };
        stream::once(async move { grpc.watch_endpoints(req).await })
            .flat_map(move |res| match res {
                Ok(resp) => resp.into_inner().boxed(),
                Err(status) => stream::once(async move { Err(status) }).boxed(),
            })
            .filter_map(move |item| {
                let out = match item {
                    Ok(ev) => decoder.decode(ev).transpose(),
                    Err(status) => Some(Err(error_from_status(&status, &addr))),
                };
                futures::future::ready(out)
            })
            .boxed()
    }
}

/// The agent's registry backend (`--registry-backend=registrar`).
///
/// - Reads come from a local cache fed by the registrar's `WatchEndpoints`
///   stream (before it is up, from `ListAllEndpoints`), and go on from the
///   last-known-good state while the registrar is unreachable.
/// - Writes are validated, applied to the local cache at once, then sent.
///   If the registrar is unreachable the write is kept (bounded by
///   `max_pending`, then [`Error::Overloaded`]) and re-sent when it is back;
///   other errors undo the local change and are returned.
/// - The stream reconnects with exponential backoff and jitter, resuming
///   with the registrar's epoch and version. A restarted registrar (new
///   epoch) sends a full snapshot, after which this client re-asserts every
///   endpoint it registered, so a registrar crash loses nothing the agent
///   still holds.
///
/// ```no_run
/// # async fn demo() -> registry_api::Result<()> {
/// use registry_api::{Endpoint, Registry};
/// use registry_registrar::{ClientConfig, RegistrarClient};
/// let cfg = ClientConfig::new("http://127.0.0.1:9443", "cluster-a", "node-1");
/// let reg = RegistrarClient::connect(cfg)?;
/// reg.register(Endpoint::new("api", "pod-1", "10.0.0.5", 8080).with_node("node-1")).await?;
/// let endpoints = reg.list("api").await?;
/// # Ok(()) }
/// ```
pub struct RegistrarClient {
    cache: Arc<CachedRegistry<Raw>>,
    writes: Arc<Writes>,
    reconciler: tokio::task::JoinHandle<()>,
}

/// What this client wrote: the desired value of each key (None: removed)
/// and the keys not yet accepted by the registrar.
struct Writes {
    owned: Mutex<BTreeMap<EndpointKey, Option<Endpoint>>>,
    pending: Mutex<BTreeSet<EndpointKey>>,
    max_pending: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RegistrarClient {
    /// A client for the registrar in `cfg`. Connects lazily: this fails
    /// only for an address that is not a URL; an unreachable registrar
    /// shows up as `Unavailable` errors and a cache that waits.
    /// Must be called inside a Tokio runtime.
    pub fn connect(cfg: ClientConfig) -> Result<Self> {
        let raw = Raw::connect(cfg.clone())?;
        let connected = raw.connected.subscribe();
        let cache = Arc::new(CachedRegistry::with_config(
            raw,
            CachedConfig::default()
                .with_local_versions(true)
                .with_write_wait(Duration::ZERO)
                .with_history(cfg.history)
                .with_reconnect(cfg.reconnect.0, cfg.reconnect.1),
        )?);
        let writes = Arc::new(Writes {
            owned: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(BTreeSet::new()),
            max_pending: cfg.max_pending,
        });
        let reconciler = tokio::spawn(reconcile_loop(
            Arc::downgrade(&cache),
            Arc::downgrade(&writes),
            connected,
            cfg.retry_interval,
        ));
        Ok(Self {
            cache,
            writes,
            reconciler,
        })
    }

    /// The local cache (age, readiness, the raw client).
    pub fn cache(&self) -> &CachedRegistry<Raw> {
        &self.cache
    }

    /// Writes waiting for the registrar to come back.
    pub fn pending_writes(&self) -> usize {
        lock(&self.writes.pending).len()
    }

    /// Endpoints this client registered and still holds.
    pub fn owned(&self) -> Vec<Endpoint> {
        lock(&self.writes.owned)
            .values()
            .flatten()
            .cloned()
            .collect()
    }

    /// Apply `op` locally, record it, send it; undo on a definite error.
    async fn write(&self, op: Op) -> Result<()> {
        let key = op.key();
        let previous_local = self.cache.cached().and_then(|s| s.get(&key).cloned());
        let previous_owned = lock(&self.writes.owned).insert(
            key.clone(),
            match &op {
                Op::Register(e) => Some(e.clone()),
                Op::Deregister(_) => None,
            },
        );
        self.cache.apply_local(std::slice::from_ref(&op));
        match send(self.cache.get_ref(), &self.writes, &op).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // Undo: the registrar refused it for good, or the queue is full.
                let mut owned = lock(&self.writes.owned);
                match previous_owned {
                    Some(v) => owned.insert(key.clone(), v),
                    None => owned.remove(&key),
                };
                drop(owned);
                let undo = match previous_local {
                    Some(ep) => Op::Register(ep),
                    None => Op::Deregister(key),
                };
                self.cache.apply_local(&[undo]);
                Err(e)
            }
        }
    }
}

/// Send one write. `Unavailable` keeps it queued (Ok) while there is room.
async fn send(raw: &Raw, writes: &Writes, op: &Op) -> Result<()> {
    let key = op.key();
    let res = match op {
        Op::Register(e) => raw.register(e.clone()).await,
        Op::Deregister(k) => raw.deregister(k).await,
    };
    match res {
        Ok(()) => {
            lock(&writes.pending).remove(&key);
            if let Op::Deregister(_) = op {
                let mut owned = lock(&writes.owned);
                if owned.get(&key).is_some_and(Option::is_none) {
                    owned.remove(&key);
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == registry_api::ErrorKind::Unavailable => {
            let mut pending = lock(&writes.pending);
            if pending.len() >= writes.max_pending && !pending.contains(&key) {
                return Err(Error::overloaded(format!(
                    "registrar unreachable and {} writes already queued: {e}",
                    pending.len()
                )));
            }
            tracing::debug!(%key, error = %e, "registrar unreachable; write queued");
            pending.insert(key);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Re-send queued writes when the registrar is reachable again, and every
/// owned write when it restarted (a new epoch).
async fn reconcile_loop(
    cache: Weak<CachedRegistry<Raw>>,
    writes: Weak<Writes>,
    mut connected: watch::Receiver<u64>,
    retry: Duration,
) {
    let mut last_epoch: Option<u64> = None;
    loop {
        let has_pending = writes
            .upgrade()
            .is_some_and(|w| !lock(&w.pending).is_empty());
        tokio::select! {
            changed = connected.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(retry), if has_pending => {}
        }
        let (Some(cache), Some(writes)) = (cache.upgrade(), writes.upgrade()) else {
            return;
        };
        let raw = cache.get_ref();
        let epoch = *raw.epoch.borrow();
        let restarted = last_epoch.is_some() && epoch.is_some() && epoch != last_epoch;
        if epoch.is_some() {
            last_epoch = epoch;
        }
        let ops: Vec<Op> = {
            let owned = lock(&writes.owned);
            let pending = lock(&writes.pending);
            owned
                .iter()
                .filter(|(k, _)| restarted || pending.contains(*k))
                .map(|(k, v)| match v {
                    Some(e) => Op::Register(e.clone()),
                    None => Op::Deregister(k.clone()),
                })
                .collect()
        };
        if ops.is_empty() {
            continue;
        }
        if restarted {
            tracing::info!(
                count = ops.len(),
                "registrar restarted; re-asserting this agent's endpoints"
            );
        }
        for op in ops {
            if let Err(e) = send(raw, &writes, &op).await {
                tracing::warn!(key = %op.key(), error = %e, "re-sending a write failed");
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
        fmt::Display::fmt(&*self.cache, f)
    }
}

impl fmt::Debug for RegistrarClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrarClient")
            .field("cache", &self.cache)
            .field("pending", &self.pending_writes())
            .finish()
    }
}

#[async_trait]
impl Registry for RegistrarClient {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        self.write(Op::Register(endpoint)).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.write(Op::Deregister(key.clone())).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.cache.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.cache.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_native_liveness(true)
            .with_max_batch(1000)
    }
}

#[async_trait]
impl Batch for RegistrarClient {
    /// Not atomic: the ops are sent one by one, in order.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        for op in ops {
            self.write(op).await?;
        }
        Ok(())
    }
}

impl Watch for RegistrarClient {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.cache.watch(from)
    }
}

#[async_trait]
impl Heartbeat for RegistrarClient {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.cache.get_ref().heartbeat(node).await
    }
}
