//! Liveness kept in the table, as several processes share it: registries
//! connected separately (each with its own memory, as two processes have)
//! judge every node by the node's record in the table, so a node heard by
//! one is alive for all, and a silent node is marked and removed by all.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::Harness;
use waypost::liveness::LivenessConfig;
use waypost::stack::{stack, StackConfig};
use waypost::testing::{ep, eventually, unique};
use waypost::{Endpoint, Health, Heartbeat, Registry};
use waypost_dynamodb::{DynamoDbConfig, DynamoDbRegistry, WatchMode};

const SUSPECT: Duration = Duration::from_millis(3000);
const REMOVE: Duration = Duration::from_millis(7000);
const SWEEP: Duration = Duration::from_millis(250);

fn short(cfg: DynamoDbConfig) -> DynamoDbConfig {
    cfg.with_liveness(
        LivenessConfig::default()
            .with_thresholds(SUSPECT, REMOVE)
            .with_sweep_interval(SWEEP),
    )
}

/// Two stacks over one table without a stream (each polled, as `stack()`
/// wraps such a table): a node that heartbeats only through the first
/// stays healthy in the second, past `suspect_after` and many sweeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_heard_by_one_process_is_alive_in_the_other() {
    let h = Harness::with_config(false, short).await;
    let other = DynamoDbRegistry::connect(h.cfg.clone()).await.unwrap();
    let (a, b) = (
        stack(h.reg, &StackConfig::default()).unwrap(),
        stack(other, &StackConfig::default()).unwrap(),
    );
    // Liveness is the table's: stack() adds only the polling.
    assert!(!a.to_string().contains("Liveness"), "{a}");
    let svc = unique("hb");
    let e = ep(&svc, "a", 1).with_node("node-a");
    a.register(e.clone()).await.unwrap();
    let until = tokio::time::Instant::now() + SUSPECT + SWEEP * 6;
    while tokio::time::Instant::now() < until {
        a.heartbeat("node-a").await.unwrap();
        for (name, reg) in [("first", &a), ("second", &b)] {
            let got = reg.list(&svc).await.unwrap();
            assert_eq!(got, vec![e.clone()], "the {name} process's view");
        }
        tokio::time::sleep(SWEEP / 2).await;
    }
}

/// A fleet of 20 nodes split over two processes, and one node that goes
/// silent: both mark the silent one unhealthy (and only it), then remove
/// it; self-preservation does not hold, since the shared view has one
/// silent node in 21.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_fleet_marks_and_removes_only_the_silent_node_on_both() {
    let h = Harness::with_config(false, |c| short(c).with_watch(WatchMode::ChangeLog)).await;
    let other = DynamoDbRegistry::connect(h.cfg.clone()).await.unwrap();
    let regs = [Arc::new(h.reg), Arc::new(other)];
    let svc = unique("fleet");
    let node = |i: usize| format!("node-{i:02}");
    let live: Vec<Endpoint> = (0..20)
        .map(|i| ep(&svc, &format!("e{i:02}"), 100 + i as u16).with_node(node(i)))
        .collect();
    for (i, e) in live.iter().enumerate() {
        regs[i % 2].register(e.clone()).await.unwrap();
    }
    let silent = ep(&svc, "silent", 99).with_node("node-silent");
    regs[0].register(silent.clone()).await.unwrap();
    // Each live node heartbeats through its own process only.
    let beats = {
        let regs = regs.clone();
        tokio::spawn(async move {
            loop {
                for i in 0..20 {
                    regs[i % 2].heartbeat(&node(i)).await.unwrap();
                }
                tokio::time::sleep(SWEEP).await;
            }
        })
    };
    let check_live = |got: &[Endpoint], name: &str| {
        for e in got.iter().filter(|e| e.node != "node-silent") {
            assert_eq!(
                e.health,
                Health::Healthy,
                "{name} reported a live node unhealthy: {e:?}"
            );
        }
    };
    let marked = silent.clone().with_health(Health::Unhealthy);
    eventually(
        "both processes to mark the silent node unhealthy",
        || async {
            let mut all = true;
            for (name, reg) in [("first", &regs[0]), ("second", &regs[1])] {
                let got = reg.list(&svc).await.unwrap();
                check_live(&got, name);
                all &= got.contains(&marked);
            }
            all.then_some(())
        },
    )
    .await;
    let report = regs[1].sweep().await.unwrap();
    assert!(
        !report.held,
        "self-preservation held a sweep of a healthy fleet: {report:?}"
    );
    eventually("both processes to remove the silent node", || async {
        let mut gone = true;
        for (name, reg) in [("first", &regs[0]), ("second", &regs[1])] {
            let got = reg.list(&svc).await.unwrap();
            check_live(&got, name);
            assert_eq!(
                got.len(),
                20 + usize::from(got.iter().any(|e| e.node == "node-silent"))
            );
            gone &= !got.iter().any(|e| e.node == "node-silent");
        }
        gone.then_some(())
    })
    .await;
    beats.abort();
    let records = regs[0].node_records().await.unwrap();
    assert!(
        !records.iter().any(|r| r.node == "node-silent"),
        "the removed node's record stays: {records:?}"
    );
    assert_eq!(records.len(), 20, "{records:?}");
}

/// A heartbeat that lands between a sweep's read and its write wins: a
/// node marked unhealthy comes back healthy at its next heartbeat, through
/// any process, and the endpoints it registered unhealthy itself stay so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_node_is_revived_by_a_heartbeat_through_another_process() {
    let h = Harness::with_config(false, short).await;
    let other = DynamoDbRegistry::connect(h.cfg.clone()).await.unwrap();
    let svc = unique("revive");
    let up = ep(&svc, "up", 1).with_node("node-r");
    let down = ep(&svc, "down", 2)
        .with_node("node-r")
        .with_health(Health::Unhealthy);
    h.reg.register(up.clone()).await.unwrap();
    h.reg.register(down.clone()).await.unwrap();
    let marked = up.clone().with_health(Health::Unhealthy);
    eventually("the silent node to be marked", || async {
        let got = other.list(&svc).await.unwrap();
        got.contains(&marked).then_some(())
    })
    .await;
    other.heartbeat("node-r").await.unwrap();
    assert_eq!(h.reg.list(&svc).await.unwrap(), vec![down, up]);
}
