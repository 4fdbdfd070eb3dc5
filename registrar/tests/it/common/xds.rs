//! Helpers of the xDS tests: the registrar binary with `--xds-addr`, Rust
//! ADS clients (envoy-types), the Python greeter processes (grpcio), and
//! decoding load assignments.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{address, socket_address, Node};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prost::Message;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{serve_binary, Served};

pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// How long one response may take to come.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The registrar binary with the xDS server on a free loopback port; the
/// xDS address.
pub async fn serve_with_xds() -> (Served, String) {
    let served = serve_binary(&["--xds-addr=127.0.0.1:0"]).await;
    let xds = served.field("xds=");
    (served, xds)
}

pub fn node(id: &str) -> Option<Node> {
    Some(Node {
        id: id.to_string(),
        cluster: "test".to_string(),
        ..Default::default()
    })
}

/// One ADS stream: requests `Q` out, responses `R` in.
pub struct Ads<Q, R> {
    pub tx: mpsc::Sender<Q>,
    pub rx: tonic::Streaming<R>,
}

/// A state-of-the-world ADS stream.
pub type Sotw = Ads<DiscoveryRequest, DiscoveryResponse>;
/// A delta ADS stream.
pub type Delta = Ads<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

impl<Q, R> Ads<Q, R> {
    pub async fn send(&self, req: Q) {
        self.tx
            .send(req)
            .await
            .unwrap_or_else(|_| panic!("the xDS stream closed"));
    }

    pub async fn next(&mut self) -> R
    where
        R: prost::Message + Default + 'static,
    {
        tokio::time::timeout(LIMIT, self.rx.message())
            .await
            .expect("no xDS response in time")
            .unwrap()
            .expect("the xDS stream ended")
    }
}

/// The client and the channel of a stream to open on `xds`.
async fn client(xds: &str) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
        .await
        .unwrap()
}

impl Sotw {
    pub async fn open(xds: &str) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let rx = client(xds)
            .await
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self { tx, rx }
    }

    /// Ask for `names` of `type_url`, acknowledging `last` if given; the
    /// next response.
    pub async fn ask(
        &mut self,
        type_url: &str,
        names: &[String],
        last: Option<&DiscoveryResponse>,
    ) -> DiscoveryResponse {
        self.send(DiscoveryRequest {
            node: node("rust-sotw"),
            type_url: type_url.to_string(),
            resource_names: names.to_vec(),
            version_info: last.map(|r| r.version_info.clone()).unwrap_or_default(),
            response_nonce: last.map(|r| r.nonce.clone()).unwrap_or_default(),
            ..Default::default()
        })
        .await;
        let resp = self.next().await;
        assert_eq!(resp.type_url, type_url);
        resp
    }
}

impl Delta {
    pub async fn open(xds: &str) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let rx = client(xds)
            .await
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self { tx, rx }
    }

    /// Acknowledge `resp`.
    pub async fn ack(&self, resp: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })
        .await;
    }
}

/// The `(address, port)` of a load assignment's endpoints.
pub fn endpoints(any_value: &[u8]) -> BTreeSet<(String, u32)> {
    let cla = ClusterLoadAssignment::decode(any_value).unwrap();
    let mut out = BTreeSet::new();
    for l in cla.endpoints {
        for e in l.lb_endpoints {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = e.host_identifier else {
                panic!("an lb endpoint without an endpoint");
            };
            let Some(address::Address::SocketAddress(sa)) = ep.address.and_then(|a| a.address)
            else {
                panic!("an endpoint without a socket address");
            };
            let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                panic!("a socket address without a port");
            };
            out.insert((sa.address, port));
        }
    }
    out
}

/// A Python process running `tests/it/xds_greeter.py`; killed on drop, ends
/// by itself when its stdin closes.
pub struct Python {
    pub child: Child,
    pub lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

fn greeter_script() -> String {
    format!("{}/tests/it/xds_greeter.py", env!("CARGO_MANIFEST_DIR"))
}

impl Python {
    fn spawn(args: &[&str], env: &[(&str, &Path)]) -> Self {
        let mut child = Command::new("python3")
            .arg("-u")
            .arg(greeter_script())
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// A greeter answering with `id`; its port.
    pub async fn greeter(id: &str) -> (Self, u16) {
        let mut p = Self::spawn(&["server", id], &[]);
        let line = p.next_line().await;
        let port = line
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("greeter {id} said {line:?}"));
        (p, port)
    }

    /// A client calling `target` in a loop with `bootstrap` as its
    /// `GRPC_XDS_BOOTSTRAP`.
    pub fn client(target: &str, bootstrap: &Path) -> Self {
        Self::spawn(&["client", target], &[("GRPC_XDS_BOOTSTRAP", bootstrap)])
    }

    pub async fn next_line(&mut self) -> String {
        tokio::time::timeout(LIMIT, self.lines.next_line())
            .await
            .expect("the Python process said nothing in time")
            .unwrap()
            .expect("the Python process ended")
    }
}

/// A gRPC xDS bootstrap naming the registrar at `xds` (plaintext).
pub fn bootstrap_json(xds: &str, node_id: &str) -> String {
    serde_json::json!({
        "xds_servers": [{
            "server_uri": xds,
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {"id": node_id, "cluster": "test", "locality": {"zone": "z1"}},
    })
    .to_string()
}
