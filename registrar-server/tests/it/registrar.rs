//! The registrar over real gRPC on loopback: conformance through the agent
//! client, cross-cluster over one SQLite file, resume and epochs, backend
//! outages, bad requests.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{fast_client, start, start_on};
use futures::StreamExt;
use waypost::testing::{ep, eventually, next_event, next_item, Faulty};
use waypost::{liveness::Liveness, memory::MemoryRegistry, Event, Registry, Watch};
use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use waypost_registrar_client::proto::registrar::v1::{
    RegisterEndpointRequest, UnregisterEndpointRequest,
};
use waypost_registrar_client::{endpoint_to_proto, ClientConfig, RegistrarClient};
use waypost_registrar_server::{Backend, RegistrarConfig};

fn memory() -> Arc<dyn Backend> {
    Arc::new(Liveness::new(MemoryRegistry::new()))
}

/// The waypost conformance suite on the registrar client, against a
/// registrar over loopback gRPC (a `Liveness` over a `MemoryRegistry`
/// behind it), each check with a registrar of its own; the only place it
/// runs for this client.
mod conformance_through_the_client {
    use super::*;
    use waypost::testing::{overflow_history, Guarded};

    async fn make() -> Guarded<RegistrarClient> {
        let server = start(memory(), RegistrarConfig::new("test").with_history(64)).await;
        let client = RegistrarClient::connect(
            ClientConfig::new(server.url(), "test", "node-1")
                .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
                .with_history(64),
        )
        .unwrap();
        client.cache().wait_until_ready().await;
        // The server serves until it is dropped with the client.
        Guarded::new(client, server)
    }

    /// Push the watch history windows (the client's and the registrar's)
    /// past everything written so far.
    async fn lose_history(reg: &Guarded<RegistrarClient>) {
        overflow_history(reg, 80).await;
    }

    waypost::conformance_tests!(make, lose_history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_share_one_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let open = || async {
        let cfg =
            waypost_sqlite::SqliteConfig::new(&path).with_poll_interval(Duration::from_millis(50));
        Arc::new(waypost_sqlite::SqliteRegistry::open(cfg).await.unwrap()) as Arc<dyn Backend>
    };
    let a = start(open().await, RegistrarConfig::new("cluster-a")).await;
    let b = start(open().await, RegistrarConfig::new("cluster-b")).await;
    let agent_a = fast_client(&a.url(), "cluster-a", "node-a1");
    let agent_b1 = fast_client(&b.url(), "cluster-b", "node-b1");
    let agent_b2 = fast_client(&b.url(), "cluster-b", "node-b2");

    let payments = ep("payments", "pod-a", 8080)
        .with_node("node-a1")
        .with_cluster("cluster-a");
    agent_a.register(payments.clone()).await.unwrap();
    for agent in [&agent_b1, &agent_b2] {
        let got = eventually("cluster-a's endpoint at a cluster-b agent", || async {
            agent.list("payments").await.ok().filter(|l| l.len() == 1)
        })
        .await;
        assert_eq!(got[0].id, "pod-a");
        assert_eq!(got[0], payments);
    }
    // And back: cluster-b's endpoint reaches cluster-a.
    agent_b1
        .register(ep("search", "pod-b", 9090).with_node("node-b1"))
        .await
        .unwrap();
    eventually("cluster-b's endpoint at the cluster-a agent", || async {
        agent_a.list("search").await.ok().filter(|l| l.len() == 1)
    })
    .await;

    agent_a.deregister(&payments.key()).await.unwrap();
    for agent in [&agent_b1, &agent_b2] {
        eventually("the removal at a cluster-b agent", || async {
            agent.list("payments").await.ok().filter(Vec::is_empty)
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_gets_only_what_was_missed_and_a_new_epoch_gets_a_snapshot() {
    let backend = memory();
    let server = start(Arc::clone(&backend), RegistrarConfig::new("c")).await;
    let writer = fast_client(&server.url(), "c", "writer");
    writer.register(ep("s", "a", 1)).await.unwrap();

    let raw = waypost_registrar_client::RpcClient::connect(ClientConfig::new(
        server.url(),
        "c",
        "watcher",
    ))
    .unwrap();
    // An acknowledged write reaches the registrar's view with its batch:
    // watch until the first snapshot holds it.
    let snap = eventually("a snapshot holding the write", || async {
        let mut w = raw.watch(None);
        let Event::Snapshot(snap) = next_event(&mut w, "snapshot").await else {
            panic!("no snapshot")
        };
        (snap.list("s").len() == 1).then_some(snap)
    })
    .await;
    writer.register(ep("s", "b", 2)).await.unwrap();
    writer.deregister(&ep("s", "a", 1).key()).await.unwrap();

    let mut w = raw.watch(Some(snap.version()));
    match next_event(&mut w, "the first missed change").await {
        Event::Added { endpoint, .. } => assert_eq!(endpoint.id, "b"),
        other => panic!("expected only the missed changes, got {other:?}"),
    }
    match next_event(&mut w, "the second missed change").await {
        Event::Removed { key, .. } => assert_eq!(key.id, "a"),
        other => panic!("expected only the missed changes, got {other:?}"),
    }
    drop(w);

    // A restarted registrar (same address, same backend, new epoch).
    let addr = server.addr;
    let old_epoch = server.registrar.epoch();
    server.stop().await;
    let server = start_on(Arc::clone(&backend), RegistrarConfig::new("c"), addr).await;
    assert_ne!(server.registrar.epoch(), old_epoch);
    // The client's connection to the old registrar may end the first
    // watch with an `Err` item; the consumer then resumes, as it would.
    let s = eventually("a snapshot from the new epoch", || async {
        let mut w = raw.watch(Some(snap.version()));
        match next_item(&mut w, "a snapshot from the new epoch").await {
            Err(_) => None,
            Ok(Event::Snapshot(s)) => Some(s),
            Ok(other) => panic!("a new epoch must start with a snapshot, got {other:?}"),
        }
    })
    .await;
    let ids: Vec<_> = s.list("s").into_iter().map(|e| e.id).collect();
    assert_eq!(ids, vec!["b".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_read_through_a_backend_outage_and_writes_land_after() {
    let faulty = Arc::new(Faulty::new(Liveness::new(MemoryRegistry::new())));
    let server = start(
        Arc::clone(&faulty) as Arc<dyn Backend>,
        RegistrarConfig::new("c"),
    )
    .await;
    let agent = fast_client(&server.url(), "c", "n1");
    let other = fast_client(&server.url(), "c", "n2");
    agent.register(ep("s", "a", 1)).await.unwrap();
    eventually("a in the backend", || async {
        (faulty.get_ref().list("s").await.unwrap().len() == 1).then_some(())
    })
    .await;

    faulty.set_down(true);
    assert_eq!(other.list("s").await.unwrap().len(), 1, "reads go on");
    agent.register(ep("s", "b", 2)).await.unwrap();
    agent.register(ep("s", "c", 3)).await.unwrap();
    // The optimistic broadcast reaches the other agent while the backend is down.
    eventually("b and c at the other agent", || async {
        (other.list("s").await.unwrap().len() == 3).then_some(())
    })
    .await;
    assert!(
        server.registrar.queue_depth() > 0,
        "writes should be queued"
    );

    faulty.set_down(false);
    eventually("every queued write in the backend", || async {
        (faulty.get_ref().list("s").await.unwrap().len() == 3).then_some(())
    })
    .await;
    assert_eq!(server.registrar.queue_depth(), 0);
}

/// A durable write whose answer never reaches the agent (its request
/// timed out while the registrar went on and committed it) was reported
/// failed: the agent then removes it again, instead of leaving in the
/// registry an endpoint it does not hold (found by the chaos soak on
/// DynamoDB: a durable agent's register cut mid-call stayed for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_write_reported_failed_does_not_stay_in_the_registry() {
    let faulty = Arc::new(Faulty::new(Liveness::new(MemoryRegistry::new())));
    let server = start(
        Arc::clone(&faulty) as Arc<dyn Backend>,
        RegistrarConfig::new("c").with_ack(waypost_registrar_server::Ack::Durable),
    )
    .await;
    let agent = RegistrarClient::connect(
        ClientConfig::new(server.url(), "c", "n1")
            .with_ack(waypost_registrar_client::Ack::Durable)
            .with_timeouts(Duration::from_secs(5), Duration::from_millis(300))
            .with_retry_interval(Duration::from_millis(50)),
    )
    .unwrap();
    agent.register(ep("s", "kept", 1)).await.unwrap();
    // The backend now takes longer than the agent waits for an answer.
    faulty.set_latency(Duration::from_millis(1500));
    let err = agent.register(ep("s", "lost", 2)).await.unwrap_err();
    assert_eq!(err.kind(), waypost::ErrorKind::Unavailable, "{err}");
    assert!(agent.owned().iter().all(|e| e.id != "lost"));
    // The registrar goes on and commits it after the agent gave up: a
    // write queued behind it (another agent's) reaches the backend after it.
    let other = fast_client(&server.url(), "c", "n2");
    other.register(ep("t", "sentinel", 3)).await.unwrap();
    eventually("the write queued after it in the backend", || async {
        (faulty.get_ref().list("t").await.unwrap().len() == 1).then_some(())
    })
    .await;
    faulty.set_latency(Duration::ZERO);
    // The agent, told it failed, has it removed again.
    eventually("the failed write undone in the backend", || async {
        let ids: Vec<String> = faulty
            .get_ref()
            .list("s")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        (ids == ["kept"]).then_some(())
    })
    .await;
    assert_eq!(agent.owned().len(), 1);
    eventually("the agent's cache as the backend", || async {
        (agent.list("s").await.unwrap().len() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_invalid_argument_naming_the_field() {
    let backend = memory();
    let server = start(Arc::clone(&backend), RegistrarConfig::new("c")).await;
    let mut grpc = Grpc::connect(server.url()).await.unwrap();

    let err = grpc
        .register_endpoint(RegisterEndpointRequest {
            endpoint: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("endpoint"), "{}", err.message());

    let cases = [
        ("endpoint.port", {
            let mut p = endpoint_to_proto(&ep("s", "a", 1));
            p.port = 70_000;
            p
        }),
        ("endpoint.protocol", {
            let mut p = endpoint_to_proto(&ep("s", "a", 1));
            p.protocol = 42;
            p
        }),
        ("endpoint.health", {
            let mut p = endpoint_to_proto(&ep("s", "a", 1));
            p.health = 9;
            p
        }),
        ("endpoint.service_name", {
            let mut p = endpoint_to_proto(&ep("s", "a", 1));
            p.service_name = String::new();
            p
        }),
        ("endpoint.address", {
            let mut p = endpoint_to_proto(&ep("s", "a", 1));
            p.address = "a b".into();
            p
        }),
    ];
    for (field, p) in cases {
        let err = grpc
            .register_endpoint(RegisterEndpointRequest {
                endpoint: Some(p),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let err = grpc
        .unregister_endpoint(UnregisterEndpointRequest {
            service_name: String::new(),
            id: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("service_name"));
    // An oversized message is refused by the transport, not written.
    let mut huge = endpoint_to_proto(&ep("s", "huge", 1));
    huge.labels.insert("k".into(), "v".repeat(70 * 1024 * 1024));
    let err = grpc
        .register_endpoint(RegisterEndpointRequest {
            endpoint: Some(huge),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted | tonic::Code::InvalidArgument
        ),
        "{err:?}"
    );
    // Nothing was written.
    assert!(server
        .registrar
        .state()
        .snapshot()
        .await
        .unwrap()
        .is_empty());
    assert!(backend.snapshot().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_agent_is_cut_off_and_resumes() {
    let server = start(memory(), RegistrarConfig::new("c").with_agent_buffer(8)).await;
    let writer = fast_client(&server.url(), "c", "w");
    let raw =
        waypost_registrar_client::RpcClient::connect(ClientConfig::new(server.url(), "c", "slow"))
            .unwrap();
    let mut w = raw.watch(None);
    let Event::Snapshot(_) = next_event(&mut w, "snapshot").await else {
        panic!()
    };
    // Never read while 1200 changes of 4 KiB go by: more than HTTP/2's
    // flow-control windows hold, so the registrar's buffer for it fills.
    let pad = "x".repeat(1000);
    for i in 0..1200u16 {
        let mut e = ep("s", &format!("e{}", i % 50), i + 1);
        for k in 0..4 {
            e = e.with_label(format!("pad{k}"), pad.clone());
        }
        writer.register(e).await.unwrap();
    }
    let mut saw_error = false;
    while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        if let Err(e) = item {
            assert_eq!(e.kind(), waypost::ErrorKind::Overloaded, "{e}");
            saw_error = true;
            break;
        }
    }
    assert!(saw_error, "the slow stream was not cut off");
    // A fresh watch still works and has the final state.
    let mut w = raw.watch(None);
    let Event::Snapshot(s) = next_event(&mut w, "snapshot").await else {
        panic!()
    };
    assert_eq!(s.list("s").len(), 50);
}

/// A registrar restarted (new epoch) on an empty backend, with a write
/// queue of one: most of the agent's re-asserted writes are refused
/// `RESOURCE_EXHAUSTED` at first, and each is sent again until it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_asserted_writes_refused_as_overloaded_are_sent_again() {
    let server = start(Arc::new(MemoryRegistry::new()), RegistrarConfig::new("c")).await;
    let agent = fast_client(&server.url(), "c", "n1");
    for i in 0..20u16 {
        agent
            .register(ep("s", &format!("e{i}"), 1000 + i).with_node("n1"))
            .await
            .unwrap();
    }
    let addr = server.addr;
    server.stop().await;

    let backend = Arc::new(MemoryRegistry::new());
    let cfg = RegistrarConfig::new("c")
        .with_write_queue_capacity(1)
        .with_write_batch_interval(Duration::from_millis(100));
    let _server = start_on(Arc::clone(&backend) as Arc<dyn Backend>, cfg, addr).await;
    eventually(
        "all 20 endpoints re-asserted into the new backend",
        || async { (backend.list("s").await.ok()?.len() == 20).then_some(()) },
    )
    .await;
}

/// While its backend is still opening, the registrar takes connections
/// (many more than a small listen backlog holds) and serves them once the
/// backend is open: a fleet reconnecting at once to a restarting registrar
/// is not left to the kernel's accept queue, which drops or resets what
/// overflows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_made_while_the_backend_opens_are_held_then_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const CLIENTS: usize = 200;
    // A listen backlog of 4: the kernel alone would complete a handful.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_nonblocking(true).unwrap();
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&addr.into()).unwrap();
    socket.listen(4).unwrap();
    let grpc = tokio::net::TcpListener::from_std(socket.into()).unwrap();
    let addr = grpc.local_addr().unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (open, opened) = tokio::sync::watch::channel(false);
    let backend = memory();
    let server = tokio::spawn(
        waypost_registrar_server::Opening::new(RegistrarConfig::new("c")).serve(
            move || {
                let (backend, mut opened) = (Arc::clone(&backend), opened.clone());
                async move {
                    let _ = opened.wait_for(|o| *o).await;
                    Ok(backend)
                }
            },
            grpc,
            health,
            std::future::pending(),
        ),
    );
    // Every connection is established while the backend is not open.
    let connects =
        futures::future::join_all((0..CLIENTS).map(|_| tokio::net::TcpStream::connect(addr)));
    let mut conns: Vec<tokio::net::TcpStream> =
        tokio::time::timeout(Duration::from_secs(30), connects)
            .await
            .expect("connections were not taken while the backend was opening")
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert!(!*open.borrow());
    open.send_replace(true);
    // Each is then served: HTTP/2's preface and an empty SETTINGS frame get
    // the server's SETTINGS frame back.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    for (i, conn) in conns.iter_mut().enumerate() {
        conn.write_all(PREFACE).await.unwrap();
        let mut head = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(30), conn.read_exact(&mut head))
            .await
            .unwrap_or_else(|_| panic!("connection {i} was not served"))
            .unwrap();
        assert_eq!(
            head[3], 0x04,
            "connection {i}: the first frame is not SETTINGS: {head:?}"
        );
    }
    server.abort();
}
