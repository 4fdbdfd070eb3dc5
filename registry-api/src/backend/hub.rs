//! [`Hub`]: one upstream of events fanned out to many subscribers.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::stream::{self, StreamExt};
use tokio::sync::{mpsc, watch};

use super::history::History;
use crate::error::{Error, Result};
use crate::model::{Endpoint, EndpointKey, Version};
use crate::snapshot::{Event, Snapshot};
use crate::traits::EventStream;

/// Sees what a [`Hub`] publishes, synchronously, while the hub holds its
/// lock ([`Hub::observe`]): one call per event, in publishing order, with
/// the state just before it. For fanning events out to many readers
/// without a subscription (and a copy of every event) each; an observer
/// must be quick and must not call back into the hub.
pub trait Observer: Send + Sync {
    /// `event` is published; `before` is the state it applies to.
    fn event(&self, event: &Event, before: &Snapshot);
    /// The source reported `error` ([`Hub::report_error`]).
    fn failed(&self, error: &Error) {
        let _ = error;
    }
}

/// The current state of a registry plus its live subscribers.
///
/// One writer [`publish`](Hub::publish)es events; any number of readers
/// [`subscribe`](Hub::subscribe) (a snapshot, or the missed deltas when
/// resuming from a version the hub still holds, then every change) or read
/// the [`current`](Hub::current) snapshot without waiting on the writer.
///
/// Each subscriber has a bounded buffer. One that falls behind by more than
/// that is cut off: its stream yields an [`Error::Overloaded`] and ends, and
/// it must resubscribe (getting a fresh snapshot or the deltas it missed).
/// The writer never waits for a subscriber, so one slow reader never stalls
/// the rest.
///
/// A hub made with [`Hub::pending`] has no state yet: subscribers wait until
/// the first published `Snapshot`.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use waypost::backend::Hub;
/// use waypost::{Endpoint, Event, Version};
/// let hub = Arc::new(Hub::new(16, 128));
/// let mut sub = hub.subscribe(None);
/// hub.publish([Event::Added { version: Version(1), endpoint: Endpoint::new("s", "a", "h", 1) }]);
/// assert!(matches!(sub.next().await, Some(Ok(Event::Snapshot(_)))));
/// assert!(matches!(sub.next().await, Some(Ok(Event::Added { .. }))));
/// assert_eq!(hub.current().len(), 1);
/// # });
/// ```
pub struct Hub {
    current: ArcSwap<Current>,
    state: Mutex<HubState>,
    buffer: usize,
    ready: watch::Sender<bool>,
    changed: watch::Sender<()>,
}

/// The state readers see: the snapshot, and the lists of the services
/// readers asked for, shared between them ([`Hub::shared_list`]). Replaced
/// whole by every publish; a reader adds a list by compare-and-swap.
struct Current {
    snap: Arc<Snapshot>,
    /// Only non-empty lists of services in `snap`, so the memo never holds
    /// more entries than there are services, whatever names readers ask
    /// for.
    lists: imbl::HashMap<Arc<str>, Arc<[Endpoint]>>,
}

impl Current {
    fn new(snap: Snapshot) -> Self {
        Self {
            snap: Arc::new(snap),
            lists: imbl::HashMap::new(),
        }
    }
}

/// Drop from `lists` the list of the service `event` changes (all of them
/// for a snapshot).
fn forget(lists: &mut imbl::HashMap<Arc<str>, Arc<[Endpoint]>>, event: &Event) {
    if lists.is_empty() {
        return;
    }
    match event {
        Event::Snapshot(_) => lists.clear(),
        Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
            lists.remove(endpoint.service.as_str());
        }
        Event::Removed { key, .. } => {
            lists.remove(key.service.as_str());
        }
    }
}

struct HubState {
    history: History,
    subscribers: Vec<Subscriber>,
    observers: Vec<Arc<dyn Observer>>,
    /// The endpoints the last removals took away, oldest first: as many as
    /// a subscriber can still be behind (its buffer plus the history), so
    /// whoever turns a queued [`Event::Removed`] into a message can still
    /// tell what was removed ([`Hub::removed`]).
    removed: VecDeque<(Version, Endpoint)>,
    removed_cap: usize,
}

struct Subscriber {
    tx: mpsc::Sender<Result<Event>>,
    cut_off: Arc<AtomicBool>,
}

impl Hub {
    /// Events buffered per subscriber unless configured: 1024.
    pub const DEFAULT_BUFFER: usize = 1024;

    /// An empty hub at version 0: `buffer` events per subscriber, `history`
    /// deltas kept for resuming.
    pub fn new(buffer: usize, history: usize) -> Self {
        let hub = Self::pending(buffer, history);
        hub.ready.send_replace(true);
        hub
    }

    /// A hub without state: subscribers wait until the first published
    /// [`Event::Snapshot`], and [`Hub::is_ready`] is false until then.
    pub fn pending(buffer: usize, history: usize) -> Self {
        Self {
            current: ArcSwap::from_pointee(Current::new(Snapshot::empty(Version::ZERO))),
            state: Mutex::new(HubState {
                history: History::new(history, Version::ZERO),
                subscribers: Vec::new(),
                observers: Vec::new(),
                removed: VecDeque::new(),
                removed_cap: buffer.max(1).saturating_add(history),
            }),
            buffer: buffer.max(1),
            ready: watch::channel(false).0,
            changed: watch::channel(()).0,
        }
    }

    /// Whether the hub holds a state (always true for [`Hub::new`]).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // State is only replaced whole after each step; a panic elsewhere
        // cannot leave it half-written.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current state. Never waits for the writer.
    pub fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&self.current.load().snap)
    }

    /// The endpoints of `service` in the current state, shared: the first
    /// call after a change to the service builds the list, every later one
    /// (from any thread) gets the same allocation, until a change to that
    /// service. Changes to other services keep it. Costs a hash lookup and
    /// a reference count when the list is built; O(log n + k) otherwise.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use waypost::backend::Hub;
    /// use waypost::{Endpoint, Event, Version};
    /// let hub = Hub::new(16, 16);
    /// let ep = |s: &str, id: &str| Endpoint::new(s, id, "10.0.0.1", 80);
    /// hub.publish([Event::Added { version: Version(1), endpoint: ep("api", "a") }]);
    /// let first = hub.shared_list("api");
    /// assert!(Arc::ptr_eq(&first, &hub.shared_list("api")));
    /// hub.publish([Event::Added { version: Version(2), endpoint: ep("db", "b") }]);
    /// assert!(Arc::ptr_eq(&first, &hub.shared_list("api"))); // another service changed
    /// hub.publish([Event::Added { version: Version(3), endpoint: ep("api", "c") }]);
    /// assert_eq!(hub.shared_list("api").len(), 2);
    /// ```
    pub fn shared_list(&self, service: &str) -> Arc<[Endpoint]> {
        let seen = self.current.load();
        if let Some(list) = seen.lists.get(service) {
            return Arc::clone(list);
        }
        let list: Arc<[Endpoint]> = seen.snap.service(service).cloned().collect();
        if !list.is_empty() {
            let mut lists = seen.lists.clone();
            lists.insert(Arc::from(service), Arc::clone(&list));
            let next = Arc::new(Current {
                snap: Arc::clone(&seen.snap),
                lists,
            });
            // Fails when a publish (or another reader) came first; the list
            // is still right for the state read, and is built again later.
            let _ = self.current.compare_and_swap(&seen, next);
        }
        list
    }

    /// The endpoint that the removal of `key` at `version` took away, while
    /// it is among the last removals a subscriber can still receive (its
    /// buffer plus the history); `None` otherwise, or when the key was not
    /// there.
    pub fn removed(&self, version: Version, key: &EndpointKey) -> Option<Endpoint> {
        let st = self.lock();
        // Newest last and versions grow: a stream reading recent events
        // finds its removal after a few steps, not a scan of the window.
        st.removed
            .iter()
            .rev()
            .skip_while(|(v, _)| *v > version)
            .take_while(|(v, _)| *v == version)
            .find(|(_, e)| e.service == key.service && e.id == key.id)
            .map(|(_, e)| e.clone())
    }

    /// Call `observer` with every event published from now on, in order,
    /// and every failure reported (see [`Observer`]).
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        self.lock().observers.push(observer);
    }

    /// Run `f` on the current state (`None` before the first snapshot)
    /// while no event is published: whatever `f` sets up (for instance a
    /// subscription an [`Observer`] feeds) starts exactly after that state.
    /// `f` must not call back into the hub.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use waypost::backend::Hub;
    /// use waypost::Version;
    /// let hub = Hub::new(16, 16);
    /// assert_eq!(hub.with_current(|s| s.map(|s| s.version())), Some(Version::ZERO));
    /// assert!(Hub::pending(16, 16).with_current(|s| s.is_none()));
    /// ```
    pub fn with_current<T>(&self, f: impl FnOnce(Option<&Arc<Snapshot>>) -> T) -> T {
        let _st = self.lock();
        let current = self.current.load();
        f(self.is_ready().then_some(&current.snap))
    }

    /// How many subscribers are connected.
    pub fn subscriber_count(&self) -> usize {
        self.lock().subscribers.len()
    }

    /// Apply `events` to the state and send them to every subscriber. A
    /// `Snapshot` replaces the state and restarts the history. Subscribers
    /// whose buffer is full are cut off; closed ones are dropped.
    pub fn publish(&self, events: impl IntoIterator<Item = Event>) {
        let mut st = self.lock();
        let before = self.current.load_full();
        let mut snap = Snapshot::clone(&before.snap);
        let mut lists = before.lists.clone();
        for ev in events {
            for o in &st.observers {
                o.event(&ev, &snap);
            }
            forget(&mut lists, &ev);
            if let Event::Removed { version, key } = &ev {
                if let Some(gone) = snap.get(key) {
                    if st.removed.len() >= st.removed_cap {
                        st.removed.pop_front();
                    }
                    st.removed.push_back((*version, gone.clone()));
                }
            }
            snap.apply(&ev);
            match &ev {
                Event::Snapshot(s) => {
                    st.history.reset(s.version());
                    self.ready.send_replace(true);
                }
                _ => st.history.push(ev.clone()),
            }
            self.send_all(&mut st, Ok(ev));
        }
        // Swapped while the lock is held, so a subscriber's initial events
        // and the live ones meet exactly.
        self.current.store(Arc::new(Current {
            snap: Arc::new(snap),
            lists,
        }));
        self.changed.send_replace(());
    }

    /// Tell every subscriber that the source is failing: each gets
    /// `Err(error)` and stays subscribed (see [`crate::Watch::watch`]). The
    /// source publishes a fresh [`Event::Snapshot`] once it is healthy
    /// again, which subscribers take as the end of the failure. The state
    /// and the history are unchanged.
    pub fn report_error(&self, error: Error) {
        let mut st = self.lock();
        for o in &st.observers {
            o.failed(&error);
        }
        self.send_all(&mut st, Err(error));
    }

    /// Send `item` to every subscriber, cutting off those that are full
    /// and dropping those that are gone.
    fn send_all(&self, st: &mut HubState, item: Result<Event>) {
        let buffer = self.buffer;
        st.subscribers
            .retain(|sub| match sub.tx.try_send(item.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    sub.cut_off.store(true, Ordering::SeqCst);
                    tracing::warn!(buffer, "watch subscriber fell behind and was cut off");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// A stream that yields once after the state changes (several changes
    /// between two polls yield once): for a reader that looks at the whole
    /// state again on each change, without a subscription's queue.
    pub fn changes(&self) -> tokio_stream::wrappers::WatchStream<()> {
        tokio_stream::wrappers::WatchStream::from_changes(self.changed.subscribe())
    }

    /// Wait until `cond` holds for the current state, at most `limit`.
    /// Returns whether it held.
    pub async fn wait_until(
        &self,
        mut cond: impl FnMut(&Snapshot) -> bool,
        limit: Duration,
    ) -> bool {
        let mut changed = self.changed.subscribe();
        let wait = async {
            loop {
                changed.borrow_and_update();
                if self.is_ready() && cond(&self.current.load().snap) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok() && cond(&self.current.load().snap)
    }

    /// A stream of the state from `from` (see [`crate::Watch::watch`]).
    /// On a ready hub the subscription is in place when this returns, so no
    /// later change is missed; on a pending one it starts once the first
    /// snapshot is published.
    pub fn subscribe(self: &Arc<Self>, from: Option<Version>) -> EventStream {
        if self.is_ready() {
            return self.subscribe_now(from);
        }
        let hub = Arc::clone(self);
        let mut ready = self.ready.subscribe();
        stream::once(async move {
            // The sender lives in `hub`, which this future holds.
            let _ = ready.wait_for(|r| *r).await;
            hub.subscribe_now(from)
        })
        .flatten()
        .boxed()
    }

    fn subscribe_now(&self, from: Option<Version>) -> EventStream {
        let (tx, rx) = mpsc::channel(self.buffer);
        let cut_off = Arc::new(AtomicBool::new(false));
        let initial = {
            let mut st = self.lock();
            let initial = st.history.since(from, &self.current.load().snap);
            st.subscribers.push(Subscriber {
                tx,
                cut_off: cut_off.clone(),
            });
            initial
        };
        let buffer = self.buffer;
        let live = stream::unfold(Some((rx, cut_off)), move |state| async move {
            let (mut rx, cut_off) = state?;
            match rx.recv().await {
                Some(item) => Some((item, Some((rx, cut_off)))),
                None if cut_off.load(Ordering::SeqCst) => Some((
                    Err(Error::overloaded(format!(
                        "watch subscriber fell more than {buffer} events behind and was cut \
                         off; resubscribe to get a fresh snapshot"
                    ))),
                    None,
                )),
                None => None,
            }
        });
        stream::iter(initial.into_iter().map(Ok))
            .chain(live)
            .boxed()
    }
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub")
            .field("version", &self.current.load().snap.version())
            .field("endpoints", &self.current.load().snap.len())
            .field("subscribers", &self.subscriber_count())
            .field("buffer", &self.buffer)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ep;

    /// Records what it sees: each event's version with the number of
    /// endpoints in the state before it, and failures.
    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl Observer for Seen {
        fn event(&self, event: &Event, before: &Snapshot) {
            let line = format!(
                "{} v{} after {}",
                event.type_name(),
                event.version().0,
                before.len()
            );
            self.0.lock().unwrap().push(line);
        }
        fn failed(&self, error: &Error) {
            self.0.lock().unwrap().push(format!("failed: {error}"));
        }
    }

    #[test]
    fn observers_see_each_event_with_the_state_before_it() {
        let hub = Hub::pending(4, 4);
        assert!(hub.with_current(|s| s.is_none()));
        let seen = Arc::new(Seen::default());
        hub.observe(Arc::clone(&seen) as Arc<dyn Observer>);
        hub.publish([Event::Snapshot(Snapshot::empty(Version(1)))]);
        hub.publish([
            Event::Added {
                version: Version(2),
                endpoint: ep("s", "a", 1),
            },
            Event::Added {
                version: Version(2),
                endpoint: ep("s", "b", 1),
            },
        ]);
        hub.report_error(Error::unavailable("backend down"));
        hub.publish([Event::Removed {
            version: Version(3),
            key: EndpointKey::new("s", "a"),
        }]);
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                "snapshot v1 after 0",
                "added v2 after 0",
                "added v2 after 1",
                "failed: unavailable: backend down",
                "removed v3 after 2",
            ]
        );
        assert_eq!(
            hub.with_current(|s| s.map(|s| (s.version(), s.len()))),
            Some((Version(3), 1))
        );
    }

    #[test]
    fn shared_lists_follow_every_change_to_their_service() {
        let hub = Hub::new(16, 16);
        let added = |v: u64, e: Endpoint| Event::Added {
            version: Version(v),
            endpoint: e,
        };
        hub.publish([added(1, ep("a", "1", 1)), added(2, ep("b", "1", 1))]);
        let a = hub.shared_list("a");
        let b = hub.shared_list("b");
        assert!(Arc::ptr_eq(&a, &hub.shared_list("a")));
        // Unknown services are not remembered.
        assert!(hub.shared_list("zz").is_empty());
        assert!(hub.current.load().lists.get("zz").is_none());
        // An update to `a` replaces its list and keeps `b`'s.
        hub.publish([Event::Updated {
            version: Version(3),
            endpoint: ep("a", "1", 2),
        }]);
        let a2 = hub.shared_list("a");
        assert_eq!(a2[0].port, 2);
        assert!(Arc::ptr_eq(&b, &hub.shared_list("b")));
        // A removal empties it.
        hub.publish([Event::Removed {
            version: Version(4),
            key: EndpointKey::new("a", "1"),
        }]);
        assert!(hub.shared_list("a").is_empty());
        // A snapshot replaces everything.
        hub.publish([Event::Snapshot(Snapshot::from_endpoints(
            Version(5),
            [ep("b", "1", 9)],
        ))]);
        assert_eq!(hub.shared_list("b")[0].port, 9);
        assert_eq!(*hub.shared_list("b"), *hub.current().list("b"));
    }

    #[test]
    fn removed_endpoints_are_kept_for_as_long_as_a_subscriber_can_lag() {
        // Buffer 2 + history 1: the last three removals are remembered.
        let hub = Hub::new(2, 1);
        hub.publish((1..=5u16).map(|i| Event::Added {
            version: Version(u64::from(i)),
            endpoint: ep("s", &format!("e{i}"), i),
        }));
        hub.publish((1..=4u16).map(|i| Event::Removed {
            version: Version(10 + u64::from(i)),
            key: EndpointKey::new("s", format!("e{i}")),
        }));
        let key = |i: u16| EndpointKey::new("s", format!("e{i}"));
        assert_eq!(hub.removed(Version(14), &key(4)).map(|e| e.port), Some(4));
        assert_eq!(hub.removed(Version(12), &key(2)).map(|e| e.port), Some(2));
        // The oldest fell out; a wrong version or key finds nothing.
        assert!(hub.removed(Version(11), &key(1)).is_none());
        assert!(hub.removed(Version(13), &key(4)).is_none());
        // Removing a key that is not there remembers nothing.
        hub.publish([Event::Removed {
            version: Version(20),
            key: key(9),
        }]);
        assert!(hub.removed(Version(20), &key(9)).is_none());
    }
}
