//! The `Registrar` gRPC service.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use registry_api::{Error, Event, Op, Watch};
use registry_registrar::proto::registrar::v1::endpoint_event::EventType;
use registry_registrar::proto::registrar::v1::registrar_server::{
    Registrar as GrpcRegistrar, RegistrarServer,
};
use registry_registrar::proto::registrar::v1::{
    AckMode, EndpointEvent, HeartbeatRequest, HeartbeatResponse, ListAllEndpointsRequest,
    ListAllEndpointsResponse, RegisterEndpointRequest, RegisterEndpointResponse,
    UnregisterEndpointRequest, UnregisterEndpointResponse, WatchEndpointsRequest, WriteRefusal,
};
use registry_registrar::{
    endpoint_from_proto, endpoint_to_proto, key_from_parts, status_from_error, Token,
};
use tonic::{Request, Response, Status};

use crate::auth::{Caller, Security};
use crate::config::Ack;
use crate::refusals::Refusal;
use crate::Registrar;

/// The gRPC face of a [`Registrar`].
#[derive(Clone)]
pub struct RegistrarService {
    registrar: Arc<Registrar>,
    security: Arc<Security>,
    max_request_bytes: usize,
}

/// The largest request message the registrar decodes by default: 64 KiB,
/// four times the largest valid endpoint
/// ([`registry_api::limits::MAX_ENCODED_LEN`]). Larger requests are
/// refused (`OUT_OF_RANGE`) before they are read whole.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024;

impl RegistrarService {
    /// Serve `registrar` without authentication (plaintext).
    pub fn new(registrar: Arc<Registrar>) -> Self {
        Self {
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

    /// Refuse a write of `key` (to become `new`, or removed) unless
    /// `caller` may write both `new` and the endpoint stored now.
    async fn authorize_write(
        &self,
        caller: &Caller,
        key: &registry_api::EndpointKey,
        new: Option<&registry_api::Endpoint>,
    ) -> Result<(), Status> {
        if caller.is_anyone() {
            return Ok(());
        }
        if let Some(ep) = new {
            caller.may_write(ep)?;
        }
        if let Some(current) = self.registrar.current(key).await.map_err(status)? {
            if Some(&current) != new {
                caller.may_write(&current)?;
            }
        }
        Ok(())
    }

    /// As a tonic service: requests up to the request limit, responses
    /// large enough for big registries (256 MiB).
    pub fn into_server(self) -> RegistrarServer<Self> {
        let limit = self.max_request_bytes;
        RegistrarServer::new(self)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(256 * 1024 * 1024)
    }
}

fn status(e: Error) -> Status {
    status_from_error(&e)
}

/// Counts a connected agent while alive.
struct AgentGuard;

impl AgentGuard {
    fn new() -> Self {
        metrics::gauge!("registrar_connected_agents").increment(1.0);
        AgentGuard
    }
}

impl Drop for AgentGuard {
    fn drop(&mut self) {
        metrics::gauge!("registrar_connected_agents").decrement(1.0);
    }
}

/// One event as protobuf messages (a snapshot in chunks); `refusal` is
/// the refused write a delta undoes, if any.
fn encode(ev: Event, epoch: u64, chunk: usize, refusal: Option<Refusal>) -> Vec<EndpointEvent> {
    let version = Token {
        epoch,
        version: ev.version(),
    }
    .to_string();
    let refusal = refusal.map(|r| WriteRefusal {
        code: status_from_error(&r.error).code() as i32,
        message: r.error.to_string(),
        refused: match &r.op {
            Op::Register(e) => Some(endpoint_to_proto(e)),
            Op::Deregister(_) => None,
        },
    });
    let delta = |ty: EventType, ep: registry_registrar::proto::registry::v1::ServiceEndpoint| {
        EndpointEvent {
            r#type: ty as i32,
            service_name: ep.service_name.clone(),
            protocol: ep.protocol,
            endpoint: Some(ep),
            version: version.clone(),
            snapshot_endpoints: Vec::new(),
            snapshot_last: false,
            refusal: refusal.clone(),
        }
    };
    match ev {
        Event::Snapshot(s) => {
            let all: Vec<_> = s.iter().map(endpoint_to_proto).collect();
            let chunks: Vec<Vec<_>> = if all.is_empty() {
                vec![Vec::new()]
            } else {
                all.chunks(chunk.max(1)).map(<[_]>::to_vec).collect()
            };
            let n = chunks.len();
            chunks
                .into_iter()
                .enumerate()
                .map(|(i, eps)| EndpointEvent {
                    r#type: EventType::FullSnapshot as i32,
                    service_name: String::new(),
                    protocol: 0,
                    endpoint: None,
                    version: version.clone(),
                    snapshot_endpoints: eps,
                    snapshot_last: i + 1 == n,
                    refusal: None,
                })
                .collect()
        }
        Event::Added { endpoint, .. } => vec![delta(
            EventType::EndpointAdded,
            endpoint_to_proto(&endpoint),
        )],
        Event::Updated { endpoint, .. } => {
            vec![delta(
                EventType::EndpointUpdated,
                endpoint_to_proto(&endpoint),
            )]
        }
        Event::Removed { key, .. } => {
            let ep = registry_registrar::proto::registry::v1::ServiceEndpoint {
                service_name: key.service,
                id: key.id,
                ..Default::default()
            };
            vec![delta(EventType::EndpointRemoved, ep)]
        }
    }
}

/// The metadata key that picks the acknowledgement of one write.
pub const ACK_METADATA: &str = "x-registrar-ack";

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
            text.parse::<Ack>().map(Some).map_err(|_| {
                let shown: String = text.chars().take(64).collect();
                status(Error::invalid(
                    ACK_METADATA,
                    format!(
                        "{shown:?} ({} bytes) is not optimistic or durable",
                        text.len()
                    ),
                ))
            })
        }
    }
}

fn type_label(ty: i32) -> &'static str {
    match EventType::try_from(ty) {
        Ok(EventType::FullSnapshot) => "full_snapshot",
        Ok(EventType::EndpointAdded) => "endpoint_added",
        Ok(EventType::EndpointRemoved) => "endpoint_removed",
        Ok(EventType::EndpointUpdated) => "endpoint_updated",
        Err(_) => "unknown",
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<EndpointEvent, Status>> + Send + 'static>>;

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
        let endpoint = endpoint_from_proto(proto, "endpoint.").map_err(status)?;
        self.authorize_write(&caller, &endpoint.key(), Some(&endpoint))
            .await?;
        let token = self
            .registrar
            .write(Op::Register(endpoint), ack)
            .await
            .map_err(status)?;
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
        self.authorize_write(&caller, &key, None).await?;
        let token = self
            .registrar
            .write(Op::Deregister(key), ack)
            .await
            .map_err(status)?;
        Ok(Response::new(UnregisterEndpointResponse {
            version: token.to_string(),
        }))
    }

    type WatchEndpointsStream = EventStream;

    async fn watch_endpoints(
        &self,
        request: Request<WatchEndpointsRequest>,
    ) -> Result<Response<Self::WatchEndpointsStream>, Status> {
        let caller = self.security.caller(&request)?;
        caller.may_read()?;
        let req = request.into_inner();
        let from = self.registrar.resume_from(&req.last_version);
        tracing::debug!(
            cluster = %req.cluster_name,
            node = %req.node_name,
            last_version = %req.last_version,
            resume = from.is_some(),
            %caller,
            "agent watching"
        );
        let epoch = self.registrar.epoch();
        let chunk = self.registrar.config().snapshot_chunk;
        let guard = AgentGuard::new();
        let registrar = Arc::clone(&self.registrar);
        let stream = self
            .registrar
            .state()
            .watch(from)
            .take_until(self.registrar.closing())
            .flat_map(move |item| {
                let _alive = &guard;
                let out: Vec<Result<EndpointEvent, Status>> = match item {
                    Ok(ev) => {
                        let refusal = match &ev {
                            Event::Snapshot(_) => None,
                            delta => registrar.refusal_at(delta.version()),
                        };
                        encode(ev, epoch, chunk, refusal)
                        .into_iter()
                        .map(|m| {
                            metrics::counter!("registrar_event_broadcast_total", "type" => type_label(m.r#type))
                                .increment(1);
                            Ok(m)
                        })
                        .collect()
                    }
                    Err(e) => vec![Err(status(e))],
                };
                futures::stream::iter(out)
            });
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
                let snap = registry_api::Registry::snapshot(self.registrar.backend().as_ref())
                    .await
                    .map_err(status)?;
                let eps = snap.iter().map(endpoint_to_proto).collect();
                (
                    eps,
                    Token {
                        epoch: self.registrar.epoch(),
                        version: registry_api::Version::ZERO,
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
        caller.may_heartbeat(&req.node_name)?;
        self.registrar
            .heartbeat(&req.node_name)
            .await
            .map_err(status)?;
        Ok(Response::new(HeartbeatResponse {}))
    }
}
