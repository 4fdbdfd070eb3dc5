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
//! resources are built once, whatever the number of clients) and pushes
//! those that changed. Types come from `envoy-types`.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Security;
use crate::core::registrar::Registrar;
use crate::metrics::names;

mod delta;
pub(crate) mod resources;
mod sotw;
mod stream;

pub use resources::{MAX_WEIGHT, REGION_LABEL, WEIGHT_LABEL, ZONE_LABEL};

/// Responses queued for one stream before its task waits for the client
/// to read.
const STREAM_BUFFER: usize = 8;
/// How long a stream waits for a change before checking again that it is
/// still wanted (a wake-up, not a poll: changes wake it at once).
const IDLE_WAKE: std::time::Duration = std::time::Duration::from_secs(300);

/// The aggregated discovery service over a registrar's state. Every
/// caller must be allowed to read (the gRPC API's authorization, when the
/// server has TLS).
#[derive(Clone)]
pub struct XdsService {
    registrar: Arc<Registrar>,
    security: Arc<Security>,
    cache: Arc<resources::Cache>,
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
            cache: Arc::default(),
        }
    }

    /// Authenticate and authorize callers as `security` says.
    pub(crate) fn with_security(mut self, security: Arc<Security>) -> Self {
        self.security = security;
        self
    }

    /// The tonic server of this service.
    pub fn into_server(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self)
    }

    fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        self.security.caller(req)?.may_read()
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.open(request, sotw::Sotw::new)
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.open(request, delta::Delta::new)
    }
}

/// The responses of one stream of variant `V`, as tonic sends them.
type Responses<V> = ReceiverStream<Result<<V as stream::Variant>::Response, Status>>;

impl XdsService {
    /// Check the caller of `request`, then serve its stream with the
    /// state `variant` makes (from the peer's name and the shared cache)
    /// in a task of its own.
    fn open<V: stream::Variant>(
        &self,
        request: Request<Streaming<V::Request>>,
        variant: fn(String, Arc<resources::Cache>) -> V,
    ) -> Result<Response<Responses<V>>, Status> {
        self.check(&request)?;
        let state = variant(peer(&request), Arc::clone(&self.cache));
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(stream::run(
            Arc::clone(&self.registrar),
            request.into_inner(),
            tx,
            state,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
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

/// Count one response pushed.
pub(crate) fn count_push(type_url: &str, resources: usize) {
    metrics::counter!(names::XDS_PUSHES_TOTAL, "type_url" => type_url.to_string()).increment(1);
    metrics::counter!(names::XDS_RESOURCES_SENT_TOTAL, "type_url" => type_url.to_string())
        .increment(resources as u64);
}
