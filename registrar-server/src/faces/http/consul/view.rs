//! What Consul's routes need beyond the state, kept in step with it by an
//! observer of the registrar's store: each service's modify index (the
//! `X-Consul-Index` of a query on one service) and which endpoint holds
//! each check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use waypost::backend::Observer;
use waypost::{Endpoint, EndpointKey, Event, Snapshot};

use super::check;
use crate::engine::registrar::Registrar;

/// Per-service modify indexes and the check → endpoint map.
#[derive(Debug, Default)]
pub(crate) struct ConsulView {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The version of the last change to each service the state holds.
    services: HashMap<String, u64>,
    /// The index of a service the state holds nothing of: the first
    /// snapshot's version, raised to the version that removed each
    /// service's last endpoint (so a service's index never goes back, and
    /// the map holds only services that exist).
    floor: u64,
    /// Which endpoint holds each check id.
    checks: HashMap<String, EndpointKey>,
}

impl Inner {
    fn touch(&mut self, service: &str, version: u64) {
        match self.services.get_mut(service) {
            Some(v) => *v = version,
            None => {
                self.services.insert(service.to_string(), version);
            }
        }
    }

    fn gone(&mut self, service: &str, version: u64) {
        self.services.remove(service);
        self.floor = self.floor.max(version);
    }

    fn learn_checks(&mut self, e: &Endpoint) {
        for id in check::check_ids(e) {
            self.checks.insert(id.to_string(), e.key());
        }
    }

    fn forget_checks(&mut self, e: &Endpoint) {
        for id in check::check_ids(e) {
            if self
                .checks
                .get(id)
                .is_some_and(|k| k.service == e.service && k.id == e.id)
            {
                self.checks.remove(id);
            }
        }
    }

    /// A snapshot replaces `before`: services whose endpoints differ take
    /// its version; the check map is rebuilt.
    fn reset(&mut self, before: &Snapshot, after: &Snapshot) {
        let version = after.version().0;
        if self.floor == 0 {
            self.floor = version;
        }
        let mut names: Vec<&str> = before.services().collect();
        names.extend(after.services());
        names.sort_unstable();
        names.dedup();
        for name in names {
            if before.fingerprint(name) == after.fingerprint(name)
                && self.services.contains_key(name)
            {
                continue;
            }
            if after.service(name).next().is_some() {
                self.touch(name, version);
            } else {
                self.gone(name, version);
            }
        }
        self.checks.clear();
        for e in after.iter() {
            self.learn_checks(e);
        }
    }
}

impl ConsulView {
    /// A view of `registrar`'s state, kept current from now on.
    pub(crate) fn attach(registrar: &Registrar) -> Arc<Self> {
        let view = Arc::new(Self::default());
        let store = registrar.state().store();
        // Observe first, then take the state: what was published in between
        // is in both, and taking the state again is idempotent.
        store.observe(Arc::clone(&view) as _);
        store.with_state(|snap| {
            if let Some(s) = snap {
                view.lock()
                    .reset(&Snapshot::empty(waypost::Version::ZERO), s);
            }
        });
        view
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The modify index of `service`: the version of its last change (at
    /// least 1, as Consul's clients expect).
    pub(crate) fn index(&self, service: &str) -> u64 {
        let inner = self.lock();
        inner
            .services
            .get(service)
            .copied()
            .unwrap_or(inner.floor)
            .max(1)
    }

    /// The endpoint that holds check `id`.
    pub(crate) fn check_owner(&self, id: &str) -> Option<EndpointKey> {
        self.lock().checks.get(id).cloned()
    }

    /// Every check id with its endpoint.
    pub(crate) fn all_checks(&self) -> Vec<(String, EndpointKey)> {
        let inner = self.lock();
        inner
            .checks
            .iter()
            .map(|(id, k)| (id.clone(), k.clone()))
            .collect()
    }
}

impl Observer for ConsulView {
    fn event(&self, event: &Event, before: &Snapshot) {
        let mut inner = self.lock();
        match event {
            Event::Snapshot(s) => inner.reset(before, s),
            Event::Added { version, endpoint } | Event::Updated { version, endpoint } => {
                inner.touch(&endpoint.service, version.0);
                if let Some(old) = before.get(&endpoint.key()) {
                    inner.forget_checks(old);
                }
                inner.learn_checks(endpoint);
            }
            Event::Removed { version, key } => {
                if let Some(old) = before.get(key) {
                    inner.forget_checks(old);
                }
                let others = before.service(&key.service).any(|e| e.id != key.id);
                if others {
                    inner.touch(&key.service, version.0);
                } else {
                    inner.gone(&key.service, version.0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::Version;

    fn ep(service: &str, id: &str) -> Endpoint {
        waypost::testing::ep(service, id, 80)
    }

    fn apply(view: &ConsulView, state: &mut Snapshot, ev: Event) {
        view.event(&ev, state);
        state.apply(&ev);
    }

    #[test]
    fn a_service_keeps_its_own_index_and_it_never_goes_back() {
        let view = ConsulView::default();
        let mut state = Snapshot::empty(Version::ZERO);
        let first = Snapshot::from_endpoints(Version(10), [ep("web", "a"), ep("api", "a")]);
        apply(&view, &mut state, Event::Snapshot(first));
        assert_eq!((view.index("web"), view.index("api")), (10, 10));
        assert_eq!(view.index("unknown"), 10);

        let added = Event::Added {
            version: Version(11),
            endpoint: ep("api", "b"),
        };
        apply(&view, &mut state, added);
        assert_eq!((view.index("web"), view.index("api")), (10, 11));

        let removed = Event::Removed {
            version: Version(12),
            key: EndpointKey::new("web", "a"),
        };
        apply(&view, &mut state, removed);
        // The last endpoint of `web` went: it falls to the floor, which
        // rose to the removal's version.
        assert_eq!(view.index("web"), 12);
        assert_eq!(view.index("api"), 11);

        // A resync that changes only `api` moves only `api`.
        let resync = Snapshot::from_endpoints(Version(20), [ep("api", "a")]);
        apply(&view, &mut state, Event::Snapshot(resync));
        assert_eq!((view.index("web"), view.index("api")), (12, 20));
    }
}
