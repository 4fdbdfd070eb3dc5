//! A registrar (memory backend) serving gRPC, the HTTP API and DNS on
//! loopback, for the field-protocol tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use waypost::{liveness::Liveness, memory::MemoryRegistry};
use waypost_registrar_server::{Backend, Opening, RegistrarConfig};

pub struct Stack {
    pub grpc: SocketAddr,
    #[cfg(feature = "http-api")]
    pub http: SocketAddr,
    #[cfg(feature = "dns")]
    pub dns: SocketAddr,
    running: Running,
}

/// Serve on free loopback ports; DNS answers for `registry.` with TTL 0.
pub async fn start() -> Stack {
    start_with(RegistrarConfig::new("test")).await
}

/// [`start`] with the registrar configured as `cfg` says.
pub async fn start_with(cfg: RegistrarConfig) -> Stack {
    let mut server = Opening::new(cfg);
    #[cfg(feature = "http-api")]
    let http = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        server.protocols.http_api = Some(l);
        addr
    };
    #[cfg(feature = "dns")]
    let dns = {
        let l = waypost_registrar_server::DnsListeners::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let cfg = waypost_registrar_server::DnsConfig::new("registry.", Duration::ZERO).unwrap();
        server.protocols.dns = Some((l, cfg));
        addr
    };
    let (grpc, running) = serve(server).await;
    Stack {
        grpc,
        #[cfg(feature = "http-api")]
        http,
        #[cfg(feature = "dns")]
        dns,
        running,
    }
}

/// A server [`serve`] started.
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<waypost::Result<()>>,
}

impl Running {
    /// Graceful stop; what `serve` returned.
    pub async fn stop(mut self) -> waypost::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("the server did not stop")
            .unwrap()
    }
}

/// Serve `opening` (its protocols and options as set) over a memory
/// backend, gRPC and health on free loopback ports: the gRPC address.
pub async fn serve(opening: Opening) -> (SocketAddr, Running) {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(opening.serve(
        || async { Ok(Arc::new(Liveness::new(MemoryRegistry::new())) as Arc<dyn Backend>) },
        grpc,
        health,
        async move {
            let _ = rx.await;
        },
    ));
    (
        addr,
        Running {
            stop: Some(tx),
            task,
        },
    )
}

impl Stack {
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Graceful stop; what `serve` returned.
    pub async fn stop(self) -> waypost::Result<()> {
        self.running.stop().await
    }
}

/// Serve `opening` over a memory backend on loopback gRPC and health
/// ports, expecting it to refuse to start: its error.
pub async fn refusal(opening: Opening) -> waypost::Error {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend =
        || async { Ok(Arc::new(Liveness::new(MemoryRegistry::new())) as Arc<dyn Backend>) };
    tokio::time::timeout(
        Duration::from_secs(30),
        opening.serve(backend, grpc, health, futures::future::pending()),
    )
    .await
    .expect("serve did not refuse in time")
    .expect_err("serve started")
}
