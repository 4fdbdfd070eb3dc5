//! An in-process registrar on loopback for tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub mod pki;

use registrar_server::{serve, serve_with, Backend, Registrar, RegistrarConfig, ServeOptions};
use registry_registrar::{ClientConfig, RegistrarClient};

pub struct Server {
    pub addr: SocketAddr,
    pub registrar: Arc<Registrar>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<registry_api::Result<()>>,
}

pub async fn start(backend: Arc<dyn Backend>, cfg: RegistrarConfig) -> Server {
    start_on(backend, cfg, "127.0.0.1:0".parse().unwrap()).await
}

pub async fn start_on(backend: Arc<dyn Backend>, cfg: RegistrarConfig, addr: SocketAddr) -> Server {
    let grpc = bind_retrying(addr).await;
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let registrar = Registrar::new(backend, cfg).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(
        Arc::clone(&registrar),
        grpc,
        health,
        None,
        async move {
            let _ = rx.await;
        },
    ));
    Server {
        addr,
        registrar,
        stop: Some(tx),
        task,
    }
}

/// A registrar serving with `options` (mTLS, authorization) on loopback.
pub async fn start_with(
    backend: Arc<dyn Backend>,
    cfg: RegistrarConfig,
    options: ServeOptions,
) -> Server {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let registrar = Registrar::new(backend, cfg).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        Arc::clone(&registrar),
        grpc,
        health,
        None,
        options,
        async move {
            let _ = rx.await;
        },
    ));
    Server {
        addr,
        registrar,
        stop: Some(tx),
        task,
    }
}

/// The port was just released by a previous server: retry briefly.
async fn bind_retrying(addr: SocketAddr) -> tokio::net::TcpListener {
    for _ in 0..100 {
        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("could not bind {addr}");
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Graceful: stop serving and drain the write queue.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Graceful, returning what `serve` returned.
    pub async fn stop_result(mut self) -> registry_api::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.unwrap()
    }

    /// Wait until `serve` returns by itself (a background task died).
    pub async fn wait(mut self) -> registry_api::Result<()> {
        (&mut self.task).await.unwrap()
    }

    /// A crash: the server stops at once, nothing is drained first.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

pub fn fast_client(url: &str, cluster: &str, node: &str) -> RegistrarClient {
    let cfg = ClientConfig::new(url, cluster, node)
        .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
        .with_retry_interval(Duration::from_millis(50));
    RegistrarClient::connect(cfg).unwrap()
}

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A `registrar serve` child on free loopback ports, killed on drop.
pub struct Served {
    _child: Child,
    pub grpc: String,
    pub health: String,
}

pub async fn serve_binary(extra: &[&str]) -> Served {
    serve_binary_with_env(extra, &[]).await
}

/// [`serve_binary`] with extra environment variables for the child.
pub async fn serve_binary_with_env(extra: &[&str], env: &[(&str, &str)]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_registrar"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the server did not print its addresses")
        .unwrap()
        .expect("the server exited before listening");
    // "registrar listening grpc=127.0.0.1:P health=127.0.0.1:Q"
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_string()
    };
    Served {
        grpc: field("grpc="),
        health: field("health="),
        _child: child,
    }
}

impl Served {
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }
}
