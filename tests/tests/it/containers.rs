//! The testcontainers path of the fixtures, for real: etcd and moto in
//! containers, a real client against each, and the container gone after
//! the fixture is dropped (also when the test panics).
//!
//! Runs when a Docker-compatible engine answers (`DOCKER_HOST`, see
//! `scripts/containers-setup.sh`); otherwise each test says it skipped and
//! passes. `REGISTRY_TEST_REQUIRE_CONTAINERS=1` (set by `.ci/run` once the
//! setup succeeded) turns a missing engine or image into a failure.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use waypost::{Endpoint, Registry};
use waypost_fixtures::containers::{engine_probe, EngineAddr};
use waypost_fixtures::{EtcdServer, MotoServer, Provision};

/// The engine to use, or `None` (after saying so) when the test should be
/// skipped: no engine answers, or `REGISTRY_TEST_CONTAINERS` leaves `kind`
/// out (as `scripts/containers-setup.sh` does when it has no moto image).
fn engine(test: &str, kind: &str) -> Option<EngineAddr> {
    let required = std::env::var_os("REGISTRY_TEST_REQUIRE_CONTAINERS").is_some_and(|v| v == "1");
    if !waypost_fixtures::containers::containers_allowed(kind) {
        eprintln!("{test}: skipped: REGISTRY_TEST_CONTAINERS leaves out {kind}");
        return None;
    }
    match engine_probe() {
        Ok(addr) => Some(addr),
        Err(why) => {
            assert!(!required, "{test}: containers required but {why}");
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}

/// Whether the engine still lists the container (all states).
fn listed(engine: &EngineAddr, id: &str) -> bool {
    let (code, body) = engine
        .get("/containers/json?all=true", Duration::from_secs(5))
        .unwrap();
    assert_eq!(code, 200, "listing containers: {body}");
    body.contains(id)
}

/// Whether inspecting the container answers 404.
fn inspect_gone(engine: &EngineAddr, id: &str) -> bool {
    let (code, _) = engine
        .get(&format!("/containers/{id}/json"), Duration::from_secs(5))
        .unwrap();
    code == 404
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_in_a_container_serves_a_registry_and_is_removed_on_drop() {
    let Some(engine) = engine("etcd container", "etcd") else {
        return;
    };
    let etcd = EtcdServer::start_container_async().await.unwrap();
    assert_eq!(etcd.provision(), Provision::Container);
    let id = etcd.container().unwrap().id().to_string();
    assert!(listed(&engine, &id), "{id} not listed while running");

    let cfg = waypost_etcd::EtcdConfig::new([etcd.endpoint()]).with_prefix(unique("/ct"));
    let reg = waypost_etcd::EtcdRegistry::connect(cfg).await.unwrap();
    reg.register(Endpoint::new("svc", "a", "127.0.0.1", 8080))
        .await
        .unwrap();
    let listed_eps = reg.list("svc").await.unwrap();
    assert_eq!(listed_eps.len(), 1, "{listed_eps:?}");
    assert_eq!(listed_eps[0].port, 8080);
    drop(reg);

    let url = etcd.endpoint().to_string();
    drop(etcd);
    assert!(!listed(&engine, &id), "{id} still listed after drop");
    assert!(inspect_gone(&engine, &id), "{id} still inspectable");
    let addr = url.trim_start_matches("http://");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "{url} still answers after drop"
    );
}

#[test]
fn etcd_container_survives_kill_and_restart_on_the_same_port() {
    let Some(engine) = engine("etcd container restart", "etcd") else {
        return;
    };
    let mut etcd = EtcdServer::start_container().unwrap();
    let url = etcd.endpoint().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let prefix = unique("/ct-restart");
    let put = |rt: &tokio::runtime::Runtime, id: &str| {
        let cfg = waypost_etcd::EtcdConfig::new([url.as_str()]).with_prefix(prefix.clone());
        rt.block_on(async {
            let reg = waypost_etcd::EtcdRegistry::connect(cfg).await.unwrap();
            if !id.is_empty() {
                reg.register(Endpoint::new("svc", id, "127.0.0.1", 9000))
                    .await
                    .unwrap();
            }
            reg.list("svc").await.unwrap().len()
        })
    };
    assert_eq!(put(&rt, "before"), 1);
    etcd.kill();
    let addr = url.trim_start_matches("http://");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "etcd still answers after kill"
    );
    etcd.restart().unwrap();
    assert_eq!(etcd.endpoint(), url, "the endpoint moved");
    // The data survived the kill.
    assert_eq!(put(&rt, ""), 1);
    let id = etcd.container().unwrap().id().to_string();
    drop(etcd);
    assert!(!listed(&engine, &id), "{id} still listed after drop");
}

#[test]
fn a_panicking_test_still_removes_its_container() {
    let Some(engine) = engine("etcd container panic", "etcd") else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let etcd = EtcdServer::start_container().unwrap();
        tx.send(etcd.container().unwrap().id().to_string()).unwrap();
        panic!("a test failing while it holds the fixture");
    })
    .join();
    assert!(result.is_err(), "the thread should have panicked");
    let id = rx.recv().unwrap();
    assert!(!listed(&engine, &id), "{id} still listed after the panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_in_a_container_serves_dynamodb_and_is_removed_on_drop() {
    let Some(engine) = engine("moto container", "moto") else {
        return;
    };
    let moto = MotoServer::start_container_async().await.unwrap();
    assert_eq!(moto.provision(), Provision::Container);
    let id = moto.container().unwrap().id().to_string();
    assert!(listed(&engine, &id), "{id} not listed while running");

    let cfg = waypost_dynamodb::DynamoDbConfig::new(unique("tbl"))
        .with_region("us-east-1")
        .with_endpoint_url(moto.url())
        .with_static_credentials("test", "test");
    let created = waypost_dynamodb::DynamoDbRegistry::create_table_if_missing(&cfg, false)
        .await
        .unwrap();
    assert!(created);
    let reg = waypost_dynamodb::DynamoDbRegistry::connect(cfg)
        .await
        .unwrap();
    reg.register(Endpoint::new("svc", "a", "127.0.0.1", 8080))
        .await
        .unwrap();
    let eps = reg.list("svc").await.unwrap();
    assert_eq!(eps.len(), 1, "{eps:?}");
    drop(reg);

    drop(moto);
    assert!(!listed(&engine, &id), "{id} still listed after drop");
    assert!(inspect_gone(&engine, &id), "{id} still inspectable");
}

#[test]
fn start_container_names_a_missing_engine() {
    // Only meaningful where no engine answers: then the error must say so.
    if engine_probe().is_ok() {
        return;
    }
    let err = EtcdServer::start_container().err().unwrap();
    assert!(err.to_string().contains("no container engine"), "{err}");
}
