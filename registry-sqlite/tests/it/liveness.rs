//! Liveness on an injected clock: nodes marked unhealthy after
//! `suspect_after` and removed after `remove_after` of silence, timed on
//! the process's monotonic clock, whatever its wall clock does.

use std::path::Path;
use std::time::{Duration, SystemTime};

use waypost::testing::{ep, eventually, next_event};
use waypost::{Endpoint, ErrorKind, Event, Health, Heartbeat, Registry, Watch};
use waypost_sqlite::{Clock, ManualClock, SqliteConfig, SqliteRegistry};

fn cfg(path: &Path) -> SqliteConfig {
    SqliteConfig::new(path).with_sweep_interval(None)
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn health_of(eps: &[Endpoint]) -> Vec<(String, Health)> {
    eps.iter().map(|e| (e.id.clone(), e.health)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_unhealthy_at_30s_pruned_at_5min_readmitted_by_heartbeat() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let clock = ManualClock::new(t0());
    let reg = SqliteRegistry::open(cfg(&path).with_clock(clock.clone()))
        .await
        .expect("open");
    let sec = Duration::from_secs;

    reg.register_node("n1", "10.0.0.1", "compute")
        .await
        .expect("register node");
    // A node unknown so far (no endpoint, no node row) is not admitted by
    // a heartbeat: its client must register first.
    let err = reg
        .heartbeat("n2")
        .await
        .expect_err("heartbeat of unknown n2");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(reg.node("n2").await.expect("node").is_none());
    for (id, node) in [("a1", "n1"), ("a2", "n1"), ("b1", "n2")] {
        reg.register(ep("api", id, 80).with_node(node))
            .await
            .expect("register");
    }
    reg.heartbeat("n2").await.expect("heartbeat n2");
    // Registered unhealthy by its owner: liveness must not revive it.
    reg.register(
        ep("api", "a3", 80)
            .with_node("n1")
            .with_health(Health::Unhealthy),
    )
    .await
    .expect("register");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot")
    };

    // 29 s of silence: nothing happens.
    clock.advance(sec(29));
    reg.heartbeat("n2").await.expect("n2 stays alive");
    assert!(reg.sweep().await.expect("sweep").nodes.suspected.is_empty());
    // 30 s: n1 and its healthy endpoints are marked unhealthy.
    clock.advance(sec(1));
    let report = reg.sweep().await.expect("sweep");
    assert_eq!(report.nodes.suspected, vec!["n1"]);
    assert_eq!(report.endpoints_changed, 2);
    let n1 = reg.node("n1").await.expect("node").expect("n1 known");
    assert_eq!(
        (n1.status, n1.address.as_str()),
        (Health::Unhealthy, "10.0.0.1")
    );
    assert_eq!(n1.last_seen, t0());
    assert_eq!(
        health_of(&reg.list("api").await.expect("list")),
        vec![
            ("a1".into(), Health::Unhealthy),
            ("a2".into(), Health::Unhealthy),
            ("a3".into(), Health::Unhealthy),
            ("b1".into(), Health::Healthy)
        ]
    );
    // The watch reports the change as two updates.
    for _ in 0..2 {
        match next_event(&mut w, "an unhealthy update").await {
            ev @ Event::Updated { .. } => state.apply(&ev),
            other => panic!("expected Updated, got {other:?}"),
        }
    }
    assert_eq!(state.list("api"), reg.list("api").await.expect("list"));

    // A heartbeat revives what liveness marked, not a3.
    clock.advance(sec(1));
    reg.heartbeat("n1").await.expect("heartbeat n1");
    let healths = health_of(&reg.list("api").await.expect("list"));
    assert_eq!(
        healths[0..3].iter().map(|h| h.1).collect::<Vec<_>>(),
        [Health::Healthy, Health::Healthy, Health::Unhealthy]
    );
    assert_eq!(
        reg.node("n1").await.expect("node").expect("n1").status,
        Health::Healthy
    );

    // Silent again: unhealthy after 30 s, removed at 5 min, with its endpoints.
    clock.advance(sec(30));
    reg.heartbeat("n2").await.expect("n2");
    assert_eq!(
        reg.sweep().await.expect("sweep").nodes.suspected,
        vec!["n1"]
    );
    clock.advance(sec(269));
    reg.heartbeat("n2").await.expect("n2");
    assert!(
        reg.sweep().await.expect("sweep").nodes.removed.is_empty(),
        "removed before 5 min"
    );
    clock.advance(sec(1));
    let report = reg.sweep().await.expect("sweep");
    assert_eq!(report.nodes.removed, vec!["n1"]);
    assert_eq!(report.endpoints_removed, 3);
    assert_eq!(
        health_of(&reg.list("api").await.expect("list")),
        vec![("b1".into(), Health::Healthy)]
    );
    assert!(reg.node("n1").await.expect("node").is_none());
    assert_eq!(reg.nodes().await.expect("nodes").len(), 1);

    // A heartbeat after pruning is `NotFound` and admits nothing: its
    // owner registers its endpoints again, and then heartbeats.
    let err = reg
        .heartbeat("n1")
        .await
        .expect_err("heartbeat after pruning");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(reg.node("n1").await.expect("node").is_none());
    assert_eq!(reg.list("api").await.expect("list").len(), 1);
    reg.register(ep("api", "a1", 80).with_node("n1"))
        .await
        .expect("re-register");
    reg.heartbeat("n1")
        .await
        .expect("heartbeat after registering");
    let n1 = reg.node("n1").await.expect("node").expect("re-admitted");
    assert_eq!((n1.status, n1.last_seen), (Health::Healthy, clock.now()));
    assert_eq!(reg.list("api").await.expect("list").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sweep_runs_by_itself() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let clock = ManualClock::new(t0());
    let reg = SqliteRegistry::open(
        SqliteConfig::new(&path)
            .with_clock(clock.clone())
            .with_sweep_interval(Some(Duration::from_millis(20))),
    )
    .await
    .expect("open");
    reg.register(ep("api", "a", 1).with_node("n1"))
        .await
        .expect("register");
    reg.heartbeat("n1").await.expect("heartbeat");
    clock.advance(Duration::from_secs(31));
    eventually("the sweeper to mark n1 unhealthy", || async {
        let eps = reg.list("api").await.expect("list");
        (eps.first().map(|e| e.health) == Some(Health::Unhealthy)).then_some(())
    })
    .await;
    clock.advance(Duration::from_secs(300));
    eventually("the sweeper to remove n1", || async {
        reg.list("api")
            .await
            .expect("list")
            .is_empty()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_open_every_node_gets_a_full_grace_and_keeps_its_stored_status() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let clock = ManualClock::new(t0());
    let open_at = |c: &ManualClock| SqliteRegistry::open(cfg(&path).with_clock(c.clone()));
    let sec = Duration::from_secs;
    let reg = open_at(&clock).await.expect("open");
    reg.register(ep("api", "a", 1).with_node("n1"))
        .await
        .expect("register");
    reg.register(ep("api", "b", 2).with_node("n2"))
        .await
        .expect("register");
    reg.close().await;
    drop(reg);

    // Closed for 40 s by the wall clock: a process cannot tell that from a
    // step of its clock, so both nodes get a full `suspect_after` from now.
    clock.advance(sec(40));
    let reg = open_at(&clock).await.expect("reopen");
    assert_eq!(
        health_of(&reg.list("api").await.expect("list")),
        vec![("a".into(), Health::Healthy), ("b".into(), Health::Healthy)]
    );
    clock.advance(sec(29));
    reg.heartbeat("n2").await.expect("heartbeat n2");
    assert!(reg.sweep().await.expect("sweep").nodes.suspected.is_empty());
    clock.advance(sec(1));
    assert_eq!(
        reg.sweep().await.expect("sweep").nodes.suspected,
        vec!["n1"]
    );
    reg.close().await;
    drop(reg);

    // Closed for 6 minutes: n1 keeps the status the file holds, and is
    // removed `remove_after` after this process first saw it.
    clock.advance(sec(360));
    let reg = open_at(&clock).await.expect("reopen");
    assert_eq!(
        reg.node("n1").await.expect("node").expect("n1").status,
        Health::Unhealthy
    );
    assert_eq!(reg.list("api").await.expect("list").len(), 2);
    clock.advance(sec(299));
    reg.heartbeat("n2").await.expect("heartbeat n2");
    assert!(reg.sweep().await.expect("sweep").nodes.removed.is_empty());
    // Not revived by a sweep: nothing was heard from it.
    assert_eq!(
        reg.node("n1").await.expect("node").expect("n1").status,
        Health::Unhealthy
    );
    clock.advance(sec(1));
    assert_eq!(reg.sweep().await.expect("sweep").nodes.removed, vec!["n1"]);
    assert_eq!(
        health_of(&reg.list("api").await.expect("list")),
        vec![("b".into(), Health::Healthy)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_change_no_judgement() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let clock = ManualClock::new(t0());
    let reg = SqliteRegistry::open(cfg(&path).with_clock(clock.clone()))
        .await
        .expect("open");
    let sec = Duration::from_secs;
    for (id, node) in [("live", "alive"), ("quiet", "silent")] {
        reg.register(ep("api", id, 80).with_node(node))
            .await
            .expect("register");
    }
    // Ten minutes forward, then twenty back: the live node heartbeats
    // every 10 s and is never marked; the silent one is marked 30 s after
    // its last write, on the monotonic clock.
    let steps = [
        (5, Some(t0() + sec(600))),
        (10, None),
        (12, Some(t0() - sec(600))),
        (20, None),
        (29, None),
    ];
    let mut elapsed = 0;
    for (at, step) in steps {
        clock.advance(sec(at - elapsed));
        elapsed = at;
        if let Some(to) = step {
            clock.set(to);
        }
        reg.heartbeat("alive").await.expect("heartbeat");
        let report = reg.sweep().await.expect("sweep");
        assert!(
            report.nodes.suspected.is_empty() && report.nodes.removed.is_empty(),
            "at {at} s: {report:?}"
        );
    }
    clock.advance(sec(1));
    reg.heartbeat("alive").await.expect("heartbeat");
    assert_eq!(
        reg.sweep().await.expect("sweep").nodes.suspected,
        vec!["silent"]
    );
    // A step of ten minutes forward right after the marking removes
    // nothing: removal comes `remove_after` (5 min) after the silence began.
    clock.set(clock.now() + sec(600));
    let report = reg.sweep().await.expect("sweep");
    assert!(report.nodes.removed.is_empty(), "{report:?}");
    // 290 s after the silent node's last write: still there.
    for _ in 0..26 {
        clock.advance(sec(10));
        reg.heartbeat("alive").await.expect("heartbeat");
        let report = reg.sweep().await.expect("sweep");
        assert!(report.nodes.removed.is_empty(), "{report:?}");
    }
    // 300 s after it.
    clock.advance(sec(10));
    reg.heartbeat("alive").await.expect("heartbeat");
    assert_eq!(
        reg.sweep().await.expect("sweep").nodes.removed,
        vec!["silent"]
    );
    assert_eq!(
        health_of(&reg.list("api").await.expect("list")),
        vec![("live".into(), Health::Healthy)]
    );
    // Its wall time is there for people: the last step's.
    let alive = reg.node("alive").await.expect("node").expect("alive");
    assert_eq!(alive.last_seen, clock.now());
}
