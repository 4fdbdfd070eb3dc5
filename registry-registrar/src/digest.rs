//! Resuming by content: per service, a digest of its endpoints that every
//! registrar and every agent compute the same way from the same endpoints
//! (unlike versions, whose epoch names one registrar run), so that an agent
//! reconnecting to another replica, or to a restarted registrar, is sent
//! only the services that differ.
//!
//! The agent sends what it holds ([`Digests::held`]) in
//! `WatchEndpointsRequest.held`; a registrar that cannot resume from
//! `last_version` answers with a partial snapshot of the services whose
//! digest differs ([`Digests::differing`]), and the agent applies it to
//! what it holds ([`merge_partial`]). The format is the proto's
//! (`ServiceDigest`), so clients in other languages can compute it too.
//!
//! With the summary the agent sends its total ([`Digests::total`], in
//! `WatchEndpointsRequest.held_total`): one digest over every service's
//! name and digest. A registrar whose own total is the same answers the
//! empty partial snapshot without reading the summary, and its total is
//! computed once per content of the registry, not per agent.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use sha2::{Digest as _, Sha256};
use waypost::{Endpoint, Event, Snapshot, Version};

use crate::layout::{health_to_proto, protocol_to_proto};
use crate::proto::registrar::v1::{HeldServices, HeldTotal, ServiceDigest};

/// The largest summary an agent sends: a registry of more services than
/// fit (about 30,000 of 20-byte names) is resumed with a full snapshot.
pub const MAX_SUMMARY_BYTES: usize = 1024 * 1024;

/// The digest of one service's endpoints, as the proto's `ServiceDigest`
/// defines it; `endpoints` in id order (as a [`Snapshot`] lists them).
///
/// ```
/// use waypost::{Endpoint, Snapshot, Version};
/// use waypost_registrar_client::service_digest;
/// let a = Snapshot::from_endpoints(Version(1), [Endpoint::new("api", "a", "10.0.0.1", 80)]);
/// let b = Snapshot::from_endpoints(Version(9), [Endpoint::new("api", "a", "10.0.0.1", 80)]);
/// let c = Snapshot::from_endpoints(Version(1), [Endpoint::new("api", "a", "10.0.0.2", 80)]);
/// assert_eq!(service_digest(a.service("api")), service_digest(b.service("api")));
/// assert_ne!(service_digest(a.service("api")), service_digest(c.service("api")));
/// ```
pub fn service_digest<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) -> u64 {
    fn text(h: &mut Sha256, s: &str) {
        number(h, s.len());
        h.update(s.as_bytes());
    }
    fn number(h: &mut Sha256, n: impl TryInto<u32>) {
        h.update(n.try_into().unwrap_or(u32::MAX).to_be_bytes());
    }
    let mut h = Sha256::new();
    for e in endpoints {
        // The wire's view of the endpoint: its enums' numbers as sent.
        text(&mut h, &e.id);
        text(&mut h, &e.address);
        number(&mut h, e.port);
        number(&mut h, protocol_to_proto(e.protocol) as i32);
        text(&mut h, &e.cluster);
        text(&mut h, &e.node);
        number(&mut h, health_to_proto(e.health) as i32);
        number(&mut h, e.labels.len());
        for (k, v) in &e.labels {
            text(&mut h, k);
            text(&mut h, v);
        }
    }
    let out = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out[..8]);
    u64::from_be_bytes(first)
}

/// The total of a summary, as the proto's `HeldTotal` defines it:
/// `services` (name, digest) in name order, each name once.
///
/// ```
/// use waypost_registrar_client::total_digest;
/// let one = total_digest([("api", 1), ("db", 2)]);
/// assert_eq!(one.services, 2);
/// assert_ne!(one, total_digest([("api", 1), ("db", 3)]));
/// assert_ne!(one, total_digest([("api", 1)]));
/// ```
pub fn total_digest<'a>(services: impl IntoIterator<Item = (&'a str, u64)>) -> HeldTotal {
    let mut h = Sha256::new();
    let mut count = 0u32;
    for (name, digest) in services {
        h.update(u32::try_from(name.len()).unwrap_or(u32::MAX).to_be_bytes());
        h.update(name.as_bytes());
        h.update(digest.to_be_bytes());
        count = count.saturating_add(1);
    }
    let out = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out[..8]);
    HeldTotal {
        digest: u64::from_be_bytes(first),
        services: count,
    }
}

/// What an agent's summary says differs from a registry's state.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Differing {
    /// Services whose endpoints differ from the summary's, or that it
    /// lacks, in order.
    pub changed: Vec<String>,
    /// Services of the summary that have no endpoint any more, in order.
    pub removed: Vec<String>,
}

impl Differing {
    /// The partial snapshot at `version` that brings a holder of the
    /// summary to `snap`: the endpoints of the changed services.
    pub fn snapshot(&self, snap: &Snapshot, version: Version) -> Snapshot {
        let endpoints = self
            .changed
            .iter()
            .flat_map(|s| snap.service(s).cloned())
            .collect::<Vec<_>>();
        Snapshot::from_endpoints(version, endpoints)
    }
}

/// One service's digest, with the [`Snapshot::fingerprint`] it was
/// computed at.
#[derive(Debug, Clone)]
struct Entry {
    service: String,
    print: u128,
    digest: u64,
}

/// Every service with its digest, in order, and their total.
#[derive(Debug)]
struct Summary {
    entries: Vec<Entry>,
    total: HeldTotal,
}

impl Summary {
    fn of(entries: Vec<Entry>) -> Self {
        let total = total_digest(entries.iter().map(|e| (e.service.as_str(), e.digest)));
        Self { entries, total }
    }
}

impl Default for Summary {
    fn default() -> Self {
        Self::of(Vec::new())
    }
}

/// Service digests, each computed once per content: a cache keyed by the
/// [`Snapshot::fingerprint`] of the service, and the last whole summary
/// with its total, which the next caller checks against its snapshot's
/// fingerprints (a walk of the service index, no hashing) and reuses when
/// nothing changed, as when many agents resume against one state. Shared
/// by the streams of one registrar, or kept by one client.
#[derive(Debug, Default)]
pub struct Digests {
    cache: Mutex<HashMap<String, (u128, u64)>>,
    last: Mutex<Arc<Summary>>,
}

impl Digests {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// `service`'s digest in `snap`; `None` when it has no endpoint.
    pub fn of(&self, snap: &Snapshot, service: &str) -> Option<u64> {
        let print = snap.fingerprint(service)?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        Some(Self::cached(&mut cache, snap, service, print))
    }

    fn cached(
        cache: &mut HashMap<String, (u128, u64)>,
        snap: &Snapshot,
        service: &str,
        print: u128,
    ) -> u64 {
        match cache.get(service) {
            Some((p, d)) if *p == print => *d,
            _ => {
                let d = service_digest(snap.service(service));
                cache.insert(service.to_string(), (print, d));
                d
            }
        }
    }

    /// Every service of `snap` with its digest, in order, and their total.
    fn all(&self, snap: &Snapshot) -> Arc<Summary> {
        let last = Arc::clone(&self.last.lock().unwrap_or_else(|p| p.into_inner()));
        let mut prints = snap.fingerprints();
        let same = last.entries.len() == snap.services().count()
            && last.entries.iter().all(|e| {
                prints
                    .next()
                    .is_some_and(|(s, p)| p == e.print && s == e.service)
            });
        if same {
            return last;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let out: Vec<Entry> = snap
            .fingerprints()
            .map(|(s, print)| Entry {
                service: s.to_string(),
                print,
                digest: Self::cached(&mut cache, snap, s, print),
            })
            .collect();
        // Forget services gone from the registry, now and then.
        if cache.len() > 2 * out.len() + 64 {
            cache.retain(|s, _| snap.fingerprint(s).is_some());
        }
        let out = Arc::new(Summary::of(out));
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&out);
        out
    }

    /// The summary of what `snap` holds, as an agent sends it; `None`
    /// when it would be larger than [`MAX_SUMMARY_BYTES`].
    pub fn held(&self, snap: &Snapshot) -> Option<HeldServices> {
        let services: Vec<ServiceDigest> = self
            .all(snap)
            .entries
            .iter()
            .map(|e| ServiceDigest {
                service_name: e.service.clone(),
                digest: e.digest,
            })
            .collect();
        let held = HeldServices { services };
        (prost::Message::encoded_len(&held) <= MAX_SUMMARY_BYTES).then_some(held)
    }

    /// The total of what `snap` holds ([`total_digest`] over its summary),
    /// computed once per content: a walk of the service index when the
    /// last summary still holds, no hashing.
    pub fn total(&self, snap: &Snapshot) -> HeldTotal {
        self.all(snap).total
    }

    /// What differs between `held` (an agent's summary, in any order) and
    /// `snap`: a merge of the two in service order.
    pub fn differing(&self, snap: &Snapshot, held: &HeldServices) -> Differing {
        let mut theirs: Vec<&ServiceDigest> = held.services.iter().collect();
        if !theirs.is_sorted_by(|a, b| a.service_name <= b.service_name) {
            theirs.sort_by(|a, b| a.service_name.cmp(&b.service_name));
        }
        let summary = self.all(snap);
        let ours = &summary.entries;
        let mut out = Differing::default();
        let (mut i, mut j) = (0, 0);
        while i < ours.len() || j < theirs.len() {
            let order = match (ours.get(i), theirs.get(j)) {
                (Some(o), Some(t)) => o.service.as_str().cmp(t.service_name.as_str()),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match order {
                Ordering::Less => {
                    out.changed.push(ours[i].service.clone());
                    i += 1;
                }
                Ordering::Greater => {
                    // The same name twice in a summary is said once.
                    if out.removed.last() != Some(&theirs[j].service_name) {
                        out.removed.push(theirs[j].service_name.clone());
                    }
                    j += 1;
                }
                Ordering::Equal => {
                    if ours[i].digest != theirs[j].digest {
                        out.changed.push(ours[i].service.clone());
                    }
                    i += 1;
                    // Past every entry of this name.
                    while theirs
                        .get(j)
                        .is_some_and(|t| t.service_name == ours[i - 1].service)
                    {
                        j += 1;
                    }
                }
            }
        }
        out
    }
}

/// `base` brought up to date by a partial snapshot at `version`: every
/// service `endpoints` name replaced by exactly those endpoints, the
/// `removed` services dropped, the rest kept.
///
/// ```
/// use waypost::{Endpoint, Snapshot, Version};
/// use waypost_registrar_client::merge_partial;
/// let base = Snapshot::from_endpoints(
///     Version(3),
///     [Endpoint::new("api", "a", "10.0.0.1", 80), Endpoint::new("db", "d", "10.0.0.4", 5432),
///      Endpoint::new("old", "o", "10.0.0.9", 1)],
/// );
/// let got = merge_partial(
///     &base,
///     Version(7),
///     vec![Endpoint::new("api", "b", "10.0.0.2", 80)],
///     &["old".to_string()],
/// );
/// assert_eq!(got.version(), Version(7));
/// let ids: Vec<_> = got.iter().map(|e| e.id.as_str()).collect();
/// assert_eq!(ids, ["b", "d"]);
/// ```
pub fn merge_partial(
    base: &Snapshot,
    version: Version,
    endpoints: Vec<Endpoint>,
    removed: &[String],
) -> Snapshot {
    let mut out = base.clone();
    let replaced: BTreeSet<&str> = endpoints
        .iter()
        .map(|e| e.service.as_str())
        .chain(removed.iter().map(String::as_str))
        .collect();
    for service in replaced {
        for key in base.service(service).map(Endpoint::key) {
            out.apply(&Event::Removed { version, key });
        }
    }
    for endpoint in endpoints {
        out.apply(&Event::Added { version, endpoint });
    }
    out.at_version(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::testing::ep;

    fn snap(eps: Vec<Endpoint>) -> Snapshot {
        Snapshot::from_endpoints(Version(1), eps)
    }

    #[test]
    fn the_digest_is_fixed_by_the_format() {
        // The proto's definition, computed by hand for one endpoint.
        let e = ep("api", "a", 80).with_label("zone", "z1");
        let mut h = Sha256::new();
        for s in ["a", &e.address] {
            h.update((s.len() as u32).to_be_bytes());
            h.update(s.as_bytes());
        }
        h.update(80u32.to_be_bytes());
        h.update(1u32.to_be_bytes()); // TCP
        for s in [&e.cluster, &e.node] {
            h.update((s.len() as u32).to_be_bytes());
            h.update(s.as_bytes());
        }
        h.update(1u32.to_be_bytes()); // HEALTHY
        h.update(1u32.to_be_bytes());
        for s in ["zone", "z1"] {
            h.update((s.len() as u32).to_be_bytes());
            h.update(s.as_bytes());
        }
        let want = u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"));
        assert_eq!(service_digest([&e]), want);
    }

    #[test]
    fn only_what_differs_is_named_and_the_merge_restores_the_state() {
        let held_state = snap(vec![ep("a", "1", 1), ep("b", "1", 2), ep("gone", "1", 3)]);
        let now = snap(vec![
            ep("a", "1", 1),
            ep("b", "1", 2).with_label("v", "2"),
            ep("new", "1", 4),
        ]);
        let agent = Digests::new();
        let held = agent.held(&held_state).expect("small summary");
        let registrar = Digests::new();
        let diff = registrar.differing(&now, &held);
        assert_eq!(diff.changed, ["b", "new"]);
        assert_eq!(diff.removed, ["gone"]);
        let partial = diff.snapshot(&now, Version(5));
        assert_eq!(partial.len(), 2);
        let merged = merge_partial(&held_state, Version(5), partial.to_vec(), &diff.removed);
        assert!(merged.same_endpoints(&now));
        // Nothing differs once merged.
        let again = agent.held(&merged).expect("small summary");
        assert_eq!(registrar.differing(&now, &again), Differing::default());
    }

    #[test]
    fn a_summary_in_any_order_is_read_the_same() {
        let held_state = snap(vec![ep("a", "1", 1), ep("b", "1", 2), ep("c", "1", 3)]);
        let now = snap(vec![ep("a", "1", 1), ep("c", "1", 9)]);
        let d = Digests::new();
        let mut held = d.held(&held_state).expect("small summary");
        held.services.reverse();
        let dup = held.services[0].clone();
        held.services.push(dup);
        let diff = Digests::new().differing(&now, &held);
        assert_eq!(diff.changed, ["c"]);
        assert_eq!(diff.removed, ["b"]);
        // The memo follows a changed state.
        let later = now.with_endpoint(ep("a", "2", 1));
        assert_eq!(d.differing(&later, &held).changed, ["a", "c"]);
        assert_eq!(d.differing(&now, &held).changed, ["c"]);
    }

    #[test]
    fn the_total_is_fixed_by_the_format() {
        let mut h = Sha256::new();
        for (name, digest) in [("api", 7u64), ("db", 9)] {
            h.update((name.len() as u32).to_be_bytes());
            h.update(name.as_bytes());
            h.update(digest.to_be_bytes());
        }
        let want = u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"));
        let total = total_digest([("api", 7), ("db", 9)]);
        assert_eq!((total.digest, total.services), (want, 2));
    }

    #[test]
    fn the_total_follows_the_endpoints_not_the_version_or_the_holder() {
        let eps = || vec![ep("a", "1", 1), ep("a", "2", 2), ep("b", "1", 3)];
        let here = Snapshot::from_endpoints(Version(3), eps());
        // Another registrar, of another epoch, at another version.
        let there = Snapshot::from_endpoints(Version(900), eps().into_iter().rev());
        let (one, two) = (Digests::new(), Digests::new());
        assert_eq!(one.total(&here), two.total(&there));
        // The total of what the summary lists.
        let held = one.held(&here).expect("small summary");
        let listed = held
            .services
            .iter()
            .map(|s| (s.service_name.as_str(), s.digest));
        assert_eq!(one.total(&here), total_digest(listed));
        // One field of one endpoint, a service more or less: another total.
        let moved = there.with_endpoint(ep("b", "1", 4));
        assert_ne!(two.total(&moved), one.total(&here));
        let more = there.with_endpoint(ep("c", "1", 1));
        assert_ne!(two.total(&more), one.total(&here));
        assert_eq!(two.total(&more).services, 3);
        // And back: the same total again.
        assert_eq!(two.total(&there), one.total(&here));
        assert_eq!(Digests::new().total(&snap(vec![])).services, 0);
    }

    #[test]
    fn a_cached_digest_follows_the_content() {
        let d = Digests::new();
        let one = snap(vec![ep("a", "1", 1)]);
        let two = one.with_endpoint(ep("a", "2", 2));
        let first = d.of(&one, "a");
        assert_ne!(d.of(&two, "a"), first);
        assert_eq!(d.of(&one, "a"), first);
        assert_eq!(d.of(&one, "none"), None);
    }
}
