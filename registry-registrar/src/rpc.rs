//! [`RpcClient`]: the registrar's gRPC API as a `Registry + Watch +
//! Heartbeat`, without a cache: every call is one RPC (its watch is in
//! [`crate::watch`]).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use tonic::transport::{Channel, Endpoint as TonicEndpoint};
use waypost::{
    Capabilities, Endpoint, EndpointKey, Error, Heartbeat, Op, Registry, Result, Snapshot,
};

use crate::config::{Ack, ClientConfig};
use crate::digest::Digests;
use crate::error::error_from_status;
use crate::layout::{endpoint_from_proto, endpoint_to_proto, Token};
use crate::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use crate::proto::registrar::v1::{
    AckMode, HeartbeatRequest, ListAllEndpointsRequest, RegisterEndpointRequest,
    UnregisterEndpointRequest,
};
use crate::tls::{self, TlsFiles};

/// HTTP/2 keepalive of the channel: a registrar that vanished without
/// closing the connection is noticed within about interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A refusal read from the watch stream: the write the backend refused,
/// the value the registrar restored, and why.
#[derive(Debug, Clone)]
pub(crate) struct StreamRefusal {
    pub(crate) refused: Op,
    pub(crate) restored: Op,
    pub(crate) error: Error,
}

/// The registrar's plain gRPC client: every call is one RPC to the
/// registrar, nothing is cached or retried ([`crate::RegistrarClient`]
/// builds its cache on it). `Registry`, `Watch` (the `WatchEndpoints`
/// stream, resumed with the registrar's epoch) and `Heartbeat`.
pub struct RpcClient {
    pub(crate) grpc: Grpc<Channel>,
    channel: Channel,
    pub(crate) cfg: ClientConfig,
    /// The epoch of the last snapshot received.
    pub(crate) epoch: Arc<watch::Sender<Option<u64>>>,
    /// Counts streams that delivered their first event.
    pub(crate) connected: Arc<watch::Sender<u64>>,
    /// Refusals of writes read from the watch stream.
    pub(crate) refusals: broadcast::Sender<StreamRefusal>,
    /// What the watch streams delivered, as the client holds it: summarized
    /// in the next stream's request (resume by content).
    pub(crate) held: Arc<Mutex<Option<Snapshot>>>,
    /// The digests of that summary, each computed once per content.
    pub(crate) digests: Arc<Digests>,
}

impl RpcClient {
    /// A client for the registrar in `cfg` (no cache): every call is an
    /// RPC. Connects lazily; fails only for an address that is not a URL
    /// and for TLS files that cannot be loaded.
    pub fn connect(cfg: ClientConfig) -> Result<Self> {
        cfg.validate()?;
        let channel = match &cfg.tls {
            None => {
                if cfg.address.starts_with("https://") {
                    return Err(Error::invalid(
                        "address",
                        format!("{}: https needs TLS files (a CA bundle)", cfg.address),
                    ));
                }
                TonicEndpoint::from_shared(cfg.address.clone())
                    .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?
                    .connect_timeout(cfg.connect_timeout)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                    .keep_alive_while_idle(true)
                    .connect_lazy()
            }
            Some(files) => tls_channel(&cfg, files)?,
        };
        let grpc = Grpc::new(channel.clone())
            .max_decoding_message_size(256 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        Ok(RpcClient {
            grpc,
            channel,
            cfg,
            epoch: Arc::new(watch::channel(None).0),
            connected: Arc::new(watch::channel(0).0),
            refusals: broadcast::channel(256).0,
            held: Arc::default(),
            digests: Arc::default(),
        })
    }

    /// Send one write, acknowledged as `ack` says.
    pub async fn send(&self, op: &Op, ack: Ack) -> Result<()> {
        let ack = match ack {
            Ack::Optimistic => AckMode::Optimistic,
            Ack::Durable => AckMode::Durable,
        } as i32;
        let mut grpc = self.grpc.clone();
        match op {
            Op::Register(e) => {
                let req = RegisterEndpointRequest {
                    endpoint: Some(endpoint_to_proto(e)),
                    ack,
                };
                self.call("RegisterEndpoint", grpc.register_endpoint(req))
                    .await?;
            }
            Op::Deregister(k) => {
                let req = UnregisterEndpointRequest {
                    service_name: k.service.clone(),
                    id: k.id.clone(),
                    ack,
                };
                self.call("UnregisterEndpoint", grpc.unregister_endpoint(req))
                    .await?;
            }
        }
        Ok(())
    }

    /// The epoch of the last snapshot this client's watch received (`None`
    /// before the first): with an event's version, the resume token
    /// `Token { epoch, version }` a later watch can start from.
    pub fn epoch(&self) -> Option<u64> {
        *self.epoch.borrow()
    }

    /// The watch resumed after `token` (as printed by `registrar watch
    /// --json`): the changes since, or a fresh snapshot when the registrar
    /// restarted (another epoch) or no longer has them.
    pub fn watch_from(&self, token: Token) -> waypost::EventStream {
        self.epoch.send_replace(Some(token.epoch));
        waypost::Watch::watch(self, Some(token.version))
    }

    /// The registrar's address.
    pub fn address(&self) -> &str {
        &self.cfg.address
    }

    /// The generated gRPC client on this client's channel (exact status
    /// codes, the operator CLI).
    pub fn grpc(&self) -> Grpc<Channel> {
        self.grpc.clone()
    }

    fn err(&self, s: &tonic::Status) -> Error {
        error_from_status(s, &self.cfg.address)
    }

    async fn call<T, F>(&self, what: &str, fut: F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.cfg.request_timeout, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(self.err(&status)),
            Err(_) => Err(Error::unavailable(format!(
                "registrar {}: {what} timed out after {:?}",
                self.cfg.address, self.cfg.request_timeout
            ))),
        }
    }

    async fn list_all(&self) -> Result<Snapshot> {
        let mut grpc = self.grpc.clone();
        let resp = self
            .call(
                "ListAllEndpoints",
                grpc.list_all_endpoints(ListAllEndpointsRequest {}),
            )
            .await?;
        let token: Token = resp.version.parse()?;
        let eps = resp
            .endpoints
            .into_iter()
            .enumerate()
            .map(|(i, p)| endpoint_from_proto(p, &format!("endpoints[{i}].")))
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot::from_endpoints(token.version, eps))
    }
}

/// A channel whose connections are TLS with `files` (rustls, certificates
/// re-read on change). tonic is given the address as `http://` and the TLS
/// is done by this connector, so that a rotated certificate is used by the
/// next connection without rebuilding the channel.
fn tls_channel(cfg: &ClientConfig, files: &TlsFiles) -> Result<Channel> {
    let uri: tonic::codegen::http::Uri = cfg
        .address
        .parse()
        .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?;
    let host = uri
        .host()
        .ok_or_else(|| Error::invalid("address", format!("{:?}: no host", cfg.address)))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    let server_name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls::client_config(files)?));
    let plain = format!("http://{}:{port}", uri.host().unwrap_or(host.as_str()));
    let endpoint = TonicEndpoint::from_shared(plain)
        .map_err(|e| Error::invalid("address", format!("{:?}: {e}", cfg.address)))?
        .connect_timeout(cfg.connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let target = (host, port);
    let svc = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        let (host, port) = target.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(svc))
}

impl fmt::Display for RpcClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registrar({})", self.cfg.address)
    }
}

impl fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcClient")
            .field("config", &self.cfg)
            .finish()
    }
}

#[async_trait]
impl Registry for RpcClient {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.send(&Op::Register(endpoint), self.cfg.ack).await
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.send(&Op::Deregister(key.clone()), self.cfg.ack).await
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        Ok(self.list_all().await?.list(service))
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.list_all().await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_native_liveness(true)
    }

    /// The registrar's gRPC health check of its `Registrar` service.
    async fn probe(&self) -> Result<()> {
        self.health().await
    }
}

/// The registrar's `Registrar` service name in the gRPC health service.
const SERVICE_NAME: &str = "aether.registrar.v1.Registrar";

impl RpcClient {
    /// Ask the registrar's gRPC health service whether it serves: `Ok` when
    /// it does, `Unavailable` when it is unreachable or not ready (its
    /// backend refuses writes, it is starting or shutting down).
    async fn health(&self) -> Result<()> {
        use tonic_health::pb::{health_check_response::ServingStatus, HealthCheckRequest};
        let mut client = tonic_health::pb::health_client::HealthClient::new(self.channel.clone());
        let req = HealthCheckRequest {
            service: SERVICE_NAME.to_string(),
        };
        let resp = self.call("Health/Check", client.check(req)).await?;
        if resp.status == ServingStatus::Serving as i32 {
            Ok(())
        } else {
            Err(Error::unavailable(format!(
                "registrar {}: not serving (not ready)",
                self.cfg.address
            )))
        }
    }
}

#[async_trait]
impl Heartbeat for RpcClient {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        waypost::backend::check_name("node", node, true)?;
        let mut grpc = self.grpc.clone();
        let req = HeartbeatRequest {
            node_name: node.to_string(),
        };
        self.call("Heartbeat", grpc.heartbeat(req)).await?;
        Ok(())
    }
}
