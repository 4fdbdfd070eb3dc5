//! A service that is found and finds others: it serves gRPC (the standard
//! health service) and HTTP, announces both in a registry chosen by an
//! environment variable, calls a peer through a balanced channel (in its
//! own zone while the zone has a peer), and drains, then leaves the
//! registry before its servers stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use waypost::announce::{announce, AnnounceConfig};
use waypost::channel::{balanced_channel, BalancedChannel, ChannelConfig};
use waypost::stack::Stack;
use waypost::{Endpoint, Protocol};
use waypost_any::OpenOptions;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service's name in the registry (its gRPC endpoints).
pub const SERVICE: &str = "hello";
/// The name of its HTTP endpoints.
pub const HTTP_SERVICE: &str = "hello-http";
/// How long a call to a peer may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What one instance needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the registry is, as one URL: `sqlite:PATH`,
    /// `etcd://HOST:PORT/PREFIX` or `registrar://HOST:PORT?cluster=…`.
    pub registry: String,
    /// The unit of liveness: the machine or pod this instance runs on.
    pub node: String,
    /// This instance's id, unique within the service.
    pub id: String,
    /// The address peers reach this instance at.
    pub host: String,
    pub grpc_port: u16,
    pub http_port: u16,
    /// This instance's zone; calls to peers stay in it while it has one.
    pub zone: Option<String>,
    /// How long to stay registered as draining before leaving: peers
    /// stop sending new calls, and finish the ones under way.
    pub drain_for: Duration,
}

impl Settings {
    /// From `REGISTRY`, `NODE_NAME`, `INSTANCE_ID`, `ADVERTISE_HOST`,
    /// `GRPC_PORT`, `HTTP_PORT`, `ZONE` and `DRAIN_SECONDS`, with defaults
    /// for a laptop.
    pub fn from_env() -> Result<Settings, BoxError> {
        let var =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
        let port = |name: &str, default: &str| -> Result<u16, BoxError> {
            let v = var(name, default);
            v.parse()
                .map_err(|_| format!("{name}={v:?}: not a port").into())
        };
        let id = var("INSTANCE_ID", &format!("pid-{}", std::process::id()));
        let drain = var("DRAIN_SECONDS", "5");
        let drain_for = drain
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("DRAIN_SECONDS={drain:?}: not a number of seconds"))?;
        Ok(Settings {
            registry: var("REGISTRY", "sqlite:registry.db"),
            node: var("NODE_NAME", &id),
            host: var("ADVERTISE_HOST", "127.0.0.1"),
            grpc_port: port("GRPC_PORT", "0")?,
            http_port: port("HTTP_PORT", "0")?,
            zone: std::env::var("ZONE").ok().filter(|z| !z.is_empty()),
            drain_for,
            id,
        })
    }
}

/// Open the registry `url` names; `waypost_any` adds what the backend
/// lacks (a watch by polling, liveness). `node` is this instance's node,
/// which a registrar's agent needs.
pub async fn open(url: &str, node: &str) -> Result<Arc<dyn Stack>, BoxError> {
    let options = OpenOptions::default().with_node(node);
    Ok(waypost_any::open_with(url, &options).await?)
}

/// A running instance.
pub struct Service {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    peers: HealthClient<BalancedChannel>,
    stop: watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<Result<(), BoxError>>>,
}

/// Serve gRPC and HTTP, announce both endpoints in `registry`, and keep a
/// channel to the other instances of the service.
pub async fn start(registry: Arc<dyn Stack>, s: &Settings) -> Result<Service, BoxError> {
    let grpc = tokio::net::TcpListener::bind(("0.0.0.0", s.grpc_port)).await?;
    let http = tokio::net::TcpListener::bind(("0.0.0.0", s.http_port)).await?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);
    let mut endpoints = vec![
        Endpoint::new(SERVICE, &s.id, &s.host, grpc_addr.port())
            .with_protocol(Protocol::Grpc)
            .with_node(&s.node),
        Endpoint::new(HTTP_SERVICE, &s.id, &s.host, http_addr.port())
            .with_protocol(Protocol::Http)
            .with_node(&s.node),
    ];
    if let Some(zone) = &s.zone {
        endpoints = endpoints.into_iter().map(|e| e.with_zone(zone)).collect();
    }
    let cfg = AnnounceConfig::default().with_drain_for(s.drain_for);
    let announced = announce(Arc::clone(&registry), endpoints, cfg)?;
    announced.registered().await;

    // On stop: drain and leave the registry first, then let both servers
    // finish.
    let (stop, mut stopping) = watch::channel(false);
    let (left_tx, left) = watch::channel(false);
    tokio::spawn(async move {
        announced
            .leave_on(async move {
                let _ = stopping.wait_for(|s| *s).await;
            })
            .await;
        let _ = left_tx.send(true);
    });
    let after_leaving = move || {
        let mut left = left.clone();
        async move {
            let _ = left.wait_for(|l| *l).await;
        }
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let grpc_server = tonic::transport::Server::builder()
        .add_service(health_service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(grpc), after_leaving());
    let id = s.id.clone();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || std::future::ready(format!("hello from {id}\n"))),
    );
    let http_server = axum::serve(http, app).with_graceful_shutdown(after_leaving());
    let servers = vec![
        tokio::spawn(async move { grpc_server.await.map_err(BoxError::from) }),
        tokio::spawn(async move { http_server.await.map_err(BoxError::from) }),
    ];

    // Peers: the healthy gRPC endpoints of the service, except this one,
    // in this instance's zone while it has one.
    let me = s.id.clone();
    let mut cfg = ChannelConfig::default()
        .with_filter(move |e| e.id != me)
        .with_timeout(CALL_TIMEOUT);
    if let Some(zone) = &s.zone {
        cfg = cfg.with_zone(zone);
    }
    let channel = balanced_channel(registry, SERVICE, cfg)?;
    Ok(Service {
        grpc: grpc_addr,
        http: http_addr,
        peers: HealthClient::new(channel),
        stop,
        servers,
    })
}

impl Service {
    /// Ask one peer (balanced over all of them) whether it serves.
    pub async fn call_peer(&self) -> Result<String, BoxError> {
        let mut peers = self.peers.clone();
        // With no peer registered, a balanced channel waits for one: bound it.
        let reply = tokio::time::timeout(CALL_TIMEOUT, peers.check(HealthCheckRequest::default()))
            .await
            .map_err(|_| format!("no peer answered within {CALL_TIMEOUT:?}"))??;
        Ok(format!("{:?}", reply.into_inner().status()))
    }

    /// Drain and leave the registry, then stop both servers.
    pub async fn stop(self) -> Result<(), BoxError> {
        let _ = self.stop.send(true);
        for server in self.servers {
            server.await??;
        }
        Ok(())
    }
}
