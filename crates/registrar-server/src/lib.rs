#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod auth;
mod http;
mod metered;
mod service;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use registry_api::{
    Batch, CachedConfig, CachedRegistry, Coalescing, CoalescingConfig, EndpointKey, Error,
    Heartbeat, Op, Registry, Result, Version, Watch,
};
use registry_registrar::Token;
use tokio::net::TcpListener;

pub use auth::{AuthzConfig, DEFAULT_ID_PATTERN};
pub use http::health_router;
pub use metered::{describe_metrics, SyncMetered};
pub use registry_registrar::TlsFiles;
pub use service::RegistrarService;

/// What the registrar needs of a backend: batches, a watch and heartbeats.
/// Wrap backends without a native watch in [`registry_api::Polling`] and
/// those without native liveness in [`registry_api::Liveness`].
pub trait Backend: Batch + Watch + Heartbeat {}
impl<T: Batch + Watch + Heartbeat> Backend for T {}

/// Settings of the registrar (defaults from the Aether registrar document).
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct RegistrarConfig {
    /// This registrar's cluster (logged, and the default of the agents'
    /// `--cluster-name`; endpoints carry their own `cluster`).
    pub cluster_name: String,
    /// Flush the write queue at least this often. Default 100 ms.
    pub write_batch_interval: Duration,
    /// Flush as soon as this many writes are queued. Default 50.
    pub write_batch_ops: usize,
    /// Most writes queued; one more gets `RESOURCE_EXHAUSTED`. Default 10 000.
    pub write_queue_capacity: usize,
    /// Events buffered per agent stream before it is cut off. Default 1024.
    pub agent_buffer: usize,
    /// Versions kept so a reconnecting agent gets only what it missed.
    /// Default 8192.
    pub history: usize,
    /// Endpoints per `FULL_SNAPSHOT` message. Default 1000.
    pub snapshot_chunk: usize,
}

impl RegistrarConfig {
    /// Defaults for cluster `cluster_name`.
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            write_batch_interval: Duration::from_millis(100),
            write_batch_ops: 50,
            write_queue_capacity: 10_000,
            agent_buffer: 1024,
            history: 8192,
            snapshot_chunk: 1000,
        }
    }

    /// Set `write_batch_interval`.
    pub fn with_write_batch_interval(mut self, d: Duration) -> Self {
        self.write_batch_interval = d;
        self
    }

    /// Set `write_queue_capacity`.
    pub fn with_write_queue_capacity(mut self, n: usize) -> Self {
        self.write_queue_capacity = n;
        self
    }

    /// Set `history`.
    pub fn with_history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// Set `agent_buffer`.
    pub fn with_agent_buffer(mut self, n: usize) -> Self {
        self.agent_buffer = n;
        self
    }
}

/// The registrar's state: one backend connection for the whole cluster.
///
/// - Writes are validated, broadcast to agents at once (optimistic), and
///   queued in [`Coalescing`] (100 ms / 50 ops) for the backend. A write
///   the backend refuses for good is undone in the broadcast state.
/// - The state is a [`CachedRegistry`] over the backend's watch (native or
///   polling), numbered with this registrar's own versions; together with
///   the epoch (the start time in microseconds) they form the tokens agents
///   resume from.
/// - Replicas are independent: each keeps its own state from the shared
///   backend, which is also how endpoints of other clusters arrive.
pub struct Registrar {
    cfg: RegistrarConfig,
    epoch: u64,
    backend: Arc<dyn Backend>,
    state: CachedRegistry<Arc<dyn Backend>>,
    writer: Coalescing<Arc<dyn Backend>>,
    closing: tokio::sync::watch::Sender<bool>,
    /// Clusters seen by `registrar_endpoint_count` (published as 0 when gone).
    counted: std::sync::Mutex<BTreeMap<String, usize>>,
}

impl Registrar {
    /// A registrar over `backend`. Must be called inside a Tokio runtime.
    ///
    /// A backend with a native watch is wrapped in [`SyncMetered`] so that
    /// `registrar_sync_duration_seconds` and `registrar_sync_errors_total`
    /// are recorded for it too ([`registry_api::Polling`] records them for
    /// the others).
    pub fn new(backend: Arc<dyn Backend>, cfg: RegistrarConfig) -> Result<Arc<Self>> {
        let backend: Arc<dyn Backend> = if backend.capabilities().native_watch {
            Arc::new(SyncMetered::new(backend))
        } else {
            backend
        };
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let state = CachedRegistry::with_config(
            Arc::clone(&backend),
            CachedConfig::default()
                .with_local_versions(true)
                .with_write_wait(Duration::ZERO)
                .with_history(cfg.history)
                .with_buffer(cfg.agent_buffer),
        )?;
        let writer = Coalescing::with_config(
            Arc::clone(&backend),
            CoalescingConfig::default()
                .with_flush_interval(cfg.write_batch_interval)
                .with_flush_ops(cfg.write_batch_ops)
                .with_capacity(cfg.write_queue_capacity),
        )?;
        let this = Arc::new(Self {
            cfg,
            epoch,
            backend,
            state,
            writer,
            closing: tokio::sync::watch::channel(false).0,
            counted: std::sync::Mutex::new(BTreeMap::new()),
        });
        tokio::spawn(count_endpoints(Arc::downgrade(&this)));
        Ok(this)
    }

    /// The settings.
    pub fn config(&self) -> &RegistrarConfig {
        &self.cfg
    }

    /// This run's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The token of the current state.
    pub fn token(&self) -> Token {
        Token {
            epoch: self.epoch,
            version: self.state.hub().current().version(),
        }
    }

    /// The state agents are served from.
    pub fn state(&self) -> &CachedRegistry<Arc<dyn Backend>> {
        &self.state
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Whether the first snapshot of the backend has arrived.
    pub fn is_ready(&self) -> bool {
        self.state.is_ready()
    }

    /// Writes queued for the backend.
    pub fn queue_depth(&self) -> usize {
        self.writer.queue_depth()
    }

    /// The version to resume from for an agent's `last_version`: `None`
    /// (a full snapshot) when it is empty, unparsable or of another epoch.
    pub fn resume_from(&self, last_version: &str) -> Option<Version> {
        match last_version.parse::<Token>() {
            Ok(t) if t.epoch == self.epoch => Some(t.version),
            _ => None,
        }
    }

    /// Accept one write: broadcast it at once, queue it for the backend.
    pub fn write(self: &Arc<Self>, op: Op) -> Result<Token> {
        op.validate()?;
        let key = op.key();
        let before = self.state.cached().and_then(|s| s.get(&key).cloned());
        self.state.apply_local(std::slice::from_ref(&op));
        match self.writer.submit(vec![op]) {
            Ok(ticket) => {
                let this = Arc::clone(self);
                tokio::spawn(async move {
                    if let Err(e) = ticket.durable().await {
                        tracing::error!(%key, error = %e, "the backend refused a write; undoing its broadcast");
                        this.resync_key(&key).await;
                    }
                });
                Ok(self.token())
            }
            Err(e) => {
                let undo = match before {
                    Some(ep) => Op::Register(ep),
                    None => Op::Deregister(key),
                };
                self.state.apply_local(&[undo]);
                Err(e)
            }
        }
    }

    /// Put the backend's value of `key` back into the broadcast state.
    async fn resync_key(&self, key: &EndpointKey) {
        match self.backend.list(&key.service).await {
            Ok(eps) => {
                let op = match eps.into_iter().find(|e| e.has_key(key)) {
                    Some(e) => Op::Register(e),
                    None => Op::Deregister(key.clone()),
                };
                self.state.apply_local(&[op]);
            }
            Err(e) => tracing::warn!(%key, error = %e, "could not re-read a refused write"),
        }
    }

    /// Resolves once the registrar is shutting down (agent streams end then).
    pub fn closing(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// The node owning `key` now (from the state once it is ready, before
    /// that from the backend); `None` when the endpoint does not exist.
    pub async fn current_node(&self, key: &EndpointKey) -> Result<Option<String>> {
        if let Some(snap) = self.state.cached() {
            return Ok(snap.get(key).map(|e| e.node.clone()));
        }
        let eps = self.backend.list(&key.service).await?;
        Ok(eps.into_iter().find(|e| e.has_key(key)).map(|e| e.node))
    }

    /// Publish the gauges computed from the state:
    /// `registrar_endpoint_count{cluster}` (0 for clusters gone since) and
    /// `registrar_write_queue_depth`. Called every 5 s and on each scrape.
    pub fn publish_gauges(&self) {
        metrics::gauge!("registrar_write_queue_depth").set(self.queue_depth() as f64);
        let Some(snap) = self.state.cached() else {
            return;
        };
        let mut seen = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        let mut counts: BTreeMap<String, usize> = seen.keys().map(|k| (k.clone(), 0)).collect();
        counts.entry(self.cfg.cluster_name.clone()).or_default();
        for e in snap.iter() {
            *counts.entry(e.cluster.clone()).or_default() += 1;
        }
        for (cluster, n) in &counts {
            metrics::gauge!("registrar_endpoint_count", "cluster" => cluster.clone())
                .set(*n as f64);
        }
        *seen = counts;
    }

    /// Record a node's heartbeat with the backend.
    pub async fn heartbeat(&self, node: &str) -> Result<()> {
        registry_api::check_name("node_name", node, true)?;
        self.backend.heartbeat(node).await
    }

    /// Refuse new writes and drain the queue to the backend.
    pub async fn drain(&self) {
        self.writer.shutdown().await;
    }
}

/// Publish the state's gauges every few seconds.
async fn count_endpoints(this: std::sync::Weak<Registrar>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let Some(this) = this.upgrade() else { return };
        this.publish_gauges();
    }
}

/// Where a running registrar listens.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The health and metrics address.
    pub health: SocketAddr,
}

/// How [`serve_with`] secures the gRPC port.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// mTLS: the server's certificate and key, and the CA bundle agents'
    /// certificates must chain to; all re-read when the files change.
    /// `None`: plaintext (logged as a warning).
    pub tls: Option<TlsFiles>,
    /// Authorization by SPIFFE ID (needs `tls`). `None` with `tls`: any
    /// certificate of the CA may write any endpoint (logged as a warning).
    pub authz: Option<AuthzConfig>,
    /// Longest TLS handshake. Default 10 s.
    pub handshake_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            authz: None,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl ServeOptions {
    /// Plaintext, no authorization.
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// mTLS with `files`.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Authorize by SPIFFE ID.
    pub fn with_authz(mut self, authz: AuthzConfig) -> Self {
        self.authz = Some(authz);
        self
    }

    /// Check the options as [`serve_with`] will: the certificate files
    /// load, the authorization settings are valid and have TLS.
    pub fn check(&self) -> Result<()> {
        if let Some(a) = &self.authz {
            auth::Authz::new(a)?;
            if self.tls.is_none() {
                return Err(Error::invalid(
                    "authz",
                    "authorization by SPIFFE ID needs TLS certificates",
                ));
            }
        }
        if let Some(files) = &self.tls {
            registry_registrar::tls::server_config(files)?;
        }
        Ok(())
    }
}

/// Serve `registrar` on the two listeners until `shutdown` resolves, then
/// drain the write queue. `metrics` renders `/metrics` when given.
/// Plaintext; see [`serve_with`] for mTLS.
pub async fn serve(
    registrar: Arc<Registrar>,
    grpc: TcpListener,
    health: TcpListener,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_with(
        registrar,
        grpc,
        health,
        metrics,
        ServeOptions::default(),
        shutdown,
    )
    .await
}

/// [`serve`] with options: mTLS and authorization. Fails at once when the
/// certificate files cannot be loaded or the authorization settings are
/// wrong.
pub async fn serve_with(
    registrar: Arc<Registrar>,
    grpc: TcpListener,
    health: TcpListener,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let authz = options.authz.as_ref().map(auth::Authz::new).transpose()?;
    let acceptor = match &options.tls {
        Some(files) => {
            let cfg = registry_registrar::tls::server_config(files)?;
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
        }
        None => None,
    };
    match (&options.tls, &options.authz) {
        (None, None) => tracing::warn!(
            "no certificates configured: serving plaintext gRPC without authentication"
        ),
        (None, Some(_)) => {
            return Err(Error::invalid(
                "authz",
                "authorization by SPIFFE ID needs TLS certificates",
            ))
        }
        (Some(files), None) => tracing::warn!(
            ca = %files.ca.display(),
            "mTLS without a trust domain: any certificate of the CA may write any endpoint"
        ),
        (Some(files), Some(a)) => tracing::info!(
            ca = %files.ca.display(),
            trust_domain = %a.trust_domain,
            id_pattern = %a.id_pattern,
            admins = a.admin_ids.len(),
            "mTLS with authorization by SPIFFE ID"
        ),
    }
    let security = auth::Security {
        tls: acceptor.is_some(),
        authz,
    };

    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<registry_registrar::proto::registrar::v1::registrar_server::RegistrarServer<
            RegistrarService,
        >>()
        .await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let closing = registrar.closing.clone();
    tokio::spawn(async move {
        shutdown.await;
        // End the agents' streams first: they would hold the server open.
        closing.send_replace(true);
        let _ = stop_tx.send(true);
    });
    let mut stop_http = stop_rx.clone();
    let router = health_router(Arc::clone(&registrar), metrics);
    let http = tokio::spawn(async move {
        axum::serve(health, router)
            .with_graceful_shutdown(async move {
                let _ = stop_http.wait_for(|s| *s).await;
            })
            .await
    });
    let mut stop_grpc = stop_rx;
    let stopped = async move {
        let _ = stop_grpc.wait_for(|s| *s).await;
    };
    let grpc_router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(
            RegistrarService::new(Arc::clone(&registrar))
                .with_security(security)
                .into_server(),
        );
    let result = match acceptor {
        None => {
            // Without TCP_NODELAY on accepted sockets, small responses wait
            // for delayed ACKs (tens of milliseconds per call).
            let incoming =
                tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
            grpc_router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
        }
        Some(acceptor) => {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            tokio::spawn(accept_tls(grpc, acceptor, tx, options.handshake_timeout));
            let incoming =
                tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
            grpc_router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
        }
    };
    tracing::info!(
        queued = registrar.queue_depth(),
        "shutting down: draining the write queue"
    );
    registrar.drain().await;
    if let Ok(Err(e)) = http.await {
        tracing::warn!(error = %e, "health server failed");
    }
    result.map_err(|e| Error::unavailable(format!("gRPC server failed: {e}")).with_source(e))
}

type TlsConn = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Accept TCP connections and hand those that complete the TLS handshake
/// to the gRPC server; handshakes run concurrently, each bounded by
/// `timeout`. Ends when the server stops taking connections.
async fn accept_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: tokio::sync::mpsc::Sender<TlsConn>,
    timeout: Duration,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = tx.closed() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: do not spin.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send(tls).await;
                }
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    tracing::warn!(%peer, ?timeout, "TLS handshake timed out");
                }
            }
        });
    }
}
