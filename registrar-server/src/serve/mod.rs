//! Serving a [`Registrar`]: the gRPC port (plaintext or mTLS) and the
//! health port, graceful shutdown with a bounded drain, and exit on a dead
//! background task.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::OnceLock;

use backon::BackoffBuilder;
use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use waypost::{Error, Result};

use crate::auth;
use crate::engine::config::RegistrarConfig;
use crate::engine::open::Backend;
use crate::engine::registrar::Registrar;
use crate::engine::registrar::Slot;
use crate::engine::status::Status;
use crate::faces::grpc::RegistrarService;

mod accept;
pub(crate) mod health;
mod options;
mod protocols;

pub use options::ServeOptions;
use options::{security, Secured};
pub use protocols::Protocols;
use protocols::Running;

/// Where a running registrar listens.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The health and metrics address.
    pub health: SocketAddr,
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
    let health = HealthServer::start(health, status, slot, metrics, options.ui);
    let incoming = accept::start(grpc, secured.acceptor.clone(), options);
    run_grpc(
        registrar,
        incoming,
        secured,
        stop,
        health,
        Running::default(),
    )
    .await
}

/// How [`Opening`] treats a backend it cannot open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenPolicy {
    /// Keep running, not ready, and retry transient failures with backoff
    /// (1 s to 30 s); a permanent failure (a read-only or corrupt file, a
    /// foreign database, bad credentials) ends [`Opening::serve`] with it.
    /// TLS files that do not exist yet are waited for.
    #[default]
    Retry,
    /// Any failure ends [`Opening::serve`] at once, a missing TLS file
    /// too.
    FailFast,
}

/// A registrar server whose backend may not be reachable yet (the
/// binary's `serve`): the health port answers from the start (`/readyz`
/// 503 naming the last error while the backend cannot be opened), the
/// backend is opened as [`OpenPolicy`] says, then the registrar serves as
/// with [`serve_with`]. The gRPC port takes connections from the start
/// (holding up to 1,024 that wait) and answers their calls once the
/// backend is open.
///
/// TLS files that do not exist yet are waited for first (checked every
/// 500 ms), with `/readyz` 503 naming them; until they load the gRPC port
/// accepts nothing (clients wait in the kernel's listen backlog), and a
/// file that appears but does not load yet (half written) is waited for
/// too. When all of them exist at the start they must load, or
/// [`Opening::serve`] fails at once; with [`OpenPolicy::FailFast`] it
/// fails at once on a missing file too.
pub struct Opening {
    /// The registrar's settings.
    pub cfg: RegistrarConfig,
    /// What to do when the backend cannot be opened.
    pub policy: OpenPolicy,
    /// mTLS and authorization.
    pub options: ServeOptions,
    /// Renders `/metrics` when given.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The HTTP API, DNS and xDS listeners, served once the backend is
    /// open (until then their clients wait in the listen backlog).
    pub protocols: Protocols,
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
            protocols: Protocols::none(),
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
            protocols,
            status,
        } = self;
        cfg.validate()?;
        // Certificate files that do not exist yet are waited for below
        // (unless failing fast); everything else must be right now.
        let secured = if policy == OpenPolicy::FailFast || options.missing_tls_files().is_empty() {
            Some(security(&options, &cfg.cluster_name)?)
        } else {
            options::settings(&options, &cfg.cluster_name)?;
            None
        };
        options.check_listener(&grpc)?;
        protocols.check(&options)?;
        let stop = stop_signal(shutdown);
        status.opening_failed(&Error::unavailable("opening"));
        if secured.is_none() {
            // Before the health port answers, so that its first answer
            // names the files.
            status.waiting_for(Some(not_found(&options)));
        }
        let slot: Slot = Arc::new(OnceLock::new());
        let health = HealthServer::start(
            health,
            Arc::clone(&status),
            Arc::clone(&slot),
            metrics,
            options.ui,
        );
        let mut stopped = stop.clone();
        let secured = match secured {
            Some(s) => s,
            None => match wait_for_tls(&options, &cfg.cluster_name, &status, &mut stopped).await {
                Some(s) => s,
                None => {
                    health.stop().await;
                    return Ok(());
                }
            },
        };
        // Connections are taken (and held) from now on, answered once the
        // backend is open.
        let incoming = accept::start(grpc, secured.acceptor.clone(), options.clone());
        let mut delays = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(30))
            .with_jitter()
            .without_max_times()
            .build();
        let backend = loop {
            let attempt = tokio::select! {
                r = open() => r,
                () = until_stopped(&mut stopped) => {
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
                        () = until_stopped(&mut stopped) => {
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
        let running = protocols.start(&registrar, &secured);
        run_grpc(registrar, incoming, secured, stop, health, running).await
    }
}

/// How often [`wait_for_tls`] looks for the certificate files.
const TLS_POLL: Duration = Duration::from_millis(500);

/// Wait until the certificate files of `options` exist and load (a
/// sidecar, such as SPIRE's helper, may write them after the registrar
/// starts), not ready meanwhile: `/readyz` names the files missing, or why
/// they do not load (a file half written). `None` when stopped first.
async fn wait_for_tls(
    options: &ServeOptions,
    cluster: &str,
    status: &Status,
    stopped: &mut watch::Receiver<bool>,
) -> Option<Secured> {
    let mut last: Option<String> = None;
    loop {
        let missing = options.missing_tls_files();
        let why = if missing.is_empty() {
            let loaded = options
                .tls
                .as_ref()
                .map_or(Ok(()), |f| {
                    waypost_registrar_client::tls::server_config(f).map(drop)
                })
                .and_then(|()| security(options, cluster));
            match loaded {
                Ok(secured) => {
                    status.waiting_for(None);
                    tracing::info!("the TLS files are in place: serving");
                    return Some(secured);
                }
                Err(e) => format!("the TLS files to load ({e})"),
            }
        } else {
            not_found(options)
        };
        if last.as_ref() != Some(&why) {
            tracing::warn!(waiting_for = %why, "not serving yet: waiting for the TLS files");
            status.waiting_for(Some(why.clone()));
            last = Some(why);
        }
        tokio::select! {
            () = tokio::time::sleep(TLS_POLL) => {}
            () = until_stopped(stopped) => return None,
        }
    }
}

/// What [`wait_for_tls`] waits for while TLS files of `options` do not
/// exist, naming them.
fn not_found(options: &ServeOptions) -> String {
    let named: Vec<String> = options
        .missing_tls_files()
        .iter()
        .map(|(what, path)| format!("the {what} {}", path.display()))
        .collect();
    format!(
        "the TLS files (not found: {}); serving once they exist",
        named.join(", ")
    )
}

/// Resolves once `stopped` says so (or its sender is gone). Keeps the
/// `watch::Ref` out of `select!`'s output, so that [`Opening::serve`]'s
/// future is `Send` and can be spawned.
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
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
        ui: bool,
    ) -> Self {
        if metrics.is_some() {
            // A recorder is installed: every metric described, and present
            // from the start.
            crate::metrics::describe_metrics();
            crate::metrics::zero();
        }
        let (stop, mut stopped) = watch::channel(false);
        // The dashboard's event streams end when the server stops, or the
        // graceful shutdown would wait for them.
        let ui = ui.then(|| {
            crate::faces::ui::Ui::new(Arc::clone(&status), Arc::clone(&slot), stopped.clone())
        });
        let router = crate::serve::health::router(status, slot, metrics, ui);
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
    incoming: accept::Incoming,
    secured: Secured,
    mut stop: watch::Receiver<bool>,
    health: HealthServer,
    protocols: Running,
) -> Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let mirror = tokio::spawn(mirror_readiness(Arc::clone(&registrar), reporter));
    let closer = Arc::clone(&registrar);
    let status = Arc::clone(registrar.status());
    let (stop_grpc_tx, mut stop_grpc) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            _ = status.failed() => {}
        }
        // End the agents' streams first: they would hold the server open.
        closer.close();
        let _ = stop_grpc_tx.send(true);
    });
    let stopped = async move {
        let _ = stop_grpc.wait_for(|s| *s).await;
    };
    let Secured {
        security, options, ..
    } = secured;
    // Every caller is identified from its connection and headers before a
    // message is decoded (the interceptor), then by the handlers.
    let authenticate = auth::Authenticate(Arc::new(security.clone()));
    let service = RegistrarService::new(Arc::clone(&registrar))
        .with_security(security)
        .with_max_request_bytes(options.max_request_bytes)
        .into_server();
    let grpc_router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(options.http2_keepalive_interval)
        .http2_keepalive_timeout(Some(options.http2_keepalive_timeout))
        .add_service(InterceptedService::new(
            health_service,
            authenticate.clone(),
        ))
        .add_service(InterceptedService::new(service, authenticate));
    let result = match incoming {
        accept::Incoming::Plain(rx) => {
            let incoming =
                tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
            grpc_router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await
        }
        accept::Incoming::Tls(rx) => {
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
    protocols.stop().await;
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
    type Svc = waypost_registrar_client::proto::registrar::v1::registrar_server::RegistrarServer<
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
