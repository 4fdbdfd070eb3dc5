//! `waypost::channel::balanced_channel` with real tonic greeter
//! servers on loopback: requests reach every healthy server, none reach one
//! that was removed or marked unhealthy once the change is delivered, and a
//! new one gets requests.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use examples::greeter::{self, GreeterClient, HelloRequest};
use waypost::channel::BalancedChannel;
use waypost::channel::{balanced_channel, ChannelConfig};
use waypost::memory::MemoryRegistry;
use waypost::testing::eventually;
use waypost::{Endpoint, Health, Protocol, Registry};

async fn server(id: &str) -> Endpoint {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, _task) = greeter::serve(id, listener, std::future::pending()).unwrap();
    Endpoint::new("greeter", id, "127.0.0.1", addr.port()).with_protocol(Protocol::Grpc)
}

async fn answers(client: &mut GreeterClient<BalancedChannel>, n: usize) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for _ in 0..n {
        let reply = client
            .say_hello(HelloRequest { name: "t".into() })
            .await
            .unwrap();
        *by.entry(reply.into_inner().server).or_insert(0) += 1;
    }
    by
}

/// Wait (bounded) until 20 requests in a row avoid `gone`, then check that
/// the next 60 do too.
async fn avoided(client: &mut GreeterClient<BalancedChannel>, gone: &str) {
    eventually(&format!("requests to avoid {gone}"), || {
        let mut c = client.clone();
        async move { (!answers(&mut c, 20).await.contains_key(gone)).then_some(()) }
    })
    .await;
    let by = answers(client, 60).await;
    assert!(!by.contains_key(gone), "{gone} still answers: {by:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_follows_the_registry() {
    let reg = Arc::new(MemoryRegistry::new());
    let (a, b, c) = (server("a").await, server("b").await, server("c").await);
    for e in [&a, &b, &c] {
        reg.register(e.clone()).await.unwrap();
    }
    // Another service's endpoint must never receive these calls.
    let other = server("other").await;
    reg.register(Endpoint {
        service: "other".into(),
        ..other
    })
    .await
    .unwrap();
    let channel = balanced_channel(
        Arc::clone(&reg),
        "greeter",
        ChannelConfig::default().with_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let mut client = GreeterClient::new(channel);
    eventually("every server to answer", || {
        let mut c = client.clone();
        async move {
            let by = answers(&mut c, 60).await;
            (by.len() == 3).then_some(by)
        }
    })
    .await;
    assert!(!answers(&mut client, 60).await.contains_key("other"));

    // Removed.
    reg.deregister(&a.key()).await.unwrap();
    avoided(&mut client, "a").await;
    // Marked unhealthy.
    reg.register(b.clone().with_health(Health::Unhealthy))
        .await
        .unwrap();
    avoided(&mut client, "b").await;
    assert_eq!(
        answers(&mut client, 10).await.keys().collect::<Vec<_>>(),
        ["c"]
    );
    // A new one, and b healthy again.
    let d = server("d").await;
    reg.register(d.clone()).await.unwrap();
    reg.register(b.clone()).await.unwrap();
    eventually("d and b to get requests", || {
        let mut c = client.clone();
        async move {
            let by = answers(&mut c, 60).await;
            (by.contains_key("d") && by.contains_key("b")).then_some(())
        }
    })
    .await;
}

/// A filter keeps only some endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_keeps_only_matching_endpoints() {
    let reg = Arc::new(MemoryRegistry::new());
    let a = server("a").await.with_label("zone", "z1");
    let b = server("b").await.with_label("zone", "z2");
    reg.register(a).await.unwrap();
    reg.register(b).await.unwrap();
    let cfg = ChannelConfig::default()
        .with_filter(|e| e.labels.get("zone").map(String::as_str) == Some("z1"));
    let mut client =
        GreeterClient::new(balanced_channel(Arc::clone(&reg), "greeter", cfg).unwrap());
    let by = eventually("a to answer", || {
        let mut c = client.clone();
        async move {
            let by = answers(&mut c, 20).await;
            (!by.is_empty()).then_some(by)
        }
    })
    .await;
    assert_eq!(by.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(
        answers(&mut client, 40).await.keys().collect::<Vec<_>>(),
        ["a"]
    );
}
