//! One incremental (delta) ADS stream: responses carry only the resources
//! that changed, each with its own version, and the names of those that
//! no longer exist (`removed_resources`).
//!
//! - Subscriptions change by `resource_names_subscribe` /
//!   `resource_names_unsubscribe`, in any request (whatever its nonce). A
//!   type's first request naming nothing is a wildcard for LDS and CDS;
//!   `*` subscribes to all resources of a type, unsubscribing `*` ends it.
//! - `initial_resource_versions` (a reconnecting client's cache) is taken
//!   as what the client has: a resource of the same version is not sent
//!   again.
//! - A request with `error_detail` is a NACK of the response of its nonce:
//!   logged and counted; the rejected versions are not sent again until
//!   the resources change.
//! - A subscribed name that does not exist is answered once in
//!   `removed_resources`, so a client need not wait for its timer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use waypost::Snapshot;

use super::frame::Frame;
use super::resources::{self, Kind};
use super::stream::{PerStream, Variant};
use super::{Client, Shared};

/// Responses remembered for their ACK or NACK, per type.
const OUTSTANDING: usize = 16;

/// One type's subscription and what the client holds.
#[derive(Debug, Default)]
struct TypeState {
    /// Whether a request of this type was seen.
    seen: bool,
    /// All resources of the type.
    wildcard: bool,
    /// The names subscribed to (without `*`).
    names: BTreeSet<String>,
    /// What the client holds, as far as the stream knows: name → version,
    /// `None` for a name it was told does not exist.
    held: BTreeMap<String, Option<String>>,
    /// The nonces of the last responses not yet acknowledged or rejected
    /// (at most [`OUTSTANDING`]).
    outstanding: VecDeque<String>,
    /// A response is due even if nothing changed (the first one).
    pending: bool,
}

impl TypeState {
    fn wanted(&self, snap: &Snapshot) -> BTreeSet<String> {
        let mut names = self.names.clone();
        if self.wildcard {
            names.extend(resources::services(snap));
        }
        names
    }
}

/// One stream's state.
pub(super) struct Delta(PerStream<TypeState>);

impl Variant for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const NAME: &'static str = "delta";

    fn new(peer: String, shared: Arc<Shared>) -> Self {
        Self(PerStream::new(peer, shared))
    }

    fn client(&self) -> &Client {
        &self.0.client
    }

    /// Take a request; the type to answer at once, if any.
    fn on_request(&mut self, r: DeltaDiscoveryRequest) -> Option<Kind> {
        let (kind, t, client) = self.0.request(r.node.as_ref(), Self::NAME, &r.type_url)?;
        let answered = t.outstanding.iter().position(|n| *n == r.response_nonce);
        if let Some(i) = answered {
            t.outstanding.remove(i);
            match &r.error_detail {
                Some(detail) => client.nacked(&r.type_url, &r.response_nonce, detail),
                None => {
                    tracing::debug!(node = %client.id(), type_url = %r.type_url, nonce = %r.response_nonce, "xDS: ACK")
                }
            }
        }
        let first = !t.seen;
        t.seen = true;
        if first {
            t.pending = true;
            t.held = r
                .initial_resource_versions
                .into_iter()
                .map(|(n, v)| (n, Some(v)))
                .collect();
            if r.resource_names_subscribe.is_empty() && kind.empty_is_wildcard() {
                t.wildcard = true;
            }
        }
        let mut changed = first;
        for n in r.resource_names_subscribe {
            if n == "*" {
                changed |= !t.wildcard;
                t.wildcard = true;
            } else {
                changed |= t.names.insert(n);
            }
        }
        for n in r.resource_names_unsubscribe {
            if n == "*" {
                changed |= t.wildcard;
                t.wildcard = false;
            } else {
                changed |= t.names.remove(&n);
                // The client forgets it: nothing to say about it any more.
                t.held.remove(&n);
            }
        }
        changed.then_some(kind)
    }

    /// The response for `kind` at `snap`: the resources whose version the
    /// client does not hold and the names it holds that are gone; `None`
    /// when there is nothing to say.
    fn response(&mut self, kind: Kind, snap: &Snapshot) -> Option<Frame<DeltaDiscoveryResponse>> {
        let t = self.0.types.get_mut(&kind).filter(|t| t.seen)?;
        let wanted = t.wanted(snap);
        let mut resources = Vec::new();
        let mut removed = Vec::new();
        for name in &wanted {
            let held = t.held.get(name);
            match self.0.shared.cache.build(kind, name, snap) {
                Some(b) => {
                    if !matches!(held, Some(Some(v)) if *v == b.version) {
                        t.held.insert(name.clone(), Some(b.version.clone()));
                        resources.push(b.delta());
                    }
                }
                None => {
                    if held != Some(&None) {
                        t.held.insert(name.clone(), None);
                        removed.push(name.clone());
                    }
                }
            }
        }
        // Resources of a wildcard subscription whose service went away.
        let gone: Vec<String> = t
            .held
            .keys()
            .filter(|n| !wanted.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(Some(_)) = t.held.remove(&name) {
                removed.push(name);
            }
        }
        if resources.is_empty() && removed.is_empty() && !t.pending {
            return None;
        }
        t.pending = false;
        let nonce = self.0.nonces.next();
        if t.outstanding.len() >= OUTSTANDING {
            t.outstanding.pop_front();
        }
        t.outstanding.push_back(nonce.clone());
        self.0.shared.count_push(kind, resources.len());
        Some(Frame {
            resources,
            own: DeltaDiscoveryResponse {
                system_version_info: snap.version().to_string(),
                type_url: kind.type_url().to_string(),
                removed_resources: removed,
                nonce,
                ..Default::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use waypost::testing::ep;
    use waypost::Version;

    fn stream() -> Delta {
        Delta::new("test".into(), Arc::default())
    }

    /// The whole response for `kind` at `snap`, if one is due.
    fn respond(d: &mut Delta, kind: Kind, snap: &Snapshot) -> Option<DeltaDiscoveryResponse> {
        d.response(kind, snap).map(|f| f.message())
    }

    fn req(kind: Kind, sub: &[&str], unsub: &[&str]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: kind.type_url().to_string(),
            resource_names_subscribe: sub.iter().map(|n| n.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        }
    }

    fn snap(v: u64, services: &[&str]) -> Snapshot {
        Snapshot::from_endpoints(Version(v), services.iter().map(|s| ep(s, "1", 80)))
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn a_wildcard_cds_gets_new_services_and_removals() {
        let mut d = stream();
        let kind = d.on_request(req(Kind::Cluster, &[], &[])).unwrap();
        let r1 = respond(&mut d, kind, &snap(1, &["a", "b"])).unwrap();
        assert_eq!(names(&r1), ["a", "b"]);
        assert!(respond(&mut d, kind, &snap(2, &["a", "b"])).is_none());
        let r2 = respond(&mut d, kind, &snap(3, &["a", "c"])).unwrap();
        assert_eq!(names(&r2), ["c"], "only what changed");
        assert_eq!(r2.removed_resources, ["b"]);
        // Unsubscribing `*` ends the wildcard: nothing more is pushed.
        assert_eq!(d.on_request(req(Kind::Cluster, &[], &["*"])), Some(kind));
        let r3 = respond(&mut d, kind, &snap(4, &["a", "d"])).unwrap();
        assert!(r3.resources.is_empty());
        assert_eq!(r3.removed_resources, ["a", "c"]);
        assert!(respond(&mut d, kind, &snap(5, &["e"])).is_none());
    }

    #[test]
    fn held_versions_are_not_sent_again_and_absent_names_are_said_once() {
        let mut d = stream();
        let s = snap(1, &["a"]);
        let version = resources::build(Kind::Endpoints, "a", &s)
            .unwrap()
            .version
            .clone();
        let mut first = req(Kind::Endpoints, &["a"], &[]);
        first.initial_resource_versions = [("a".to_string(), version)].into();
        let kind = d.on_request(first).unwrap();
        let r1 = respond(&mut d, kind, &s).unwrap();
        assert!(r1.resources.is_empty(), "the client holds a already");
        assert_eq!(
            d.on_request(req(Kind::Listener, &["nope"], &[])),
            Some(Kind::Listener)
        );
        let r2 = respond(&mut d, Kind::Listener, &s).unwrap();
        assert_eq!(r2.removed_resources, ["nope"]);
        assert!(respond(&mut d, Kind::Listener, &snap(2, &["a"])).is_none());
        // A name subscribed twice is no change.
        assert_eq!(d.on_request(req(Kind::Endpoints, &["a"], &[])), None);
    }
}
