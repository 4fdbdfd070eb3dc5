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

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use waypost::Snapshot;

use super::frame::Frame;
use super::resources::{Built, Kind};
use super::stream::{PerStream, Variant};
use super::{Client, Shared};

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
    /// The resources of the last response, in order.
    sent: Vec<Built>,
    /// The last response's nonce; empty before the first.
    nonce: String,
    /// A response is due even if the resources did not change (the
    /// subscription did).
    pending: bool,
}

/// One stream's state.
pub(super) struct Sotw(PerStream<TypeState>);

/// Whether two responses hold the same resources (a resource the cache
/// did not rebuild is the same one).
fn same(a: &[Built], b: &[Built]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| Arc::ptr_eq(x, y) || (x.name == y.name && x.version == y.version))
}

impl Variant for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "sotw";

    fn new(peer: String, shared: Arc<Shared>) -> Self {
        Self(PerStream::new(peer, shared))
    }

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
    fn response(&mut self, kind: Kind, snap: &Snapshot) -> Option<Frame<DiscoveryResponse>> {
        let t = self.0.types.get_mut(&kind).filter(|t| t.subscribed)?;
        let cache = &self.0.shared.cache;
        let built: Vec<Built> = if t.wildcard {
            let mut names: BTreeSet<&str> = t.names.iter().map(String::as_str).collect();
            names.extend(snap.services());
            names
                .into_iter()
                .filter_map(|n| cache.build(kind, n, snap))
                .collect()
        } else {
            t.names
                .iter()
                .filter_map(|n| cache.build(kind, n, snap))
                .collect()
        };
        if !t.pending && same(&built, &t.sent) {
            return None;
        }
        t.pending = false;
        t.nonce = self.0.nonces.next();
        self.0.shared.count_push(kind, built.len());
        let resources = built.iter().map(|b| b.sotw.clone()).collect();
        t.sent = built;
        Some(Frame {
            resources,
            own: DiscoveryResponse {
                version_info: snap.version().to_string(),
                type_url: kind.type_url().to_string(),
                nonce: t.nonce.clone(),
                ..Default::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use waypost::testing::ep;
    use waypost::Version;

    fn stream() -> Sotw {
        Sotw::new("test".into(), Arc::default())
    }

    /// The whole response for `kind` at `snap`, if one is due.
    fn respond(s: &mut Sotw, kind: Kind, snap: &Snapshot) -> Option<DiscoveryResponse> {
        s.response(kind, snap).map(|f| f.message())
    }

    fn req(kind: Kind, names: &[&str], last: Option<&DiscoveryResponse>) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: kind.type_url().to_string(),
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
        let r1 = respond(&mut s, kind, &snap(1, &["a", "b"])).unwrap();
        assert_eq!(r1.resources.len(), 2);
        assert_eq!(r1.version_info, "1");
        // Nothing changed: nothing to push; the ACK asks for nothing.
        assert!(respond(&mut s, kind, &snap(2, &["a", "b"])).is_none());
        assert_eq!(s.on_request(req(Kind::Listener, &[], Some(&r1))), None);
        let r2 = respond(&mut s, kind, &snap(3, &["a"])).unwrap();
        assert_eq!(r2.resources.len(), 1, "b deleted by its absence");
        assert_ne!(r2.nonce, r1.nonce);
    }

    #[test]
    fn stale_nonces_are_ignored_nacks_are_not_answered_and_names_are() {
        let mut s = stream();
        let kind = s.on_request(req(Kind::Endpoints, &["a"], None)).unwrap();
        let r1 = respond(&mut s, kind, &snap(1, &["a"])).unwrap();
        let r2 = respond(&mut s, kind, &snap(2, &["a", "c"]));
        assert!(r2.is_none(), "a's endpoints did not change");
        let r3 = respond(
            &mut s,
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
        let r4 = respond(
            &mut s,
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
        assert!(respond(&mut s, Kind::Endpoints, &snap(1, &["a"])).is_none());
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
