//! A [`Registrar`] served in process on loopback for tests: gRPC and
//! health ports of its own, stopped gracefully, waited for, or crashed.
//!
//! ```no_run
//! # async fn demo() -> Result<(), waypost_fixtures::FixtureError> {
//! use std::sync::Arc;
//! use waypost_registrar_server::{Backend, RegistrarConfig};
//! use waypost::liveness::Liveness;
//! use waypost::memory::MemoryRegistry;
//! use waypost_fixtures::registrar::TestRegistrar;
//!
//! let backend: Arc<dyn Backend> = Arc::new(Liveness::new(MemoryRegistry::new()));
//! let server = TestRegistrar::new(backend, RegistrarConfig::new("cluster-a"))
//!     .start()
//!     .await?;
//! println!("agents connect to {}", server.url());
//! server.stop().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use waypost_registrar_server::{serve_with, Backend, Registrar, RegistrarConfig, ServeOptions};

use crate::FixtureError;

/// How to start a test registrar: the backend and settings, and optionally
/// serving options and where the gRPC port listens.
pub struct TestRegistrar {
    backend: Arc<dyn Backend>,
    cfg: RegistrarConfig,
    options: ServeOptions,
    grpc: Grpc,
}

enum Grpc {
    Free,
    At(SocketAddr),
    Listener(TcpListener),
}

impl TestRegistrar {
    /// A registrar over `backend` with `cfg`, plaintext, on free loopback
    /// ports.
    pub fn new(backend: Arc<dyn Backend>, cfg: RegistrarConfig) -> TestRegistrar {
        TestRegistrar {
            backend,
            cfg,
            options: ServeOptions::default(),
            grpc: Grpc::Free,
        }
    }

    /// Serve with `options` (mTLS, authorization, the dashboard).
    pub fn options(mut self, options: ServeOptions) -> TestRegistrar {
        self.options = options;
        self
    }

    /// Listen for gRPC on `addr`; when the port was just released by an
    /// earlier server, binding is retried for up to 5 s.
    pub fn on(mut self, addr: SocketAddr) -> TestRegistrar {
        self.grpc = Grpc::At(addr);
        self
    }

    /// Serve gRPC on `listener`, bound by the caller.
    pub fn listener(mut self, listener: TcpListener) -> TestRegistrar {
        self.grpc = Grpc::Listener(listener);
        self
    }

    /// Bind the ports, create the registrar and serve it in a task until
    /// [`Running::stop`] (or until a background task of it dies).
    pub async fn start(self) -> Result<Running, FixtureError> {
        let grpc = match self.grpc {
            Grpc::Free => bind(LOOPBACK).await?,
            Grpc::At(addr) => bind_retrying(addr).await?,
            Grpc::Listener(l) => l,
        };
        let health = bind(LOOPBACK).await?;
        let addr = grpc
            .local_addr()
            .map_err(crate::io("reading the gRPC port"))?;
        let health_addr = health
            .local_addr()
            .map_err(crate::io("reading the health port"))?;
        let registrar =
            Registrar::new(self.backend, self.cfg).map_err(|source| FixtureError::Registry {
                what: "creating the test registrar".into(),
                source,
            })?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_with(
            Arc::clone(&registrar),
            grpc,
            health,
            None,
            self.options,
            async move {
                let _ = rx.await;
            },
        ));
        Ok(Running {
            addr,
            health: health_addr,
            registrar,
            stop: Some(tx),
            task,
        })
    }
}

/// `127.0.0.1:0`: a free loopback port.
const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

async fn bind(addr: SocketAddr) -> Result<TcpListener, FixtureError> {
    TcpListener::bind(addr)
        .await
        .map_err(crate::io(format!("binding {addr}")))
}

async fn bind_retrying(addr: SocketAddr) -> Result<TcpListener, FixtureError> {
    let mut last = None;
    for _ in 0..100 {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(crate::io(format!("binding {addr} for 5 s"))(
        last.unwrap_or_else(|| std::io::Error::other("no attempt")),
    ))
}

/// A registrar serving in a task of the test's runtime. Dropping it stops
/// serving gracefully, in the background.
pub struct Running {
    /// The gRPC address.
    pub addr: SocketAddr,
    /// The health (and dashboard) address.
    pub health: SocketAddr,
    /// The registrar being served.
    pub registrar: Arc<Registrar>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<waypost::Result<()>>,
}

impl Running {
    /// `http://` and the gRPC address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://` and the health address, then `path`.
    pub fn health_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.health)
    }

    /// Graceful: stop serving and drain the write queue.
    pub async fn stop(self) {
        let _ = self.stop_result().await;
    }

    /// Graceful, returning what serving returned (a panic of the serving
    /// task is an `Internal` error).
    pub async fn stop_result(mut self) -> waypost::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.wait().await
    }

    /// Wait until serving ends by itself (a background task died).
    pub async fn wait(mut self) -> waypost::Result<()> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(waypost::Error::internal(format!(
                "the serving task ended abnormally: {e}"
            ))),
        }
    }

    /// A crash: serving stops at once, nothing is drained first.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
