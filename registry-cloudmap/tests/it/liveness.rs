//! Liveness kept in the namespace, as several processes share it:
//! registries connected separately (each with its own memory, as two
//! processes have) judge every node by the node's record in the namespace,
//! so a node heard by one is alive for all, and a silent node is marked and
//! removed by all.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, connect, start_moto};
use futures::future::join_all;
use tokio::time::Instant;
use waypost::liveness::LivenessConfig;
use waypost::stack::{stack, StackConfig};
use waypost::testing::{ep, eventually, unique};
use waypost::{Batch, Endpoint, Health, Heartbeat, Op, Registry};
use waypost_cloudmap::{layout, CloudMapConfig, CloudMapRegistry};
use waypost_fixtures::MotoServer;

const SUSPECT: Duration = Duration::from_secs(3);
const REMOVE: Duration = Duration::from_secs(8);
const SWEEP: Duration = Duration::from_millis(300);

fn short() -> LivenessConfig {
    LivenessConfig::default()
        .with_thresholds(SUSPECT, REMOVE)
        .with_sweep_interval(SWEEP)
}

/// Two registries on one namespace with `liveness`, connected separately
/// as two processes are.
async fn pair(moto: &MotoServer, liveness: LivenessConfig) -> [CloudMapRegistry; 2] {
    let cfg = |c: CloudMapConfig| c.with_liveness(liveness.clone());
    let first = connect(cfg(config(moto))).await;
    let mut second = cfg(config(moto));
    second.namespace = first.namespace().to_string();
    let second = connect(second).await;
    assert_eq!(first.namespace_id(), second.namespace_id());
    [first, second]
}

/// Two stacks over one namespace: a node that heartbeats only through the
/// first stays healthy in the second, past `suspect_after` and the
/// second's sweeps; node records are neither endpoints nor services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_heard_by_one_process_is_alive_in_the_other() {
    let moto = start_moto();
    let [one, two] = pair(&moto, short()).await;
    let (a, b) = (
        stack(one.clone(), &StackConfig::default()).unwrap(),
        stack(two.clone(), &StackConfig::default()).unwrap(),
    );
    // Liveness is the namespace's: stack() adds only the polling.
    assert!(!a.to_string().contains("Liveness"), "{a}");
    assert!(a.capabilities().native_liveness);
    let svc = unique("hb");
    let e = ep(&svc, "a", 1).with_node("node-a");
    a.register(e.clone()).await.unwrap();
    let registered = Instant::now();
    eventually(
        "suspect_after and a sweep to pass, heartbeating through the first",
        || async {
            a.heartbeat("node-a").await.unwrap();
            for (name, reg) in [("first", &a), ("second", &b)] {
                let got = reg.list(&svc).await.unwrap();
                assert_eq!(got, vec![e.clone()], "the {name} process's view");
            }
            (registered.elapsed() > SUSPECT + SWEEP * 2).then_some(())
        },
    )
    .await;
    let report = two.sweep().await.unwrap();
    assert!(
        !report.held && report.suspected.is_empty() && report.removed.is_empty(),
        "{report:?}"
    );
    assert_eq!(b.list(&svc).await.unwrap(), vec![e.clone()]);
    let records = two.node_records().await.unwrap();
    let nodes: Vec<&str> = records.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(nodes, vec!["node-a"]);
    assert!(records[0].marked.is_empty(), "{records:?}");
    // The record's service holds no endpoints, for either process.
    assert_eq!(b.snapshot().await.unwrap().to_vec(), vec![e.clone()]);
    assert!(b
        .list(&layout::node_service("node-a"))
        .await
        .unwrap()
        .is_empty());
}

/// A fleet of 20 nodes split over two processes, and one node that goes
/// silent: both see the silent one marked unhealthy (and only it), then
/// removed. Self-preservation applies from one node here; it does not
/// hold, since the shared view has one silent node in 21 (a process that
/// judged by the ten nodes it hears would see eleven silent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_fleet_marks_and_removes_only_the_silent_node_on_both() {
    let moto = start_moto();
    let mut liveness = short();
    liveness.hold_min_nodes = 1;
    let regs = pair(&moto, liveness).await;
    let svc = unique("fleet");
    let node = |i: usize| format!("node-{i:02}");
    let live: Vec<Endpoint> = (0..20)
        .map(|i| ep(&svc, &format!("e{i:02}"), 100 + i as u16).with_node(node(i)))
        .collect();
    let silent = ep(&svc, "silent", 99).with_node("node-silent");
    // Each live node heartbeats through its own process only, from the
    // moment its process registered it.
    let registered: Arc<[AtomicBool; 2]> =
        Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let rounds = Arc::new(AtomicUsize::new(0));
    let beats = {
        let (regs, registered, rounds) =
            (regs.clone(), Arc::clone(&registered), Arc::clone(&rounds));
        tokio::spawn(async move {
            loop {
                let each = (0..20)
                    .filter(|i| registered[i % 2].load(Ordering::Acquire))
                    .map(|i| {
                        let reg = &regs[i % 2];
                        async move { reg.heartbeat(&node(i)).await.unwrap() }
                    });
                join_all(each).await;
                if registered.iter().all(|r| r.load(Ordering::Acquire)) {
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(SWEEP / 2).await;
            }
        })
    };
    // One process after the other: moto, unlike Cloud Map, lets two
    // processes creating one service at the same moment create two.
    for (p, reg) in regs.iter().enumerate() {
        let mut ops: Vec<Op> = live
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == p)
            .map(|(_, e)| Op::Register(e.clone()))
            .collect();
        if p == 0 {
            ops.push(Op::Register(silent.clone()));
        }
        reg.apply(ops).await.unwrap();
        registered[p].store(true, Ordering::Release);
    }
    eventually("a round of heartbeats of every live node", || async {
        (rounds.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await;
    let check_live = |got: &[Endpoint], name: &str| {
        assert!(!beats.is_finished(), "the heartbeats stopped");
        let live_seen: Vec<&Endpoint> = got.iter().filter(|e| e.node != "node-silent").collect();
        assert_eq!(live_seen.len(), 20, "{name} lost a live node: {got:?}");
        for e in live_seen {
            assert_eq!(
                e.health,
                Health::Healthy,
                "{name} reported a live node unhealthy: {e:?}"
            );
        }
    };
    let marked = silent.clone().with_health(Health::Unhealthy);
    eventually(
        "both processes to see the silent node marked unhealthy",
        || async {
            let mut all = true;
            for (name, reg) in [("first", &regs[0]), ("second", &regs[1])] {
                let report = reg.sweep().await.unwrap();
                assert!(
                    !report.held,
                    "self-preservation held {name}'s sweep: {report:?}"
                );
                assert!(
                    report.suspected.iter().all(|n| n == "node-silent"),
                    "{name} suspected a live node: {report:?}"
                );
                let got = reg.list(&svc).await.unwrap();
                check_live(&got, name);
                all &= got.contains(&marked);
            }
            all.then_some(())
        },
    )
    .await;
    eventually("both processes to see the silent node removed", || async {
        let mut gone = true;
        for (name, reg) in [("first", &regs[0]), ("second", &regs[1])] {
            let got = reg.list(&svc).await.unwrap();
            check_live(&got, name);
            gone &= !got.iter().any(|e| e.node == "node-silent");
        }
        gone.then_some(())
    })
    .await;
    beats.abort();
    let records = regs[1].node_records().await.unwrap();
    assert!(
        !records.iter().any(|r| r.node == "node-silent"),
        "the removed node's record stays: {records:?}"
    );
    assert_eq!(records.len(), 20, "{records:?}");
    assert!(records.iter().all(|r| r.marked.is_empty()), "{records:?}");
}

/// A node marked unhealthy comes back healthy at its next heartbeat,
/// through the other process, and the endpoints it registered unhealthy
/// itself stay so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_node_is_revived_by_a_heartbeat_through_the_other_process() {
    let moto = start_moto();
    let [one, two] = pair(&moto, short()).await;
    let svc = unique("revive");
    let up = ep(&svc, "up", 1).with_node("node-r");
    let down = ep(&svc, "down", 2)
        .with_node("node-r")
        .with_health(Health::Unhealthy);
    one.register(up.clone()).await.unwrap();
    one.register(down.clone()).await.unwrap();
    let marked = up.clone().with_health(Health::Unhealthy);
    eventually("the silent node to be marked", || async {
        let got = two.list(&svc).await.unwrap();
        got.contains(&marked).then_some(())
    })
    .await;
    let records = two.node_records().await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0].marked,
        vec![up.key()],
        "only what liveness marked"
    );
    two.heartbeat("node-r").await.unwrap();
    assert_eq!(one.list(&svc).await.unwrap(), vec![down, up]);
    let records = one.node_records().await.unwrap();
    assert!(records[0].marked.is_empty(), "{records:?}");
}

/// A heartbeat of a node that never registered is `NotFound` and writes
/// no record; registering writes one before the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_written_by_registrations_not_by_unknown_heartbeats() {
    let moto = start_moto();
    let [one, _two] = pair(&moto, LivenessConfig::default()).await;
    let err = one.heartbeat("node-ghost").await.unwrap_err();
    assert_eq!(err.kind(), waypost::ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("node-ghost"), "{err}");
    assert!(one.node_records().await.unwrap().is_empty());
    let svc = unique("rec");
    let writes = one.stats().record_writes;
    one.register(ep(&svc, "a", 1).with_node("node-w"))
        .await
        .unwrap();
    one.register(ep(&svc, "b", 2).with_node("node-w"))
        .await
        .unwrap();
    assert_eq!(
        one.stats().record_writes - writes,
        1,
        "one record write for two registrations within suspect_after / 3"
    );
    let records = one.node_records().await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].node, "node-w");
}
