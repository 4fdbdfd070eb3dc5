//! What both ADS variants do per stream: answer each request, push when
//! the registrar's state changes, stop when the client, the server or the
//! registrar goes.
//!
//! A stream is the response body tonic polls, with no task of its own:
//! each time it is polled it takes the client's requests that arrived and
//! the change of the registrar's state, if any ([`Store::changes`]: a
//! wake-up, nothing queued per stream), and yields the responses due. So
//! a change costs each stream one wake-up, and what the stream sends is
//! the resources' shared encodings ([`super::frame`]).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::config::core::v3::Node;
use futures::Stream;
use tokio_stream::wrappers::WatchStream;
use tonic::{Status, Streaming};
use waypost::cached::Store;
use waypost::{Snapshot, Version};

use super::frame::Frame;
use super::resources::Kind;
use super::{Client, Shared, StreamGauge};
use crate::engine::registrar::Registrar;

/// One stream's protocol state: state of the world or delta.
pub(super) trait Variant: Send + Unpin + 'static {
    /// What the client sends.
    type Request: prost::Message + Default + Send + Unpin + 'static;
    /// What the server sends, but for its resources.
    type Response: prost::Message + Default + Send + Unpin + 'static;
    /// The `variant` label of `registrar_xds_streams`.
    const NAME: &'static str;

    /// A new stream's state; `peer` names it in logs until its node does.
    fn new(peer: String, shared: Arc<Shared>) -> Self;
    /// Take a request; the type to answer at once, if any.
    fn on_request(&mut self, request: Self::Request) -> Option<Kind>;
    /// The response for `kind` at `snap`, if one is due.
    fn response(&mut self, kind: Kind, snap: &Snapshot) -> Option<Frame<Self::Response>>;
    /// Who is at the other end.
    fn client(&self) -> &Client;
}

/// What a stream of either variant keeps: who the client is, each type's
/// state (`T`, the variant's), the nonces it gave out and what the
/// server's streams share.
pub(super) struct PerStream<T> {
    pub(super) client: Client,
    pub(super) types: BTreeMap<Kind, T>,
    pub(super) nonces: Nonces,
    /// The server's resources and counters.
    pub(super) shared: Arc<Shared>,
}

impl<T: Default> PerStream<T> {
    /// A new stream's state; `peer` names it in logs until its node does.
    pub(super) fn new(peer: String, shared: Arc<Shared>) -> Self {
        Self {
            client: Client::new(peer),
            types: BTreeMap::new(),
            nonces: Nonces::default(),
            shared,
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

/// One ADS stream of variant `V`, as tonic polls it (see the module docs).
pub(super) struct AdsStream<V: Variant> {
    state: V,
    requests: Streaming<V::Request>,
    store: Store,
    changes: WatchStream<()>,
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Responses due, in order.
    due: VecDeque<Frame<V::Response>>,
    /// The version every subscribed type was last evaluated at.
    seen: Option<Version>,
    ended: bool,
    _gauge: StreamGauge,
}

impl<V: Variant> AdsStream<V> {
    /// Serve `requests` from `registrar`'s state with `state`.
    pub(super) fn new(registrar: &Registrar, requests: Streaming<V::Request>, state: V) -> Self {
        let store = registrar.state().store().clone();
        Self {
            state,
            requests,
            changes: store.changes(),
            store,
            closing: Box::pin(registrar.closing()),
            due: VecDeque::new(),
            seen: None,
            ended: false,
            _gauge: StreamGauge::new(V::NAME),
        }
    }

    /// Take one request: the response it asks for, if one is due (before
    /// the first snapshot, it is answered once that arrives).
    fn take(&mut self, request: V::Request) {
        let Some(kind) = self.state.on_request(request) else {
            return;
        };
        if let Some(snap) = self.store.snapshot() {
            self.due.extend(self.state.response(kind, &snap));
        }
    }

    /// The state changed (or may have): every subscribed type whose
    /// resources changed is due.
    fn changed(&mut self) {
        let Some(snap) = self.store.snapshot() else {
            return;
        };
        if self.seen == Some(snap.version()) {
            return;
        }
        self.seen = Some(snap.version());
        for kind in Kind::ALL {
            self.due.extend(self.state.response(kind, &snap));
        }
    }

    fn end(&mut self, why: &str) -> Poll<Option<Result<Frame<V::Response>, Status>>> {
        self.ended = true;
        tracing::debug!(node = %self.state.client().id(), why, "xDS stream closed");
        Poll::Ready(None)
    }
}

impl<V: Variant> Stream for AdsStream<V> {
    type Item = Result<Frame<V::Response>, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(frame) = this.due.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if this.closing.as_mut().poll(cx).is_ready() {
                return this.end("the registrar is closing");
            }
            match Pin::new(&mut this.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(request))) => {
                    this.take(request);
                    continue;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(node = %this.state.client().id(), error = %e, "xDS stream failed");
                    return this.end("the client's stream failed");
                }
                Poll::Ready(None) => return this.end("the client ended its stream"),
                Poll::Pending => {}
            }
            match Pin::new(&mut this.changes).poll_next(cx) {
                Poll::Ready(Some(())) => this.changed(),
                Poll::Ready(None) => return this.end("the registrar's state is gone"),
                Poll::Pending => {
                    if this.due.is_empty() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}
