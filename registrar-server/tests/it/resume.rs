//! Resuming by content: an agent that moves to another replica over the
//! same backend, or outlives a registrar restart, is sent only the
//! services that differ from what it holds; a client that says nothing of
//! what it holds gets a full snapshot.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{fast_client, start, start_on};
use waypost::testing::{ep, eventually};
use waypost::{liveness::Liveness, memory::MemoryRegistry, Endpoint, Registry, Snapshot, Version};
use waypost_fixtures::proxy::CutProxy;
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use waypost_registrar_client::proto::registrar::v1::WatchEndpointsRequest;
use waypost_registrar_client::{Digests, RegistrarClient};
use waypost_registrar_server::{Backend, RegistrarConfig};

const SERVICES: usize = 40;

fn endpoints() -> Vec<Endpoint> {
    (0..SERVICES)
        .flat_map(|s| (0..2).map(move |i| ep(&format!("svc-{s:02}"), &format!("ep-{i}"), 8000)))
        .map(|e| e.with_node("writer"))
        .collect()
}

/// Every endpoint the agent holds, in key order: what its watch delivered
/// (before that, a client's reads go to the registrar).
async fn held(agent: &RegistrarClient) -> Vec<Endpoint> {
    tokio::time::timeout(Duration::from_secs(30), agent.cache().wait_until_ready())
        .await
        .expect("the agent's first snapshot within 30 s");
    agent
        .snapshot()
        .await
        .map(|s| s.to_vec())
        .unwrap_or_default()
}

/// Wait until `agent` holds exactly what `reference` lists.
async fn agrees(agent: &RegistrarClient, reference: &RegistrarClient, what: &str) {
    eventually(what, || async {
        let want = reference.snapshot().await.ok()?.to_vec();
        (held(agent).await == want).then_some(())
    })
    .await;
}

/// The bytes of `FULL_SNAPSHOT` messages a registrar has sent so far.
fn snapshot_bytes(server: &common::Server) -> u64 {
    server.registrar.watch_stats().snapshot_bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_moved_to_another_replica_gets_only_what_changed() {
    let backend: Arc<dyn Backend> = Arc::new(Liveness::new(MemoryRegistry::new()));
    let a = start(Arc::clone(&backend), RegistrarConfig::new("c")).await;
    let b = start(Arc::clone(&backend), RegistrarConfig::new("c")).await;
    let writer = fast_client(&a.url(), "c", "writer");
    for e in endpoints() {
        writer.register(e).await.unwrap();
    }
    // The agent reaches the registrar through a load balancer.
    let lb = CutProxy::start(a.addr).await.unwrap();
    let agent = fast_client(&lb.url(), "c", "agent");
    let at_b = fast_client(&b.url(), "c", "reference");
    agrees(&agent, &writer, "the agent's first snapshot from replica a").await;
    assert_eq!(held(&agent).await.len(), 2 * SERVICES);

    // While the agent is away, one service gains an endpoint and another
    // goes; then the load balancer sends it to replica b.
    lb.refuse();
    writer
        .register(ep("svc-03", "ep-new", 8000).with_node("writer"))
        .await
        .unwrap();
    for i in 0..2 {
        let gone = ep("svc-05", &format!("ep-{i}"), 8000);
        writer.deregister(&gone.key()).await.unwrap();
    }
    eventually("replica b has the changes", || async {
        let s = at_b.snapshot().await.ok()?;
        (s.list("svc-03").len() == 3 && s.list("svc-05").is_empty()).then_some(())
    })
    .await;
    let before = snapshot_bytes(&b);
    lb.retarget(b.addr);
    lb.heal();
    agrees(&agent, &at_b, "the agent's state from replica b").await;
    let partial = snapshot_bytes(&b) - before;

    // What a client that holds nothing is sent by replica b, for scale.
    let full_before = snapshot_bytes(&b);
    let first = first_snapshot(
        b.url(),
        WatchEndpointsRequest {
            cluster_name: "c".into(),
            node_name: "new-agent".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(first.partial, Some(false), "a client that held nothing");
    assert_eq!(first.endpoints, 2 * SERVICES - 2 + 1, "the whole registry");
    let full = snapshot_bytes(&b) - full_before;
    assert!(
        partial * 10 < full,
        "replica b sent {partial} bytes to the returning agent, a full snapshot is {full}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_outliving_a_restart_gets_only_what_changed() {
    let backend: Arc<dyn Backend> = Arc::new(Liveness::new(MemoryRegistry::new()));
    let server = start(Arc::clone(&backend), RegistrarConfig::new("c")).await;
    let writer = fast_client(&server.url(), "c", "writer");
    for e in endpoints() {
        writer.register(e).await.unwrap();
    }
    let agent = fast_client(&server.url(), "c", "agent");
    agrees(&agent, &writer, "the agent's first snapshot").await;
    let addr = server.addr;
    let old_epoch = server.registrar.epoch();
    server.stop().await;

    let server = start_on(Arc::clone(&backend), RegistrarConfig::new("c"), addr).await;
    assert_ne!(server.registrar.epoch(), old_epoch);
    // Both clients (the writer watches too) come back.
    eventually("the clients back on the restarted registrar", || async {
        let stats = server.registrar.watch_stats();
        (stats.streams == 2 && stats.snapshot_chunks >= 2 && stats.pending_endpoints == 0)
            .then_some(())
    })
    .await;
    // Nothing changed: an empty partial snapshot each, a few bytes; the
    // registry's 80 endpoints would be a few KiB.
    let sent = snapshot_bytes(&server);
    assert!(sent < 2 * 64, "the restarted registrar sent {sent} bytes");
    assert_eq!(
        held(&agent).await,
        backend.snapshot().await.unwrap().to_vec()
    );

    // And changes after the restart reach it as usual.
    writer
        .register(ep("svc-00", "ep-late", 8000).with_node("writer"))
        .await
        .unwrap();
    agrees(&agent, &writer, "a change after the restart").await;
}

/// The first snapshot a watch is answered with.
struct First {
    /// Whether its messages say partial: `None` if they disagree.
    partial: Option<bool>,
    /// The endpoints it holds.
    endpoints: usize,
    /// The services they name, in order.
    services: Vec<String>,
    /// The services it says are gone.
    removed: Vec<String>,
}

/// The first snapshot `req` is answered with.
async fn first_snapshot(url: String, req: WatchEndpointsRequest) -> First {
    let mut grpc = Grpc::connect(url).await.unwrap();
    let mut stream = grpc.watch_endpoints(req).await.unwrap().into_inner();
    let mut first = First {
        partial: None,
        endpoints: 0,
        services: Vec::new(),
        removed: Vec::new(),
    };
    let mut flags = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("a snapshot within 30 s")
            .unwrap()
            .expect("the stream ended");
        assert_eq!(ev.r#type, EventType::FullSnapshot as i32);
        flags.push(ev.snapshot_partial);
        first.endpoints += ev.snapshot_endpoints.len();
        first
            .services
            .extend(ev.snapshot_endpoints.iter().map(|e| e.service_name.clone()));
        first.removed.extend(ev.snapshot_removed_services);
        if ev.snapshot_last {
            break;
        }
    }
    first.services.dedup();
    first.partial = flags.iter().all(|f| *f == flags[0]).then_some(flags[0]);
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_with_its_total_or_without_gets_what_differs() {
    let backend: Arc<dyn Backend> = Arc::new(Liveness::new(MemoryRegistry::new()));
    let server = start(Arc::clone(&backend), RegistrarConfig::new("c")).await;
    let writer = fast_client(&server.url(), "c", "writer");
    for e in endpoints() {
        writer.register(e).await.unwrap();
    }
    eventually(
        "the registrar and its backend hold every endpoint",
        || async {
            let s = writer.snapshot().await.ok()?;
            let b = backend.snapshot().await.ok()?;
            (s.len() == 2 * SERVICES && b.len() == 2 * SERVICES).then_some(())
        },
    )
    .await;
    // What an agent of another registrar would hold: the same endpoints.
    let state = backend.snapshot().await.unwrap();
    let held = Snapshot::from_endpoints(Version(12_345), state.to_vec());
    let agent = Digests::new();
    let request = |total: bool| WatchEndpointsRequest {
        cluster_name: "c".into(),
        node_name: "agent".into(),
        last_version: "1.12345".into(),
        held: agent.held(&held),
        held_total: total.then(|| agent.total(&held)),
    };
    let answer = |f: First| (f.partial, f.services, f.removed);
    let nothing = (Some(true), vec![], vec![]);
    assert_eq!(
        answer(first_snapshot(server.url(), request(true)).await),
        nothing
    );
    // Without the total, as agents that do not send it: the same answer.
    assert_eq!(
        answer(first_snapshot(server.url(), request(false)).await),
        nothing
    );

    // One service gains an endpoint, another goes.
    writer
        .register(ep("svc-03", "ep-new", 8000).with_node("writer"))
        .await
        .unwrap();
    for i in 0..2 {
        writer
            .deregister(&ep("svc-05", &format!("ep-{i}"), 8000).key())
            .await
            .unwrap();
    }
    eventually("the registrar has the changes", || async {
        let s = writer.snapshot().await.ok()?;
        (s.list("svc-03").len() == 3 && s.list("svc-05").is_empty()).then_some(())
    })
    .await;
    let some = (
        Some(true),
        vec!["svc-03".to_string()],
        vec!["svc-05".to_string()],
    );
    assert_eq!(
        answer(first_snapshot(server.url(), request(true)).await),
        some
    );
    assert_eq!(
        answer(first_snapshot(server.url(), request(false)).await),
        some
    );
}
