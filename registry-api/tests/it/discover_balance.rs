//! `discover()` feeding `tower::balance::p2c::Balance`: requests reach an
//! endpoint once it is registered and stop reaching it once it is
//! deregistered or unhealthy.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use tower::balance::p2c::Balance;
use tower::load::Constant;
use tower::{service_fn, Service, ServiceExt};
use waypost::{discover::discover, memory::MemoryRegistry, Endpoint, Health, Registry};

fn ep(id: &str, port: u16) -> Endpoint {
    waypost::testing::ep("echo", id, port)
}

/// Send `n` requests through the balancer; count which endpoint answered.
async fn send<S>(balancer: &mut S, n: usize) -> BTreeMap<String, usize>
where
    S: Service<(), Response = String>,
    S::Error: std::fmt::Debug,
{
    let mut hits = BTreeMap::new();
    for _ in 0..n {
        let who = balancer.ready().await.unwrap().call(()).await.unwrap();
        *hits.entry(who).or_default() += 1;
    }
    hits
}

#[tokio::test]
async fn requests_follow_endpoints_that_come_and_go() {
    let reg = Arc::new(MemoryRegistry::new());
    reg.register(ep("a", 1)).await.unwrap();
    reg.register(ep("b", 2)).await.unwrap();
    // Another service: never a target.
    reg.register(Endpoint::new("other", "x", "127.0.0.1", 3))
        .await
        .unwrap();

    // Each endpoint's "service" answers with its id.
    let discovery = discover(Arc::clone(&reg), |ep: &Endpoint| {
        let id = ep.id.clone();
        Constant::new(
            service_fn(move |()| {
                let id = id.clone();
                async move { Ok::<_, Infallible>(id) }
            }),
            1,
        )
    })
    .service("echo");
    let mut balancer = Balance::new(discovery);

    let hits = send(&mut balancer, 200).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["a", "b"], "{hits:?}");

    // A new endpoint gets traffic.
    reg.register(ep("c", 4)).await.unwrap();
    let hits = send(&mut balancer, 300).await;
    assert!(hits.get("c").copied().unwrap_or(0) > 50, "{hits:?}");

    // A removed endpoint gets none, from the very next request.
    reg.deregister(&ep("a", 1).key()).await.unwrap();
    let hits = send(&mut balancer, 300).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["b", "c"], "{hits:?}");

    // Unhealthy is out, healthy again is back in.
    reg.register(ep("b", 2).with_health(Health::Unhealthy))
        .await
        .unwrap();
    let hits = send(&mut balancer, 100).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["c"], "{hits:?}");
    reg.register(ep("b", 2)).await.unwrap();
    let hits = send(&mut balancer, 300).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["b", "c"], "{hits:?}");
}
