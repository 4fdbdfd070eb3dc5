//! Delta xDS resumed on another replica: two registrars over one SQLite
//! file serve the same resource versions (hashes of the resources'
//! content), so a proxy reconnecting to the other one with
//! `initial_resource_versions` is sent only what changed.

use crate::common;

use std::collections::BTreeMap;

use common::xds::{endpoints, node, Delta, EDS};
use common::{fast_client, serve_binary};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use registry_api::testing::eventually;
use registry_api::{Endpoint, Registry};

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

/// Subscribe to `want`'s load assignments, saying `held` is cached, and
/// read (acknowledging) until each name was sent with `want` endpoints or
/// was held and not sent: the versions then held, and the names sent.
async fn follow(
    ads: &mut Delta,
    held: BTreeMap<String, String>,
    want: &BTreeMap<&str, usize>,
) -> (BTreeMap<String, String>, Vec<String>) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_moved_to_another_replica_gets_only_what_changed() {
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
    let mut on_a = Delta::open(&a.field("xds=")).await;
    let (held, _) = follow(&mut on_a, BTreeMap::new(), &one).await;
    drop(on_a);

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

    let mut on_b = Delta::open(&b.field("xds=")).await;
    let want = BTreeMap::from([("web", 1), ("db", 2)]);
    let (versions, sent) = follow(&mut on_b, held.clone(), &want).await;
    assert_eq!(sent, ["db"], "replica b sent only what changed");
    assert_eq!(versions["web"], held["web"]);
    assert_ne!(versions["db"], held["db"]);

    // A proxy holding nothing is sent both, web at a's version.
    let mut fresh = Delta::open(&b.field("xds=")).await;
    let (all, sent) = follow(&mut fresh, BTreeMap::new(), &want).await;
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(all, versions);
}
