//! Rust's own proxyless xDS client, `tonic-xds` (0.1.0-alpha.4), resolving
//! `xds:///greeter` through the registrar: calls spread over the greeters
//! the registry names and follow it as endpoints are deregistered, turn
//! unhealthy, come back and are added.
//!
//! The greeters are tonic servers of the standard health service, each
//! answering with its name in the `x-greeter` header, so a call tells
//! which one it reached.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::fast_client;
use common::xds::serve_with_xds;
use tonic::codegen::http;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_xds::{BootstrapConfig, XdsChannelBuilder, XdsChannelConfig, XdsChannelGrpc, XdsUri};
use waypost::testing::wait_limit;
use waypost::{Endpoint, EndpointKey, Health, Registry};

/// The service the greeters are registered under.
const SERVICE: &str = "greeter";
/// The header a greeter names itself in.
const NAME_HEADER: &str = "x-greeter";
/// Calls per look at the traffic (tonic-xds picks by power of two random
/// choices, so a greeter left out of 30 calls is unlikely: 30 × (1/3)²).
const ROUND: usize = 30;
/// One call's limit: tonic-xds waits without a deadline for a service it
/// has no endpoint of.
const CALL_LIMIT: Duration = Duration::from_secs(3);

fn greeter(id: &str, port: u16) -> Endpoint {
    Endpoint::new(SERVICE, id, "127.0.0.1", port).with_node("node-1")
}

/// A greeter on a free loopback port: the health service, every answer
/// carrying `name` in [`NAME_HEADER`]. Served until the test ends.
async fn start_greeter(name: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let named = tower::util::MapResponseLayer::new(move |mut resp: http::Response<_>| {
        resp.headers_mut()
            .insert(NAME_HEADER, http::HeaderValue::from_static(name));
        resp
    });
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .layer(named)
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    port
}

/// A tonic-xds channel to `xds:///<service>` through the registrar's xDS
/// listener at `xds` (the bootstrap names it with a scheme: tonic-xds
/// does not connect to a bare `host:port` with insecure credentials).
fn channel(xds: &str, service: &str) -> XdsChannelGrpc {
    let bootstrap = serde_json::json!({
        "xds_servers": [{
            "server_uri": format!("http://{xds}"),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {"id": "tonic-client", "cluster": "test", "locality": {"zone": "z1"}},
    });
    let bootstrap = BootstrapConfig::from_json(&bootstrap.to_string()).unwrap();
    let uri = XdsUri::parse(&format!("xds:///{service}")).unwrap();
    XdsChannelBuilder::new(XdsChannelConfig::new(uri).with_bootstrap(bootstrap))
        .build_grpc_channel()
        .unwrap()
}

/// [`ROUND`] calls, one after the other: who answered each ("error: …"
/// for a call that failed or got no answer), counted.
async fn round(client: &mut HealthClient<XdsChannelGrpc>) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..ROUND {
        let call = client.check(HealthCheckRequest {
            service: String::new(),
        });
        let who = match tokio::time::timeout(CALL_LIMIT, call).await {
            Ok(Ok(resp)) => resp
                .metadata()
                .get(NAME_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("unnamed")
                .to_string(),
            Ok(Err(status)) => format!("error: {:?}", status.code()),
            Err(_) => "error: no answer".to_string(),
        };
        *seen.entry(who).or_default() += 1;
    }
    seen
}

/// Look at rounds of calls until two in a row are answered by exactly
/// the greeters `want`, within the tests' wait limit (twice: a new
/// connection's backoff may apply).
async fn converges_to(client: &mut HealthClient<XdsChannelGrpc>, want: &[&str], what: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let deadline = tokio::time::Instant::now() + wait_limit() * 2;
    let mut in_a_row = 0;
    loop {
        let seen = round(client).await;
        let who: BTreeSet<String> = seen.keys().cloned().collect();
        in_a_row = if who == want { in_a_row + 1 } else { 0 };
        if in_a_row == 2 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the last {ROUND} calls went to {seen:?}, want only {want:?}"
        );
    }
}

/// tonic-xds follows the registry through the registrar: requests spread
/// over the three registered greeters; a deregistered one, then an
/// unhealthy one, gets no more calls; one registered again, and a new
/// one, get calls. It acknowledges every response (no NACK counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_xds_follows_the_registry() {
    let (served, xds) = serve_with_xds().await;
    let agent = fast_client(&served.url(), "default", "node-1");
    let mut ports = BTreeMap::new();
    for id in ["g1", "g2", "g3", "g4"] {
        ports.insert(id, start_greeter(id).await);
    }
    for id in ["g1", "g2", "g3"] {
        agent.register(greeter(id, ports[id])).await.unwrap();
    }
    let mut client = HealthClient::new(channel(&xds, SERVICE));

    converges_to(&mut client, &["g1", "g2", "g3"], "three greeters").await;
    agent
        .deregister(&EndpointKey::new(SERVICE, "g3"))
        .await
        .unwrap();
    converges_to(&mut client, &["g1", "g2"], "g3 deregistered").await;
    agent.register(greeter("g3", ports["g3"])).await.unwrap();
    converges_to(&mut client, &["g1", "g2", "g3"], "g3 registered again").await;
    agent
        .register(greeter("g2", ports["g2"]).with_health(Health::Unhealthy))
        .await
        .unwrap();
    converges_to(&mut client, &["g1", "g3"], "g2 unhealthy").await;
    agent.register(greeter("g4", ports["g4"])).await.unwrap();
    converges_to(&mut client, &["g1", "g3", "g4"], "g4 added").await;

    let (_, metrics) = common::http_get(&served.health, "/metrics").await;
    let m = common::parse(&metrics);
    assert!(
        m.find("registrar_xds_streams", &[("variant", "sotw")]) >= Some(1.0),
        "tonic-xds speaks the state of the world: {metrics}"
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("registrar_xds_nacks_total{") && !l.ends_with(" 0")),
        "{metrics}"
    );
}
