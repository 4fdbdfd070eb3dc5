//! The loop both ADS variants run per stream: answer each request, push
//! when the registrar's state changes, stop when the client, the server or
//! the registrar goes.

use std::sync::Arc;

use registry_api::{Snapshot, Version};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::Node;

use super::resources::{self, Kind};
use super::{Client, StreamGauge, IDLE_WAKE};
use crate::core::registrar::Registrar;

/// One stream's protocol state: state of the world or delta.
pub(super) trait Variant: Send + 'static {
    /// What the client sends.
    type Request: Send + 'static;
    /// What the server sends.
    type Response: Send + 'static;
    /// The `variant` label of `registrar_xds_streams`.
    const NAME: &'static str;

    /// Take a request; the type to answer at once, if any.
    fn on_request(&mut self, request: Self::Request) -> Option<Kind>;
    /// The response for `kind` at `snap`, if one is due.
    fn response(&mut self, kind: Kind, snap: &Snapshot) -> Option<Self::Response>;
    /// Who is at the other end.
    fn client(&self) -> &Client;
}

/// What a stream of either variant keeps: who the client is, each type's
/// state (`T`, the variant's), the nonces it gave out and the server's
/// resources.
pub(super) struct PerStream<T> {
    pub(super) client: Client,
    pub(super) types: BTreeMap<Kind, T>,
    pub(super) nonces: Nonces,
    /// The server's resources, shared by its streams.
    pub(super) cache: Arc<resources::Cache>,
}

impl<T: Default> PerStream<T> {
    /// A new stream's state; `peer` names it in logs until its node does;
    /// resources come from `cache`.
    pub(super) fn new(peer: String, cache: Arc<resources::Cache>) -> Self {
        Self {
            client: Client::new(peer),
            types: BTreeMap::new(),
            nonces: Nonces::default(),
            cache,
        }
    }

    /// The start of taking a request of `variant` from `node` for
    /// `type_url`: the client noted, and its type's state (with the
    /// client, for logs), or `None` for a type this registrar does not
    /// serve.
    pub(super) fn request(
        &mut self,
        node: Option<&Node>,
        variant: &'static str,
        type_url: &str,
    ) -> Option<(Kind, &mut T, &Client)> {
        self.client.saw(node, variant);
        let Some(kind) = Kind::from_type_url(type_url) else {
            tracing::debug!(node = %self.client.id(), type_url = %type_url, "xDS: a type this registrar does not serve; ignored");
            return None;
        };
        Some((kind, self.types.entry(kind).or_default(), &self.client))
    }
}

/// The nonces of one stream's responses: `1`, `2`, …
#[derive(Debug, Default)]
pub(super) struct Nonces(u64);

impl Nonces {
    /// The next one.
    pub(super) fn next(&mut self) -> String {
        self.0 += 1;
        self.0.to_string()
    }
}

/// Serve one stream until the client or the registrar ends it.
pub(super) async fn run<V: Variant>(
    registrar: Arc<Registrar>,
    mut requests: Streaming<V::Request>,
    tx: mpsc::Sender<Result<V::Response, Status>>,
    mut st: V,
) {
    let _gauge = StreamGauge::new(V::NAME);
    let store = registrar.state().store().clone();
    // The version every subscribed type was last evaluated at.
    let mut seen: Option<Version> = None;
    loop {
        let current = seen;
        let responses: Vec<V::Response> = tokio::select! {
            req = requests.message() => match req {
                Ok(Some(r)) => {
                    let Some(kind) = st.on_request(r) else { continue };
                    // Before the first snapshot: answered once it arrives.
                    let Some(snap) = store.snapshot() else { continue };
                    st.response(kind, &snap).into_iter().collect()
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(node = %st.client().id(), error = %e, "xDS stream failed");
                    break;
                }
            },
            changed = store.wait_until(|s| Some(s.version()) != current, IDLE_WAKE) => {
                if !changed {
                    continue;
                }
                let Some(snap) = store.snapshot() else { continue };
                seen = Some(snap.version());
                Kind::ALL
                    .into_iter()
                    .filter_map(|k| st.response(k, &snap))
                    .collect()
            }
            () = registrar.closing() => break,
            () = tx.closed() => break,
        };
        for resp in responses {
            if tx.send(Ok(resp)).await.is_err() {
                return;
            }
        }
    }
    tracing::debug!(node = %st.client().id(), "xDS stream closed");
}
