//! A registrar with its health port for the dashboard's tests
//! (`ui.rs`, `ui_browser.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use waypost::{liveness::Liveness, memory::MemoryRegistry, Endpoint, Health, Op};
use waypost_fixtures::registrar::{Running, TestRegistrar};
use waypost_registrar_server::{Backend, Registrar, RegistrarConfig, ServeOptions};

pub const LIMIT: Duration = Duration::from_secs(30);

/// A registrar on loopback with its health port.
pub struct Server {
    pub health: SocketAddr,
    pub registrar: Arc<Registrar>,
    running: Running,
}

pub async fn start(ui: bool) -> Server {
    start_with(ui, RegistrarConfig::new("cluster-a"), MemoryRegistry::new()).await
}

/// [`start`] with `config`, over `backend` (which may hold endpoints
/// already).
pub async fn start_with(ui: bool, config: RegistrarConfig, backend: MemoryRegistry) -> Server {
    let backend: Arc<dyn Backend> = Arc::new(Liveness::new(backend));
    let running = TestRegistrar::new(backend, config)
        .options(ServeOptions::default().with_ui(ui))
        .start()
        .await
        .unwrap();
    Server {
        health: running.health,
        registrar: Arc::clone(&running.registrar),
        running,
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        self.running.health_url(path)
    }

    pub async fn register(&self, ep: Endpoint) {
        self.registrar.write(Op::Register(ep), None).await.unwrap();
    }

    pub async fn deregister(&self, service: &str, id: &str) {
        let key = waypost::EndpointKey::new(service, id);
        self.registrar
            .write(Op::Deregister(key), None)
            .await
            .unwrap();
    }

    /// Graceful stop; bounded, so an event stream that held the health
    /// server open would fail the test.
    pub async fn stop(self) {
        tokio::time::timeout(LIMIT, self.running.stop_result())
            .await
            .expect("the server did not stop (an open event stream held it?)")
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
