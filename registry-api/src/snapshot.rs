//! [`Snapshot`]: the whole registry at one version, immutable and cheap to
//! clone; and [`Event`], a change that brings a consumer from one snapshot to
//! the next.

use std::fmt;
use std::hash::Hash;
use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use imbl::OrdMap;

use crate::model::{Endpoint, EndpointKey, Version};

/// Every endpoint at one [`Version`].
///
/// A persistent ordered map underneath: cloning is O(1), and a changed copy
/// ([`Snapshot::with_event`]) shares all untouched structure with the
/// original, so caches can swap in a new snapshot per change without copying
/// the registry. Listing one service is O(log n + k).
///
/// ```
/// use waypost::{Endpoint, Snapshot, Version};
/// let snap = Snapshot::from_endpoints(
///     Version(7),
///     [Endpoint::new("api", "a", "10.0.0.1", 80), Endpoint::new("db", "b", "10.0.0.2", 5432)],
/// );
/// assert_eq!(snap.len(), 2);
/// assert_eq!(snap.service("api").count(), 1);
/// ```
#[derive(Clone, Default, PartialEq)]
pub struct Snapshot {
    version: Version,
    endpoints: OrdMap<EndpointKey, Entry>,
    /// Per service, the XOR of its endpoints' fingerprints and their
    /// count, kept with every change: two snapshots hold the same
    /// endpoints of a service when these agree (up to a 128-bit hash
    /// collision), so [`crate::backend::diff`] skips whole services.
    services: OrdMap<String, Sum>,
}

/// The fingerprint of a service's endpoints (see [`Snapshot`]).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct Sum {
    pub(crate) print: u128,
    pub(crate) count: u64,
}

impl Sum {
    /// What [`Snapshot::fingerprint`] says of the service.
    fn fingerprint(&self) -> u128 {
        self.print ^ u128::from(self.count).rotate_left(64)
    }
}

/// An endpoint with its fingerprint: a 128-bit hash of the whole endpoint
/// (key included), computed once when it enters a snapshot, so that
/// [`crate::backend::diff`] can pass over equal endpoints of two
/// independently built snapshots by comparing 16 bytes instead of every
/// field. The endpoint is behind an `Arc`, which keeps the map's nodes
/// small: a changed copy of a snapshot copies a node's entries as pointers,
/// and a walk over all entries reads a fraction of the memory.
#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) print: u128,
    pub(crate) endpoint: Arc<Endpoint>,
}

impl Entry {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            print: fingerprint(&endpoint),
            endpoint: Arc::new(endpoint),
        }
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.print == other.print
            && (Arc::ptr_eq(&self.endpoint, &other.endpoint) || self.endpoint == other.endpoint)
    }
}

/// XXH3-128 of `endpoint`'s `Hash` with a seed drawn once per process:
/// fingerprints are only compared within the process that made them, and
/// an unpredictable seed keeps anyone from choosing endpoints that collide.
fn fingerprint(endpoint: &Endpoint) -> u128 {
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(rand::random);
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(seed);
    endpoint.hash(&mut h);
    h.digest128()
}

impl Snapshot {
    /// An empty snapshot at `version`.
    pub fn empty(version: Version) -> Self {
        Self {
            version,
            endpoints: OrdMap::new(),
            services: OrdMap::new(),
        }
    }

    /// A snapshot holding `endpoints` (a later duplicate key wins).
    pub fn from_endpoints(version: Version, endpoints: impl IntoIterator<Item = Endpoint>) -> Self {
        let endpoints: OrdMap<EndpointKey, Entry> = endpoints
            .into_iter()
            .map(|e| (e.key(), Entry::new(e)))
            .collect();
        let mut services: OrdMap<String, Sum> = OrdMap::new();
        let mut current: Option<(&str, Sum)> = None;
        for (key, entry) in &endpoints {
            match &mut current {
                Some((name, sum)) if *name == key.service => {
                    sum.print ^= entry.print;
                    sum.count += 1;
                }
                _ => {
                    if let Some((name, sum)) = current.take() {
                        services.insert(name.to_owned(), sum);
                    }
                    current = Some((
                        &key.service,
                        Sum {
                            print: entry.print,
                            count: 1,
                        },
                    ));
                }
            }
        }
        if let Some((name, sum)) = current {
            services.insert(name.to_owned(), sum);
        }
        Self {
            version,
            endpoints,
            services,
        }
    }

    /// The version this snapshot reflects.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are no endpoints.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint with `key`, if present.
    pub fn get(&self, key: &EndpointKey) -> Option<&Endpoint> {
        self.endpoints.get(key).map(|e| &*e.endpoint)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &EndpointKey) -> bool {
        self.endpoints.contains_key(key)
    }

    /// All endpoints, ordered by key.
    pub fn iter(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        self.endpoints.values().map(|e| &*e.endpoint)
    }

    /// The endpoints whose key comes after `key` (all of them for `None`),
    /// ordered by key: a cursor for reading a snapshot in pieces. Costs
    /// O(log n) to start, then O(1) per endpoint.
    ///
    /// ```
    /// use waypost::{Endpoint, Snapshot, Version};
    /// let snap = Snapshot::from_endpoints(
    ///     Version(1),
    ///     ["a", "b", "c"].map(|id| Endpoint::new("api", id, "10.0.0.1", 80)),
    /// );
    /// let first: Vec<_> = snap.after(None).take(2).map(|e| e.key()).collect();
    /// let rest: Vec<_> = snap.after(first.last()).map(|e| e.id.clone()).collect();
    /// assert_eq!(rest, ["c"]);
    /// ```
    pub fn after<'a>(
        &'a self,
        key: Option<&EndpointKey>,
    ) -> impl Iterator<Item = &'a Endpoint> + 'a {
        let start = match key {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        self.endpoints
            .range((start, Bound::Unbounded))
            .map(|(_, v)| &*v.endpoint)
    }

    /// One page of the snapshot: at most `n` endpoints after `key` (from
    /// the first without one), in key order, and whether they are the last
    /// (nothing follows them). A snapshot sent in pages is read with the
    /// last key of each page, until a last page; an empty snapshot is one
    /// empty, last page.
    ///
    /// ```
    /// use waypost::{Endpoint, Snapshot, Version};
    /// let snap = Snapshot::from_endpoints(
    ///     Version(1),
    ///     ["a", "b", "c"].map(|id| Endpoint::new("api", id, "10.0.0.1", 80)),
    /// );
    /// let (first, last) = snap.page(None, 2);
    /// assert_eq!((first.len(), last), (2, false));
    /// let (rest, last) = snap.page(first.last().map(|e| e.key()).as_ref(), 2);
    /// assert_eq!((rest.len(), last), (1, true));
    /// ```
    pub fn page<'a>(&'a self, key: Option<&EndpointKey>, n: usize) -> (Vec<&'a Endpoint>, bool) {
        let endpoints: Vec<&Endpoint> = self.after(key).take(n).collect();
        let last = match endpoints.last() {
            Some(e) => self.after(Some(&e.key())).next().is_none(),
            None => true,
        };
        (endpoints, last)
    }

    /// All keys, ordered.
    pub fn keys(&self) -> impl Iterator<Item = &EndpointKey> + '_ {
        self.endpoints.keys()
    }

    /// The endpoints of one service, ordered by id. Costs O(log n + k).
    pub fn service<'a>(&'a self, service: &'a str) -> impl Iterator<Item = &'a Endpoint> + 'a {
        let start = EndpointKey::new(service, "");
        self.endpoints
            .range((Bound::Included(start), Bound::Unbounded))
            .take_while(move |(k, _)| k.service == service)
            .map(|(_, v)| &*v.endpoint)
    }

    /// The endpoints of one service, cloned into a `Vec`.
    pub fn list(&self, service: &str) -> Vec<Endpoint> {
        self.service(service).cloned().collect()
    }

    /// Every endpoint, cloned into a `Vec`.
    pub fn to_vec(&self) -> Vec<Endpoint> {
        self.iter().cloned().collect()
    }

    /// A copy with `endpoint` inserted or replaced; the version is unchanged.
    pub fn with_endpoint(&self, endpoint: Endpoint) -> Snapshot {
        let mut s = self.clone();
        s.insert(endpoint);
        s
    }

    /// A copy without `key`; the version is unchanged.
    pub fn without(&self, key: &EndpointKey) -> Snapshot {
        let mut s = self.clone();
        s.remove(key);
        s
    }

    /// A copy at `version`.
    pub fn at_version(&self, version: Version) -> Snapshot {
        let mut s = self.clone();
        s.version = version;
        s
    }

    /// Apply one watch event: a `Snapshot` replaces everything, a delta
    /// changes one key and moves the version to the event's.
    pub fn with_event(&self, event: &Event) -> Snapshot {
        let mut s = self.clone();
        s.apply(event);
        s
    }

    /// In-place form of [`Snapshot::with_event`].
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Snapshot(snap) => *self = snap.clone(),
            Event::Added { version, endpoint } | Event::Updated { version, endpoint } => {
                self.insert(endpoint.clone());
                self.version = *version;
            }
            Event::Removed { version, key } => {
                self.remove(key);
                self.version = *version;
            }
        }
    }

    fn insert(&mut self, endpoint: Endpoint) {
        let entry = Entry::new(endpoint);
        let print = entry.print;
        let endpoint = Arc::clone(&entry.endpoint);
        let old = self.endpoints.insert(endpoint.key(), entry);
        let change = print ^ old.as_ref().map_or(0, |o| o.print);
        let added = u64::from(old.is_none());
        match self.services.get_mut(endpoint.service.as_str()) {
            Some(sum) => {
                sum.print ^= change;
                sum.count += added;
            }
            None => {
                let sum = Sum {
                    print: change,
                    count: added,
                };
                self.services.insert(endpoint.service.clone(), sum);
            }
        }
    }

    fn remove(&mut self, key: &EndpointKey) {
        let Some(old) = self.endpoints.remove(key) else {
            return;
        };
        if let Some(sum) = self.services.get_mut(key.service.as_str()) {
            sum.print ^= old.print;
            sum.count -= 1;
            if sum.count == 0 {
                self.services.remove(key.service.as_str());
            }
        }
    }

    /// The services that have at least one endpoint, in order; without a
    /// walk over the endpoints.
    ///
    /// ```
    /// use waypost::{Endpoint, Snapshot, Version};
    /// let snap = Snapshot::from_endpoints(
    ///     Version(1),
    ///     [Endpoint::new("db", "a", "10.0.0.1", 5432), Endpoint::new("api", "b", "10.0.0.2", 80),
    ///      Endpoint::new("api", "c", "10.0.0.3", 80)],
    /// );
    /// assert_eq!(snap.services().collect::<Vec<_>>(), ["api", "db"]);
    /// ```
    pub fn services(&self) -> impl Iterator<Item = &str> + '_ {
        self.services.keys().map(String::as_str)
    }

    /// A fingerprint of `service`'s endpoints (`None` when it has none):
    /// snapshots of one process whose fingerprints of a service agree hold
    /// the same endpoints of it, every field compared, up to a collision
    /// of 128-bit hashes (seeded per process, so not comparable across
    /// processes). Costs a map lookup: what a cache of something derived
    /// from one service's endpoints keys on.
    ///
    /// ```
    /// use waypost::{Endpoint, Snapshot, Version};
    /// let a = Snapshot::from_endpoints(Version(1), [Endpoint::new("api", "a", "10.0.0.1", 80)]);
    /// let b = a.with_endpoint(Endpoint::new("db", "d", "10.0.0.9", 5432));
    /// let c = b.with_endpoint(Endpoint::new("api", "a", "10.0.0.2", 80));
    /// assert_eq!(a.fingerprint("api"), b.fingerprint("api"));
    /// assert_ne!(b.fingerprint("api"), c.fingerprint("api"));
    /// assert_eq!(a.fingerprint("none"), None);
    /// ```
    pub fn fingerprint(&self, service: &str) -> Option<u128> {
        self.services.get(service).map(Sum::fingerprint)
    }

    /// Every service with its [`Snapshot::fingerprint`], in order; a walk
    /// of the service index, not of the endpoints.
    ///
    /// ```
    /// use waypost::{Endpoint, Snapshot, Version};
    /// let snap = Snapshot::from_endpoints(Version(1), [Endpoint::new("api", "a", "10.0.0.1", 80)]);
    /// let all: Vec<_> = snap.fingerprints().collect();
    /// assert_eq!(all, [("api", snap.fingerprint("api").unwrap())]);
    /// ```
    pub fn fingerprints(&self) -> impl Iterator<Item = (&str, u128)> + '_ {
        self.services
            .iter()
            .map(|(s, sum)| (s.as_str(), sum.fingerprint()))
    }

    /// The services whose endpoints differ between `self` and `other`
    /// (added, removed or changed in any field), in order, each once. The
    /// service index is compared by [`Snapshot::fingerprint`] and its
    /// shared structure skipped, so for a snapshot derived from the other
    /// by a few changes this costs about those changes, not a walk of
    /// every service: what a reader that keeps something per service
    /// rebuilds after a change.
    ///
    /// ```
    /// use waypost::{Endpoint, Snapshot, Version};
    /// let a = Snapshot::from_endpoints(
    ///     Version(1),
    ///     [Endpoint::new("api", "a", "10.0.0.1", 80), Endpoint::new("db", "d", "10.0.0.9", 5432)],
    /// );
    /// let b = a
    ///     .with_endpoint(Endpoint::new("api", "b", "10.0.0.2", 80))
    ///     .with_endpoint(Endpoint::new("web", "w", "10.0.0.3", 80));
    /// assert_eq!(a.changed_services(&b).collect::<Vec<_>>(), ["api", "web"]);
    /// assert_eq!(b.changed_services(&a).collect::<Vec<_>>(), ["api", "web"]);
    /// assert_eq!(a.changed_services(&a.clone()).count(), 0);
    /// ```
    pub fn changed_services<'a>(
        &'a self,
        other: &'a Snapshot,
    ) -> impl Iterator<Item = &'a str> + 'a {
        use imbl::ordmap::DiffItem;
        self.services.diff(&other.services).map(|d| match d {
            DiffItem::Add(name, _) | DiffItem::Remove(name, _) => name.as_str(),
            DiffItem::Update { new: (name, _), .. } => name.as_str(),
        })
    }

    /// Every service with the fingerprint of its endpoints, in order.
    pub(crate) fn service_sums(&self) -> impl Iterator<Item = (&String, &Sum)> + '_ {
        self.services.iter()
    }

    /// The entries of one service, in key order.
    pub(crate) fn service_entries<'a>(
        &'a self,
        service: &'a str,
    ) -> impl Iterator<Item = (&'a EndpointKey, &'a Entry)> + 'a {
        let start = EndpointKey::new(service, "");
        self.endpoints
            .range((Bound::Included(start), Bound::Unbounded))
            .take_while(move |(k, _)| k.service == service)
    }

    /// Whether both hold exactly the same endpoints (versions ignored).
    pub fn same_endpoints(&self, other: &Snapshot) -> bool {
        self.endpoints == other.endpoints
    }

    /// Whether the two share structure (one was derived from the other, or
    /// both from a common snapshot): checked at the first and last entry,
    /// which a derived copy shares unless the change touched them.
    pub(crate) fn shares_structure_with(&self, other: &Snapshot) -> bool {
        let same = |a: Option<&(EndpointKey, Entry)>, b: Option<&(EndpointKey, Entry)>| matches!((a, b), (Some(a), Some(b)) if std::ptr::eq(a, b));
        self.endpoints.ptr_eq(&other.endpoints)
            || same(self.endpoints.get_min(), other.endpoints.get_min())
            || same(self.endpoints.get_max(), other.endpoints.get_max())
    }

    /// Pairs of (key, left, right) that differ between `self` and `other`,
    /// skipping shared structure.
    pub(crate) fn changes<'a>(
        &'a self,
        other: &'a Snapshot,
    ) -> impl Iterator<Item = imbl::ordmap::DiffItem<'a, 'a, EndpointKey, Entry>> + 'a {
        self.endpoints.diff(&other.endpoints)
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("len", &self.endpoints.len())
            .finish()
    }
}

impl FromIterator<Endpoint> for Snapshot {
    fn from_iter<I: IntoIterator<Item = Endpoint>>(iter: I) -> Self {
        Snapshot::from_endpoints(Version::ZERO, iter)
    }
}

/// One item of a watch stream.
///
/// A stream starts with [`Event::Snapshot`] unless it resumed from a version
/// whose history is still held; it sends a fresh `Snapshot` whenever the
/// source lost history, so a consumer never has to guess.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The whole state at `version`; replaces everything the consumer held.
    Snapshot(Snapshot),
    /// An endpoint that did not exist before.
    Added {
        /// Version of this change.
        version: Version,
        /// The new endpoint.
        endpoint: Endpoint,
    },
    /// An existing endpoint changed; carries its new value.
    Updated {
        /// Version of this change.
        version: Version,
        /// The endpoint as it is now.
        endpoint: Endpoint,
    },
    /// An endpoint was removed.
    Removed {
        /// Version of this change.
        version: Version,
        /// The key that is gone.
        key: EndpointKey,
    },
}

impl Event {
    /// The same change at another version (a snapshot keeps its own).
    pub fn with_version(self, version: Version) -> Event {
        match self {
            Event::Added { endpoint, .. } => Event::Added { version, endpoint },
            Event::Updated { endpoint, .. } => Event::Updated { version, endpoint },
            Event::Removed { key, .. } => Event::Removed { version, key },
            snap @ Event::Snapshot(_) => snap,
        }
    }

    /// The version this event brings the consumer to.
    pub fn version(&self) -> Version {
        match self {
            Event::Snapshot(s) => s.version(),
            Event::Added { version, .. }
            | Event::Updated { version, .. }
            | Event::Removed { version, .. } => *version,
        }
    }

    /// The key a delta is about; `None` for a snapshot.
    pub fn key(&self) -> Option<EndpointKey> {
        match self {
            Event::Snapshot(_) => None,
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => Some(endpoint.key()),
            Event::Removed { key, .. } => Some(key.clone()),
        }
    }

    /// Short name of the variant: `snapshot`, `added`, `updated`, `removed`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Snapshot(_) => "snapshot",
            Event::Added { .. } => "added",
            Event::Updated { .. } => "updated",
            Event::Removed { .. } => "removed",
        }
    }
}
