//! The ready registries of `registry_fixtures::registries` work and are
//! isolated from each other.

use registry_api::testing::ep;
use registry_api::Registry;

async fn works_and_is_isolated<R: Registry>(a: R, b: R) {
    a.register(ep("svc", "only-in-a", 1)).await.unwrap();
    assert_eq!(a.list("svc").await.unwrap().len(), 1, "{a}");
    assert!(
        b.list("svc").await.unwrap().is_empty(),
        "{b} sees {a}'s endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    let (a, b) = (
        registry_fixtures::registries::etcd().await.unwrap(),
        registry_fixtures::registries::etcd().await.unwrap(),
    );
    works_and_is_isolated(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb() {
    let a = registry_fixtures::registries::dynamodb(true).await.unwrap();
    let b = registry_fixtures::registries::dynamodb(false)
        .await
        .unwrap();
    works_and_is_isolated(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudmap() {
    let a = registry_fixtures::registries::cloudmap().await.unwrap();
    let b = registry_fixtures::registries::cloudmap().await.unwrap();
    works_and_is_isolated(a, b).await;
}
