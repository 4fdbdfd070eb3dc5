//! The ready registries of `waypost_fixtures::registries` work and are
//! isolated from each other.

use waypost::testing::ep;
use waypost::Registry;

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
        waypost_fixtures::registries::etcd().await.unwrap(),
        waypost_fixtures::registries::etcd().await.unwrap(),
    );
    works_and_is_isolated(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb() {
    let a = waypost_fixtures::registries::dynamodb(true).await.unwrap();
    let b = waypost_fixtures::registries::dynamodb(false).await.unwrap();
    works_and_is_isolated(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudmap() {
    let a = waypost_fixtures::registries::cloudmap().await.unwrap();
    let b = waypost_fixtures::registries::cloudmap().await.unwrap();
    works_and_is_isolated(a, b).await;
}
