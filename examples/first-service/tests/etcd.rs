//! Two instances on a real etcd (started by the fixtures, removed when the
//! test ends) find each other, and each leaves the registry when it stops.

use std::time::{Duration, Instant};

use first_service::{open, start, Settings, HTTP_SERVICE, SERVICE};
use waypost::Registry;
use waypost_fixtures::EtcdServer;

fn settings(etcd: &EtcdServer, id: &str) -> Settings {
    Settings {
        registry: format!(
            "etcd://{}/hello",
            etcd.endpoint().trim_start_matches("http://")
        ),
        node: format!("node-{id}"),
        id: id.to_string(),
        host: "127.0.0.1".to_string(),
        grpc_port: 0,
        http_port: 0,
        zone: Some("zone-a".to_string()),
        drain_for: Duration::from_millis(200),
    }
}

/// The ids registered for `service`.
async fn ids(registry: &dyn Registry, service: &str) -> Vec<String> {
    let endpoints = registry.list(service).await.expect("list");
    endpoints.into_iter().map(|e| e.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_find_each_other_and_leave_on_stop() {
    let etcd = EtcdServer::start_async()
        .await
        .expect("start etcd (apt-get install etcd-server)");
    let (sa, sb) = (settings(&etcd, "a"), settings(&etcd, "b"));
    let registry = open(&sa.registry, &sa.node).await.expect("open etcd");
    let a = start(registry.clone(), &sa).await.expect("start a");
    assert_eq!(ids(&*registry, SERVICE).await, ["a"]);
    assert_eq!(ids(&*registry, HTTP_SERVICE).await, ["a"]);
    assert!(a.call_peer().await.is_err(), "a alone must find no peer");

    let b = start(open(&sb.registry, &sb.node).await.expect("open etcd"), &sb)
        .await
        .expect("start b");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match a.call_peer().await {
            Ok(status) => break status,
            Err(e) if Instant::now() > deadline => panic!("a found no peer in 10 s: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(status, "Serving");

    b.stop().await.expect("stop b");
    assert_eq!(ids(&*registry, SERVICE).await, ["a"]);
    assert_eq!(ids(&*registry, HTTP_SERVICE).await, ["a"]);
    a.stop().await.expect("stop a");
    assert!(ids(&*registry, SERVICE).await.is_empty());
    assert!(ids(&*registry, HTTP_SERVICE).await.is_empty());
}
