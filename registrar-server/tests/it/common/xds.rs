//! Helpers of the in-process xDS tests: an ADS client over mTLS as the
//! agents' own client makes its connections.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// How long one response may take to come.
pub const LIMIT: Duration = Duration::from_secs(30);

pub fn node(id: &str) -> Option<Node> {
    Some(Node {
        id: id.to_string(),
        cluster: "test".to_string(),
        ..Default::default()
    })
}

/// A channel to `addr` over mTLS with `files` (the registrar's CA, a
/// client certificate), as the agents' own client makes it.
pub fn tls_channel(
    addr: &str,
    files: &waypost_registrar_server::TlsFiles,
) -> tonic::transport::Channel {
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        waypost_registrar_client::tls::client_config(files).unwrap(),
    ));
    let addr = addr.to_string();
    let svc = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let connector = connector.clone();
        let addr = addr.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr.as_str()).await?;
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    tonic::transport::Endpoint::from_static("http://127.0.0.1").connect_with_connector_lazy(svc)
}

/// Open a state-of-the-world stream on `channel` and ask for every
/// cluster: the first response, or the status the server refused with.
pub async fn first_cds(
    channel: tonic::transport::Channel,
) -> Result<DiscoveryResponse, tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: node("rust-tls"),
        type_url: CDS.to_string(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = tokio::time::timeout(
        LIMIT,
        client.stream_aggregated_resources(ReceiverStream::new(rx)),
    )
    .await
    .expect("no answer in time")?
    .into_inner();
    let first = tokio::time::timeout(LIMIT, stream.message())
        .await
        .expect("no xDS response in time")?;
    drop(tx);
    Ok(first.expect("the xDS stream ended"))
}
