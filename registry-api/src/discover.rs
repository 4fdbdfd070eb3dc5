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
///   [`include_unhealthy`](Discovery::include_unhealthy)) and the predicate
///   set with [`filter`](Discovery::filter).
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
    rebuild: RebuildFn,
    /// What was inserted, as it was when its service was made.
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
            rebuild: Box::new(|old, new| {
                old.address != new.address || old.port != new.port || old.protocol != new.protocol
            }),
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

    /// The endpoints inserted and not removed, as they were when their
    /// services were made, ordered by key. Changes not yet taken from the
    /// stream are already counted.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        self.inserted.values()
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
            && (!self.healthy_only || ep.health == Health::Healthy)
            && self.filter.as_ref().is_none_or(|f| f(ep))
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

    /// Bring what is inserted to `ep` (present, with this value).
    fn upsert(&mut self, ep: &Endpoint) {
        if !self.wants(ep) {
            self.remove(&ep.key());
            return;
        }
        match self.inserted.get(&ep.key()) {
            None => self.insert(ep),
            Some(old) if (self.rebuild)(old, ep) => {
                self.remove(&ep.key());
                self.insert(ep);
            }
            Some(_) => {}
        }
    }

    fn resync(&mut self, snap: &Snapshot) {
        let gone: Vec<EndpointKey> = self
            .inserted
            .keys()
            .filter(|k| !snap.get(k).is_some_and(|ep| self.wants(ep)))
            .cloned()
            .collect();
        for key in &gone {
            self.remove(key);
        }
        let service = self.service.clone();
        let candidates: Vec<&Endpoint> = match &service {
            Some(s) => snap.service(s).collect(),
            None => snap.iter().collect(),
        };
        // Rebuilt endpoints: remove all first, so every removal comes
        // before every insertion.
        let mut fresh = Vec::new();
        for ep in candidates {
            if !self.wants(ep) {
                continue;
            }
            match self.inserted.get(&ep.key()) {
                None => fresh.push(ep),
                Some(old) if (self.rebuild)(old, ep) => {
                    self.remove(&ep.key());
                    fresh.push(ep);
                }
                Some(_) => {}
            }
        }
        for ep in fresh {
            self.insert(ep);
        }
    }

    fn apply(&mut self, ev: &Event) {
        self.version = Some(ev.version());
        match ev {
            Event::Snapshot(snap) => self.resync(snap),
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                self.upsert(endpoint)
            }
            Event::Removed { key, .. } => self.remove(key),
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
            .field("inserted", &self.inserted.len())
            .field("pending", &self.pending.len())
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::error::Error;
    use crate::testing::ep;
    use futures::stream;

    fn added(v: u64, e: Endpoint) -> Result<Event> {
        Ok(Event::Added {
            version: Version(v),
            endpoint: e,
        })
    }

    fn updated(v: u64, e: Endpoint) -> Result<Event> {
        Ok(Event::Updated {
            version: Version(v),
            endpoint: e,
        })
    }

    fn removed(v: u64, e: &Endpoint) -> Result<Event> {
        Ok(Event::Removed {
            version: Version(v),
            key: e.key(),
        })
    }

    fn snap(v: u64, eps: impl IntoIterator<Item = Endpoint>) -> Result<Event> {
        Ok(Event::Snapshot(Snapshot::from_endpoints(Version(v), eps)))
    }

    /// The changes as `+id:port` / `-id`, the service being the port.
    async fn run(d: Discovery<u16>) -> Vec<String> {
        d.map(|c| match c.unwrap() {
            Change::Insert(k, port) => format!("+{}:{port}", k.id),
            Change::Remove(k) => format!("-{}", k.id),
        })
        .collect()
        .await
    }

    fn from(events: Vec<Result<Event>>) -> Discovery<u16> {
        Discovery::from_stream(stream::iter(events), |e| e.port)
    }

    #[tokio::test]
    async fn first_snapshot_inserts_then_deltas() {
        let a = ep("api", "a", 1);
        let d = from(vec![
            snap(1, [a.clone(), ep("api", "b", 2)]),
            added(2, ep("api", "c", 3)),
            removed(3, &a),
            removed(4, &ep("api", "never", 9)),
        ]);
        assert_eq!(run(d).await, ["+a:1", "+b:2", "+c:3", "-a"]);
    }

    #[tokio::test]
    async fn resync_snapshot_yields_only_the_difference() {
        let d = from(vec![
            snap(1, [ep("api", "a", 1), ep("api", "b", 2), ep("api", "c", 3)]),
            // a unchanged, b gone, c moved to a new port, d new.
            snap(
                9,
                [ep("api", "a", 1), ep("api", "c", 30), ep("api", "d", 4)],
            ),
            // The same again: nothing.
            snap(
                10,
                [ep("api", "a", 1), ep("api", "c", 30), ep("api", "d", 4)],
            ),
        ]);
        assert_eq!(
            run(d).await,
            ["+a:1", "+b:2", "+c:3", "-b", "-c", "+c:30", "+d:4"]
        );
    }

    #[tokio::test]
    async fn health_changes_remove_and_insert() {
        let a = ep("api", "a", 1);
        let sick = a.clone().with_health(Health::Unhealthy);
        let d = from(vec![
            snap(
                1,
                [a.clone(), ep("api", "b", 2).with_health(Health::Unhealthy)],
            ),
            updated(2, sick.clone()),
            updated(3, sick.clone()),
            updated(4, a.clone()),
            snap(5, [sick]),
        ]);
        assert_eq!(run(d).await, ["+a:1", "-a", "+a:1", "-a"]);
    }

    #[tokio::test]
    async fn include_unhealthy_keeps_them() {
        let a = ep("api", "a", 1);
        let d = from(vec![
            snap(1, [a.clone().with_health(Health::Unhealthy)]),
            updated(2, a),
        ])
        .include_unhealthy();
        assert_eq!(run(d).await, ["+a:1"]);
    }

    #[tokio::test]
    async fn updates_rebuild_only_on_address_changes() {
        let a = ep("api", "a", 1);
        let d = from(vec![
            added(1, a.clone()),
            updated(2, a.clone().with_label("weight", "5")),
            updated(3, a.clone().with_label("weight", "5")),
            updated(4, ep("api", "a", 11)),
            updated(5, Endpoint::new("api", "a", "127.0.0.2", 11)),
        ]);
        assert_eq!(run(d).await, ["+a:1", "-a", "+a:11", "-a", "+a:11"]);

        let d = from(vec![
            added(1, a.clone()),
            updated(2, a.clone().with_label("weight", "5")),
        ])
        .rebuild_if(|old, new| old != new);
        assert_eq!(run(d).await, ["+a:1", "-a", "+a:1"]);
    }

    #[tokio::test]
    async fn service_and_filter() {
        let d = from(vec![
            snap(
                1,
                [
                    ep("api", "a", 1).with_label("zone", "x"),
                    ep("api", "b", 2).with_label("zone", "y"),
                    ep("search", "s", 3).with_label("zone", "x"),
                ],
            ),
            added(2, ep("search", "t", 4).with_label("zone", "x")),
            // a leaves zone x: removed; b joins it: inserted.
            updated(3, ep("api", "a", 1).with_label("zone", "y")),
            updated(4, ep("api", "b", 2).with_label("zone", "x")),
        ])
        .service("api")
        .filter(|e| e.labels.get("zone").map(String::as_str) == Some("x"));
        assert_eq!(run(d).await, ["+a:1", "-a", "+b:2"]);
    }

    #[tokio::test]
    async fn errors_pass_through_from_a_plain_stream() {
        let mut d = from(vec![
            added(1, ep("api", "a", 1)),
            Err(Error::unavailable("backend down")),
            added(2, ep("api", "b", 2)),
        ]);
        assert!(matches!(d.next().await, Some(Ok(Change::Insert(..)))));
        assert!(d.next().await.unwrap().is_err());
        assert_eq!(d.len(), 1);
        assert!(d.next().await.is_none());
        assert!(d.next().await.is_none(), "stays ended");
    }

    #[tokio::test(start_paused = true)]
    async fn discover_watches_again_after_an_error_and_diffs_the_snapshot() {
        use std::sync::Mutex;

        /// Streams still to hand out, and the `from` of each call.
        type Script = (Vec<Vec<Result<Event>>>, Vec<Option<Version>>);
        /// Hands out prepared streams, recording the `from` of each call.
        struct Scripted(Mutex<Script>);
        impl Watch for Scripted {
            fn watch(&self, from: Option<Version>) -> EventStream {
                let mut s = self.0.lock().unwrap();
                s.1.push(from);
                if s.0.is_empty() {
                    return stream::pending().boxed();
                }
                // A prepared stream ends after its last item, as a watch
                // does after a failure it does not retry itself.
                stream::iter(s.0.remove(0)).boxed()
            }
        }
        let a = ep("api", "a", 1);
        let b = ep("api", "b", 2);
        let scripted = Arc::new(Scripted(Mutex::new((
            vec![
                vec![
                    snap(1, [a.clone()]),
                    added(2, b.clone()),
                    Err(Error::unavailable("lost")),
                ],
                // The source lost history: a fresh snapshot without a.
                vec![snap(7, [b.clone()])],
            ],
            Vec::new(),
        ))));
        let mut d = discover(Arc::clone(&scripted), |e| e.port);
        let mut seen = Vec::new();
        for _ in 0..3 {
            match d.next().await.unwrap().unwrap() {
                Change::Insert(k, _) => seen.push(format!("+{}", k.id)),
                Change::Remove(k) => seen.push(format!("-{}", k.id)),
            }
        }
        assert_eq!(seen, ["+a", "+b", "-a"]);
        assert_eq!(d.version(), Some(Version(7)));
        assert_eq!(scripted.0.lock().unwrap().1, [None, Some(Version(2))]);
        assert_eq!(
            d.endpoints().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
    }
}
