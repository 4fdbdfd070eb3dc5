//! [`announce`]: a service makes itself known and keeps it that way —
//! register on start, heartbeat, register again when the registry forgot
//! it, drain and leave on shutdown.
//!
//! What a heartbeat means depends on the backend: on etcd it keeps the
//! node's lease alive (the endpoints vanish when it lapses); on SQLite it
//! updates the node's `last_seen` (silent nodes turn unhealthy, then are
//! removed); on gossip it confirms the node is a live member of the
//! cluster (SWIM decides liveness); through a registrar it reaches the
//! registrar's backend; on any other backend wrapped in
//! [`crate::liveness::Liveness`] it resets the node's silence timer. On
//! every backend a heartbeat of a node the registry no longer knows is
//! `NotFound`, and the announcement registers again.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{backoff, check_duration};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Endpoint, EndpointKey, Health};
use crate::traits::{Heartbeat, Registry};

/// Settings of [`announce`].
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct AnnounceConfig {
    /// Time between two heartbeats (and checks that the endpoints are
    /// still registered). Default 10 s, a third of the 30 s after which
    /// the liveness sweepers suspect a silent node; 1 ms to 1 h.
    pub heartbeat_every: Duration,
    /// Each wait is shortened by up to this share at random, so a fleet
    /// started together does not beat together. Default 0.1; 0 to 0.5.
    pub jitter: f64,
    /// First and longest delay between retries while the registry fails
    /// (exponential, with jitter). Default 100 ms and 10 s.
    pub retry: (Duration, Duration),
    /// How long [`Announcement::shutdown`] keeps the endpoints registered
    /// as [`Health::Draining`] before it deregisters them: the time the
    /// service's callers need to see the change and stop sending new
    /// calls, while the calls they have under way finish. Default 0: no
    /// draining, deregister at once; 0 to 1 h. Keep it well under the
    /// registry's liveness timeout (nothing heartbeats meanwhile).
    pub drain_for: Duration,
}

impl Default for AnnounceConfig {
    fn default() -> Self {
        Self {
            heartbeat_every: Duration::from_secs(10),
            jitter: 0.1,
            retry: (Duration::from_millis(100), Duration::from_secs(10)),
            drain_for: Duration::ZERO,
        }
    }
}

impl AnnounceConfig {
    /// Set `heartbeat_every`.
    pub fn with_heartbeat_every(mut self, d: Duration) -> Self {
        self.heartbeat_every = d;
        self
    }
    /// Set `jitter`.
    pub fn with_jitter(mut self, share: f64) -> Self {
        self.jitter = share;
        self
    }
    /// Set the retry delays.
    pub fn with_retry(mut self, min: Duration, max: Duration) -> Self {
        self.retry = (min, max);
        self
    }
    /// Set `drain_for`.
    pub fn with_drain_for(mut self, d: Duration) -> Self {
        self.drain_for = d;
        self
    }

    /// Check every setting against its range.
    pub fn validate(&self) -> Result<()> {
        let ms = Duration::from_millis(1);
        let hour = Duration::from_secs(3600);
        check_duration("heartbeat_every", self.heartbeat_every, ms, hour)?;
        check_duration("retry_min", self.retry.0, ms, hour)?;
        check_duration("retry_max", self.retry.1, self.retry.0, hour)?;
        check_duration("drain_for", self.drain_for, Duration::ZERO, hour)?;
        if !(0.0..=0.5).contains(&self.jitter) {
            return Err(Error::invalid(
                "jitter",
                format!("{} is out of range: allowed 0 to 0.5", self.jitter),
            ));
        }
        Ok(())
    }
}

/// Where an [`Announcement`] stands.
#[derive(Debug, Clone)]
pub enum AnnounceStatus {
    /// Registering for the first time.
    Starting,
    /// Every endpoint is registered; `at` is when that was last confirmed
    /// (a heartbeat that succeeded and a check that found them all).
    Registered {
        /// When it was last confirmed.
        at: Instant,
    },
    /// [`Announcement::shutdown`] marked the endpoints draining; they are
    /// deregistered at `until`.
    Draining {
        /// When the endpoints are deregistered.
        until: Instant,
    },
    /// The registry failed; retrying with backoff.
    Retrying {
        /// The last error.
        error: Error,
        /// Since when it has been failing.
        since: Instant,
    },
    /// [`Announcement::shutdown`] ran: the endpoints were drained (for
    /// `drain_for`) and deregistered (or the error says why not).
    Left {
        /// Why leaving failed, if it did.
        error: Option<Error>,
    },
}

/// A service's endpoints kept registered; see [`announce`].
pub struct Announcement {
    status: watch::Receiver<AnnounceStatus>,
    leave: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    keys: Vec<EndpointKey>,
    deregister: Arc<dyn Deregister>,
}

/// What dropping an announcement needs: deregistering, type-erased.
trait Deregister: Send + Sync + 'static {
    fn deregister<'a>(
        &'a self,
        key: &'a EndpointKey,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;
}

impl<R: Registry + ?Sized> Deregister for Arc<R> {
    fn deregister<'a>(
        &'a self,
        key: &'a EndpointKey,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
        Registry::deregister(&**self, key)
    }
}

/// Register `endpoints` with `registry` and keep them registered until
/// [`Announcement::shutdown`]:
///
/// - they are registered at once (retried with backoff while the registry
///   fails);
/// - every `heartbeat_every` (with jitter) each of their nodes heartbeats,
///   and the endpoints are checked to still be there; a heartbeat that is
///   `NotFound` (the registry pruned the node, restarted, or its lease
///   lapsed) or an endpoint that is missing makes them register again;
/// - [`Announcement::status`] says where it stands;
/// - [`Announcement::shutdown`] (or [`Announcement::leave_on`], for a
///   server's graceful shutdown) drains them — registers them as
///   [`Health::Draining`] and waits [`AnnounceConfig::drain_for`], so that
///   callers stop sending new calls while theirs finish — then deregisters
///   them before it returns; dropping the announcement deregisters them
///   in the background, best effort, without draining.
///
/// Every endpoint is validated first; endpoints without a `node` are
/// registered and checked but have no heartbeat.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use waypost::announce::{announce, AnnounceConfig};
/// use waypost::memory::MemoryRegistry;
/// use waypost::{Endpoint, Registry};
/// let reg = Arc::new(MemoryRegistry::new());
/// let me = Endpoint::new("api", "pod-1", "127.0.0.1", 8080).with_node("node-1");
/// let announced = announce(Arc::clone(&reg), vec![me], AnnounceConfig::default())?;
/// announced.registered().await;
/// assert_eq!(reg.list("api").await?.len(), 1);
/// announced.shutdown().await?;
/// assert!(reg.list("api").await?.is_empty());
/// # Ok::<(), waypost::Error>(()) });
/// ```
pub fn announce<R>(
    registry: Arc<R>,
    endpoints: Vec<Endpoint>,
    cfg: AnnounceConfig,
) -> Result<Announcement>
where
    R: Registry + Heartbeat + ?Sized,
{
    cfg.validate()?;
    for (i, e) in endpoints.iter().enumerate() {
        e.validate()
            .map_err(|err| err.in_field(&format!("endpoints[{i}].")))?;
    }
    let (status_tx, status) = watch::channel(AnnounceStatus::Starting);
    let (leave, left) = tokio::sync::oneshot::channel();
    let keys = endpoints.iter().map(Endpoint::key).collect();
    let task = tokio::spawn(keep(Arc::clone(&registry), endpoints, cfg, status_tx, left));
    Ok(Announcement {
        status,
        leave: Some(leave),
        task: Some(task),
        keys,
        deregister: Arc::new(registry),
    })
}

impl Announcement {
    /// Where it stands; changes are signalled.
    pub fn status(&self) -> watch::Receiver<AnnounceStatus> {
        self.status.clone()
    }

    /// Wait until every endpoint is registered (the first time, or again).
    pub async fn registered(&self) {
        let mut st = self.status.clone();
        let _ = st
            .wait_for(|s| matches!(s, AnnounceStatus::Registered { .. }))
            .await;
    }

    /// Stop heartbeating, drain (mark every endpoint draining and wait
    /// [`AnnounceConfig::drain_for`]; skipped when it is 0) and deregister
    /// every endpoint; returns once they are gone (or with the first error
    /// deregistering them). A failure to mark them draining is logged and
    /// the wait kept: they are deregistered all the same.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(leave) = self.leave.take() {
            let _ = leave.send(());
        }
        let result = match self.task.take() {
            Some(task) => task
                .await
                .map_err(|e| Error::internal(format!("the announcement's task failed: {e}"))),
            None => Ok(()),
        };
        result?;
        match &*self.status.borrow() {
            AnnounceStatus::Left { error: Some(e) } => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// A future for a server's graceful shutdown: it waits for `signal`,
    /// then drains and deregisters (and logs a failure to), then resolves
    /// — so the service's callers have moved away before the server stops
    /// accepting calls. For `axum::serve(..).with_graceful_shutdown(..)` or
    /// `tonic`'s `serve_with_shutdown`.
    pub async fn leave_on(self, signal: impl Future<Output = ()> + Send + 'static) {
        signal.await;
        if let Err(e) = self.shutdown().await {
            tracing::warn!(error = %e, "could not deregister every endpoint at shutdown");
        }
    }
}

impl Announcement {
    /// Stop keeping the endpoints registered without deregistering them,
    /// as if the process had died: the registry's liveness (a lease that
    /// lapses, a sweeper) removes them in its own time.
    pub fn abandon(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        // Not shut down: stop, and deregister in the background.
        let Some(task) = self.task.take() else {
            return;
        };
        task.abort();
        let keys = std::mem::take(&mut self.keys);
        let reg = Arc::clone(&self.deregister);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for key in &keys {
                    if let Err(e) = reg.deregister(key).await {
                        tracing::warn!(%key, error = %e, "could not deregister a dropped announcement's endpoint");
                    }
                }
            });
        }
    }
}

/// The announcement's task: register, then heartbeat and check, until told
/// to leave; then deregister.
async fn keep<R: Registry + Heartbeat + ?Sized>(
    reg: Arc<R>,
    endpoints: Vec<Endpoint>,
    cfg: AnnounceConfig,
    status: watch::Sender<AnnounceStatus>,
    mut leave: tokio::sync::oneshot::Receiver<()>,
) {
    let nodes: BTreeSet<String> = endpoints
        .iter()
        .filter(|e| !e.node.is_empty())
        .map(|e| e.node.clone())
        .collect();
    let mut delays = backoff(cfg.retry.0, cfg.retry.1);
    let mut registered = false;
    loop {
        let outcome = if registered {
            check(&*reg, &endpoints, &nodes).await
        } else {
            register_all(&*reg, &endpoints).await.map(|()| true)
        };
        let wait = match outcome {
            Ok(true) => {
                registered = true;
                delays = backoff(cfg.retry.0, cfg.retry.1);
                status.send_replace(AnnounceStatus::Registered { at: Instant::now() });
                jittered(cfg.heartbeat_every, cfg.jitter)
            }
            Ok(false) => {
                // Forgotten: register again right away.
                registered = false;
                continue;
            }
            Err(e) => {
                let since = match &*status.borrow() {
                    AnnounceStatus::Retrying { since, .. } => *since,
                    _ => Instant::now(),
                };
                let delay = delays.next().unwrap_or(cfg.retry.1);
                tracing::warn!(error = %e, ?delay, "announcing the service failed; retrying");
                status.send_replace(AnnounceStatus::Retrying { error: e, since });
                delay
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut leave => break,
        }
    }
    if !cfg.drain_for.is_zero() {
        drain(&*reg, &endpoints, cfg.drain_for, &status).await;
    }
    let mut error = None;
    for e in &endpoints {
        if let Err(err) = Registry::deregister(&*reg, &e.key()).await {
            tracing::warn!(key = %e.key(), error = %err, "could not deregister at shutdown");
            error.get_or_insert(err);
        }
    }
    status.send_replace(AnnounceStatus::Left { error });
}

/// Register every endpoint as draining, then wait `drain_for`.
async fn drain<R: Registry + ?Sized>(
    reg: &R,
    endpoints: &[Endpoint],
    drain_for: Duration,
    status: &watch::Sender<AnnounceStatus>,
) {
    let until = Instant::now() + drain_for;
    for e in endpoints {
        let draining = e.clone().with_health(Health::Draining);
        if let Err(err) = reg.register(draining).await {
            tracing::warn!(key = %e.key(), error = %err, "could not mark an endpoint draining");
        }
    }
    tracing::info!(
        ?drain_for,
        "endpoints draining; deregistering them after the wait"
    );
    status.send_replace(AnnounceStatus::Draining { until });
    tokio::time::sleep_until(until).await;
}

async fn register_all<R: Registry + ?Sized>(reg: &R, endpoints: &[Endpoint]) -> Result<()> {
    for e in endpoints {
        reg.register(e.clone()).await?;
    }
    Ok(())
}

/// Heartbeat every node and check every endpoint is still there: `false`
/// when the registry forgot something.
async fn check<R: Registry + Heartbeat + ?Sized>(
    reg: &R,
    endpoints: &[Endpoint],
    nodes: &BTreeSet<String>,
) -> Result<bool> {
    for node in nodes {
        match reg.heartbeat(node).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                tracing::info!(node, "the registry forgot this node; registering again");
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
    }
    let services: BTreeSet<&str> = endpoints.iter().map(|e| e.service.as_str()).collect();
    for service in services {
        let present = reg.list(service).await?;
        let missing = endpoints.iter().filter(|e| e.service == service).any(|e| {
            !present
                .iter()
                .any(|p| p.key() == e.key() && p.address == e.address && p.port == e.port)
        });
        if missing {
            tracing::info!(
                service,
                "an endpoint of this service is missing; registering again"
            );
            return Ok(false);
        }
    }
    Ok(true)
}

/// `every`, shortened by up to `share` at random.
fn jittered(every: Duration, share: f64) -> Duration {
    every.saturating_sub(every.mul_f64(share * rand::random::<f64>()))
}
