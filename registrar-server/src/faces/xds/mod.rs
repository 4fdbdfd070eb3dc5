//! The xDS server (feature `xds`): Envoy's aggregated discovery service
//! (ADS), state of the world (`StreamAggregatedResources`) and incremental
//! (`DeltaAggregatedResources`), over the registrar's state.
//!
//! Each service of the registry is one listener, one route configuration,
//! one cluster and one load assignment, all named by the service's name
//! (see `docs/registrar/xds.md`), so a proxyless gRPC client resolves
//! `xds:///<service>`.
//! Every stream follows the registrar's own state (the snapshot and change
//! notifications `WatchEndpoints`, DNS and the HTTP API read): when the
//! state changes, each stream takes the resources its client subscribed
//! to from a cache the server's streams share (a changed service's
//! resources are built, encoded and hashed once, whatever the number of
//! clients) and pushes those that changed, as the shared encodings plus
//! the few fields of its own ([`frame`]). Types come from `envoy-types`.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use metrics::Counter;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Security;
use crate::engine::registrar::Registrar;
use crate::metrics::names;

mod delta;
pub(crate) mod frame;
pub(crate) mod resources;
mod sotw;
mod stream;

pub use resources::{MAX_WEIGHT, REGION_LABEL, WEIGHT_LABEL, ZONE_LABEL};

use frame::{Frame, FrameCodec};
use resources::Kind;
use stream::{AdsStream, Variant};

/// The gRPC service's name.
const SERVICE_NAME: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// The path of the state-of-the-world method.
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// The path of the incremental method.
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The aggregated discovery service over a registrar's state. Every
/// caller must be allowed to read (the gRPC API's authorization, when the
/// server has TLS).
#[derive(Clone)]
pub struct XdsService {
    registrar: Arc<Registrar>,
    security: Arc<Security>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for XdsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsService").finish_non_exhaustive()
    }
}

impl XdsService {
    /// The service over `registrar`'s state, without authentication (for a
    /// plaintext listener).
    pub fn new(registrar: Arc<Registrar>) -> Self {
        Self {
            registrar,
            security: Arc::new(Security::default()),
            shared: Arc::new(Shared::default()),
        }
    }

    /// Authenticate and authorize callers as `security` says.
    pub(crate) fn with_security(mut self, security: Arc<Security>) -> Self {
        self.security = security;
        self
    }

    /// The tonic server of this service: what
    /// `tonic::transport::Server::add_service` takes.
    pub fn into_server(self) -> XdsServer {
        XdsServer(self)
    }

    /// Check the caller of `request`, then serve its stream with the
    /// state of variant `V`.
    fn open<V: Variant>(
        &self,
        request: Request<Streaming<V::Request>>,
    ) -> Result<AdsStream<V>, Status> {
        self.security.caller(&request)?.may_read()?;
        let state = V::new(peer(&request), Arc::clone(&self.shared));
        Ok(AdsStream::new(&self.registrar, request.into_inner(), state))
    }
}

/// The ADS gRPC service ([`XdsService::into_server`]): both methods, each
/// over a codec of its own, so a resource encoded once goes to every
/// stream as the same bytes. The paths and the messages on the wire are
/// those of Envoy's `AggregatedDiscoveryService`.
#[derive(Clone, Debug)]
pub struct XdsServer(XdsService);

impl NamedService for XdsServer {
    const NAME: &'static str = SERVICE_NAME;
}

impl<B> Service<http::Request<B>> for XdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let service = self.0.clone();
        match req.uri().path() {
            SOTW_PATH => Box::pin(Method::<sotw::Sotw>::serve(service, req)),
            DELTA_PATH => Box::pin(Method::<delta::Delta>::serve(service, req)),
            other => {
                let status =
                    Status::unimplemented(format!("no method {other:?} in {SERVICE_NAME}"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// One ADS method, of variant `V`.
struct Method<V>(XdsService, PhantomData<fn() -> V>);

impl<V: Variant> Method<V> {
    async fn serve<B>(
        service: XdsService,
        req: http::Request<B>,
    ) -> Result<http::Response<tonic::body::Body>, Infallible>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let mut grpc = Grpc::new(FrameCodec::<V::Request, V::Response>::default());
        Ok(grpc.streaming(Method::<V>(service, PhantomData), req).await)
    }
}

impl<V: Variant> StreamingService<V::Request> for Method<V> {
    type Response = Frame<V::Response>;
    type ResponseStream = AdsStream<V>;
    type Future = std::future::Ready<Result<Response<AdsStream<V>>, Status>>;

    fn call(&mut self, request: Request<Streaming<V::Request>>) -> Self::Future {
        std::future::ready(self.0.open(request).map(Response::new))
    }
}

/// What the streams of one server share: the resources built for them and
/// the push counters.
pub(crate) struct Shared {
    pub(crate) cache: resources::Cache,
    /// `registrar_xds_pushes_total` and `…_resources_sent_total`, per kind.
    pushes: [(Counter, Counter); 4],
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            cache: resources::Cache::default(),
            pushes: Kind::ALL.map(|k| {
                let label = k.type_url();
                (
                    metrics::counter!(names::XDS_PUSHES_TOTAL, "type_url" => label),
                    metrics::counter!(names::XDS_RESOURCES_SENT_TOTAL, "type_url" => label),
                )
            }),
        }
    }
}

impl Shared {
    /// Count one response of `kind` pushed with `resources` resources.
    pub(crate) fn count_push(&self, kind: Kind, resources: usize) {
        let (pushes, sent) = &self.pushes[kind.index()];
        pushes.increment(1);
        sent.increment(resources as u64);
    }
}

fn peer<T>(req: &Request<T>) -> String {
    req.remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Who is at the other end of one stream, for logs: the node of its
/// first request that named one.
#[derive(Debug, Default)]
pub(crate) struct Client {
    peer: String,
    node: Option<String>,
}

impl Client {
    pub(crate) fn new(peer: String) -> Self {
        Self { peer, node: None }
    }

    /// Remember the node of a request (only the first one names it).
    pub(crate) fn saw(&mut self, node: Option<&Node>, variant: &'static str) {
        if self.node.is_some() {
            return;
        }
        if let Some(n) = node {
            tracing::info!(peer = %self.peer, node = %n.id, cluster = %n.cluster, variant, "xDS stream opened");
            self.node = Some(n.id.clone());
        }
    }

    /// The node's ID, or the peer's address before one is known.
    pub(crate) fn id(&self) -> &str {
        self.node.as_deref().unwrap_or(&self.peer)
    }

    /// Log and count a rejection of the response `nonce` of `type_url`.
    pub(crate) fn nacked(&self, type_url: &str, nonce: &str, detail: &RpcStatus) {
        tracing::warn!(
            node = %self.id(),
            type_url,
            nonce,
            code = detail.code,
            error = %detail.message,
            "xDS client rejected a response (NACK)"
        );
        metrics::counter!(names::XDS_NACKS_TOTAL, "type_url" => type_url.to_string()).increment(1);
    }
}

/// Counts an open stream in `registrar_xds_streams{variant}` while alive.
pub(crate) struct StreamGauge(&'static str);

impl StreamGauge {
    pub(crate) fn new(variant: &'static str) -> Self {
        metrics::gauge!(names::XDS_STREAMS, "variant" => variant).increment(1.0);
        Self(variant)
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        metrics::gauge!(names::XDS_STREAMS, "variant" => self.0).decrement(1.0);
    }
}
