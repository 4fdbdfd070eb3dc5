//! Serving a [`Registrar`]: the gRPC port (plaintext or mTLS) and the
//! health port, graceful shutdown with a bounded drain, and exit on a dead
//! background task.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::OnceLock;

use backon::BackoffBuilder;
use futures::StreamExt;
use registry_api::{backend::check_duration, Error, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth;
use crate::http::Slot;
use crate::service::RegistrarService;
use crate::status::Status;
use crate::{AuthzConfig, Backend, Registrar, RegistrarConfig, TlsFiles};

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
    /// How often an HTTP/2 PING is sent on each connection, idle or not.
    /// `None`: never. Default 30 s.
    pub http2_keepalive_interval: Option<Duration>,
    /// A connection whose peer has not answered a PING within this long is
    /// closed, with its streams. Default 10 s. So a client that vanished
    /// (powered off, partitioned, stopped) is dropped within interval +
    /// timeout, instead of whenever TCP gives up (many minutes).
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive on accepted connections: idle time before the first
    /// probe (the kernel's interval and count follow). `None`: off.
    /// Default 60 s.
    pub tcp_keepalive: Option<Duration>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            authz: None,
            handshake_timeout: Duration::from_secs(10),
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(10),
            tcp_keepalive: Some(Duration::from_secs(60)),
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

    /// Set the HTTP/2 keepalive: a PING every `interval` (`None`: never),
    /// the connection closed when one is not answered within `timeout`.
    pub fn with_http2_keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.http2_keepalive_interval = interval;
        self.http2_keepalive_timeout = timeout;
        self
    }

    /// Set the TCP keepalive idle time (`None`: off).
    pub fn with_tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.tcp_keepalive = idle;
        self
    }

    /// Check the options as [`serve_with`] will: the certificate files
    /// load, the authorization settings are valid and have TLS, the
    /// keepalive durations are in range (HTTP/2 interval and timeout 10 ms
    /// to 1 h, TCP keepalive 1 s to 1 h).
    pub fn check(&self) -> Result<()> {
        self.check_keepalive()?;
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
///
/// Stops when `shutdown` resolves or a background task of the registrar
/// died ([`Status::fail`]); then agents' streams end, the gRPC server
/// stops, and the write queue drains for at most
/// [`RegistrarConfig::drain_timeout`](crate::RegistrarConfig). Returns an
/// error when a task died, so a binary exits non-zero.
pub async fn serve_with(
    registrar: Arc<Registrar>,
    grpc: TcpListener,
    health: TcpListener,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (security, acceptor) = security(&options)?;
    let stop = stop_signal(shutdown);
    let status = Arc::clone(registrar.status());
    let slot: Slot = Arc::new(OnceLock::from(Arc::clone(&registrar)));
    let health = HealthServer::start(health, status, slot, metrics);
    run_grpc(
        registrar,
        grpc,
        (security, acceptor),
        &options,
        stop,
        health,
    )
    .await
}

/// How [`Opening`] treats a backend it cannot open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenPolicy {
    /// Keep running, not ready, and retry transient failures with backoff
    /// (1 s to 30 s); a permanent failure (a read-only or corrupt file, a
    /// foreign database, bad credentials) ends [`Opening::serve`] with it.
    #[default]
    Retry,
    /// Any failure ends [`Opening::serve`] at once.
    FailFast,
}

/// A registrar server whose backend may not be reachable yet (the
/// binary's `serve`): the health port answers from the start (`/readyz`
/// 503 naming the last error while the backend cannot be opened), the
/// backend is opened as [`OpenPolicy`] says, then the registrar serves as
/// with [`serve_with`]. The gRPC listener is bound from the start and
/// accepts calls once the backend is open.
pub struct Opening {
    /// The registrar's settings.
    pub cfg: RegistrarConfig,
    /// What to do when the backend cannot be opened.
    pub policy: OpenPolicy,
    /// mTLS and authorization.
    pub options: ServeOptions,
    /// Renders `/metrics` when given.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    status: Arc<Status>,
}

impl Opening {
    /// A server for `cfg`, retrying the backend, plaintext, no metrics.
    pub fn new(cfg: RegistrarConfig) -> Self {
        Self {
            cfg,
            policy: OpenPolicy::Retry,
            options: ServeOptions::default(),
            metrics: None,
            status: Arc::new(Status::default()),
        }
    }

    /// The status the registrar will report to (hand it to a panic hook
    /// with [`Status::fail`]).
    pub fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// Open the backend with `open` and serve until `shutdown` (or a dead
    /// background task: then an error is returned).
    pub async fn serve<F, Fut>(
        self,
        mut open: F,
        grpc: TcpListener,
        health: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Arc<dyn Backend>>>,
    {
        let Self {
            cfg,
            policy,
            options,
            metrics,
            status,
        } = self;
        cfg.validate()?;
        let (security, acceptor) = security(&options)?;
        let stop = stop_signal(shutdown);
        status.opening_failed(&Error::unavailable("opening"));
        let slot: Slot = Arc::new(OnceLock::new());
        let health = HealthServer::start(health, Arc::clone(&status), Arc::clone(&slot), metrics);
        let mut delays = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(30))
            .with_jitter()
            .without_max_times()
            .build();
        let mut stopped = stop.clone();
        let backend = loop {
            let attempt = tokio::select! {
                r = open() => r,
                _ = stopped.wait_for(|s| *s) => {
                    health.stop().await;
                    return Ok(());
                }
            };
            match attempt {
                Ok(b) => break b,
                Err(e) if policy == OpenPolicy::FailFast || !e.is_retryable() => {
                    health.stop().await;
                    return Err(e);
                }
                Err(e) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(30));
                    tracing::warn!(error = %e, ?delay, "cannot open the backend yet; not ready, retrying");
                    status.opening_failed(&e);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stopped.wait_for(|s| *s) => {
                            health.stop().await;
                            return Ok(());
                        }
                    }
                }
            }
        };
        status.opened();
        let registrar = Registrar::with_status(backend, cfg, status)?;
        let _ = slot.set(Arc::clone(&registrar));
        tracing::info!(backend = %registrar.backend(), epoch = registrar.epoch(), "backend open");
        run_grpc(
            registrar,
            grpc,
            (security, acceptor),
            &options,
            stop,
            health,
        )
        .await
    }
}

impl ServeOptions {
    fn check_keepalive(&self) -> Result<()> {
        let hour = Duration::from_secs(3600);
        let ms10 = Duration::from_millis(10);
        if let Some(d) = self.http2_keepalive_interval {
            check_duration("http2_keepalive_interval", d, ms10, hour)?;
        }
        check_duration(
            "http2_keepalive_timeout",
            self.http2_keepalive_timeout,
            ms10,
            hour,
        )?;
        if let Some(d) = self.tcp_keepalive {
            check_duration("tcp_keepalive", d, Duration::from_secs(1), hour)?;
        }
        Ok(())
    }
}

/// Check the options and log what the gRPC port will do.
fn security(options: &ServeOptions) -> Result<(auth::Security, Option<tokio_rustls::TlsAcceptor>)> {
    options.check_keepalive()?;
    let authz = options.authz.as_ref().map(auth::Authz::new).transpose()?;
    let tls = match &options.tls {
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
        tls: tls.is_some(),
        authz,
    };
    Ok((security, tls))
}

/// `true` once `shutdown` resolved.
fn stop_signal(
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown => {}
            () = tx.closed() => return,
        }
        let _ = tx.send(true);
    });
    rx
}

/// The health port, served until told to stop.
struct HealthServer {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl HealthServer {
    fn start(
        listener: TcpListener,
        status: Arc<Status>,
        slot: Slot,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let router = crate::http::router(status, slot, metrics);
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        });
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        if let Ok(Err(e)) = self.task.await {
            tracing::warn!(error = %e, "health server failed");
        }
    }
}

/// Serve gRPC until `stop` or a dead task, then drain and stop the health
/// port (last, so `/readyz` tells the truth while draining).
async fn run_grpc(
    registrar: Arc<Registrar>,
    grpc: TcpListener,
    (security, acceptor): (auth::Security, Option<tokio_rustls::TlsAcceptor>),
    options: &ServeOptions,
    mut stop: watch::Receiver<bool>,
    health: HealthServer,
) -> Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let mirror = tokio::spawn(mirror_readiness(Arc::clone(&registrar), reporter));
    let closing = registrar.closing.clone();
    let status = Arc::clone(registrar.status());
    let (stop_grpc_tx, mut stop_grpc) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            _ = status.failed() => {}
        }
        // End the agents' streams first: they would hold the server open.
        closing.send_replace(true);
        let _ = stop_grpc_tx.send(true);
    });
    let stopped = async move {
        let _ = stop_grpc.wait_for(|s| *s).await;
    };
    let grpc_router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(options.http2_keepalive_interval)
        .http2_keepalive_timeout(Some(options.http2_keepalive_timeout))
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
            let incoming = tonic::transport::server::TcpIncoming::from(grpc)
                .with_nodelay(Some(true))
                .with_keepalive(options.tcp_keepalive);
            grpc_router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
        }
        Some(acceptor) => {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            tokio::spawn(accept_tls(grpc, acceptor, tx, options.clone()));
            let incoming =
                tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
            grpc_router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
        }
    };
    tracing::info!(
        queued = registrar.queue_depth(),
        timeout = ?registrar.config().drain_timeout,
        "shutting down: draining the write queue"
    );
    let unwritten = registrar.drain().await;
    mirror.abort();
    health.stop().await;
    if let Some(why) = registrar.status().failure() {
        return Err(Error::internal(format!(
            "the registrar stopped because a background task died: {why}"
        )));
    }
    result.map_err(|e| Error::unavailable(format!("gRPC server failed: {e}")).with_source(e))?;
    if !unwritten.is_empty() {
        let shown: Vec<String> = unwritten.iter().take(10).map(ToString::to_string).collect();
        return Err(Error::unavailable(format!(
            "shut down with {} writes the backend has not confirmed (drain timeout {:?}): {}{}",
            unwritten.len(),
            registrar.config().drain_timeout,
            shown.join(", "),
            if unwritten.len() > shown.len() {
                ", …"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Keep the gRPC health service's answer for the `Registrar` service in
/// step with `/readyz`.
async fn mirror_readiness(
    registrar: Arc<Registrar>,
    reporter: tonic_health::server::HealthReporter,
) {
    type Svc = registry_registrar::proto::registrar::v1::registrar_server::RegistrarServer<
        RegistrarService,
    >;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last = None;
    loop {
        tick.tick().await;
        let ready = registrar.is_ready();
        if last != Some(ready) {
            if ready {
                reporter.set_serving::<Svc>().await;
            } else {
                reporter.set_not_serving::<Svc>().await;
            }
            last = Some(ready);
        }
    }
}

type TlsConn = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Accept TCP connections and hand those that complete the TLS handshake
/// to the gRPC server; handshakes run concurrently, each bounded by
/// `timeout`. Ends when the server stops taking connections.
async fn accept_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: tokio::sync::mpsc::Sender<TlsConn>,
    options: ServeOptions,
) {
    let timeout = options.handshake_timeout;
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
        if let Some(idle) = options.tcp_keepalive {
            let keepalive = socket2::TcpKeepalive::new().with_time(idle);
            if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
                tracing::warn!(%peer, error = %e, "cannot set TCP keepalive");
            }
        }
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
