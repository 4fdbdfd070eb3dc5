//! [`Discovery`]: a [`Watch`] as a [`tower::discover::Discover`], so a
//! registry feeds `tower::balance` directly (feature `tower`).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tower::discover::Change;

use crate::error::Result;
use crate::model::{Endpoint, EndpointKey, Health, Version};
use crate::snapshot::{Event, Snapshot};
use crate::traffic::ZonePreference;
use crate::traits::{EventStream, Watch};

type MakeFn<S> = Box<dyn Fn(&Endpoint) -> S + Send>;
type FilterFn = Box<dyn Fn(&Endpoint) -> bool + Send>;
type RebuildFn = Box<dyn Fn(&Endpoint, &Endpoint) -> bool + Send>;

/// Follow `watch` as a [`tower::discover::Discover`]: every endpoint that
/// passes the filters becomes a service made by `make`, keyed by its
/// [`EndpointKey`].
///
/// The stream never fails: when the watch reports an error or ends, the
/// error is logged and it watches again from the last version it saw
/// (exponential backoff with jitter, 100 ms to 5 s), so a balancer fed by it
/// keeps running through an outage with the endpoints it had. See
/// [`Discovery`] for the filters and for how events become changes.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use futures::TryStreamExt;
/// use waypost::{Endpoint, Registry, discover::discover, memory::MemoryRegistry};
/// use tower::discover::Change;
///
/// let reg = Arc::new(MemoryRegistry::new());
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 8080)).await?;
/// reg.register(Endpoint::new("search", "s", "127.0.0.1", 9200)).await?;
///
/// // A "service" here is just the address; in real code a client for it.
/// let mut changes = discover(Arc::clone(&reg), |ep| format!("{}:{}", ep.address, ep.port))
///     .service("api");
/// let Some(Change::Insert(key, addr)) = changes.try_next().await? else { panic!() };
/// assert_eq!((key.id.as_str(), addr.as_str()), ("a", "127.0.0.1:8080"));
///
/// reg.deregister(&key).await?;
/// let Some(Change::Remove(gone)) = changes.try_next().await? else { panic!() };
/// assert_eq!(gone, key);
/// # Ok::<(), waypost::Error>(()) });
/// ```
///
/// Feeding a balancer (`tower` with the `balance` feature): each endpoint
/// becomes a client wrapped in a `tower::load` measure.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use waypost::{Endpoint, Registry, discover::discover, memory::MemoryRegistry};
/// use tower::{balance::p2c::Balance, load::Constant, service_fn, Service, ServiceExt};
///
/// let reg = Arc::new(MemoryRegistry::new());
/// reg.register(Endpoint::new("api", "a", "127.0.0.1", 8080)).await?;
///
/// // Stands in for a real client of `ep` (an HTTP or gRPC channel).
/// let client = |ep: &Endpoint| {
///     let addr = format!("{}:{}", ep.address, ep.port);
///     Constant::new(service_fn(move |req: String| {
///         let addr = addr.clone();
///         async move { Ok::<_, std::convert::Infallible>(format!("{addr} answered {req}")) }
///     }), 1)
/// };
/// let mut balancer = Balance::new(discover(reg, client).service("api"));
/// let answer = balancer.ready().await.unwrap().call("ping".to_string()).await.unwrap();
/// assert_eq!(answer, "127.0.0.1:8080 answered ping");
/// # Ok::<(), waypost::Error>(()) });
/// ```
pub fn discover<W, S>(watch: W, make: impl Fn(&Endpoint) -> S + Send + 'static) -> Discovery<S>
where
    W: Watch,
{
    let events = crate::backend::resume_with_backoff(
        Arc::new(watch),
        None,
        Duration::from_millis(100),
        Duration::from_secs(5),
    );
    let mut d = Discovery::build(events, make);
    d.skip_errors = true;
    d
}

/// The endpoints of a watch as a stream of [`Change`]s, which is what
/// [`tower::discover::Discover`] is; made by [`discover`] or
/// [`Discovery::from_stream`].
///
/// - **Filters.** An endpoint is a service when it passes all of: the
///   service name set with [`service`](Discovery::service) (default: every
///   service), health (default: healthy only; see
///   [`include_unhealthy`](Discovery::include_unhealthy); a
///   [draining](Health::Draining) endpoint is never inserted, so a
///   balancer starts nothing new on it) and the predicate set with
///   [`filter`](Discovery::filter).
/// - **Zone.** With [`prefer_zone`](Discovery::prefer_zone), only the
///   endpoints in the caller's zone are inserted while the zone holds its
///   floor ([`ZonePreference`]); when it falls below, every endpoint is
///   inserted (spread), and when it is back, the others are removed.
/// - **Weights** are the endpoints' own ([`Endpoint::weight`]), read from
///   [`endpoint`](Discovery::endpoint); [`crate::balance::WeightedBalance`]
///   picks by them.
/// - **Deltas.** `Added` or `Updated` of an endpoint that passes and was not
///   inserted is a [`Change::Insert`]; of one that no longer passes (it
///   turned unhealthy, say) a [`Change::Remove`]. An `Updated` endpoint that
///   was inserted and still passes is a `Remove` then an `Insert` with a new
///   service when its address, port or protocol changed (see
///   [`rebuild_if`](Discovery::rebuild_if)), and nothing otherwise.
///   `Removed` of an inserted key is a `Remove`.
/// - **Snapshots** (the first one, and fresh ones after a resync) are diffed
///   against what was inserted before: only real changes come out, removals
///   first, so a balancer does not drop and rebuild its connections on every
///   resync.
///
/// A key is never inserted twice without a `Remove` in between.
///
/// The stream yields `Result<Change<EndpointKey, S>, waypost::Error>`.
/// Made by [`discover`], it never yields an error (it watches again); made
/// by [`from_stream`](Discovery::from_stream), it passes the stream's first
/// error on and ends there, or when the stream ends.
pub struct Discovery<S> {
    stream: EventStream,
    /// Log the stream's errors instead of passing them on (a stream that
    /// resumes by itself).
    skip_errors: bool,
    make: MakeFn<S>,
    service: Option<String>,
    healthy_only: bool,
    filter: Option<FilterFn>,
    zone: Option<ZonePreference>,
    rebuild: RebuildFn,
    /// Every endpoint that passes the filters, as last seen.
    candidates: BTreeMap<EndpointKey, Endpoint>,
    /// What was inserted, as last seen (its service made from the value
    /// it had when inserted or rebuilt).
    inserted: BTreeMap<EndpointKey, Endpoint>,
    pending: VecDeque<Change<EndpointKey, S>>,
    version: Option<Version>,
    done: bool,
}

// Nothing inside is ever pinned in place: the event stream is boxed.
impl<S> Unpin for Discovery<S> {}

impl<S> Discovery<S> {
    /// Changes from one stream of events (such as `watch.watch(None)`, or
    /// `futures::stream::iter(vec![...])` in a test). Errors of the stream
    /// are passed on; the `Discovery` ends when the stream ends.
    pub fn from_stream(
        events: impl Stream<Item = Result<Event>> + Send + 'static,
        make: impl Fn(&Endpoint) -> S + Send + 'static,
    ) -> Self {
        Self::build(events.boxed(), make)
    }

    fn build(stream: EventStream, make: impl Fn(&Endpoint) -> S + Send + 'static) -> Self {
        Self {
            stream,
            skip_errors: false,
            make: Box::new(make),
            service: None,
            healthy_only: true,
            filter: None,
            zone: None,
            rebuild: Box::new(|old, new| {
                old.address != new.address || old.port != new.port || old.protocol != new.protocol
            }),
            candidates: BTreeMap::new(),
            inserted: BTreeMap::new(),
            pending: VecDeque::new(),
            version: None,
            done: false,
        }
    }

    /// Only endpoints of `service`.
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// Also insert endpoints marked [`Health::Unhealthy`] (by default they
    /// are left out, and an endpoint turning unhealthy is removed).
    /// Draining endpoints stay out either way.
    pub fn include_unhealthy(mut self) -> Self {
        self.healthy_only = false;
        self
    }

    /// Only endpoints for which `keep` is true (on top of the service name
    /// and health). Evaluated on every change, so an endpoint whose labels
    /// change can come and go.
    pub fn filter(mut self, keep: impl Fn(&Endpoint) -> bool + Send + 'static) -> Self {
        self.filter = Some(Box::new(keep));
        self
    }

    /// Keep new work in the caller's zone while it holds the floor of
    /// `pref` (see [`ZonePreference`]): only the endpoints of that zone
    /// are inserted then, and every endpoint otherwise. Whether the zone
    /// holds is judged on the healthy endpoints that pass the other
    /// filters, again at every change.
    pub fn prefer_zone(mut self, pref: ZonePreference) -> Self {
        self.zone = Some(pref);
        self
    }

    /// When an inserted endpoint is updated and still passes the filters,
    /// its service is replaced (a `Remove`, then an `Insert` made from the
    /// new value) if `rebuild(old, new)` is true. Default: when the address,
    /// port or protocol changed; a label-only change keeps the service.
    pub fn rebuild_if(
        mut self,
        rebuild: impl Fn(&Endpoint, &Endpoint) -> bool + Send + 'static,
    ) -> Self {
        self.rebuild = Box::new(rebuild);
        self
    }

    /// The endpoints inserted and not removed, as last seen (a label-only
    /// change, such as a new weight, shows here without a new service),
    /// ordered by key. Changes not yet taken from the stream are already
    /// counted.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        self.inserted.values()
    }

    /// The inserted endpoint under `key`, as last seen.
    pub fn endpoint(&self, key: &EndpointKey) -> Option<&Endpoint> {
        self.inserted.get(key)
    }

    /// Number of endpoints inserted and not removed.
    pub fn len(&self) -> usize {
        self.inserted.len()
    }

    /// Whether no endpoint is inserted.
    pub fn is_empty(&self) -> bool {
        self.inserted.is_empty()
    }

    /// The version of the last event seen.
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    fn wants(&self, ep: &Endpoint) -> bool {
        self.service.as_deref().is_none_or(|s| ep.service == s)
            && ep.health != Health::Draining
            && (!self.healthy_only || ep.health == Health::Healthy)
            && self.filter.as_ref().is_none_or(|f| f(ep))
    }

    /// Whether the preferred zone holds its floor among the candidates
    /// (`None` without a preference).
    fn zone_holds(&self) -> Option<bool> {
        let pref = self.zone.as_ref()?;
        Some(
            pref.holds(
                self.candidates
                    .values()
                    .filter(|e| e.health == Health::Healthy),
            ),
        )
    }

    /// Whether a candidate is inserted, given whether the zone holds.
    fn selected(&self, holds: Option<bool>, ep: &Endpoint) -> bool {
        match (&self.zone, holds) {
            (Some(pref), Some(holds)) => pref.admits(holds, ep),
            _ => true,
        }
    }

    fn insert(&mut self, ep: &Endpoint) {
        let key = ep.key();
        self.pending
            .push_back(Change::Insert(key.clone(), (self.make)(ep)));
        self.inserted.insert(key, ep.clone());
    }

    fn remove(&mut self, key: &EndpointKey) {
        if self.inserted.remove(key).is_some() {
            self.pending.push_back(Change::Remove(key.clone()));
        }
    }

    /// Bring what is inserted under `key` to the candidate's state (the
    /// path of one change without a zone preference).
    fn reconcile_key(&mut self, key: &EndpointKey) {
        let Some(ep) = self.candidates.get(key).cloned() else {
            self.remove(key);
            return;
        };
        match self.inserted.get(key) {
            None => self.insert(&ep),
            Some(old) if (self.rebuild)(old, &ep) => {
                self.remove(key);
                self.insert(&ep);
            }
            Some(_) => {
                self.inserted.insert(key.clone(), ep);
            }
        }
    }

    /// Bring everything inserted to the candidates as selected: removals
    /// first, then insertions (rebuilt endpoints included).
    fn reconcile_all(&mut self) {
        let holds = self.zone_holds();
        let gone: Vec<EndpointKey> = self
            .inserted
            .keys()
            .filter(|k| {
                !self
                    .candidates
                    .get(k)
                    .is_some_and(|ep| self.selected(holds, ep))
            })
            .cloned()
            .collect();
        for key in &gone {
            self.remove(key);
        }
        let mut fresh = Vec::new();
        for ep in self.candidates.values() {
            if !self.selected(holds, ep) {
                continue;
            }
            match self.inserted.get(&ep.key()) {
                None => fresh.push(ep.clone()),
                Some(old) if (self.rebuild)(old, ep) => fresh.push(ep.clone()),
                Some(_) => {}
            }
        }
        for ep in &fresh {
            self.remove(&ep.key());
        }
        for ep in &fresh {
            self.insert(ep);
        }
        // Label-only changes: keep the value as last seen.
        for (key, ep) in self.inserted.iter_mut() {
            if let Some(now) = self.candidates.get(key) {
                if now != ep {
                    *ep = now.clone();
                }
            }
        }
    }

    fn resync(&mut self, snap: &Snapshot) {
        let eps: Vec<&Endpoint> = match &self.service {
            Some(s) => snap.service(s).collect(),
            None => snap.iter().collect(),
        };
        self.candidates = eps
            .into_iter()
            .filter(|ep| self.wants(ep))
            .map(|ep| (ep.key(), ep.clone()))
            .collect();
        self.reconcile_all();
    }

    fn change(&mut self, key: EndpointKey, now: Option<&Endpoint>) {
        match now.filter(|ep| self.wants(ep)) {
            Some(ep) => self.candidates.insert(key.clone(), ep.clone()),
            None => self.candidates.remove(&key),
        };
        if self.zone.is_some() {
            self.reconcile_all();
        } else {
            self.reconcile_key(&key);
        }
    }

    fn apply(&mut self, ev: &Event) {
        self.version = Some(ev.version());
        match ev {
            Event::Snapshot(snap) => self.resync(snap),
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                self.change(endpoint.key(), Some(endpoint))
            }
            Event::Removed { key, .. } => self.change(key.clone(), None),
        }
    }
}

impl<S> Stream for Discovery<S> {
    type Item = Result<Change<EndpointKey, S>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(change) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(change)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match futures::ready!(this.stream.poll_next_unpin(cx)) {
                Some(Ok(ev)) => this.apply(&ev),
                Some(Err(e)) if this.skip_errors => {
                    tracing::warn!(error = %e, resume_from = ?this.version, "discovery's watch failed; keeping the endpoints it has");
                }
                Some(Err(e)) => {
                    // A plain stream's failure ends the discovery.
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.done = true,
            }
        }
    }
}

impl<S> fmt::Debug for Discovery<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Discovery")
            .field("service", &self.service)
            .field("healthy_only", &self.healthy_only)
            .field("zone", &self.zone)
            .field("inserted", &self.inserted.len())
            .field("pending", &self.pending.len())
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "discover_tests.rs"]
mod tests;
