//! `announce`: registered at once, back after the registry forgets it,
//! gone when it shuts down; on the in-memory backend and through the
//! generic liveness sweeper.

use std::sync::Arc;
use std::time::Duration;

use waypost::announce::{announce, AnnounceConfig, AnnounceStatus};
use waypost::liveness::{Liveness, LivenessConfig};
use waypost::memory::MemoryRegistry;
use waypost::testing::{ep, eventually, wait_limit};
use waypost::{Endpoint, ErrorKind, Heartbeat, Registry};

fn fast() -> AnnounceConfig {
    AnnounceConfig::default()
        .with_heartbeat_every(Duration::from_millis(50))
        .with_retry(Duration::from_millis(10), Duration::from_millis(100))
}

fn mine() -> Vec<Endpoint> {
    vec![
        ep("api", "pod-1", 8080).with_node("node-1"),
        ep("metrics", "pod-1", 9100).with_node("node-1"),
    ]
}

#[tokio::test]
async fn registered_then_back_after_being_forgotten_then_gone_on_shutdown() {
    let reg = Arc::new(MemoryRegistry::new());
    let a = announce(Arc::clone(&reg), mine(), fast()).unwrap();
    tokio::time::timeout(wait_limit(), a.registered())
        .await
        .expect("not registered");
    assert_eq!(reg.list("api").await.unwrap(), vec![mine()[0].clone()]);
    assert_eq!(reg.list("metrics").await.unwrap(), vec![mine()[1].clone()]);

    // Someone (an operator, a registry restart) removes one endpoint.
    reg.deregister(&mine()[0].key()).await.unwrap();
    eventually("the endpoint to be registered again", || async {
        (reg.list("api").await.unwrap().len() == 1).then_some(())
    })
    .await;

    // Everything of the node is gone: the heartbeat is NotFound.
    reg.deregister(&mine()[0].key()).await.unwrap();
    reg.deregister(&mine()[1].key()).await.unwrap();
    assert_eq!(
        reg.heartbeat("node-1").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    eventually("both endpoints to be registered again", || async {
        (reg.snapshot().await.unwrap().len() == 2).then_some(())
    })
    .await;

    a.shutdown().await.unwrap();
    assert!(
        reg.snapshot().await.unwrap().is_empty(),
        "shutdown returned before the endpoints were gone"
    );
}

/// Over the generic sweeper: a node removed for silence answers NotFound,
/// and the announcement registers it again.
#[tokio::test(start_paused = true)]
async fn liveness_removal_is_healed() {
    let live = Arc::new(
        Liveness::with_config(
            MemoryRegistry::new(),
            LivenessConfig::default()
                .with_thresholds(Duration::from_secs(30), Duration::from_secs(300))
                .with_sweep_interval(Duration::from_secs(3600)),
        )
        .unwrap(),
    );
    // Heartbeats slower than removal: the node is removed between beats.
    let slow = fast()
        .with_heartbeat_every(Duration::from_secs(600))
        .with_jitter(0.0);
    let a = announce(Arc::clone(&live), mine(), slow).unwrap();
    a.registered().await;
    tokio::time::advance(Duration::from_secs(301)).await;
    let report = live.sweep().await.unwrap();
    assert_eq!(report.removed, vec!["node-1".to_string()]);
    assert!(live.list("api").await.unwrap().is_empty());
    // The next beat (at 600 s) finds the node unknown and registers again.
    let mut status = a.status();
    tokio::time::advance(Duration::from_secs(300)).await;
    status.changed().await.unwrap();
    eventually("registered again", || async {
        (live.list("api").await.unwrap().len() == 1).then_some(())
    })
    .await;
    assert!(matches!(
        *a.status().borrow(),
        AnnounceStatus::Registered { .. }
    ));
}

/// While the registry fails, the status says so; it recovers by itself.
#[tokio::test]
async fn a_failing_registry_shows_in_the_status_and_is_retried() {
    let faulty = Arc::new(waypost::testing::Faulty::new(MemoryRegistry::new()));
    faulty.set_down(true);
    let a = announce(Arc::clone(&faulty), mine(), fast()).unwrap();
    let mut status = a.status();
    tokio::time::timeout(
        wait_limit(),
        status.wait_for(|s| matches!(s, AnnounceStatus::Retrying { .. })),
    )
    .await
    .expect("the failure did not show")
    .unwrap();
    faulty.set_down(false);
    tokio::time::timeout(wait_limit(), a.registered())
        .await
        .expect("not registered after the registry came back");
    assert_eq!(faulty.get_ref().snapshot().await.unwrap().len(), 2);
}

#[tokio::test]
async fn bad_endpoints_and_settings_are_refused() {
    let reg = Arc::new(MemoryRegistry::new());
    let err = announce(Arc::clone(&reg), vec![ep("api", "", 1)], fast())
        .err()
        .unwrap();
    assert!(err.to_string().contains("endpoints[0].id"), "{err}");
    let err = announce(reg, mine(), fast().with_heartbeat_every(Duration::ZERO))
        .err()
        .unwrap();
    assert!(err.to_string().contains("heartbeat_every"), "{err}");
}

/// `leave_on` for a server's graceful shutdown: the endpoints are gone
/// when the future resolves.
#[tokio::test]
async fn leave_on_deregisters_before_resolving() {
    let reg = Arc::new(MemoryRegistry::new());
    let a = announce(Arc::clone(&reg), mine(), fast()).unwrap();
    a.registered().await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let leaving = tokio::spawn(a.leave_on(async move {
        let _ = rx.await;
    }));
    assert_eq!(reg.snapshot().await.unwrap().len(), 2);
    tx.send(()).unwrap();
    tokio::time::timeout(wait_limit(), leaving)
        .await
        .unwrap()
        .unwrap();
    assert!(reg.snapshot().await.unwrap().is_empty());
}

/// Shutdown drains: the endpoints are registered as draining, stay so for
/// `drain_for` (on a paused clock), and are deregistered after it.
#[tokio::test(start_paused = true)]
async fn shutdown_marks_the_endpoints_draining_for_drain_for_then_deregisters() {
    use waypost::Health;
    let reg = Arc::new(MemoryRegistry::new());
    let drain_for = Duration::from_secs(30);
    let a = announce(Arc::clone(&reg), mine(), fast().with_drain_for(drain_for)).unwrap();
    a.registered().await;
    let mut status = a.status();
    let started = tokio::time::Instant::now();
    let shutdown = tokio::spawn(a.shutdown());
    status
        .wait_for(|s| matches!(s, AnnounceStatus::Draining { .. }))
        .await
        .unwrap();
    for service in ["api", "metrics"] {
        let eps = reg.list(service).await.unwrap();
        assert_eq!(eps.len(), 1, "{service}");
        assert_eq!(eps[0].health, Health::Draining, "{service}");
    }
    shutdown.await.unwrap().unwrap();
    assert!(
        started.elapsed() >= drain_for,
        "left after {:?}",
        started.elapsed()
    );
    assert!(reg.list("api").await.unwrap().is_empty());
    assert!(reg.list("metrics").await.unwrap().is_empty());
}

#[test]
fn drain_for_is_checked() {
    let err = fast()
        .with_drain_for(Duration::from_secs(7200))
        .validate()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("drain_for"), "{err}");
}
