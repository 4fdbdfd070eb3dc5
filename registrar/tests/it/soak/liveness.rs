//! Two `registrar serve` replicas over one backend, with the agents split
//! between them: every replica judges every node by the backend's record
//! of it, so no replica reports a node that heartbeats through the other
//! one unhealthy, and a node that goes silent is marked, then removed, on
//! both.

use std::sync::Arc;
use std::time::Duration;

use waypost::testing::{eventually, unique};
use waypost::{Endpoint, Health, Heartbeat, Registry};
use waypost_registrar_client::{Ack, ClientConfig, RpcClient};

use super::cluster::{Backend, Replica};
use super::watchers::Beats;
use crate::common::http::{get_at, send_at};

/// Liveness settings short enough for a test, long enough for a loaded
/// emulator.
fn liveness_flags() -> Vec<String> {
    vec![
        "--suspect-after=6s".into(),
        "--remove-after=20s".into(),
        "--liveness-sweep-interval=250ms".into(),
        "--sync-interval=200ms".into(),
    ]
}

const LIVE_NODES: usize = 10;

async fn replicas_agree(backend: Backend) {
    let _one = super::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for i in 0..2 {
        let log = dir.path().join(format!("replica-{i}.log"));
        replicas.push(Replica::start_with(&backend, log, liveness_flags()).await);
    }
    let client = |r: &Replica, node: &str| {
        RpcClient::connect(
            ClientConfig::new(format!("http://{}", r.grpc), "soak", node)
                .with_ack(Ack::Durable)
                .with_timeouts(Duration::from_secs(2), Duration::from_secs(10)),
        )
        .unwrap()
    };
    let svc = unique("agree");
    let node = |i: usize| format!("node-{i:02}");
    // Live nodes: the even ones on the first replica, the odd ones on the
    // second; each heartbeats through its own replica only.
    let mut agents = Vec::new();
    for i in 0..LIVE_NODES {
        let agent = client(&replicas[i % 2], &node(i));
        let e =
            Endpoint::new(&svc, format!("e{i:02}"), "127.0.0.1", 100 + i as u16).with_node(node(i));
        agent.register(e).await.unwrap();
        agents.push(agent);
    }
    let silent = Endpoint::new(&svc, "silent", "127.0.0.1", 99).with_node("node-silent");
    client(&replicas[0], "node-silent")
        .register(silent.clone())
        .await
        .unwrap();
    // As often as the backend's record is written at most (suspect_after / 3).
    let beating = agents.into_iter().enumerate().map(|(i, agent)| {
        let agent: Arc<dyn Heartbeat> = Arc::new(agent);
        (node(i), agent)
    });
    let beats = Beats::start(beating.collect(), Duration::from_secs(2));
    let readers = [
        client(&replicas[0], "reader"),
        client(&replicas[1], "reader"),
    ];
    let views = || async {
        let mut views = Vec::new();
        for (i, r) in readers.iter().enumerate() {
            let got = r.list(&svc).await.unwrap();
            for e in got.iter().filter(|e| e.node != "node-silent") {
                assert_eq!(
                    e.health,
                    Health::Healthy,
                    "replica {i} on {} reported a live node unhealthy: {e:?}",
                    backend.name()
                );
            }
            views.push(got);
        }
        views
    };
    // etcd has no unhealthy phase: a node's keys go when its lease lapses.
    #[cfg(feature = "etcd")]
    let marks = !matches!(backend, Backend::Etcd(_));
    #[cfg(not(feature = "etcd"))]
    let marks = true;
    if marks {
        let marked = silent.clone().with_health(Health::Unhealthy);
        // Each replica's view follows the backend at its own pace: each
        // must show the mark, not necessarily at the same moment.
        let seen = std::sync::Mutex::new([false, false]);
        eventually(
            "both replicas to mark the silent node unhealthy",
            || async {
                let v = views().await;
                let mut seen = seen.lock().unwrap();
                for (i, got) in v.iter().enumerate() {
                    seen[i] |= got.contains(&marked);
                }
                (seen[0] && seen[1]).then_some(())
            },
        )
        .await;
    }
    eventually("both replicas to remove the silent node", || async {
        let v = views().await;
        v.iter()
            .all(|got| got.len() == LIVE_NODES && !got.iter().any(|e| e.node == "node-silent"))
            .then_some(())
    })
    .await;
    // One silent node in eleven: self-preservation never held. Backends
    // that sweep with it (DynamoDB) show 0; the others have no such gauge.
    for (i, r) in replicas.iter().enumerate() {
        let (_, text) = crate::common::http_get(&r.health.to_string(), "/metrics").await;
        let held = gauge(&text, "registry_liveness_self_preservation");
        assert_ne!(
            held,
            Some(1.0),
            "replica {i} on {} held its sweeps",
            backend.name()
        );
        #[cfg(feature = "dynamodb")]
        if matches!(backend, Backend::DynamoDb(..)) {
            assert_eq!(
                held,
                Some(0.0),
                "replica {i}: no self-preservation gauge:\n{text}"
            );
        }
    }
    drop(beats);
    for mut r in replicas {
        assert!(r.terminate().await, "a replica did not drain cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_liveness_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    replicas_agree(Backend::Sqlite(dir.path().join("registry.db"))).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_liveness_on_etcd() {
    let etcd = waypost_fixtures::EtcdServer::start_process().unwrap();
    replicas_agree(Backend::Etcd(etcd)).await;
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_liveness_on_dynamodb() {
    let moto = waypost_fixtures::MotoServer::start_process().unwrap();
    replicas_agree(Backend::DynamoDb(moto, unique("agree"))).await;
}

/// The value of the unlabelled gauge `name` in a Prometheus text page.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
}

/// TTL of the check below: each replica alone hears a report only every
/// 2.4 s, more than the TTL; together, every 1.2 s.
const TTL_MS: u64 = 2000;
const REPORT_EVERY: Duration = Duration::from_millis(1200);

async fn ttl_reports_to_alternating_replicas(backend: Backend) {
    let _one = super::ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for i in 0..2 {
        let log = dir.path().join(format!("replica-{i}.log"));
        replicas.push(Replica::start_with(&backend, log, liveness_flags()).await);
    }
    let https = [replicas[0].http, replicas[1].http];
    let check = "web-ttl";
    let body = serde_json::json!({"Name": "web", "ID": "web-1", "Port": 8080,
        "Check": {"CheckID": check, "TTL": format!("{TTL_MS}ms"), "Status": "passing"}});
    // Once the replica has loaded the registry (503 until then).
    eventually("the registration to be taken", || async {
        let put = send_at(
            https[0],
            "PUT",
            "/v1/agent/service/register",
            Some(body.to_string()),
        )
        .await;
        assert!(matches!(put.status, 200 | 503), "{}", put.body);
        (put.status == 200).then_some(())
    })
    .await;
    let status = |http| async move {
        get_at(http, "/v1/agent/checks").await.body[check]["Status"]
            .as_str()
            .map(str::to_string)
    };
    eventually("the check on both replicas", || async {
        let mut both = true;
        for h in https {
            both &= status(h).await.as_deref() == Some("passing");
        }
        both.then_some(())
    })
    .await;
    let until = tokio::time::Instant::now() + Duration::from_millis(3 * TTL_MS);
    let mut turn = 0;
    while tokio::time::Instant::now() < until {
        let to = https[turn % 2];
        let pass = send_at(to, "PUT", &format!("/v1/agent/check/pass/{check}"), None).await;
        assert_eq!(pass.status, 200, "{}", pass.body);
        turn += 1;
        let next = tokio::time::Instant::now() + REPORT_EVERY;
        while tokio::time::Instant::now() < next {
            for (i, h) in https.iter().enumerate() {
                assert_eq!(
                    status(*h).await.as_deref(),
                    Some("passing"),
                    "replica {i} on {} let the check lapse although reports reached the other",
                    backend.name()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Without reports it expires, on both.
    eventually("the unreported check to turn critical on both", || async {
        let mut both = true;
        for h in https {
            both &= status(h).await.as_deref() == Some("critical");
        }
        both.then_some(())
    })
    .await;
    for mut r in replicas {
        assert!(r.terminate().await, "a replica did not drain cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_reports_to_either_replica_count_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    ttl_reports_to_alternating_replicas(Backend::Sqlite(dir.path().join("registry.db"))).await;
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_reports_to_either_replica_count_on_dynamodb() {
    let moto = waypost_fixtures::MotoServer::start_process().unwrap();
    ttl_reports_to_alternating_replicas(Backend::DynamoDb(moto, unique("ttl"))).await;
}
