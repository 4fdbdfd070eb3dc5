//! `registrar serve --registry URL`: the backend named by one URL, as any
//! program names it. An agent's registration through the registrar is
//! found in the backend behind it (SQLite, etcd, DynamoDB on moto); a URL
//! that does not parse stops `serve` with a message naming what is wrong.

use std::time::Duration;

use crate::common;

use waypost::testing::{ep, eventually, unique};
use waypost::Registry;

/// The agent registers `api/a` of node `n1` through `served`.
async fn register_through(served: &common::Served) {
    let agent = common::fast_client(&served.url(), "c", "n1");
    agent
        .register(ep("api", "a", 80).with_node("n1"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.db");
    let url = format!(
        "sqlite:{}?suspect_after=10s&remove_after=1m",
        path.display()
    );
    let served = common::serve_binary(&["--registry", &url]).await;
    register_through(&served).await;
    let direct = waypost_sqlite::SqliteRegistry::open(
        waypost_sqlite::SqliteConfig::new(&path).with_sweep_interval(None),
    )
    .await
    .unwrap();
    eventually("the endpoint in the SQLite file", || async {
        (direct.list("api").await.ok()?.len() == 1).then_some(())
    })
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd() {
    let etcd = waypost_fixtures::EtcdServer::start_async().await.unwrap();
    let prefix = format!("/{}", unique("url"));
    let host = etcd.endpoint().trim_start_matches("http://");
    let url = format!("etcd://{host}{prefix}");
    let served = common::serve_binary(&["--registry", &url]).await;
    register_through(&served).await;
    let direct = waypost_etcd::EtcdRegistry::connect(
        waypost_etcd::EtcdConfig::new([etcd.endpoint().to_string()]).with_prefix(prefix),
    )
    .await
    .unwrap();
    eventually("the endpoint under the URL's prefix in etcd", || async {
        (direct.list("api").await.ok()?.len() == 1).then_some(())
    })
    .await;
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_dynamodb_creating_its_table() {
    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let table = unique("url");
    let url = format!(
        "dynamodb://{table}?region=us-east-1&endpoint={}&create_table=true&watch=scan",
        moto.url()
    );
    let creds = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let served =
        common::serve_binary_with_env(&["--registry", &url, "--sync-interval", "200ms"], &creds)
            .await;
    register_through(&served).await;
    let direct = waypost_dynamodb::DynamoDbRegistry::connect(
        waypost_dynamodb::DynamoDbConfig::new(table)
            .with_region("us-east-1")
            .with_endpoint_url(moto.url())
            .with_static_credentials("test", "test"),
    )
    .await
    .unwrap();
    eventually("the endpoint in the DynamoDB table", || async {
        (direct.list("api").await.ok()?.len() == 1).then_some(())
    })
    .await;
}

/// `serve --registry URL` with `args` beside it: its exit code and what it
/// printed on stderr (bounded: the process must stop by itself).
async fn serve_refused(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_registrar"))
            .args([
                "serve",
                "--grpc-addr",
                "127.0.0.1:0",
                "--health-addr",
                "127.0.0.1:0",
            ])
            .args(args)
            .current_dir(dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve did not stop within 30 s")
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_or_a_backend_named_twice_stops_serve_naming_it() {
    let (code, stderr) = serve_refused(&["--registry", "sqlite:r.db?suspect=10s"]).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("\"suspect\""), "{stderr}");
    let (code, stderr) = serve_refused(&["--registry", "consul://127.0.0.1:8500"]).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("\"consul\""), "{stderr}");
    let (code, stderr) = serve_refused(&["--registry", "memory:", "--sqlite-path", "r.db"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--sqlite-path"), "{stderr}");
}
