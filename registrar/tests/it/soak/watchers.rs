//! Liveness through the chaos: both replicas' views are sampled while the
//! faults run, and no endpoint of an agent's node (agents heartbeat every
//! second throughout) may ever be reported unhealthy by either; at the
//! end a node that registered one endpoint and then fell silent is marked
//! by both replicas (on etcd, whose leases have no unhealthy phase: its
//! endpoint is dropped).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use waypost::{Endpoint, Health, Heartbeat, Registry};
use waypost_registrar_client::{ClientConfig, RegistrarClient};

use super::cluster::Replica;

/// `serve`'s liveness flags in the soak: a node is suspected after 15 s
/// of silence, five times the longest fault, so that only a node that
/// stopped heartbeating is ever marked.
pub fn flags() -> Vec<String> {
    vec![
        "--suspect-after=15s".into(),
        "--liveness-sweep-interval=250ms".into(),
    ]
}

/// One reader per replica (straight to its gRPC port, not through the
/// agents' proxy), named for messages.
pub fn readers(replicas: &[Replica]) -> Vec<(String, RegistrarClient)> {
    replicas
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let cfg =
                ClientConfig::new(format!("http://{}", r.grpc), "soak", format!("reader-{i}"));
            (
                format!("replica {i}"),
                RegistrarClient::connect(cfg).unwrap(),
            )
        })
        .collect()
}

/// Samples both replicas' views every 250 ms until `stop`, keeping every
/// unhealthy endpoint of one of `nodes` that either reported.
pub struct Sampler {
    seen: Arc<Mutex<Vec<String>>>,
    samples: Arc<Mutex<usize>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start(
        readers: Vec<(String, RegistrarClient)>,
        nodes: BTreeSet<String>,
        mut stop: watch::Receiver<bool>,
    ) -> Sampler {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let samples = Arc::new(Mutex::new(0));
        let task = {
            let (seen, samples) = (Arc::clone(&seen), Arc::clone(&samples));
            tokio::spawn(async move {
                while !*stop.borrow() {
                    for (name, r) in &readers {
                        let Ok(view) = r.cache().snapshot().await else {
                            continue;
                        };
                        *samples.lock().unwrap() += 1;
                        for e in view.iter() {
                            if e.health != Health::Healthy && nodes.contains(&e.node) {
                                seen.lock().unwrap().push(format!("{name}: {e:?}"));
                            }
                        }
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(250), stop.changed()).await;
                }
            })
        };
        Sampler {
            seen,
            samples,
            task,
        }
    }

    /// Stop sampling: the live nodes reported unhealthy, and how many
    /// views were read.
    pub async fn finish(self) -> (Vec<String>, usize) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        let seen = std::mem::take(&mut *self.seen.lock().unwrap());
        let samples = *self.samples.lock().unwrap();
        (seen, samples)
    }
}

/// A backstop for one heartbeat, beyond the clients' own request
/// timeouts (at most 10 s in these tests), which end a call first.
const CALL_LIMIT: Duration = Duration::from_secs(15);

/// Keep `agents`' nodes heartbeating, each from a task of its own (so
/// that one slow call delays no other node), every `every`, until dropped.
pub struct Beats(Vec<tokio::task::JoinHandle<()>>);

impl Beats {
    pub fn start(agents: Vec<(String, Arc<dyn Heartbeat>)>, every: Duration) -> Beats {
        Beats(
            agents
                .into_iter()
                .map(|(node, a)| {
                    tokio::spawn(async move {
                        loop {
                            match tokio::time::timeout(CALL_LIMIT, a.heartbeat(&node)).await {
                                Ok(Ok(())) => {}
                                Ok(Err(e)) => eprintln!("heartbeat of {node} failed: {e}"),
                                Err(_) => eprintln!("heartbeat of {node} did not answer"),
                            }
                            tokio::time::sleep(every).await;
                        }
                    })
                })
                .collect(),
        )
    }
}

impl Drop for Beats {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The silent node's one endpoint.
pub fn silent_endpoint(node: &str) -> Endpoint {
    Endpoint::new("soak-silent", node, "127.0.0.1", 1)
        .with_node(node)
        .with_cluster("soak")
}

/// How long the silent node may take to be marked on every replica:
/// `--suspect-after`, then a sweep, then a poll of the backend
/// (`--sync-interval`, 5 s), with room for a loaded emulator.
const MARK_LIMIT: Duration = Duration::from_secs(60);

/// Wait until every reader shows `silent` marked unhealthy (`marks`), or
/// gone (etcd), each at its own pace.
pub async fn silent_marked_on_all(
    readers: &[(String, RegistrarClient)],
    silent: &Endpoint,
    marks: bool,
) {
    let mut done = vec![false; readers.len()];
    let all = async {
        while !done.iter().all(|d| *d) {
            for (i, (_, r)) in readers.iter().enumerate() {
                let Ok(got) = r.list(&silent.service).await else {
                    continue;
                };
                done[i] |= match got.iter().find(|e| e.id == silent.id) {
                    Some(e) => marks && e.health == Health::Unhealthy,
                    None => !marks,
                };
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let what = if marks { "marked" } else { "dropped" };
    assert!(
        tokio::time::timeout(MARK_LIMIT, all).await.is_ok(),
        "the silent node was not {what} on every replica within {MARK_LIMIT:?}"
    );
}
