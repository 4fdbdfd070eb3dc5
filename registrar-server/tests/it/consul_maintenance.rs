//! Consul maintenance mode over loopback: a service or the whole node put
//! in maintenance drains from the passing answers, and lifting it brings
//! them back.

use crate::common;

use common::http::{get, put};
use common::protocols::{start, Stack};
use serde_json::{json, Value};
use waypost::testing::eventually;

use crate::consul_reads::{service_ids, three_instances};

/// The checks `/v1/health/service/web` shows for `id`, as (CheckID,
/// Status) pairs.
async fn checks_of(stack: &Stack, id: &str) -> Vec<(String, String)> {
    let r = get(stack, "/v1/health/service/web").await;
    let entry = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Service"]["ID"] == id)
        .cloned()
        .unwrap_or(Value::Null);
    entry["Checks"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                    (s("CheckID"), s("Status"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_drains_a_service_or_the_node_and_lifting_it_brings_it_back() {
    let stack = start().await;
    three_instances(&stack).await;
    let maint = "_service_maintenance:web-1";
    // Without enable: refused, naming it.
    let r = put(&stack, "/v1/agent/service/maintenance/web-1", json!(null)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.to_string().contains("enable"), "{}", r.body);
    // py-consul sends enable=True.
    let r = put(
        &stack,
        "/v1/agent/service/maintenance/web-1?enable=True&reason=upgrade",
        json!(null),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("web-1 in maintenance: critical, draining", || async {
        let checks = checks_of(&stack, "web-1").await;
        let passing = get(&stack, "/v1/health/service/web?passing=true").await;
        (checks.contains(&(maint.to_string(), "critical".to_string()))
            && service_ids(&passing.body) == ["web-2"])
        .then_some(())
    })
    .await;
    let native = get(&stack, "/v1/services/web").await;
    assert!(
        native.body.to_string().contains("draining"),
        "{}",
        native.body
    );
    let r = put(
        &stack,
        "/v1/agent/service/maintenance/web-1?enable=false",
        json!(null),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("web-1 back: passing, no maintenance check", || async {
        let passing = get(&stack, "/v1/health/service/web?passing=true").await;
        let checks = checks_of(&stack, "web-1").await;
        (service_ids(&passing.body) == ["web-1", "web-2"]
            && !checks.iter().any(|(id, _)| id == maint))
        .then_some(())
    })
    .await;
    // Node maintenance: the agent's services are on one node here.
    let r = put(
        &stack,
        "/v1/agent/maintenance?enable=1&reason=reboot",
        json!(null),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("every service of the node in maintenance", || async {
        let passing = get(&stack, "/v1/health/service/web?passing=true").await;
        let checks = checks_of(&stack, "web-2").await;
        (service_ids(&passing.body).is_empty()
            && checks.contains(&("_node_maintenance".to_string(), "critical".to_string())))
        .then_some(())
    })
    .await;
    let r = put(&stack, "/v1/agent/maintenance?enable=0", json!(null)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("the node back", || async {
        let passing = get(&stack, "/v1/health/service/web?passing=true").await;
        (service_ids(&passing.body) == ["web-1", "web-2"]).then_some(())
    })
    .await;
}
