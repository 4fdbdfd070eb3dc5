//! `Liveness` on tokio's paused clock: unhealthy at 30 s, removed at 5 min,
//! revived by a heartbeat, and self-preservation.

use std::time::Duration;

use waypost::testing::ep;
use waypost::{
    liveness::{Liveness, LivenessConfig},
    memory::MemoryRegistry,
    Endpoint, Health, Heartbeat, Registry,
};

/// Sweeps only when the test says so.
fn manual() -> LivenessConfig {
    LivenessConfig::default().with_sweep_interval(Duration::from_secs(24 * 3600))
}

fn owned(id: &str, node: &str) -> Endpoint {
    ep("svc", id, 80).with_node(node)
}

async fn health(reg: &Liveness<MemoryRegistry>, id: &str) -> Option<Health> {
    reg.list("svc")
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.id == id)
        .map(|e| e.health)
}

async fn advance(secs: f64) {
    tokio::time::advance(Duration::from_secs_f64(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn unhealthy_at_30s_removed_at_5min_readmitted_by_heartbeat() {
    let reg = Liveness::with_config(MemoryRegistry::new(), manual()).unwrap();
    reg.register(owned("a1", "node-a")).await.unwrap();
    reg.register(owned("b1", "node-b")).await.unwrap();
    reg.register(owned("b2", "node-b")).await.unwrap();

    // node-a heartbeats every 10 s; node-b goes silent at t=0.
    for _ in 0..2 {
        advance(10.0).await;
        reg.heartbeat("node-a").await.unwrap();
    }
    advance(9.9).await; // t = 29.9 s
    assert!(reg.sweep().await.unwrap().suspected.is_empty());
    assert_eq!(health(&reg, "b1").await, Some(Health::Healthy));

    advance(0.1).await; // t = 30 s
    reg.heartbeat("node-a").await.unwrap();
    let report = reg.sweep().await.unwrap();
    assert_eq!(report.suspected, vec!["node-b".to_string()]);
    assert_eq!(health(&reg, "b1").await, Some(Health::Unhealthy));
    assert_eq!(health(&reg, "b2").await, Some(Health::Unhealthy));
    assert_eq!(health(&reg, "a1").await, Some(Health::Healthy));

    // Keep node-a alive up to t = 5 min.
    for _ in 0..26 {
        advance(10.0).await;
        reg.heartbeat("node-a").await.unwrap();
    }
    advance(9.9).await; // t = 299.9 s
    assert!(reg.sweep().await.unwrap().removed.is_empty());
    assert!(health(&reg, "b1").await.is_some());
    advance(0.1).await; // t = 300 s
    reg.heartbeat("node-a").await.unwrap();
    let report = reg.sweep().await.unwrap();
    assert_eq!(report.removed, vec!["node-b".to_string()]);
    assert_eq!(health(&reg, "b1").await, None);
    assert_eq!(health(&reg, "b2").await, None);
    assert!(!reg.nodes().contains_key("node-b"));

    // After pruning the node is unknown: a heartbeat is NotFound, and its
    // agent registers again, which re-admits it.
    let err = reg.heartbeat("node-b").await.unwrap_err();
    assert_eq!(err.kind(), waypost::ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("node-b"), "{err}");
    assert!(!reg.nodes().contains_key("node-b"));
    reg.register(owned("b1", "node-b")).await.unwrap();
    assert!(reg.nodes().contains_key("node-b"));
    assert_eq!(health(&reg, "b1").await, Some(Health::Healthy));
    reg.heartbeat("node-b").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_revives_unhealthy_endpoints() {
    let reg = Liveness::with_config(MemoryRegistry::new(), manual()).unwrap();
    reg.register(owned("a1", "node-a")).await.unwrap();
    reg.register(owned("b1", "node-b")).await.unwrap();
    advance(31.0).await;
    reg.heartbeat("node-a").await.unwrap();
    reg.sweep().await.unwrap();
    assert_eq!(health(&reg, "b1").await, Some(Health::Unhealthy));
    reg.heartbeat("node-b").await.unwrap();
    assert_eq!(health(&reg, "b1").await, Some(Health::Healthy));
    assert!(reg.sweep().await.unwrap().suspected.is_empty());
}

#[tokio::test(start_paused = true)]
async fn self_preservation_holds_when_half_the_nodes_go_silent() {
    let reg = Liveness::with_config(MemoryRegistry::new(), manual()).unwrap();
    let nodes: Vec<String> = (0..10).map(|i| format!("node-{i}")).collect();
    for n in &nodes {
        reg.register(owned(&format!("{n}-ep"), n)).await.unwrap();
    }
    // Half of them stop at once (say this registry lost its network).
    advance(400.0).await;
    for n in &nodes[..5] {
        reg.heartbeat(n).await.unwrap();
    }
    let report = reg.sweep().await.unwrap();
    assert!(report.held, "{report:?}");
    assert!(report.suspected.is_empty() && report.removed.is_empty());
    let all = reg.list("svc").await.unwrap();
    assert_eq!(all.len(), 10, "self-preservation removed endpoints");
    assert!(all.iter().all(|e| e.health == Health::Healthy));

    // One node alone going silent is still handled.
    for n in &nodes[5..] {
        reg.heartbeat(n).await.unwrap();
    }
    advance(31.0).await;
    for n in &nodes[1..] {
        reg.heartbeat(n).await.unwrap();
    }
    let report = reg.sweep().await.unwrap();
    assert!(!report.held);
    assert_eq!(report.suspected, vec!["node-0".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn the_background_sweeper_runs_on_its_own() {
    let reg = Liveness::new(MemoryRegistry::new());
    reg.register(owned("a1", "node-a")).await.unwrap();
    reg.register(owned("b1", "node-b")).await.unwrap();
    for _ in 0..4 {
        advance(10.0).await;
        reg.heartbeat("node-a").await.unwrap();
    }
    // The paused clock lets the sweeper's ticks fire as time advances.
    tokio::task::yield_now().await;
    assert_eq!(health(&reg, "b1").await, Some(Health::Unhealthy));
    assert_eq!(reg.to_string(), "Liveness(Memory)");
    assert!(reg.capabilities().native_liveness);
    let err = reg.heartbeat("bad node").await.unwrap_err();
    assert!(err.to_string().contains("node"), "{err}");
}
