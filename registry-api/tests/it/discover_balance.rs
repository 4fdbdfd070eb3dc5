//! `discover()` feeding `tower::balance::p2c::Balance` and
//! `waypost::balance::WeightedBalance`: requests reach an
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

/// Each endpoint's "service" answers with its id.
fn echo(ep: &Endpoint) -> impl Service<(), Response = String, Error = Infallible, Future: Send> {
    let id = ep.id.clone();
    service_fn(move |()| {
        let id = id.clone();
        async move { Ok::<_, Infallible>(id) }
    })
}

/// `WeightedBalance` over `discover()`: shares follow the weights (1, 3
/// and 4 of 8). Over N = 8000 picks an endpoint's share is off its weight
/// share by 0.04 or more with probability at most 2·exp(−2·N·0.04²) =
/// 2·exp(−25.6) < 2e-11 (Hoeffding). A draining endpoint gets nothing
/// from the next request on; with a preferred zone, everything goes
/// there until it has no healthy endpoint.
#[tokio::test]
async fn weighted_balance_follows_weights_draining_and_the_zone() {
    use waypost::balance::WeightedBalance;
    use waypost::traffic::ZonePreference;
    const N: usize = 8000;
    let reg = Arc::new(MemoryRegistry::new());
    let a = ep("a", 1).with_zone("z1").with_weight(1);
    let b = ep("b", 2).with_zone("z2").with_weight(3);
    let c = ep("c", 3).with_zone("z2").with_weight(4);
    for e in [&a, &b, &c] {
        reg.register(e.clone()).await.unwrap();
    }
    let mut balance = WeightedBalance::new(discover(Arc::clone(&reg), echo).service("echo"));
    let hits = send(&mut balance, N).await;
    for (id, w) in [("a", 1.0), ("b", 3.0), ("c", 4.0)] {
        let share = hits.get(id).copied().unwrap_or(0) as f64 / N as f64;
        assert!(
            (share - w / 8.0).abs() < 0.04,
            "{id}: {share:.3} of {hits:?}"
        );
    }

    reg.register(c.clone().with_health(Health::Draining))
        .await
        .unwrap();
    let hits = send(&mut balance, 200).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["a", "b"], "{hits:?}");

    let discovery = discover(Arc::clone(&reg), echo)
        .service("echo")
        .prefer_zone(ZonePreference::new("z1"));
    let mut in_zone = WeightedBalance::new(discovery);
    let hits = send(&mut in_zone, 200).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["a"], "{hits:?}");
    reg.register(a.clone().with_health(Health::Unhealthy))
        .await
        .unwrap();
    let hits = send(&mut in_zone, 200).await;
    assert_eq!(hits.keys().collect::<Vec<_>>(), ["b"], "{hits:?}");
}
