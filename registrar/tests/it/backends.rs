//! `registrar serve --registry-backend=dynamodb|cloudmap` against moto: an
//! agent's registration reaches the AWS backend through the registrar.

#![cfg(any(feature = "dynamodb", feature = "cloudmap"))]

use crate::common;

use waypost::testing::{ep, eventually, unique};
use waypost::Registry;

/// The registrar binary on `backend`, with the AWS emulator's address and
/// test credentials in its environment.
/// A `DynamoDbRegistry` of its own on `table` at moto, to look behind the
/// registrar.
async fn direct_dynamodb(
    moto: &waypost_fixtures::MotoServer,
    table: impl Into<String>,
) -> waypost_dynamodb::DynamoDbRegistry {
    waypost_dynamodb::DynamoDbRegistry::connect(
        waypost_dynamodb::DynamoDbConfig::new(table)
            .with_region("us-east-1")
            .with_endpoint_url(moto.url())
            .with_static_credentials("test", "test"),
    )
    .await
    .unwrap()
}

async fn serve_on(moto: &waypost_fixtures::MotoServer, backend_args: &[&str]) -> common::Served {
    let mut args = vec![
        "--aws-region",
        "us-east-1",
        "--aws-endpoint-url",
        moto.url(),
        "--sync-interval",
        "200ms",
    ];
    args.extend_from_slice(backend_args);
    let creds = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    common::serve_binary_with_env(&args, &creds).await
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_on_dynamodb() {
    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let table = unique("registrar");
    let server = serve_on(
        &moto,
        &[
            "--registry-backend",
            "dynamodb",
            "--dynamodb-table",
            &table,
            "--dynamodb-create-table",
        ],
    )
    .await;
    let agent = common::fast_client(&server.url(), "c", "n1");
    agent
        .register(ep("api", "a", 80).with_node("n1"))
        .await
        .unwrap();
    let direct = direct_dynamodb(&moto, table).await;
    eventually("the endpoint in the DynamoDB table", || async {
        (direct.list("api").await.ok()?.len() == 1).then_some(())
    })
    .await;
}

/// Two registrars (two clusters) on one table with `--dynamodb-sync
/// changelog`: a registration through one is written with a log entry, and
/// the other's view gets it from the log.
#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrars_on_dynamodb_share_changes_through_the_change_log() {
    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let table = unique("registrar-log");
    let args = [
        "--registry-backend",
        "dynamodb",
        "--dynamodb-table",
        &table,
        "--dynamodb-create-table",
        "--dynamodb-sync",
        "changelog",
    ];
    let a = serve_on(&moto, &args).await;
    let b = serve_on(&moto, &args).await;
    common::fast_client(&a.url(), "c", "n1")
        .register(ep("api", "a", 80).with_node("n1"))
        .await
        .unwrap();
    let direct = direct_dynamodb(&moto, table).await;
    // The log's head, as the crate docs lay it out.
    eventually("a change log entry in the table", || async {
        let head = direct
            .client()
            .get_item()
            .table_name(direct.table())
            .key(
                "service",
                waypost_dynamodb::aws_sdk_dynamodb::types::AttributeValue::S(
                    "~registry changelog".into(),
                ),
            )
            .key(
                "id",
                waypost_dynamodb::aws_sdk_dynamodb::types::AttributeValue::S("~head".into()),
            )
            .consistent_read(true)
            .send()
            .await
            .ok()?;
        head.item().is_some().then_some(())
    })
    .await;
    let other = common::fast_client(&b.url(), "c2", "n2");
    eventually("the endpoint in the other registrar's view", || async {
        (other.list("api").await.ok()?.len() == 1).then_some(())
    })
    .await;
}

/// The DynamoDB table deleted under writes, then recreated (an emulator
/// restart, an operator's mistake): the registrar goes not ready and stops
/// acknowledging; once the table is back its view equals the table (no
/// phantom endpoints) and direct writes to the table reach the agents.
#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_dynamodb_table_stops_acknowledging_then_heals() {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let table = unique("healing");
    let creds = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let server = common::spawn_serve_env(
        &[
            "--aws-region",
            "us-east-1",
            "--aws-endpoint-url",
            moto.url(),
            "--registry-backend=dynamodb",
            "--dynamodb-table",
            &table,
            "--dynamodb-create-table",
            "--probe-interval=200ms",
            "--write-batch-interval=20ms",
            "--sync-interval=200ms",
        ],
        &creds,
    )
    .await;
    let cfg = waypost_dynamodb::DynamoDbConfig::new(table.clone())
        .with_region("us-east-1")
        .with_endpoint_url(moto.url())
        .with_static_credentials("test", "test");
    eventually("ready", || async {
        (server.readyz().await.0 == 200).then_some(())
    })
    .await;
    let direct = waypost_dynamodb::DynamoDbRegistry::connect(cfg.clone())
        .await
        .unwrap();
    let raw = waypost_registrar_client::RpcClient::connect(
        waypost_registrar_client::ClientConfig::new(server.url(), "c", "loader"),
    )
    .unwrap();
    for i in 0..20 {
        raw.register(ep("api", &format!("old{i}"), 80))
            .await
            .unwrap();
    }
    eventually("the first writes in the table", || async {
        (direct.list("api").await.ok()?.len() == 20).then_some(())
    })
    .await;
    // A watcher (reads only, so nothing is re-asserted by it).
    let agent = common::fast_client(&server.url(), "c", "watcher");
    agent.cache().wait_until_ready().await;

    // Writes go on while the table is deleted.
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let loader = {
        let (stop, refused) = (Arc::clone(&stop), Arc::clone(&refused));
        let raw = waypost_registrar_client::RpcClient::connect(
            waypost_registrar_client::ClientConfig::new(server.url(), "c", "loader"),
        )
        .unwrap();
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = raw.register(ep("load", &format!("k{i}"), 80)).await {
                    assert_eq!(e.kind(), waypost::ErrorKind::Unavailable, "{e}");
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    };
    direct
        .client()
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    eventually("not ready, naming the table", || async {
        let (code, body) = server.readyz().await;
        (code == 503 && body.contains(&table)).then_some(())
    })
    .await;
    eventually("writes refused with UNAVAILABLE", || async {
        (refused.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    loader.await.unwrap();

    // The table comes back, and another program writes to it directly.
    waypost_dynamodb::DynamoDbRegistry::create_table_if_missing(&cfg, true)
        .await
        .unwrap();
    let direct = waypost_dynamodb::DynamoDbRegistry::connect(cfg.clone())
        .await
        .unwrap();
    let fresh = ep("api", "fresh", 80);
    direct.register(fresh.clone()).await.unwrap();
    eventually("ready again", || async {
        (server.readyz().await.0 == 200).then_some(())
    })
    .await;
    let keys = |eps: Vec<waypost::Endpoint>| -> BTreeSet<waypost::EndpointKey> {
        eps.into_iter().map(|e| e.key()).collect()
    };
    eventually("the registrar's view to equal the table", || async {
        let table_now = keys(direct.snapshot().await.ok()?.iter().cloned().collect());
        let view = keys(raw.snapshot().await.ok()?.iter().cloned().collect());
        (view == table_now && table_now.contains(&fresh.key())).then_some(())
    })
    .await;
    eventually("the agent to see the table, not the phantoms", || async {
        (agent.list("api").await.ok()? == vec![fresh.clone()]).then_some(())
    })
    .await;
    let later = ep("api", "later", 80);
    direct.register(later.clone()).await.unwrap();
    eventually("a direct write to reach the agent", || async {
        agent.list("api").await.ok()?.contains(&later).then_some(())
    })
    .await;
}

#[cfg(feature = "cloudmap")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_on_cloudmap() {
    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let ns = unique("ns");
    let server = serve_on(
        &moto,
        &[
            "--registry-backend",
            "cloudmap",
            "--cloudmap-namespace",
            &ns,
        ],
    )
    .await;
    let agent = common::fast_client(&server.url(), "c", "n1");
    agent
        .register(ep("api", "a", 80).with_node("n1"))
        .await
        .unwrap();
    // Another agent sees it through the registrar's polling of Cloud Map.
    let other = common::fast_client(&server.url(), "c", "n2");
    eventually("the endpoint at another agent", || async {
        (other.list("api").await.ok()?.len() == 1).then_some(())
    })
    .await;
}
