//! The xDS server with real clients over loopback: proxyless gRPC in
//! Python (grpcio, `xds:///greeter`) calling three greeter servers the
//! registry names, and Rust ADS clients (envoy-types) for the state of
//! the world's conformance with `ListAllEndpoints` and for the delta
//! protocol.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use common::fast_client;
use common::xds::{
    bootstrap_json, endpoints, node, serve_with_xds, Delta, Python, Sotw, CDS, EDS, LDS,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use waypost::testing::{eventually, wait_limit};
use waypost::{Endpoint, EndpointKey, Health, Registry};
use waypost_registrar_client::RegistrarClient;

/// The service the greeters are registered under.
const SERVICE: &str = "greeter";
/// The calls a traffic check looks at: the last ones the client made.
const WINDOW: usize = 60;

fn greeter(id: &str, port: u16) -> Endpoint {
    Endpoint::new(SERVICE, id, "127.0.0.1", port).with_node("node-1")
}

/// The client's calls, read as they come.
struct Traffic {
    client: Python,
    last: VecDeque<String>,
    calls: usize,
}

impl Traffic {
    /// Read calls until the last [`WINDOW`] all succeeded and were
    /// answered by exactly the greeters `want` (bounded by the tests'
    /// wait limit, twice: gRPC's own connection backoff may apply).
    async fn converges_to(&mut self, want: &[&str], what: &str) {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let deadline = tokio::time::Instant::now() + wait_limit() * 2;
        loop {
            let line = self.client.next_line().await;
            self.calls += 1;
            if self.last.len() == WINDOW {
                self.last.pop_front();
            }
            self.last.push_back(line);
            if self.last.len() == WINDOW {
                let ids: Option<BTreeSet<String>> = self
                    .last
                    .iter()
                    .map(|l| l.strip_prefix("ok ").map(str::to_string))
                    .collect();
                if ids.as_ref() == Some(&want) {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: after {} calls the last {WINDOW} were {:?}, want only {want:?}",
                self.calls,
                self.last.iter().collect::<BTreeSet<_>>()
            );
        }
    }
}

/// Proxyless gRPC resolves `xds:///greeter` through the registrar and
/// follows the registry: requests spread over the three registered
/// greeters; a deregistered one, then an unhealthy one, gets no more
/// traffic; one registered again, and a new one, get traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_grpc_follows_the_registry() {
    common::require_python("grpc", "grpcio");
    let (served, xds) = serve_with_xds().await;
    let agent = fast_client(&served.url(), "default", "node-1");
    let mut greeters = Vec::new();
    let mut ports = BTreeMap::new();
    for id in ["g1", "g2", "g3", "g4"] {
        let (p, port) = Python::greeter(id).await;
        greeters.push(p);
        ports.insert(id, port);
    }
    for id in ["g1", "g2", "g3"] {
        agent.register(greeter(id, ports[id])).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap.json");
    std::fs::write(&bootstrap, bootstrap_json(&xds, "python-client")).unwrap();
    let mut traffic = Traffic {
        client: Python::client(&format!("xds:///{SERVICE}"), &bootstrap),
        last: VecDeque::new(),
        calls: 0,
    };

    traffic
        .converges_to(&["g1", "g2", "g3"], "three greeters")
        .await;
    agent
        .deregister(&EndpointKey::new(SERVICE, "g3"))
        .await
        .unwrap();
    traffic.converges_to(&["g1", "g2"], "g3 deregistered").await;
    agent.register(greeter("g3", ports["g3"])).await.unwrap();
    traffic
        .converges_to(&["g1", "g2", "g3"], "g3 registered again")
        .await;
    agent
        .register(greeter("g2", ports["g2"]).with_health(Health::Unhealthy))
        .await
        .unwrap();
    traffic.converges_to(&["g1", "g3"], "g2 unhealthy").await;
    agent.register(greeter("g4", ports["g4"])).await.unwrap();
    traffic.converges_to(&["g1", "g3", "g4"], "g4 added").await;
    // The Python client acknowledged every response: no NACK counted.
    let (_, metrics) = common::http_get(&served.health, "/metrics").await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("registrar_xds_nacks_total{") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// `(service, address, port)` of the healthy endpoints `ListAllEndpoints`
/// returns.
async fn healthy_listed(url: &str) -> BTreeSet<(String, String, u32)> {
    use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
    use waypost_registrar_client::proto::registrar::v1::ListAllEndpointsRequest;
    let mut grpc = Grpc::connect(url.to_string()).await.unwrap();
    grpc.list_all_endpoints(ListAllEndpointsRequest {})
        .await
        .unwrap()
        .into_inner()
        .endpoints
        .into_iter()
        .filter(|e| e.health != 2) // UNHEALTHY
        .map(|e| (e.service_name, e.address, e.port))
        .collect()
}

async fn register_mix(agent: &RegistrarClient) {
    for i in 0..12u16 {
        let svc = ["web", "db", "cache"][usize::from(i % 3)];
        let health = if i % 4 == 0 {
            Health::Unhealthy
        } else {
            Health::Healthy
        };
        agent
            .register(
                Endpoint::new(svc, format!("e{i}"), format!("10.0.2.{i}"), 1000 + i)
                    .with_node("node-1")
                    .with_health(health)
                    .with_label("zone", ["a", "b"][usize::from(i % 2)]),
            )
            .await
            .unwrap();
    }
}

/// One source of truth: the clusters CDS lists (a wildcard) are the
/// registry's services, and the endpoints of their load assignments are
/// exactly the healthy endpoints `ListAllEndpoints` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eds_agrees_with_list_all_endpoints() {
    let (served, xds) = serve_with_xds().await;
    let agent = fast_client(&served.url(), "default", "node-1");
    register_mix(&agent).await;
    let listed = eventually("12 endpoints listed", || async {
        let l = healthy_listed(&served.url()).await;
        (l.len() == 9).then_some(l)
    })
    .await;

    let mut ads = Sotw::open(&xds).await;
    // The wildcard CDS response may predate the last registrations: read
    // until it names the three services (later pushes follow changes).
    let mut cds = ads.ask(CDS, &[], None).await;
    let services: BTreeSet<String> = BTreeSet::from(["cache".into(), "db".into(), "web".into()]);
    loop {
        let names: BTreeSet<String> = cds
            .resources
            .iter()
            .map(|a| Cluster::decode(a.value.as_slice()).unwrap().name)
            .collect();
        if names == services {
            break;
        }
        cds = ads.next().await;
    }
    let names: Vec<String> = services.iter().cloned().collect();
    let eds = ads.ask(EDS, &names, None).await;
    let mut over_xds = BTreeSet::new();
    for a in &eds.resources {
        let cla = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
            a.value.as_slice(),
        )
        .unwrap();
        for (addr, port) in endpoints(&a.value) {
            over_xds.insert((cla.cluster_name.clone(), addr, port));
        }
    }
    assert_eq!(over_xds, listed);
}

/// The delta protocol: a subscription gets the resource with its version,
/// a change pushes only what changed (a new version), a NACK is counted,
/// an unsubscribed resource is no longer pushed, and a name that does not
/// exist is answered in `removed_resources`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_subscribe_change_nack_unsubscribe() {
    let (served, xds) = serve_with_xds().await;
    let agent = fast_client(&served.url(), "default", "node-1");
    agent
        .register(Endpoint::new("web", "w1", "10.0.0.1", 80).with_node("node-1"))
        .await
        .unwrap();
    agent
        .register(Endpoint::new("db", "d1", "10.0.1.1", 5432).with_node("node-1"))
        .await
        .unwrap();
    let mut ads = Delta::open(&xds).await;
    ads.send(DeltaDiscoveryRequest {
        node: node("rust-delta"),
        type_url: EDS.to_string(),
        resource_names_subscribe: vec!["web".into()],
        ..Default::default()
    })
    .await;
    // The first answer may predate the registration of w1.
    let mut first = ads.next().await;
    while !first
        .resources
        .iter()
        .any(|r| endpoints(&r.resource.as_ref().unwrap().value).len() == 1)
    {
        ads.ack(&first).await;
        first = ads.next().await;
    }
    assert_eq!(first.type_url, EDS);
    let v1 = first.resources[0].version.clone();
    assert_eq!(first.resources[0].name, "web");
    assert!(!v1.is_empty());

    // A change of web: one resource, a new version; NACK it.
    agent
        .register(Endpoint::new("web", "w2", "10.0.0.2", 80).with_node("node-1"))
        .await
        .unwrap();
    let changed = ads.next().await;
    assert_eq!(changed.resources.len(), 1);
    assert_eq!(changed.resources[0].name, "web");
    assert_ne!(changed.resources[0].version, v1);
    assert_eq!(
        endpoints(&changed.resources[0].resource.as_ref().unwrap().value),
        BTreeSet::from([("10.0.0.1".into(), 80), ("10.0.0.2".into(), 80)])
    );
    ads.send(DeltaDiscoveryRequest {
        type_url: EDS.to_string(),
        response_nonce: changed.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "test: rejected on purpose".into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await;
    let nacks = format!("registrar_xds_nacks_total{{type_url=\"{EDS}\"}}");
    eventually("the NACK counted", || async {
        let (_, text) = common::http_get(&served.health, "/metrics").await;
        (common::parse(&text).value(&nacks) == Some(1.0)).then_some(())
    })
    .await;

    // Unsubscribe web, subscribe db and a listener that does not exist;
    // then change web and db: only db is pushed.
    ads.send(DeltaDiscoveryRequest {
        type_url: EDS.to_string(),
        resource_names_subscribe: vec!["db".into()],
        resource_names_unsubscribe: vec!["web".into()],
        ..Default::default()
    })
    .await;
    let db = ads.next().await;
    assert_eq!(
        db.resources.iter().map(|r| &r.name).collect::<Vec<_>>(),
        ["db"]
    );
    ads.ack(&db).await;
    ads.send(DeltaDiscoveryRequest {
        type_url: LDS.to_string(),
        resource_names_subscribe: vec!["nope".into()],
        ..Default::default()
    })
    .await;
    let absent = ads.next().await;
    assert_eq!(absent.type_url, LDS);
    assert!(absent.resources.is_empty());
    assert_eq!(absent.removed_resources, ["nope"]);
    ads.ack(&absent).await;
    agent
        .deregister(&EndpointKey::new("web", "w1"))
        .await
        .unwrap();
    agent
        .register(Endpoint::new("db", "d2", "10.0.1.2", 5432).with_node("node-1"))
        .await
        .unwrap();
    loop {
        let next = ads.next().await;
        assert_eq!(next.type_url, EDS, "{next:?}");
        assert!(
            next.resources.iter().all(|r| r.name == "db"),
            "an unsubscribed resource was pushed: {next:?}"
        );
        ads.ack(&next).await;
        let eps = endpoints(&next.resources[0].resource.as_ref().unwrap().value);
        if eps.len() == 2 {
            break;
        }
    }
}

/// A state-of-the-world LDS subscription: the listener of a service while
/// it has endpoints, an empty response (deleted) once it has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_listener_goes_with_its_service() {
    let (served, xds) = serve_with_xds().await;
    let agent = fast_client(&served.url(), "default", "node-1");
    let mut ads = Sotw::open(&xds).await;
    let names = vec!["api".to_string()];
    let mut resp = ads.ask(LDS, &names, None).await;
    assert!(resp.resources.is_empty(), "no such service yet");
    agent
        .register(Endpoint::new("api", "a1", "10.0.3.1", 80).with_node("node-1"))
        .await
        .unwrap();
    ads.send(DiscoveryRequest {
        node: node("rust-sotw"),
        type_url: LDS.to_string(),
        resource_names: names.clone(),
        version_info: resp.version_info.clone(),
        response_nonce: resp.nonce.clone(),
        ..Default::default()
    })
    .await;
    resp = ads.next().await;
    assert_eq!(resp.resources.len(), 1);
    agent
        .deregister(&EndpointKey::new("api", "a1"))
        .await
        .unwrap();
    resp = ads.next().await;
    assert!(resp.resources.is_empty(), "the listener went with api");
}
