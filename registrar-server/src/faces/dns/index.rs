//! What a query needs, by name, built from the registrar's state once per
//! version and kept on the DNS face's side: a query is a hash lookup and a
//! copy of records encoded in advance ([`super::records`]), whatever the
//! registry's size, and names that exist nowhere cost the same lookup.
//!
//! The index follows the state incrementally: from one version to the
//! next only the services whose endpoints changed are rebuilt
//! ([`Snapshot::changed_services`]), with the node names their endpoints
//! give; everything else is shared with the previous version (persistent
//! maps, so a new version costs the change, not a copy).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};
use futures::StreamExt;
use waypost::cached::Store;
use waypost::{Endpoint, EndpointKey, Snapshot, Version};

use super::records::{Addresses, RecordSets};
use super::zone::Zone;

/// The records of one service name (lowercase), of every cluster and per
/// cluster. A name exists while any endpoint has it, healthy or not.
#[derive(Debug)]
pub(crate) struct ServiceEntry {
    /// The healthy endpoints of every cluster.
    pub(crate) all: Arc<RecordSets>,
    /// Per cluster (lowercase), those of that cluster.
    pub(crate) clusters: HashMap<Box<str>, Arc<RecordSets>>,
}

/// The records of one SRV target `<id>.<node>.node.<domain>`: the
/// addresses of every endpoint that has that target (of any health), in
/// key order.
#[derive(Debug)]
pub(crate) struct NodeEntry {
    /// The endpoints, with their IP address when they have one.
    members: Vec<(EndpointKey, Option<IpAddr>)>,
    /// Their A and AAAA records.
    pub(crate) addresses: Addresses,
}

/// Node names, by `<id>.<node>`.
type Nodes = imbl::HashMap<Arc<str>, Arc<NodeEntry>>;

/// The index at one version of the registrar's state.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    /// The state it was built from.
    snap: Arc<Snapshot>,
    /// Service names (lowercase) with their records.
    services: imbl::HashMap<Arc<str>, Arc<ServiceEntry>>,
    /// The services spelled as each lowercase name, in order (most names
    /// have one spelling).
    spellings: imbl::HashMap<Arc<str>, Arc<[Arc<str>]>>,
    /// Node names with their records.
    nodes: Nodes,
    /// The node names each service's endpoints give.
    node_keys: imbl::HashMap<Arc<str>, Arc<[Arc<str>]>>,
}

/// What taking one version cost: for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rebuilt {
    /// Services whose endpoints changed.
    pub(crate) services: usize,
    /// Endpoints read from the state.
    pub(crate) endpoints_read: usize,
}

impl Index {
    /// The index of an empty registry.
    pub(crate) fn empty() -> Self {
        Self {
            snap: Arc::new(Snapshot::empty(Version::ZERO)),
            services: imbl::HashMap::new(),
            spellings: imbl::HashMap::new(),
            nodes: imbl::HashMap::new(),
            node_keys: imbl::HashMap::new(),
        }
    }

    /// The serial of the zone's SOA: the version's low 32 bits.
    pub(crate) fn serial(&self) -> u32 {
        self.snap.version().0 as u32
    }

    /// The records of `service` (lowercase).
    pub(crate) fn service(&self, service: &str) -> Option<&ServiceEntry> {
        self.services.get(service).map(|e| &**e)
    }

    /// The records of node name `<id>.<node>` (lowercase).
    pub(crate) fn node(&self, key: &str) -> Option<&NodeEntry> {
        self.nodes.get(key).map(|e| &**e)
    }

    /// How many service names and node names it holds.
    #[cfg(test)]
    pub(crate) fn size(&self) -> (usize, usize) {
        (self.services.len(), self.nodes.len())
    }

    /// The index of `snap`, from this one: only the services whose
    /// endpoints differ are rebuilt.
    pub(crate) fn advance(&self, zone: &Zone, snap: Arc<Snapshot>) -> (Index, Rebuilt) {
        let mut next = self.clone();
        let mut cost = Rebuilt::default();
        let mut names: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut nodes: HashMap<Arc<str>, Vec<(EndpointKey, Option<IpAddr>)>> = HashMap::new();
        let changed: Vec<Arc<str>> = self.snap.changed_services(&snap).map(Arc::from).collect();
        for service in changed {
            cost.services += 1;
            let lower: Arc<str> = Arc::from(service.to_ascii_lowercase());
            let present = snap.fingerprint(&service).is_some();
            next.respell(&lower, &service, present);
            names.insert(lower);
            // The node names this service gave leave it, and those its
            // endpoints give now join.
            for key in next
                .node_keys
                .remove(&service)
                .iter()
                .flat_map(|k| k.iter())
            {
                let members = nodes.entry(Arc::clone(key)).or_insert_with(|| {
                    next.nodes
                        .get(key)
                        .map(|n| n.members.clone())
                        .unwrap_or_default()
                });
                members.retain(|(k, _)| *k.service != *service);
            }
            let mut keys = Vec::new();
            for e in snap.service(&service) {
                cost.endpoints_read += 1;
                let Some((key, _)) = zone.target(e) else {
                    continue;
                };
                let key: Arc<str> = Arc::from(key);
                let members = nodes.entry(Arc::clone(&key)).or_insert_with(|| {
                    next.nodes
                        .get(&key)
                        .map(|n| n.members.clone())
                        .unwrap_or_default()
                });
                members.push((e.key(), e.address.parse().ok()));
                keys.push(key);
            }
            if !keys.is_empty() {
                next.node_keys.insert(Arc::clone(&service), Arc::from(keys));
            }
        }
        for (key, mut members) in nodes {
            if members.is_empty() {
                next.nodes.remove(&key);
                continue;
            }
            members.sort_by(|a, b| a.0.cmp(&b.0));
            members.dedup_by(|a, b| a.0 == b.0);
            members.shrink_to_fit();
            let mut addresses = Addresses::default();
            for ip in members.iter().filter_map(|(_, ip)| *ip) {
                addresses.add(ip, zone.ttl);
            }
            addresses.shrink_to_fit();
            next.nodes
                .insert(key, Arc::new(NodeEntry { members, addresses }));
        }
        for lower in names {
            match next.entry(zone, &snap, &lower, &mut cost) {
                Some(entry) => next.services.insert(lower, Arc::new(entry)),
                None => next.services.remove(&lower),
            };
        }
        next.snap = snap;
        (next, cost)
    }

    /// Note that `service` is (`present`) or is not spelled so among the
    /// services named `lower` when lowercase.
    fn respell(&mut self, lower: &Arc<str>, service: &Arc<str>, present: bool) {
        let mut all: Vec<Arc<str>> = self
            .spellings
            .get(lower)
            .map(|s| s.to_vec())
            .unwrap_or_default();
        all.retain(|s| s != service);
        if present {
            all.push(Arc::clone(service));
            all.sort();
        }
        if all.is_empty() {
            self.spellings.remove(lower);
        } else {
            self.spellings.insert(Arc::clone(lower), Arc::from(all));
        }
    }

    /// The entry of `lower` in `snap`: the service spelled so when there
    /// is one, else every service spelled so but for case, in order;
    /// `None` when there is none.
    fn entry(
        &self,
        zone: &Zone,
        snap: &Snapshot,
        lower: &str,
        cost: &mut Rebuilt,
    ) -> Option<ServiceEntry> {
        let spellings = self.spellings.get(lower)?;
        let exact = spellings.iter().find(|s| ***s == *lower);
        let endpoints: Vec<&Endpoint> = match exact {
            Some(s) => snap.service(s).collect(),
            None => spellings.iter().flat_map(|s| snap.service(s)).collect(),
        };
        cost.endpoints_read += endpoints.len();
        if endpoints.is_empty() {
            return None;
        }
        let mut by_cluster: BTreeMap<String, Vec<&Endpoint>> = BTreeMap::new();
        for &e in &endpoints {
            by_cluster
                .entry(e.cluster.to_ascii_lowercase())
                .or_default()
                .push(e);
        }
        let all = Arc::new(RecordSets::of(zone, endpoints.iter().copied()));
        let clusters = if by_cluster.len() == 1 {
            by_cluster
                .into_keys()
                .map(|c| (c.into_boxed_str(), Arc::clone(&all)))
                .collect()
        } else {
            by_cluster
                .into_iter()
                .map(|(c, eps)| {
                    let records = RecordSets::of(zone, eps);
                    (c.into_boxed_str(), Arc::new(records))
                })
                .collect()
        };
        Some(ServiceEntry { all, clusters })
    }
}

/// The DNS face's index of the registrar's state, kept current: queries
/// take it ([`Indexer::view`]), which brings it up to the state's version
/// first when the state moved; a task ([`Indexer::follow`]) does that as
/// soon as the state changes, so queries rarely wait for it.
pub(crate) struct Indexer {
    zone: Arc<Zone>,
    store: Store,
    current: ArcSwap<Index>,
    /// Held while advancing: one version is built once, by one thread.
    advancing: Mutex<()>,
    /// Endpoints read from the state so far, by every advance.
    endpoints_read: AtomicUsize,
}

impl std::fmt::Debug for Indexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Indexer")
            .field("version", &self.current.load().snap.version())
            .finish_non_exhaustive()
    }
}

impl Indexer {
    /// An index of `store`'s state for `zone` (built on first use).
    pub(crate) fn new(zone: Arc<Zone>, store: Store) -> Self {
        Self {
            zone,
            store,
            current: ArcSwap::from_pointee(Index::empty()),
            advancing: Mutex::new(()),
            endpoints_read: AtomicUsize::new(0),
        }
    }

    /// How many endpoints it has read from the state so far: a query
    /// reads none.
    #[cfg(test)]
    pub(crate) fn endpoints_read(&self) -> usize {
        self.endpoints_read.load(Ordering::Relaxed)
    }

    /// The zone it indexes for.
    pub(crate) fn zone(&self) -> &Zone {
        &self.zone
    }

    /// The index of the state as it is now (built from it or from a later
    /// version); `None` before the first snapshot.
    pub(crate) fn view(&self) -> Option<Guard<Arc<Index>>> {
        let snap = self.store.snapshot()?;
        let index = self.current.load();
        if Arc::ptr_eq(&index.snap, &snap) {
            return Some(index);
        }
        drop(index);
        self.advance();
        Some(self.current.load())
    }

    /// Bring the index up to the state's current version.
    fn advance(&self) {
        let _one = self.advancing.lock().unwrap_or_else(|p| p.into_inner());
        let Some(snap) = self.store.snapshot() else {
            return;
        };
        let index = self.current.load_full();
        if Arc::ptr_eq(&index.snap, &snap) {
            return;
        }
        let version = snap.version();
        let (next, cost) = index.advance(&self.zone, snap);
        self.endpoints_read
            .fetch_add(cost.endpoints_read, Ordering::Relaxed);
        if cost.services > 0 {
            tracing::debug!(
                version = %version,
                services = cost.services,
                endpoints = cost.endpoints_read,
                "DNS: index rebuilt for the services that changed"
            );
        }
        self.current.store(Arc::new(next));
    }

    /// Advance the index each time the state changes, off the runtime's
    /// worker threads, until the state is gone.
    pub(crate) async fn follow(self: Arc<Self>) {
        let mut changes = self.store.changes();
        loop {
            let me = Arc::clone(&self);
            if tokio::task::spawn_blocking(move || me.advance())
                .await
                .is_err()
            {
                tracing::warn!("DNS: advancing the index failed");
            }
            if changes.next().await.is_none() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hickory_proto::rr::Name;
    use waypost::Health;

    fn zone() -> Zone {
        Zone::new(&Name::from_ascii("registry.").unwrap(), 5)
    }

    /// `n` endpoints, 10 per service, one node each.
    pub(crate) fn registry(n: usize) -> Snapshot {
        Snapshot::from_endpoints(
            Version(1),
            (0..n).map(|i| {
                Endpoint::new(
                    format!("svc-{}", i / 10),
                    format!("e{i}"),
                    format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
                    8080,
                )
                .with_node(format!("node-{i}"))
            }),
        )
    }

    #[test]
    fn a_change_rebuilds_only_its_service() {
        let z = zone();
        let snap = Arc::new(registry(1000));
        let (index, cost) = Index::empty().advance(&z, Arc::clone(&snap));
        assert_eq!(cost.services, 100);
        assert_eq!(index.size(), (100, 1000));
        let changed = Arc::new(
            snap.with_endpoint(
                Endpoint::new("svc-3", "e30", "10.9.9.9", 8080).with_node("node-30"),
            )
            .without(&EndpointKey::new("svc-4", "e41"))
            .at_version(Version(2)),
        );
        let (next, cost) = index.advance(&z, changed);
        assert_eq!(cost.services, 2);
        // Each changed service's endpoints, read for its node names and
        // for its records: 10 + 10 and 9 + 9.
        assert_eq!(cost.endpoints_read, 38);
        assert_eq!(next.size(), (100, 999));
        assert_eq!(next.serial(), 2);
        assert!(next.node("e41.node-41").is_none());
        let e30 = next.node("e30.node-30").unwrap();
        assert_eq!(&e30.addresses.a.bytes[12..], &[10, 9, 9, 9]);
        // Untouched services are the same entries.
        assert!(std::ptr::eq(
            index.service("svc-5").unwrap(),
            next.service("svc-5").unwrap()
        ));
        // The last endpoint gone: the name goes.
        let mut snap = next.snap.as_ref().clone();
        for i in 30..40 {
            snap = snap.without(&EndpointKey::new("svc-3", format!("e{i}")));
        }
        let (gone, _) = next.advance(&z, Arc::new(snap));
        assert!(gone.service("svc-3").is_none());
        assert!(gone.node("e30.node-30").is_none());
        assert_eq!(gone.size(), (99, 989));
    }

    #[test]
    fn names_that_differ_in_case_share_an_entry_unless_one_is_lowercase() {
        let z = zone();
        let ep = |s: &str, id: &str, ip: &str| Endpoint::new(s, id, ip, 80);
        let snap = Snapshot::from_endpoints(
            Version(1),
            [ep("Web", "a", "10.0.0.1"), ep("WEB", "b", "10.0.0.2")],
        );
        let (index, _) = Index::empty().advance(&z, Arc::new(snap.clone()));
        assert_eq!(index.service("web").unwrap().all.addresses.a.count, 2);
        let with_lower = Arc::new(snap.with_endpoint(ep("web", "c", "10.0.0.3")));
        let (index, _) = index.advance(&z, with_lower);
        assert_eq!(index.service("web").unwrap().all.addresses.a.count, 1);
    }

    #[test]
    fn clusters_and_health_shape_the_records() {
        let z = zone();
        let snap = Snapshot::from_endpoints(
            Version(1),
            [
                Endpoint::new("web", "a", "10.0.0.1", 80).with_cluster("East"),
                Endpoint::new("web", "b", "10.0.0.2", 80).with_cluster("west"),
                Endpoint::new("db", "c", "10.0.0.3", 80).with_health(Health::Unhealthy),
            ],
        );
        let (index, _) = Index::empty().advance(&z, Arc::new(snap));
        let web = index.service("web").unwrap();
        assert_eq!(web.all.addresses.a.count, 2);
        assert_eq!(web.clusters["east"].addresses.a.count, 1);
        assert_eq!(web.clusters["west"].srv.answer.count, 1);
        // An unhealthy endpoint keeps its names, with no records.
        let db = index.service("db").unwrap();
        assert_eq!(db.all.srv.answer.count, 0);
        assert!(index.node("c.db").unwrap().addresses.a.count == 1);
    }
}
