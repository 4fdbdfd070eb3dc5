//! One URL opens any backend: `waypost_any::open` against each backend's
//! real server (SQLite on a temporary file, etcd and moto from the
//! fixtures, a registrar and gossip nodes on loopback). Each registry takes
//! a registration and lists it back.

use std::sync::Arc;

use waypost::memory::MemoryRegistry;
use waypost::stack::Stack;
use waypost::testing::{eventually, unique};
use waypost::{Endpoint, Registry};
use waypost_fixtures::registrar::TestRegistrar;
use waypost_fixtures::{EtcdServer, MotoServer};

/// Register one endpoint through `reg` and see it listed.
async fn round_trip(reg: Arc<dyn Stack>, what: &str) {
    let service = unique("svc");
    let e = Endpoint::new(&service, "a", "127.0.0.1", 8080).with_node("node-a");
    reg.register(e.clone())
        .await
        .unwrap_or_else(|err| panic!("{what}: register: {err}"));
    eventually(&format!("{what}: the endpoint listed"), || {
        let (reg, service, e) = (Arc::clone(&reg), service.clone(), e.clone());
        async move {
            let listed = reg.list(&service).await.ok()?;
            listed.iter().any(|l| l.key() == e.key()).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite:{}?suspect_after=10s",
        dir.path().join("r.db").display()
    );
    round_trip(waypost_any::open(&url).await.unwrap(), "sqlite").await;
    round_trip(waypost_any::open("memory:").await.unwrap(), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    let server = EtcdServer::start_async().await.unwrap();
    let host = server.endpoint().trim_start_matches("http://");
    let url = format!("etcd://{host}/{}?request_timeout=5s", unique("open"));
    round_trip(waypost_any::open(&url).await.unwrap(), "etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_creating_its_table() {
    let moto = MotoServer::start_async().await.unwrap();
    let url = format!(
        "dynamodb://{}?endpoint={}&region=us-east-1&create_table=true&watch=scan\
         &access_key_id=test&secret_access_key=test",
        unique("tbl"),
        moto.url()
    );
    round_trip(waypost_any::open(&url).await.unwrap(), "dynamodb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudmap() {
    let moto = MotoServer::start_async().await.unwrap();
    let url = format!(
        "cloudmap://{}?endpoint={}&region=us-east-1&access_key_id=test&secret_access_key=test",
        unique("ns"),
        moto.url()
    );
    round_trip(waypost_any::open(&url).await.unwrap(), "cloudmap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_as_an_agent() {
    let backend = waypost::stack::stack(MemoryRegistry::new(), &Default::default()).unwrap();
    let cfg = waypost_registrar_server::RegistrarConfig::new("default");
    let running = TestRegistrar::new(backend, cfg).start().await.unwrap();
    let url = format!("registrar://{}?cluster=default", running.addr);
    let opts = waypost_any::OpenOptions::default().with_node("node-a");
    let reg = waypost_any::open_with(&url, &opts).await.unwrap();
    round_trip(reg, "registrar").await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_on_loopback() {
    let url = "gossip://127.0.0.1:0?node=first&max_clock_skew=30s";
    round_trip(waypost_any::open(url).await.unwrap(), "gossip").await;
}
