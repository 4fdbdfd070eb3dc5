//! `registrar serve --registry-backend=dynamodb|cloudmap` against moto: an
//! agent's registration reaches the AWS backend through the registrar.

#![allow(clippy::unwrap_used)]
#![cfg(any(feature = "dynamodb", feature = "cloudmap"))]

mod common;

use registry_api::testing::{ep, eventually, unique};
use registry_api::Registry;

/// The registrar binary on `backend`, with the AWS emulator's address and
/// test credentials in its environment.
async fn serve_on(moto: &registry_tests::MotoServer, backend_args: &[&str]) -> common::Served {
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
    let moto = registry_tests::MotoServer::start_async().await.unwrap();
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
    let direct = registry_dynamodb::DynamoDbRegistry::connect(
        registry_dynamodb::DynamoDbConfig::new(table)
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

#[cfg(feature = "cloudmap")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_on_cloudmap() {
    let moto = registry_tests::MotoServer::start_async().await.unwrap();
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
