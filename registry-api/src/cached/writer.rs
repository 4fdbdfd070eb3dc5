//! [`Writer`]: how changes reach a [`super::CachedRegistry`]'s state, and
//! the [`UpstreamFilter`] hook.

use std::sync::{Arc, Mutex};

use crate::backend::{diff, Hub, VersionClock};
use crate::snapshot::{Event, Snapshot};

/// Decides what of the inner registry's news reaches the cache. An
/// optimistic overlay (the registrar's) uses it to keep its own writes over
/// older news of the same keys; see [`super::CachedConfig::with_filter`].
pub trait UpstreamFilter: Send + Sync + 'static {
    /// `ev` arrived from the inner registry after the first snapshot:
    /// return what to apply instead, `None` to drop it.
    fn filter(&self, ev: Event) -> Option<Event>;
    /// The cache is about to read the whole state again
    /// ([`super::CachedRegistry::resync`]): forget local state.
    fn reset(&self) {}
}

/// Applies changes to a cache's state and publishes them to its local
/// watchers, one change at a time. The cache's own task applies what the
/// inner registry sends; [`Writer::apply`] applies a change made here (for
/// example an optimistic write not yet echoed), for the holder of the
/// cache's [`super::LocalWrites`] only.
#[derive(Clone)]
pub(crate) struct Writer {
    hub: Arc<Hub>,
    /// Held while computing and publishing a change.
    lock: Arc<Mutex<()>>,
    /// The cache's own version numbers, when configured.
    clock: Option<Arc<VersionClock>>,
    filter: Option<Arc<dyn UpstreamFilter>>,
}

impl Writer {
    pub(super) fn new(
        hub: Arc<Hub>,
        local_versions: bool,
        filter: Option<Arc<dyn UpstreamFilter>>,
    ) -> Self {
        Self {
            hub,
            lock: Arc::new(Mutex::new(())),
            clock: local_versions.then(|| Arc::new(VersionClock::new())),
            filter,
        }
    }

    /// Apply a change made here (not from the inner registry): what it
    /// changes is published, renumbered with the cache's own versions when
    /// configured. Returns the events published (none before the first
    /// snapshot, none when it changes nothing).
    pub(crate) fn apply(&self, ev: Event) -> Vec<Event> {
        self.publish(ev, false, || true)
    }

    /// [`Writer::apply`] when `keep()`, asked under the publication lock.
    pub(crate) fn apply_if(&self, ev: Event, keep: impl FnOnce() -> bool) -> Vec<Event> {
        self.publish(ev, false, keep)
    }

    pub(super) fn apply_upstream(&self, ev: Event) -> Vec<Event> {
        self.publish(ev, true, || true)
    }

    pub(super) fn reset_filter(&self) {
        if let Some(f) = &self.filter {
            f.reset();
        }
    }

    fn publish(&self, ev: Event, upstream: bool, keep: impl FnOnce() -> bool) -> Vec<Event> {
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if !keep() {
            return Vec::new();
        }
        if !self.hub.is_ready() {
            let Event::Snapshot(snap) = ev else {
                return Vec::new();
            };
            let snap = match &self.clock {
                Some(c) => snap.at_version(c.next()),
                None => snap,
            };
            let first = vec![Event::Snapshot(snap)];
            self.hub.publish(first.clone());
            return first;
        }
        let ev = match (&self.filter, upstream) {
            (Some(f), true) => match f.filter(ev) {
                Some(ev) => ev,
                None => return Vec::new(),
            },
            _ => ev,
        };
        let mut events = effective(&self.hub.current(), ev);
        if let Some(c) = &self.clock {
            events = events
                .into_iter()
                .map(|e| e.with_version(c.next()))
                .collect();
        }
        if !events.is_empty() {
            self.hub.publish(events.clone());
        }
        events
    }
}

/// The events that bring `current` to what `ev` says, dropping what is
/// already true: repeats vanish, an upsert of a missing key is an add, and a
/// snapshot after the first becomes the deltas between the two.
fn effective(current: &Snapshot, ev: Event) -> Vec<Event> {
    match ev {
        Event::Snapshot(fresh) => diff(current, &fresh),
        Event::Added { version, endpoint } | Event::Updated { version, endpoint } => {
            match current.get(&endpoint.key()) {
                Some(old) if *old == endpoint => Vec::new(),
                Some(_) => vec![Event::Updated { version, endpoint }],
                None => vec![Event::Added { version, endpoint }],
            }
        }
        Event::Removed { version, key } => {
            if current.contains(&key) {
                vec![Event::Removed { version, key }]
            } else {
                Vec::new()
            }
        }
    }
}
