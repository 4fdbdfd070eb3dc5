//! Acknowledged means kept: what the registrar does when the backend
//! refuses a write, refuses every write, is unreachable, or kills a task,
//! over gRPC on loopback with a fault-injecting backend.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use waypost::testing::{ep, eventually, wait_limit, Faulty};
use waypost::{
    liveness::Liveness, memory::MemoryRegistry, EndpointKey, Error, ErrorKind, Heartbeat, Registry,
};
use waypost_registrar_client::{ClientConfig, RegistrarClient, RpcClient};
use waypost_registrar_server::{Ack, Backend, Readiness, RegistrarConfig};

type Backing = Faulty<Liveness<MemoryRegistry>>;

fn faulty() -> Arc<Backing> {
    Arc::new(Faulty::new(Liveness::new(MemoryRegistry::new())))
}

fn fast() -> RegistrarConfig {
    RegistrarConfig::new("trust")
        .with_write_batch_interval(Duration::from_millis(10))
        .with_probe_interval(Duration::from_millis(50))
}

fn durable_raw(url: &str) -> RpcClient {
    RpcClient::connect(ClientConfig::new(url, "trust", "cli").with_ack(Ack::Durable)).unwrap()
}

/// The backend refuses one write for its content (optimistic mode): the
/// agent that wrote it learns it, stops asserting it, and its cache, the
/// registrar's state and the backend agree it is not there; other writes
/// land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_learns_that_its_write_was_refused() {
    let backend = faulty();
    let bad = ep("svc", "bad", 1).with_node("n1");
    backend.poison(
        bad.key(),
        Error::invalid("labels", "more labels than this backend stores"),
    );
    let server = common::start(Arc::clone(&backend) as Arc<dyn Backend>, fast()).await;
    let agent = common::fast_client(&server.url(), "trust", "n1");
    agent.cache().wait_until_ready().await;
    let mut refusals = agent.refusals();
    agent.register(bad.clone()).await.unwrap(); // optimistic: acknowledged
    let good = ep("svc", "good", 1).with_node("n1");
    agent.register(good.clone()).await.unwrap();
    let r = tokio::time::timeout(wait_limit(), refusals.recv())
        .await
        .expect("the agent was not told of the refusal")
        .unwrap();
    assert_eq!(r.key, bad.key());
    assert_eq!(r.error.kind(), ErrorKind::InvalidInput, "{}", r.error);
    assert!(r.error.to_string().contains("labels"), "{}", r.error);
    assert!(!r.retrying, "a write at fault must not be re-sent");
    eventually("the agent's cache to drop the refused endpoint", || async {
        let l = agent.list("svc").await.unwrap();
        (l == vec![good.clone()]).then_some(())
    })
    .await;
    eventually("the good write to land", || async {
        (backend.get_ref().list("svc").await.unwrap() == vec![good.clone()]).then_some(())
    })
    .await;
    assert!(agent.owned().iter().all(|e| e.key() != bad.key()));
    let state = server.registrar.state().store().snapshot().unwrap();
    assert!(state.get(&bad.key()).is_none());
    assert!(
        server.registrar.is_ready(),
        "one bad write must not make it unready"
    );
}

/// The backend refuses every write (a read-only or corrupt store): the
/// registrar goes not ready naming the cause, refuses writes with
/// UNAVAILABLE, tells the agent (who will re-send); once the backend
/// accepts writes again it re-reads the state, is ready, and the agent's
/// write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_refusing_writes_makes_it_unready_until_it_accepts_them() {
    let backend = faulty();
    let server = common::start(Arc::clone(&backend) as Arc<dyn Backend>, fast()).await;
    let agent = common::fast_client(&server.url(), "trust", "n1");
    agent.cache().wait_until_ready().await;
    eventually("ready", || async {
        server.registrar.is_ready().then_some(())
    })
    .await;
    backend.refuse_writes(Some(Error::unauthorized(
        "attempt to write a readonly database",
    )));
    let mut refusals = agent.refusals();
    let e1 = ep("svc", "a", 1).with_node("n1");
    agent.register(e1.clone()).await.unwrap();
    let r = tokio::time::timeout(wait_limit(), refusals.recv())
        .await
        .expect("the agent was not told of the refusal")
        .unwrap();
    assert_eq!(r.key, e1.key());
    assert!(
        r.retrying,
        "the backend was at fault: the agent must re-send"
    );
    eventually("not ready", || async {
        match server.registrar.status().readiness() {
            Readiness::NotReady(why) if why.contains("readonly") => Some(()),
            _ => None,
        }
    })
    .await;
    let raw = RpcClient::connect(ClientConfig::new(server.url(), "trust", "cli")).unwrap();
    let status = raw
        .grpc()
        .register_endpoint(
            waypost_registrar_client::proto::registrar::v1::RegisterEndpointRequest {
                endpoint: Some(waypost_registrar_client::endpoint_to_proto(&ep(
                    "svc", "b", 1,
                ))),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("readonly"),
        "{}",
        status.message()
    );
    // The backend accepts writes again.
    backend.refuse_writes(None);
    eventually("ready again", || async {
        server.registrar.is_ready().then_some(())
    })
    .await;
    eventually("the agent's re-sent write to land", || async {
        (backend.get_ref().list("svc").await.unwrap() == vec![e1.clone()]).then_some(())
    })
    .await;
}

/// Durable mode: the call returns once the backend holds the write, and a
/// refusal is the caller's error; per request by field or metadata, or as
/// the registrar's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_writes_return_once_committed_or_with_the_refusal() {
    let backend = faulty();
    let bad = ep("svc", "bad", 1);
    backend.poison(bad.key(), Error::invalid("id", "refused by the backend"));
    // A long batch interval: only durable waiting explains the write being
    // there when the call returns.
    let cfg = fast().with_write_batch_interval(Duration::from_millis(300));
    let server = common::start(Arc::clone(&backend) as Arc<dyn Backend>, cfg).await;
    let raw = durable_raw(&server.url());
    let good = ep("svc", "good", 1);
    raw.register(good.clone()).await.unwrap();
    assert_eq!(
        backend.get_ref().list("svc").await.unwrap(),
        vec![good.clone()]
    );
    let err = raw.register(bad.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("refused by the backend"), "{err}");
    raw.deregister(&good.key()).await.unwrap();
    assert!(backend.get_ref().list("svc").await.unwrap().is_empty());

    // The metadata key asks for it too.
    let mut req = tonic::Request::new(
        waypost_registrar_client::proto::registrar::v1::RegisterEndpointRequest {
            endpoint: Some(waypost_registrar_client::endpoint_to_proto(&ep(
                "svc", "meta", 1,
            ))),
            ..Default::default()
        },
    );
    req.metadata_mut()
        .insert("x-registrar-ack", "durable".parse().unwrap());
    raw.grpc().register_endpoint(req).await.unwrap();
    assert_eq!(backend.get_ref().list("svc").await.unwrap().len(), 1);
    let mut req = tonic::Request::new(
        waypost_registrar_client::proto::registrar::v1::RegisterEndpointRequest {
            endpoint: Some(waypost_registrar_client::endpoint_to_proto(&ep(
                "svc", "x", 1,
            ))),
            ..Default::default()
        },
    );
    req.metadata_mut()
        .insert("x-registrar-ack", "maybe".parse().unwrap());
    let status = raw.grpc().register_endpoint(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("x-registrar-ack"),
        "{}",
        status.message()
    );
}

/// The backend unreachable: the registrar stays ready but says it is
/// degraded, keeps acknowledging (optimistic) and queueing, and every
/// acknowledged write lands once the backend is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_degrades_but_loses_nothing() {
    let backend = faulty();
    let server = common::start(Arc::clone(&backend) as Arc<dyn Backend>, fast()).await;
    eventually("ready", || async {
        server.registrar.is_ready().then_some(())
    })
    .await;
    backend.set_down(true);
    let raw = RpcClient::connect(ClientConfig::new(server.url(), "trust", "cli")).unwrap();
    let eps: Vec<_> = (0..20).map(|i| ep("svc", &format!("e{i}"), 1)).collect();
    for e in &eps {
        raw.register(e.clone()).await.unwrap();
    }
    eventually("degraded", || async {
        match server.registrar.status().readiness() {
            Readiness::Ready(why) if why.contains("degraded: backend unreachable since") => {
                Some(())
            }
            _ => None,
        }
    })
    .await;
    assert!(server.registrar.status().down_for().is_some());
    assert!(server.registrar.queue_depth() > 0);
    backend.set_down(false);
    eventually("every acknowledged write to land", || async {
        (backend.get_ref().list("svc").await.unwrap().len() == eps.len()).then_some(())
    })
    .await;
    eventually("no longer degraded", || async {
        (server.registrar.status().readiness() == Readiness::Ready("ready".into())).then_some(())
    })
    .await;
}

/// A background task that dies (the write queue's flusher, killed by a
/// panicking backend) makes the registrar not ready and `serve` return an
/// error, so the process exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_task_makes_it_unready_and_serve_fail() {
    let backend = faulty();
    let server = common::start(Arc::clone(&backend) as Arc<dyn Backend>, fast()).await;
    eventually("ready", || async {
        server.registrar.is_ready().then_some(())
    })
    .await;
    backend.panic_writes(true);
    let raw = RpcClient::connect(ClientConfig::new(server.url(), "trust", "cli")).unwrap();
    raw.register(ep("svc", "boom", 1)).await.unwrap();
    eventually("not ready", || async {
        match server.registrar.status().readiness() {
            Readiness::NotReady(why) if why.contains("task") => Some(()),
            _ => None,
        }
    })
    .await;
    let err = tokio::time::timeout(wait_limit(), server.wait())
        .await
        .expect("serve did not stop after a task died")
        .unwrap_err();
    assert!(err.to_string().contains("background task died"), "{err}");
}

/// Draining at shutdown is bounded: during an outage it gives up at the
/// drain timeout, names the keys it could not write, and `serve` returns
/// an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_gives_up_at_its_timeout_and_names_the_keys() {
    let backend = faulty();
    let cfg = fast().with_drain_timeout(Duration::from_millis(300));
    let server = common::start(Arc::clone(&backend) as Arc<dyn Backend>, cfg).await;
    eventually("ready", || async {
        server.registrar.is_ready().then_some(())
    })
    .await;
    backend.set_down(true);
    let raw = RpcClient::connect(ClientConfig::new(server.url(), "trust", "cli")).unwrap();
    raw.register(ep("svc", "stuck", 1)).await.unwrap();
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(wait_limit(), server.stop_result())
        .await
        .expect("the drain did not stop at its timeout")
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(err.to_string().contains("svc/stuck"), "{err}");
    assert!(err.to_string().contains("not confirmed"), "{err}");
}

/// Every registrar gone, with the fallback on: the agent's writes and
/// heartbeats go to the backend directly; when a registrar comes back the
/// agent goes through it again, and the backend, the new registrar and
/// the agent agree on exactly the agent's endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_registrar_gone_the_agent_writes_to_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.db");
    let open = || async {
        let sqlite = waypost_sqlite::SqliteRegistry::open_path(&path)
            .await
            .unwrap();
        Arc::new(sqlite)
    };
    let registrar_side = open().await;
    let server = common::start(Arc::clone(&registrar_side) as Arc<dyn Backend>, fast()).await;
    let addr = server.addr;
    let direct = open().await;
    let cfg = ClientConfig::new(server.url(), "trust", "n1")
        .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
        .with_retry_interval(Duration::from_millis(50))
        .with_fallback(direct.clone(), Duration::from_millis(300));
    let agent = RegistrarClient::connect(cfg).unwrap();
    agent.cache().wait_until_ready().await;
    let before = ep("svc", "before", 1).with_node("n1");
    agent.register(before.clone()).await.unwrap();
    eventually("the first write to land", || async {
        (direct.list("svc").await.unwrap() == vec![before.clone()]).then_some(())
    })
    .await;
    server.crash().await;
    drop(registrar_side);
    eventually("the agent to fall back", || async {
        agent.is_falling_back().then_some(())
    })
    .await;
    let during: Vec<_> = (0..5)
        .map(|i| ep("svc", &format!("during{i}"), 1).with_node("n1"))
        .collect();
    for e in &during {
        agent.register(e.clone()).await.unwrap();
    }
    agent.deregister(&before.key()).await.unwrap();
    agent.heartbeat("n1").await.unwrap();
    // Written directly: in the backend although no registrar runs.
    assert_eq!(direct.list("svc").await.unwrap(), during);
    let node = direct
        .node("n1")
        .await
        .unwrap()
        .expect("the heartbeat reached the backend");
    assert_eq!(node.id, "n1");

    // A registrar comes back on the same address.
    let registrar_side = open().await;
    let server = common::start_on(
        Arc::clone(&registrar_side) as Arc<dyn Backend>,
        fast(),
        addr,
    )
    .await;
    eventually("the agent to go through the registrar again", || async {
        (!agent.is_falling_back()).then_some(())
    })
    .await;
    let after = ep("svc", "after", 1).with_node("n1");
    agent.register(after.clone()).await.unwrap();
    let mut want = during.clone();
    want.push(after.clone());
    want.sort_by_key(|e| e.key());
    eventually("backend, registrar and agent to agree", || async {
        let in_backend = direct.list("svc").await.unwrap();
        let in_registrar = server.registrar.state().store().snapshot()?.list("svc");
        let in_agent = agent.list("svc").await.unwrap();
        (in_backend == want && in_registrar == want && in_agent == want).then_some(())
    })
    .await;
    assert!(!agent
        .owned()
        .iter()
        .any(|e| e.key() == EndpointKey::new("svc", "before")));
}
