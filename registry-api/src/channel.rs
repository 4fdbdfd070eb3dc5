//! [`balanced_channel`]: a `tonic` client transport balanced over a
//! service's healthy endpoints by weight, preferring the caller's zone,
//! kept current by a watch (feature `tonic`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint as TonicEndpoint};
use tower::{BoxError, Service, ServiceExt};

use crate::discover::discover;
use crate::error::{Error, Result};
use crate::model::{Endpoint, EndpointKey};
use crate::traffic::{pick_weighted, ZonePreference};
use crate::traits::Watch;

type KeepFn = Arc<dyn Fn(&Endpoint) -> bool + Send + Sync>;

/// Settings of [`balanced_channel`].
#[non_exhaustive]
#[derive(Clone)]
pub struct ChannelConfig {
    /// TLS for every connection (`https://`); `None`: plaintext `http://`.
    pub tls: Option<ClientTlsConfig>,
    /// Only endpoints for which this is true (on top of the service name
    /// and health), e.g. a zone label.
    pub filter: Option<KeepFn>,
    /// Timeout of connecting to one endpoint. Default: tonic's (none).
    pub connect_timeout: Option<Duration>,
    /// Timeout of one call. Default: none.
    pub timeout: Option<Duration>,
    /// The caller's zone: new calls stay in it while it holds
    /// [`zone_floor`](ChannelConfig::zone_floor). Default: none (every
    /// healthy endpoint, by weight).
    pub zone: Option<String>,
    /// `(min_healthy, min_share)`: the floor under which calls leave the
    /// caller's zone (see [`ZonePreference`]). Default `(1, 0.0)`:
    /// Kubernetes' `PreferSameZone`, in the zone while it has a healthy
    /// endpoint.
    pub zone_floor: (usize, f64),
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            tls: None,
            filter: None,
            connect_timeout: None,
            timeout: None,
            zone: None,
            zone_floor: (1, 0.0),
        }
    }
}

impl fmt::Debug for ChannelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelConfig")
            .field("tls", &self.tls.is_some())
            .field("filter", &self.filter.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("zone", &self.zone)
            .field("zone_floor", &self.zone_floor)
            .finish()
    }
}

impl ChannelConfig {
    /// Connect with TLS.
    pub fn with_tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
    /// Keep only endpoints for which `keep` is true.
    pub fn with_filter(mut self, keep: impl Fn(&Endpoint) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Some(Arc::new(keep));
        self
    }
    /// Set the connect timeout.
    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = Some(d);
        self
    }
    /// Set the timeout of one call.
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
    /// Set the caller's zone (compared with each endpoint's `zone` label).
    pub fn with_zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }
    /// Set the zone floor: calls stay in the caller's zone while it has at
    /// least `min_healthy` healthy endpoints holding at least `min_share`
    /// (0 to 1) of the service's weight, and spread over every zone
    /// otherwise. Size it so that the endpoints at the floor can carry
    /// the zone's callers (see [`ZonePreference`]).
    pub fn with_zone_floor(mut self, min_healthy: usize, min_share: f64) -> Self {
        self.zone_floor = (min_healthy, min_share);
        self
    }

    /// The zone preference these settings make, checked.
    fn zone_preference(&self) -> Result<Option<ZonePreference>> {
        let Some(zone) = &self.zone else {
            return Ok(None);
        };
        let pref =
            ZonePreference::new(zone.clone()).with_floor(self.zone_floor.0, self.zone_floor.1);
        pref.validate()?;
        Ok(Some(pref))
    }
}

/// A `tonic` client transport balanced over the healthy endpoints of
/// `service`, kept current by `watch`. Give it to a generated client
/// (`GreeterClient::new(channel)`); clones share the endpoints.
///
/// - **Weights.** Each call goes to one endpoint picked at random with
///   probability proportional to its weight ([`Endpoint::weight`], the
///   `weight` label, default 1).
/// - **Draining.** An endpoint marked [`crate::Health::Draining`] (or
///   unhealthy, or deregistered) is picked for no call after the change is
///   delivered; calls already under way on it run to their end.
/// - **Zone.** With [`ChannelConfig::with_zone`], calls go only to
///   endpoints of the caller's zone while it holds its floor
///   ([`ChannelConfig::with_zone_floor`], default: one healthy endpoint),
///   and to every healthy endpoint, by weight, otherwise.
///
/// Each endpoint has its own `tonic` connection, made when it is first
/// picked. Calls made while the service has no endpoint wait for one (up
/// to the call's timeout, when set). The task following the watch ends
/// when the channel and all its clones are dropped. Must be called inside
/// a Tokio runtime. An endpoint whose address cannot form a URI is left
/// out and logged. The zone is checked: `InvalidInput` when it is not a
/// plain label value, or the floor's share is not within 0 to 1.
///
/// ```no_run
/// # async fn demo(reg: std::sync::Arc<waypost::memory::MemoryRegistry>) -> waypost::Result<()> {
/// use waypost::channel::{balanced_channel, ChannelConfig};
/// let cfg = ChannelConfig::default().with_zone("eu-west-1a");
/// let channel = balanced_channel(reg, "greeter", cfg)?;
/// // let mut client = GreeterClient::new(channel);
/// # Ok(()) }
/// ```
pub fn balanced_channel<W: Watch>(
    watch: W,
    service: &str,
    cfg: ChannelConfig,
) -> Result<BalancedChannel> {
    let zone = cfg.zone_preference()?;
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let config = cfg.clone();
    let make = move |ep: &Endpoint| {
        tonic_endpoint(ep, scheme, &config).map(|e| (e.connect_lazy(), ep.weight()))
    };
    // A new weight or zone makes a new member (and connection): the
    // picker reads both from the member.
    let mut changes = discover(watch, make)
        .service(service)
        .rebuild_if(|old, new| {
            old.address != new.address
                || old.port != new.port
                || old.protocol != new.protocol
                || old.weight() != new.weight()
                || old.zone() != new.zone()
        });
    if let Some(pref) = zone {
        changes = changes.prefer_zone(pref);
    }
    if let Some(keep) = cfg.filter.clone() {
        changes = changes.filter(move |ep| keep(ep));
    }
    let (tx, _) = tokio::sync::watch::channel(0u64);
    let members = Arc::new(Members {
        list: RwLock::new(BTreeMap::new()),
        changed: tx,
    });
    let feeding = Arc::downgrade(&members);
    let service_name = service.to_string();
    let task = tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            // `discover` never yields an error; it watches again.
            let Ok(change) = change else { continue };
            let Some(members) = feeding.upgrade() else {
                return;
            };
            members.apply(change, &service_name);
        }
    });
    Ok(BalancedChannel {
        members,
        _task: Arc::new(AbortOnDrop(task)),
        timeout: cfg.timeout,
    })
}

/// The endpoints a [`BalancedChannel`] picks from, shared by its clones.
struct Members {
    list: RwLock<BTreeMap<EndpointKey, (Channel, u32)>>,
    /// Counts changes, so that a call waiting for an endpoint wakes up.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Members {
    fn apply(
        &self,
        change: tower::discover::Change<EndpointKey, Option<(Channel, u32)>>,
        service: &str,
    ) {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        match change {
            tower::discover::Change::Insert(key, Some(member)) => {
                tracing::debug!(%key, weight = member.1, "endpoint in the balanced channel");
                list.insert(key, member);
            }
            tower::discover::Change::Insert(key, None) => {
                tracing::warn!(%key, service, "an endpoint without a usable address is left out");
                list.remove(&key);
            }
            tower::discover::Change::Remove(key) => {
                tracing::debug!(%key, "endpoint out of the balanced channel");
                list.remove(&key);
            }
        }
        drop(list);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A channel picked by weight, if there is any endpoint.
    fn pick(&self) -> Option<Channel> {
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        let weights: Vec<u32> = list.values().map(|(_, w)| *w).collect();
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        if total == 0 {
            return None;
        }
        let at = pick_weighted(&weights, rand::random::<u64>() % total)?;
        list.values().nth(at).map(|(c, _)| c.clone())
    }
}

/// Aborts the watch-following task when the last clone goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The transport [`balanced_channel`] makes: a `tower` service of HTTP/2
/// requests that `tonic`'s generated clients take, like a `Channel`.
#[derive(Clone)]
pub struct BalancedChannel {
    members: Arc<Members>,
    _task: Arc<AbortOnDrop>,
    timeout: Option<Duration>,
}

impl BalancedChannel {
    /// The keys of the endpoints new calls are spread over now (the
    /// preferred zone's alone while it holds its floor).
    pub fn endpoints(&self) -> Vec<EndpointKey> {
        let list = self.members.list.read().unwrap_or_else(|p| p.into_inner());
        list.keys().cloned().collect()
    }

    /// Wait until `ready` holds of the endpoints new calls are spread over
    /// (their keys); returns at once when it already does.
    pub async fn wait_for(&self, mut ready: impl FnMut(&[EndpointKey]) -> bool) {
        let mut changed = self.members.changed.subscribe();
        loop {
            if ready(&self.endpoints()) {
                return;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    }
}

impl fmt::Debug for BalancedChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalancedChannel")
            .field("endpoints", &self.endpoints().len())
            .finish_non_exhaustive()
    }
}

impl Service<http::Request<Body>> for BalancedChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, std::result::Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        // The pick is made by `call`; each endpoint's channel is made
        // ready there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let members = Arc::clone(&self.members);
        let timeout = self.timeout;
        async move {
            let mut changed = members.changed.subscribe();
            let wait = async {
                loop {
                    if let Some(ch) = members.pick() {
                        return Ok(ch);
                    }
                    if changed.changed().await.is_err() {
                        return Err(BoxError::from(Error::unavailable(
                            "the balanced channel stopped following its service",
                        )));
                    }
                }
            };
            let mut ch = match timeout {
                Some(t) => tokio::time::timeout(t, wait).await.map_err(|_| {
                    BoxError::from(Error::unavailable(
                        "no endpoint of the service appeared within the call's timeout",
                    ))
                })??,
                None => wait.await?,
            };
            let ready = ch.ready().await.map_err(BoxError::from)?;
            ready.call(req).await.map_err(BoxError::from)
        }
        .boxed()
    }
}

fn tonic_endpoint(ep: &Endpoint, scheme: &str, cfg: &ChannelConfig) -> Option<TonicEndpoint> {
    let host = if ep.address.contains(':') {
        format!("[{}]", ep.address)
    } else {
        ep.address.clone()
    };
    let mut e = TonicEndpoint::from_shared(format!("{scheme}://{host}:{}", ep.port)).ok()?;
    if let Some(tls) = &cfg.tls {
        e = e.tls_config(tls.clone()).ok()?;
    }
    if let Some(d) = cfg.connect_timeout {
        e = e.connect_timeout(d);
    }
    if let Some(d) = cfg.timeout {
        e = e.timeout(d);
    }
    Some(e.tcp_nodelay(true))
}
