//! Serving a [`Registrar`]: the gRPC port (plaintext or mTLS) and the
//! health port, graceful shutdown with a bounded drain, and exit on a dead
//! background task.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::OnceLock;

use backon::BackoffBuilder;
use futures::StreamExt;
use registry_api::{Error, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;

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
    /// `None`: plaintext, allowed only on a loopback address unless
    /// `insecure`.
    pub tls: Option<TlsFiles>,
    /// Authorization by SPIFFE ID (needs `tls`). `None` with `tls` is
    /// refused unless `any_certificate`.
    pub authz: Option<AuthzConfig>,
    /// Serve plaintext gRPC on a non-loopback address (anyone who can
    /// reach the port may write any endpoint).
    pub insecure: bool,
    /// With `tls` and no `authz`: let any certificate of the CA write any
    /// endpoint.
    pub any_certificate: bool,
    /// The largest request message decoded; default
    /// [`DEFAULT_MAX_REQUEST_BYTES`](crate::DEFAULT_MAX_REQUEST_BYTES).
    pub max_request_bytes: usize,
    /// Longest TLS handshake. Default 10 s.
    pub handshake_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            authz: None,
            insecure: false,
            any_certificate: false,
            max_request_bytes: crate::DEFAULT_MAX_REQUEST_BYTES,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl ServeOptions {
    /// Plaintext, no authorization (on a loopback address only).
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

    /// Allow plaintext gRPC on a non-loopback address.
    pub fn allow_insecure(mut self) -> Self {
        self.insecure = true;
        self
    }

    /// With mTLS and no authorization, let any certificate of the CA
    /// write any endpoint.
    pub fn allow_any_certificate(mut self) -> Self {
        self.any_certificate = true;
        self
    }

    /// Decode request messages of at most `bytes`.
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Check the options as [`serve_with`] will: the certificate files
    /// load, the authorization settings (and policy file) are valid and
    /// have TLS, mTLS has authorization or allows any certificate.
    pub fn check(&self) -> Result<()> {
        security(self, registry_api::Endpoint::DEFAULT_CLUSTER).map(drop)
    }

    /// Refuse plaintext on `listener` unless it is a loopback address or
    /// `insecure` was given.
    fn check_listener(&self, listener: &TcpListener) -> Result<()> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::unavailable(format!("the gRPC listener: {e}")).with_source(e))?;
        if self.tls.is_none() && !self.insecure && !addr.ip().is_loopback() {
            return Err(Error::invalid(
                "grpc_addr",
                format!(
                    "plaintext gRPC on {addr}, which is not a loopback address: anyone who \
                     can reach it could write any endpoint. Give TLS certificates \
                     (--tls-ca, --tls-cert, --tls-key), listen on 127.0.0.1 or [::1], or \
                     accept the risk with --insecure"
                ),
            ));
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
    let secured = security(&options, &registrar.config().cluster_name)?;
    options.check_listener(&grpc)?;
    let stop = stop_signal(shutdown);
    let status = Arc::clone(registrar.status());
    let slot: Slot = Arc::new(OnceLock::from(Arc::clone(&registrar)));
    let health = HealthServer::start(health, status, slot, metrics);
    run_grpc(registrar, grpc, secured, stop, health).await
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
        let secured = security(&options, &cfg.cluster_name)?;
        options.check_listener(&grpc)?;
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
        run_grpc(registrar, grpc, secured, stop, health).await
    }
}

/// How the gRPC port is secured: checked [`ServeOptions`].
struct Secured {
    security: auth::Security,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
    max_request_bytes: usize,
}

/// Check the options and log what the gRPC port will do; `cluster` is
/// what `{cluster}` stands for in the authorization policy.
fn security(options: &ServeOptions, cluster: &str) -> Result<Secured> {
    let authz = options
        .authz
        .as_ref()
        .map(|a| auth::Authz::new(a, cluster))
        .transpose()?;
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
        (Some(_), None) if !options.any_certificate => {
            return Err(Error::invalid(
                "authz",
                "mTLS without authorization would let any certificate of the CA write any \
                 endpoint: give a trust domain (--trust-domain, and optionally \
                 --authz-policy), or allow it explicitly (--allow-any-certificate)",
            ))
        }
        (Some(files), None) => tracing::warn!(
            ca = %files.ca.display(),
            "mTLS without a trust domain: any certificate of the CA may write any endpoint"
        ),
        (Some(files), Some(a)) => tracing::info!(
            ca = %files.ca.display(),
            trust_domain = %a.trust_domain,
            policy = ?a.policy_file,
            "mTLS with authorization by SPIFFE ID"
        ),
    }
    let security = auth::Security {
        tls: tls.is_some(),
        authz,
    };
    Ok(Secured {
        security,
        acceptor: tls,
        handshake_timeout: options.handshake_timeout,
        max_request_bytes: options.max_request_bytes,
    })
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
    secured: Secured,
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
    let Secured {
        security,
        acceptor,
        handshake_timeout,
        max_request_bytes,
    } = secured;
    // Every caller is identified from its connection and headers before a
    // message is decoded (the interceptor), then by the handlers.
    let authenticate = auth::Authenticate(Arc::new(security.clone()));
    let service = RegistrarService::new(Arc::clone(&registrar))
        .with_security(security)
        .with_max_request_bytes(max_request_bytes)
        .into_server();
    let grpc_router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(InterceptedService::new(
            health_service,
            authenticate.clone(),
        ))
        .add_service(InterceptedService::new(service, authenticate));
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
            tokio::spawn(accept_tls(grpc, acceptor, tx, handshake_timeout));
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
