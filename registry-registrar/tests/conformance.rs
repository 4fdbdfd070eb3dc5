//! The registry-api conformance suite on the registrar client, against a
//! registrar over loopback gRPC (a `Liveness` over a `MemoryRegistry`
//! behind it), each check with a registrar of its own; the only place it
//! runs for this client.

use std::sync::Arc;
use std::time::Duration;

use registrar_server::{serve, Registrar, RegistrarConfig};
use registry_api::liveness::Liveness;
use registry_api::memory::MemoryRegistry;
use registry_api::testing::{overflow_history, Guarded};
use registry_registrar::{ClientConfig, RegistrarClient};

const HISTORY: usize = 64;

/// A client of a fresh registrar; the guard stops the registrar's server
/// task when the client is dropped.
async fn make() -> Guarded<RegistrarClient> {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gRPC port");
    let health = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the health port");
    let url = format!("http://{}", grpc.local_addr().expect("gRPC address"));
    let backend = Arc::new(Liveness::new(MemoryRegistry::new()));
    let registrar = Registrar::new(
        backend,
        RegistrarConfig::new("conformance").with_history(HISTORY),
    )
    .expect("registrar");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(registrar, grpc, health, None, async move {
        let _ = stopped.await;
    }));
    let client = RegistrarClient::connect(
        ClientConfig::new(url, "conformance", "node-1")
            .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
            .with_history(HISTORY),
    )
    .expect("client");
    client.cache().wait_until_ready().await;
    Guarded::new(
        client,
        Server {
            stop: Some(stop),
            task: server,
        },
    )
}

/// The registrar's server task: asked to stop, and aborted, on drop.
struct Server<T> {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<T>,
}

impl<T> Drop for Server<T> {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// Push the watch history windows (the client's and the registrar's) past
/// everything written so far.
async fn lose_history(reg: &Guarded<RegistrarClient>) {
    overflow_history(reg, HISTORY + 16).await;
}

registry_api::conformance_tests!(make, lose_history);
