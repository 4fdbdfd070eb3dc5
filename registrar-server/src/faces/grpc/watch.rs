//! The `Registrar` gRPC service as served: the generated server for every
//! method but `WatchEndpoints`, which is served here with its own codec so
//! that a message encoded once goes to every stream as the same bytes
//! ([`crate::faces::grpc::stream`]). The path, the request and the messages on the wire
//! are those of the proto.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};
use waypost_registrar_client::proto::registrar::v1::registrar_server::RegistrarServer;

use super::{FrameStream, RegistrarService};
use crate::faces::grpc::stream::codec::FrameCodec;
use crate::faces::grpc::stream::request::WatchRequest;
use crate::faces::grpc::stream::Frame;

/// The path of `WatchEndpoints`.
const WATCH_PATH: &str = "/aether.registrar.v1.Registrar/WatchEndpoints";

/// The `Registrar` gRPC service ([`RegistrarService::into_server`]): what
/// `tonic::transport::Server::add_service` takes.
#[derive(Clone)]
pub struct RegistrarGrpc {
    server: RegistrarServer<RegistrarService>,
    watch: WatchService,
}

impl RegistrarGrpc {
    pub(super) fn new(server: RegistrarServer<RegistrarService>, watch: WatchService) -> Self {
        Self { server, watch }
    }
}

impl NamedService for RegistrarGrpc {
    const NAME: &'static str = <RegistrarServer<RegistrarService> as NamedService>::NAME;
}

impl<B> Service<http::Request<B>> for RegistrarGrpc
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<B>>::poll_ready(&mut self.server, cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != WATCH_PATH {
            return self.server.call(req);
        }
        let watch = self.watch.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(FrameCodec)
                .apply_max_message_size_config(Some(watch.max_request), Some(watch.max_response));
            Ok(grpc.server_streaming(watch, req).await)
        })
    }
}

/// `WatchEndpoints` over [`FrameCodec`].
#[derive(Clone)]
pub(super) struct WatchService {
    service: RegistrarService,
    max_request: usize,
    max_response: usize,
}

impl WatchService {
    pub(super) fn new(service: RegistrarService, max_request: usize, max_response: usize) -> Self {
        Self {
            service,
            max_request,
            max_response,
        }
    }
}

impl ServerStreamingService<WatchRequest> for WatchService {
    type Response = Frame;
    type ResponseStream = FrameStream;
    type Future = BoxFuture<Response<FrameStream>, Status>;

    fn call(&mut self, request: Request<WatchRequest>) -> Self::Future {
        let service = self.service.clone();
        Box::pin(async move {
            let encoding = service.registrar.config().stream_encoding;
            service.open_watch(request, encoding).map(Response::new)
        })
    }
}
