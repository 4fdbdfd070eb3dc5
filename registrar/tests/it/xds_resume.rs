//! Delta xDS resumed on another replica: two registrars over one SQLite
//! file serve the same resource versions (hashes of the resources'
//! content), so a proxy reconnecting to the other one with
//! `initial_resource_versions` is sent only what changed. Run with two
//! clients: the envoy-types one of these tests, and grpcio's with the
//! Envoy API stubs of the `xds-protos` package (`xds_delta.py`).

use crate::common;

use std::collections::BTreeMap;

use common::xds::{endpoints, node, Delta, EDS, LIMIT};
use common::{fast_client, serve_binary};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use waypost::testing::eventually;
use waypost::{Endpoint, Registry};

/// Resource names with the versions a proxy holds.
type Versions = BTreeMap<String, String>;

/// The delta xDS client a test drives.
#[derive(Clone, Copy)]
enum Client {
    /// The tests' own (tonic and envoy-types).
    EnvoyTypes,
    /// grpcio with xds-protos' stubs, in a Python process.
    Grpcio,
}

/// `(name, version, endpoint count)` of each resource a response carries.
fn resources(
    resp: &envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse,
) -> Vec<(String, String, usize)> {
    resp.resources
        .iter()
        .map(|r| {
            let value = &r.resource.as_ref().expect("a resource").value;
            (r.name.clone(), r.version.clone(), endpoints(value).len())
        })
        .collect()
}

impl Client {
    /// On a new stream to `xds`, subscribe to `want`'s load assignments,
    /// saying `held` is cached, and read (acknowledging) until each name
    /// was sent with `want` endpoints or was held and not sent: the
    /// versions then held, and the names sent.
    async fn follow(
        self,
        xds: &str,
        held: Versions,
        want: &BTreeMap<&str, usize>,
    ) -> (Versions, Vec<String>) {
        match self {
            Client::EnvoyTypes => follow_envoy_types(xds, held, want).await,
            Client::Grpcio => follow_grpcio(xds, held, want).await,
        }
    }
}

async fn follow_envoy_types(
    xds: &str,
    held: Versions,
    want: &BTreeMap<&str, usize>,
) -> (Versions, Vec<String>) {
    let mut ads = Delta::open(xds).await;
    ads.send(DeltaDiscoveryRequest {
        node: node("resuming-proxy"),
        type_url: EDS.to_string(),
        resource_names_subscribe: want.keys().map(|n| n.to_string()).collect(),
        initial_resource_versions: held.clone().into_iter().collect(),
        ..Default::default()
    })
    .await;
    let mut versions = held.clone();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut sent = Vec::new();
    loop {
        let resp = ads.next().await;
        ads.ack(&resp).await;
        for (name, version, n) in resources(&resp) {
            sent.push(name.clone());
            versions.insert(name.clone(), version);
            counts.insert(name, n);
        }
        let satisfied = want.iter().all(|(name, n)| match counts.get(*name) {
            Some(c) => c == n,
            None => held.contains_key(*name),
        });
        if satisfied {
            return (versions, sent);
        }
    }
}

async fn follow_grpcio(
    xds: &str,
    held: Versions,
    want: &BTreeMap<&str, usize>,
) -> (Versions, Vec<String>) {
    let script = format!("{}/tests/it/xds_delta.py", env!("CARGO_MANIFEST_DIR"));
    let request = serde_json::json!({"node": "resuming-proxy", "held": held, "want": want});
    let run = tokio::process::Command::new("python3")
        .arg(script)
        .arg(xds)
        .arg(request.to_string())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(LIMIT * 2, run)
        .await
        .expect("the grpcio client ended in time")
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the grpcio client failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the grpcio client's answer is not JSON ({e}): {:.200}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let versions = serde_json::from_value(answer["versions"].clone()).expect("versions");
    let sent = serde_json::from_value(answer["sent"].clone()).expect("sent");
    (versions, sent)
}

/// Two registrars over one SQLite file; `client` follows both services on
/// the first, then, after one changed, on the second with what it held.
async fn moved_to_another_replica(client: Client) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("registry.db");
    let flags = [
        "--xds-addr=127.0.0.1:0",
        "--sqlite-path",
        db.to_str().unwrap(),
    ];
    let a = serve_binary(&flags).await;
    let b = serve_binary(&flags).await;
    let agent = fast_client(&a.url(), "default", "node-1");
    for (service, id, address) in [("web", "w1", "10.0.0.1"), ("db", "d1", "10.0.1.1")] {
        agent
            .register(Endpoint::new(service, id, address, 80).with_node("node-1"))
            .await
            .unwrap();
    }
    let one = BTreeMap::from([("web", 1), ("db", 1)]);
    let (held, _) = client.follow(&a.field("xds="), Versions::new(), &one).await;

    // While the proxy is away, db changes; replica b sees it.
    agent
        .register(Endpoint::new("db", "d2", "10.0.1.2", 80).with_node("node-1"))
        .await
        .unwrap();
    let at_b = fast_client(&b.url(), "default", "reference");
    eventually("replica b has the change", || async {
        (at_b.list("db").await.ok()?.len() == 2).then_some(())
    })
    .await;

    let want = BTreeMap::from([("web", 1), ("db", 2)]);
    let (versions, sent) = client.follow(&b.field("xds="), held.clone(), &want).await;
    assert_eq!(sent, ["db"], "replica b sent only what changed");
    assert_eq!(versions["web"], held["web"]);
    assert_ne!(versions["db"], held["db"]);

    // A proxy holding nothing is sent both, web at a's version.
    let (all, sent) = client
        .follow(&b.field("xds="), Versions::new(), &want)
        .await;
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(all, versions);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_moved_to_another_replica_gets_only_what_changed() {
    moved_to_another_replica(Client::EnvoyTypes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_proxy_moved_to_another_replica_gets_only_what_changed() {
    common::require_python(
        "grpc, envoy.service.discovery.v3.ads_pb2_grpc",
        "grpcio xds-protos",
    );
    moved_to_another_replica(Client::Grpcio).await;
}
