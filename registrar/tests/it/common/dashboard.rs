//! A registrar with its health port for the dashboard's tests
//! (`tests/ui.rs`, `tests/ui_browser.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use registrar_server::{serve_with, Backend, Registrar, RegistrarConfig, ServeOptions};
use registry_api::{liveness::Liveness, memory::MemoryRegistry, Endpoint, Health, Op};

pub const LIMIT: Duration = Duration::from_secs(30);

/// A registrar on loopback with its health port.
pub struct Server {
    pub health: SocketAddr,
    pub registrar: Arc<Registrar>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<registry_api::Result<()>>,
}

pub async fn start(ui: bool) -> Server {
    start_with(ui, RegistrarConfig::new("cluster-a"), MemoryRegistry::new()).await
}

/// [`start`] with `config`, over `backend` (which may hold endpoints
/// already).
pub async fn start_with(ui: bool, config: RegistrarConfig, backend: MemoryRegistry) -> Server {
    let backend: Arc<dyn Backend> = Arc::new(Liveness::new(backend));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health_addr = health.local_addr().unwrap();
    let registrar = Registrar::new(backend, config).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        Arc::clone(&registrar),
        grpc,
        health,
        None,
        ServeOptions::default().with_ui(ui),
        async move {
            let _ = rx.await;
        },
    ));
    Server {
        health: health_addr,
        registrar,
        stop: Some(tx),
        task,
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.health)
    }

    pub async fn register(&self, ep: Endpoint) {
        self.registrar.write(Op::Register(ep), None).await.unwrap();
    }

    pub async fn deregister(&self, service: &str, id: &str) {
        let key = registry_api::EndpointKey::new(service, id);
        self.registrar
            .write(Op::Deregister(key), None)
            .await
            .unwrap();
    }

    /// Graceful stop; bounded, so an event stream that held the health
    /// server open would fail the test.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(LIMIT, &mut self.task)
            .await
            .expect("the server did not stop (an open event stream held it?)")
            .unwrap()
            .unwrap();
    }
}

pub fn endpoint(service: &str, id: &str, port: u16, node: &str, health: Health) -> Endpoint {
    let mut ep = Endpoint::new(service, id, "10.0.0.5", port);
    ep.cluster = "cluster-a".into();
    ep.node = node.into();
    ep.health = health;
    ep.labels.insert("zone".into(), "eu-west-1a".into());
    ep
}
