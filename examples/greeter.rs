//! A one-call gRPC service for the examples and their tests: every reply
//! names the server that answered.

use std::net::SocketAddr;

use tonic::{Request, Response, Status};

/// The generated protobuf and gRPC code of `proto/greeter.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
pub mod proto {
    tonic::include_proto!("examples.greeter.v1");
}

pub use proto::greeter_client::GreeterClient;
pub use proto::greeter_server::GreeterServer;
pub use proto::{HelloReply, HelloRequest};

/// A greeter that answers as `id`.
#[derive(Debug, Clone)]
pub struct Greeter {
    id: String,
}

impl Greeter {
    /// A greeter answering as `id`.
    pub fn new(id: impl Into<String>) -> Self {
        Self { id: id.into() }
    }
}

#[tonic::async_trait]
impl proto::greeter_server::Greeter for Greeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let name = request.into_inner().name;
        Ok(Response::new(HelloReply {
            message: format!("hello {name} from {}", self.id),
            server: self.id.clone(),
        }))
    }
}

/// Serve a greeter answering as `id` on `listener` until `shutdown`
/// resolves; returns the address it listens on at once.
pub fn serve(
    id: &str,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(
    SocketAddr,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
)> {
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let svc = GreeterServer::new(Greeter::new(id));
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, shutdown),
    );
    Ok((addr, task))
}
