//! One state-of-the-world ADS stream: every response of a type carries
//! all the resources of that type the client subscribed to.
//!
//! - A request whose `response_nonce` is not the last nonce sent for its
//!   type is stale and ignored (the client's newer request follows).
//! - A request with `error_detail` is a NACK of the response whose nonce
//!   it carries: logged and counted; the rejected resources are not sent
//!   again until they change.
//! - A request whose names differ from the type's subscription (or the
//!   type's first request) is answered at once, even when nothing
//!   exists: for LDS and CDS an absent resource means a deleted one.
//! - On each change of the registrar's state, every subscribed type whose
//!   resources changed is pushed, with `version_info` the state's version.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use registry_api::Snapshot;

use super::resources::{self, Kind};
use super::stream::{PerStream, Variant};
use super::{count_push, Client};

/// What one type's subscription and last response are.
#[derive(Debug, Default)]
struct TypeState {
    /// Whether the client asked for this type (and has not unsubscribed
    /// from everything).
    subscribed: bool,
    /// Whether a request was seen at all.
    seen: bool,
    /// All resources of the type, whatever names say.
    wildcard: bool,
    /// The names asked for (without `*`).
    names: BTreeSet<String>,
    /// Name → version of the resources of the last response.
    sent: BTreeMap<String, String>,
    /// The last response's nonce; empty before the first.
    nonce: String,
    /// A response is due even if the resources did not change (the
    /// subscription did).
    pending: bool,
}

/// One stream's state.
pub(super) struct Sotw(PerStream<TypeState>);

impl Sotw {
    /// A new stream's state (see [`PerStream::new`]).
    pub(super) fn new(peer: String, cache: Arc<resources::Cache>) -> Self {
        Self(PerStream::new(peer, cache))
    }
}

impl Variant for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "sotw";

    fn client(&self) -> &Client {
        &self.0.client
    }

    /// Take a request; the type to answer at once, if any.
    fn on_request(&mut self, r: DiscoveryRequest) -> Option<Kind> {
        let (kind, t, client) = self.0.request(r.node.as_ref(), Self::NAME, &r.type_url)?;
        if !r.response_nonce.is_empty() {
            if r.response_nonce != t.nonce {
                tracing::debug!(node = %client.id(), type_url = %r.type_url, nonce = %r.response_nonce, "xDS: stale nonce; request ignored");
                return None;
            }
            match &r.error_detail {
                Some(detail) => client.nacked(&r.type_url, &r.response_nonce, detail),
                None => {
                    tracing::debug!(node = %client.id(), type_url = %r.type_url, version = %r.version_info, "xDS: ACK")
                }
            }
        }
        let first = !t.seen;
        t.seen = true;
        let star = r.resource_names.iter().any(|n| n == "*");
        let names: BTreeSet<String> = r.resource_names.into_iter().filter(|n| n != "*").collect();
        let wildcard =
            star || (names.is_empty() && kind.empty_is_wildcard() && (first || t.wildcard));
        let changed = first || names != t.names || wildcard != t.wildcard;
        t.names = names;
        t.wildcard = wildcard;
        t.subscribed = wildcard || !t.names.is_empty();
        if !t.subscribed {
            t.sent.clear();
        }
        t.pending = changed && t.subscribed;
        t.pending.then_some(kind)
    }

    /// The response for `kind` at `snap`, if one is due: the resources
    /// changed since the last response, or the subscription did.
    fn response(&mut self, kind: Kind, snap: &Snapshot) -> Option<DiscoveryResponse> {
        let t = self.0.types.get_mut(&kind).filter(|t| t.subscribed)?;
        let mut names = t.names.clone();
        if t.wildcard {
            names.extend(resources::services(snap));
        }
        let built: Vec<(String, resources::Built)> = names
            .into_iter()
            .filter_map(|n| self.0.cache.build(kind, &n, snap).map(|b| (n, b)))
            .collect();
        let versions: BTreeMap<String, String> = built
            .iter()
            .map(|(n, b)| (n.clone(), b.version.clone()))
            .collect();
        if !t.pending && versions == t.sent {
            return None;
        }
        t.pending = false;
        t.nonce = self.0.nonces.next();
        t.sent = versions;
        let type_url = kind.type_url();
        count_push(&type_url, built.len());
        Some(DiscoveryResponse {
            version_info: snap.version().to_string(),
            resources: built.into_iter().map(|(_, b)| b.any).collect(),
            type_url,
            nonce: t.nonce.clone(),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use registry_api::testing::ep;
    use registry_api::Version;

    fn stream() -> Sotw {
        Sotw::new("test".into(), Arc::default())
    }

    fn req(kind: Kind, names: &[&str], last: Option<&DiscoveryResponse>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: kind.type_url(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            version_info: last.map(|r| r.version_info.clone()).unwrap_or_default(),
            response_nonce: last.map(|r| r.nonce.clone()).unwrap_or_default(),
            ..Default::default()
        }
    }

    fn snap(v: u64, services: &[&str]) -> Snapshot {
        Snapshot::from_endpoints(Version(v), services.iter().map(|s| ep(s, "1", 80)))
    }

    #[test]
    fn an_empty_first_lds_request_is_a_wildcard_that_follows_the_services() {
        let mut s = stream();
        let kind = s.on_request(req(Kind::Listener, &[], None)).unwrap();
        let r1 = s.response(kind, &snap(1, &["a", "b"])).unwrap();
        assert_eq!(r1.resources.len(), 2);
        assert_eq!(r1.version_info, "1");
        // Nothing changed: nothing to push; the ACK asks for nothing.
        assert!(s.response(kind, &snap(2, &["a", "b"])).is_none());
        assert_eq!(s.on_request(req(Kind::Listener, &[], Some(&r1))), None);
        let r2 = s.response(kind, &snap(3, &["a"])).unwrap();
        assert_eq!(r2.resources.len(), 1, "b deleted by its absence");
        assert_ne!(r2.nonce, r1.nonce);
    }

    #[test]
    fn stale_nonces_are_ignored_nacks_are_not_answered_and_names_are() {
        let mut s = stream();
        let kind = s.on_request(req(Kind::Endpoints, &["a"], None)).unwrap();
        let r1 = s.response(kind, &snap(1, &["a"])).unwrap();
        let r2 = s.response(kind, &snap(2, &["a", "c"]));
        assert!(r2.is_none(), "a's endpoints did not change");
        let r3 = s
            .response(
                kind,
                &Snapshot::from_endpoints(Version(3), [ep("a", "2", 81)]),
            )
            .unwrap();
        // r1 is stale now: a request carrying its nonce is ignored, even
        // with other names.
        assert_eq!(
            s.on_request(req(Kind::Endpoints, &["a", "b"], Some(&r1))),
            None
        );
        let mut nack = req(Kind::Endpoints, &["a"], Some(&r3));
        nack.error_detail = Some(RpcStatus {
            code: 3,
            message: "no".into(),
            details: vec![],
        });
        assert_eq!(s.on_request(nack), None, "a NACK is not answered");
        assert_eq!(
            s.on_request(req(Kind::Endpoints, &["a", "b"], Some(&r3))),
            Some(kind)
        );
        let r4 = s
            .response(
                kind,
                &Snapshot::from_endpoints(Version(3), [ep("a", "2", 81)]),
            )
            .unwrap();
        assert_eq!(r4.resources.len(), 2, "b's (empty) assignment too");
    }

    #[test]
    fn eds_without_names_is_no_subscription() {
        let mut s = stream();
        assert_eq!(s.on_request(req(Kind::Endpoints, &[], None)), None);
        assert!(s.response(Kind::Endpoints, &snap(1, &["a"])).is_none());
        assert_eq!(
            s.on_request(DiscoveryRequest {
                type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
                    .into(),
                ..Default::default()
            }),
            None
        );
    }
}
