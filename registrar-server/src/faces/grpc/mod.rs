//! The `Registrar` gRPC service.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tracing::Instrument;
use waypost::{Error, Op, Watch};
use waypost_registrar_client::proto::registrar::v1::registrar_server::{
    Registrar as GrpcRegistrar, RegistrarServer,
};
use waypost_registrar_client::proto::registrar::v1::{
    AckMode, EndpointEvent, HeartbeatRequest, HeartbeatResponse, ListAllEndpointsRequest,
    ListAllEndpointsResponse, RegisterEndpointRequest, RegisterEndpointResponse,
    UnregisterEndpointRequest, UnregisterEndpointResponse, WatchEndpointsRequest,
};
use waypost_registrar_client::{
    endpoint_from_proto, endpoint_to_proto, key_from_parts, status_from_error, Token,
    MAX_SUMMARY_BYTES,
};

use crate::auth::{authorized_write, Security};
use crate::engine::config::{
    parse_ack, Ack, StreamEncoding, ACK_METADATA, DEFAULT_MAX_REQUEST_BYTES,
};
use crate::engine::registrar::Registrar;
use crate::faces::grpc::stream::request::WatchRequest;
use crate::faces::grpc::stream::{AgentStream, Feeds, Frame};

pub(crate) mod stream;
mod watch;

pub use watch::RegistrarGrpc;

/// The gRPC face of a [`Registrar`].
#[derive(Clone)]
pub struct RegistrarService {
    registrar: Arc<Registrar>,
    feeds: Arc<Feeds>,
    security: Arc<Security>,
    max_request_bytes: usize,
}

impl RegistrarService {
    /// Serve `registrar` without authentication (plaintext).
    pub fn new(registrar: Arc<Registrar>) -> Self {
        Self {
            feeds: Arc::new(Feeds::of(&registrar)),
            registrar,
            security: Arc::new(Security::default()),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }

    /// Decode request messages of at most `bytes` (default
    /// [`DEFAULT_MAX_REQUEST_BYTES`]).
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Authenticate (and authorize) requests as `security` says.
    pub(crate) fn with_security(mut self, security: Security) -> Self {
        self.security = Arc::new(security);
        self
    }

    /// As a tonic service: requests up to the request limit (a
    /// `WatchEndpoints` request [`MAX_SUMMARY_BYTES`] more, for the agent's
    /// summary of what it holds), responses
    /// large enough for big registries (256 MiB); `WatchEndpoints` sends
    /// each message encoded once for every stream (see
    /// [`RegistrarConfig::stream_encoding`](crate::engine::config::RegistrarConfig)).
    pub fn into_server(self) -> RegistrarGrpc {
        let limit = self.max_request_bytes;
        // A watch request may carry the agent's summary of what it holds.
        let watch_limit = limit + MAX_SUMMARY_BYTES;
        let watch = watch::WatchService::new(self.clone(), watch_limit, MAX_RESPONSE_BYTES);
        let server = RegistrarServer::new(self)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(MAX_RESPONSE_BYTES);
        RegistrarGrpc::new(server, watch)
    }

    /// An agent's `WatchEndpoints` stream, as frames encoded as `encoding`
    /// says.
    fn open_watch(
        &self,
        request: Request<WatchRequest>,
        encoding: StreamEncoding,
    ) -> Result<FrameStream, Status> {
        let caller = self.security.caller(&request)?;
        caller.may_read()?;
        let mut req = request.into_inner();
        let from = self.registrar.resume_from(&req.last_version);
        // Resumed by version, the summary is not needed.
        let held = req.held.take().filter(|_| from.is_none());
        tracing::debug!(
            cluster = %req.cluster_name,
            node = %req.node_name,
            last_version = %req.last_version,
            resume = from.is_some(),
            by_content = held.is_some(),
            %caller,
            "agent watching"
        );
        let reg = &self.registrar;
        let feeds = Arc::clone(&self.feeds);
        let fed = match encoding {
            StreamEncoding::Shared => feeds.fanout.subscribe(reg.state().store(), from),
            _ => None,
        };
        let stream = match fed {
            Some((first, feed)) => AgentStream::fed(Arc::clone(reg), feeds, first, feed),
            None => AgentStream::new(Arc::clone(reg), feeds, reg.state().watch(from), encoding),
        }
        .holding(held)
        .take_until(reg.closing());
        Ok(Box::pin(stream))
    }
}

fn status(e: Error) -> Status {
    status_from_error(&e)
}

/// The acknowledgement a write asks for: the request field, else the
/// `x-registrar-ack` metadata (`optimistic` or `durable`), else `None`
/// (the registrar's default).
fn ack_mode<T>(request: &Request<T>, field: i32) -> Result<Option<Ack>, Status> {
    match AckMode::try_from(field) {
        Ok(AckMode::Optimistic) => return Ok(Some(Ack::Optimistic)),
        Ok(AckMode::Durable) => return Ok(Some(Ack::Durable)),
        Ok(AckMode::Default) => {}
        Err(_) => {
            return Err(status(Error::invalid(
                "ack",
                format!("{field} is not an AckMode"),
            )))
        }
    }
    match request.metadata().get(ACK_METADATA) {
        None => Ok(None),
        Some(v) => {
            let text = v.to_str().map_err(|_| {
                status(Error::invalid(
                    ACK_METADATA,
                    "not ASCII: optimistic or durable",
                ))
            })?;
            parse_ack(ACK_METADATA, text).map(Some).map_err(status)
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<EndpointEvent, Status>> + Send + 'static>>;

/// An agent stream's frames (see [`crate::faces::grpc::stream`]).
pub(crate) type FrameStream = Pin<Box<dyn Stream<Item = Result<Frame, Status>> + Send + 'static>>;

/// The largest response message: large enough for big registries.
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

#[tonic::async_trait]
impl GrpcRegistrar for RegistrarService {
    async fn register_endpoint(
        &self,
        request: Request<RegisterEndpointRequest>,
    ) -> Result<Response<RegisterEndpointResponse>, Status> {
        let caller = self.security.caller(&request)?;
        let ack = ack_mode(&request, request.get_ref().ack)?;
        let req = request.into_inner();
        let proto = req
            .endpoint
            .ok_or_else(|| status(Error::invalid("endpoint", "missing")))?;
        let mut endpoint = endpoint_from_proto(proto, "endpoint.").map_err(status)?;
        if endpoint.cluster.is_empty() {
            // No cluster given: this registrar's, as on every write path.
            endpoint.cluster = self.registrar.config().cluster_name.clone();
        }
        let token = authorized_write(&self.registrar, &caller, Op::Register(endpoint), ack).await?;
        Ok(Response::new(RegisterEndpointResponse {
            version: token.to_string(),
        }))
    }

    async fn unregister_endpoint(
        &self,
        request: Request<UnregisterEndpointRequest>,
    ) -> Result<Response<UnregisterEndpointResponse>, Status> {
        let caller = self.security.caller(&request)?;
        let ack = ack_mode(&request, request.get_ref().ack)?;
        let req = request.into_inner();
        let key = key_from_parts(req.service_name, req.id).map_err(status)?;
        let token = authorized_write(&self.registrar, &caller, Op::Deregister(key), ack).await?;
        Ok(Response::new(UnregisterEndpointResponse {
            version: token.to_string(),
        }))
    }

    type WatchEndpointsStream = EventStream;

    /// The generated service's path, used only by a program that serves
    /// `RegistrarServer::new(service)` itself: every stream encodes its own
    /// messages. [`RegistrarService::into_server`] serves `WatchEndpoints`
    /// with shared encodings ([`RegistrarGrpc`]).
    async fn watch_endpoints(
        &self,
        request: Request<WatchEndpointsRequest>,
    ) -> Result<Response<Self::WatchEndpointsStream>, Status> {
        let frames = self.open_watch(request.map(WatchRequest::from), StreamEncoding::PerStream)?;
        let stream = frames.map(|f| f.and_then(Frame::into_message));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_all_endpoints(
        &self,
        request: Request<ListAllEndpointsRequest>,
    ) -> Result<Response<ListAllEndpointsResponse>, Status> {
        self.security.caller(&request)?.may_read()?;
        let (endpoints, version) = match self.registrar.state().store().snapshot() {
            Some(snap) => (
                snap.iter().map(endpoint_to_proto).collect(),
                self.registrar.token(),
            ),
            None => {
                let snap = waypost::Registry::snapshot(self.registrar.backend().as_ref())
                    .await
                    .map_err(status)?;
                let eps = snap.iter().map(endpoint_to_proto).collect();
                (
                    eps,
                    Token {
                        epoch: self.registrar.epoch(),
                        version: waypost::Version::ZERO,
                    },
                )
            }
        };
        Ok(Response::new(ListAllEndpointsResponse {
            endpoints,
            version: version.to_string(),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let caller = self.security.caller(&request)?;
        let req = request.into_inner();
        let span = tracing::info_span!("heartbeat", node = %req.node_name, %caller);
        async {
            caller.may_heartbeat(&req.node_name)?;
            self.registrar
                .heartbeat(&req.node_name)
                .await
                .map_err(status)?;
            tracing::trace!("heartbeat");
            Ok(Response::new(HeartbeatResponse {}))
        }
        .instrument(span)
        .await
    }
}
