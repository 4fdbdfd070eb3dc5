//! Zones, weights and draining through `waypost::channel::balanced_channel`
//! with real tonic greeter servers on loopback: a caller in zone `a` keeps
//! its calls in `a` while `a` has a healthy endpoint and spreads when it
//! has none; weighted endpoints get shares of the calls in proportion to
//! their weights; a draining endpoint gets no new call and its calls in
//! flight finish.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use examples::greeter::proto::greeter_server::{Greeter, GreeterServer};
use examples::greeter::{GreeterClient, HelloReply, HelloRequest};
use tokio::sync::{mpsc, Semaphore};
use tonic::{Request, Response, Status};
use waypost::channel::{balanced_channel, BalancedChannel, ChannelConfig};
use waypost::memory::MemoryRegistry;
use waypost::testing::wait_limit;
use waypost::{Endpoint, EndpointKey, Health, Protocol, Registry};

/// A greeter that counts its calls; a call named `hold` says it arrived,
/// then waits for a permit of `release` before answering.
#[derive(Clone)]
struct Counting {
    id: String,
    calls: Arc<AtomicUsize>,
    arrived: mpsc::UnboundedSender<()>,
    release: Arc<Semaphore>,
}

#[tonic::async_trait]
impl Greeter for Counting {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if req.into_inner().name == "hold" {
            let _ = self.arrived.send(());
            let permit = self.release.acquire().await.unwrap();
            permit.forget();
        }
        Ok(Response::new(HelloReply {
            message: String::new(),
            server: self.id.clone(),
        }))
    }
}

struct Server {
    endpoint: Endpoint,
    calls: Arc<AtomicUsize>,
    arrived: mpsc::UnboundedReceiver<()>,
    release: Arc<Semaphore>,
}

async fn server(id: &str) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, arrived) = mpsc::unbounded_channel();
    let g = Counting {
        id: id.to_string(),
        calls: Arc::new(AtomicUsize::new(0)),
        arrived: tx,
        release: Arc::new(Semaphore::new(0)),
    };
    let (calls, release) = (Arc::clone(&g.calls), Arc::clone(&g.release));
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(g))
            .serve_with_incoming(incoming),
    );
    Server {
        endpoint: Endpoint::new("greeter", id, "127.0.0.1", port).with_protocol(Protocol::Grpc),
        calls,
        arrived,
        release,
    }
}

fn channel(reg: &Arc<MemoryRegistry>, cfg: ChannelConfig) -> BalancedChannel {
    let cfg = cfg.with_timeout(Duration::from_secs(10));
    balanced_channel(Arc::clone(reg), "greeter", cfg).unwrap()
}

/// Wait (bounded) until the channel spreads new calls over exactly `ids`.
async fn spreads_over(ch: &BalancedChannel, ids: &[&str]) {
    let want: Vec<EndpointKey> = ids
        .iter()
        .map(|i| EndpointKey::new("greeter", *i))
        .collect();
    let waited = tokio::time::timeout(wait_limit(), ch.wait_for(|now| now == want)).await;
    assert!(
        waited.is_ok(),
        "the channel spreads over {:?}, want {ids:?}",
        ch.endpoints()
    );
}

/// Make `n` calls, 16 at a time; the answers counted by server.
async fn calls(ch: &BalancedChannel, n: usize) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for chunk in 0..n.div_ceil(16) {
        let batch = (n - chunk * 16).min(16);
        let replies = futures::future::join_all((0..batch).map(|_| {
            let mut client = GreeterClient::new(ch.clone());
            async move {
                let r = client.say_hello(HelloRequest { name: "t".into() }).await;
                r.unwrap().into_inner().server
            }
        }))
        .await;
        for s in replies {
            *by.entry(s).or_insert(0) += 1;
        }
    }
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_stays_in_its_zone_while_it_has_a_healthy_endpoint_then_spreads() {
    let reg = Arc::new(MemoryRegistry::new());
    let (a, b, c) = (server("a1").await, server("b1").await, server("c1").await);
    for (s, zone) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        reg.register(s.endpoint.clone().with_zone(zone))
            .await
            .unwrap();
    }
    let ch = channel(&reg, ChannelConfig::default().with_zone("a"));
    spreads_over(&ch, &["a1"]).await;
    let by = calls(&ch, 200).await;
    assert_eq!(by, BTreeMap::from([("a1".to_string(), 200)]));

    // a loses its last healthy endpoint: spread over b and c.
    let sick = a
        .endpoint
        .clone()
        .with_zone("a")
        .with_health(Health::Unhealthy);
    reg.register(sick).await.unwrap();
    spreads_over(&ch, &["b1", "c1"]).await;
    let before = a.calls.load(Ordering::SeqCst);
    let by = calls(&ch, 200).await;
    assert_eq!(
        a.calls.load(Ordering::SeqCst),
        before,
        "a1 got calls: {by:?}"
    );
    // Each of b1 and c1 has probability 1/2 per call: that one gets none
    // of 200 has probability 2^-199.
    assert!(by.get("b1").is_some_and(|n| *n > 0) && by.get("c1").is_some_and(|n| *n > 0));
    assert_eq!(by.values().sum::<usize>(), 200);

    // a is back: everything in a again.
    reg.register(a.endpoint.clone().with_zone("a"))
        .await
        .unwrap();
    spreads_over(&ch, &["a1"]).await;
    assert_eq!(
        calls(&ch, 100).await,
        BTreeMap::from([("a1".to_string(), 100)])
    );
}

/// Shares follow weights 1, 2 and 5. With N = 6000 independent picks, an
/// endpoint's share p̂ is off its weight share p by 0.04 or more with
/// probability at most 2·exp(−2·N·0.04²) = 2·exp(−19.2) < 1e-8
/// (Hoeffding), so below 3e-8 for any of the three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_endpoints_get_shares_in_proportion_to_their_weights() {
    const N: usize = 6000;
    const TOLERANCE: f64 = 0.04;
    let reg = Arc::new(MemoryRegistry::new());
    let servers = [
        (server("w1").await, 1),
        (server("w2").await, 2),
        (server("w5").await, 5),
    ];
    for (s, w) in &servers {
        reg.register(s.endpoint.clone().with_weight(*w))
            .await
            .unwrap();
    }
    let ch = channel(&reg, ChannelConfig::default());
    spreads_over(&ch, &["w1", "w2", "w5"]).await;
    let by = calls(&ch, N).await;
    for (s, w) in &servers {
        let share = by.get(&s.endpoint.id).copied().unwrap_or(0) as f64 / N as f64;
        let want = f64::from(*w) / 8.0;
        assert!(
            (share - want).abs() < TOLERANCE,
            "{} (weight {w}) got {share:.3} of the calls, want {want:.3} ± {TOLERANCE}: {by:?}",
            s.endpoint.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_endpoint_gets_no_new_calls_and_its_calls_in_flight_finish() {
    let reg = Arc::new(MemoryRegistry::new());
    let (mut d, e) = (server("d").await, server("e").await);
    reg.register(d.endpoint.clone()).await.unwrap();
    let ch = channel(&reg, ChannelConfig::default());
    spreads_over(&ch, &["d"]).await;
    // Two calls in flight on d, the only endpoint.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = GreeterClient::new(ch.clone());
        held.push(tokio::spawn(async move {
            client
                .say_hello(HelloRequest {
                    name: "hold".into(),
                })
                .await
        }));
        tokio::time::timeout(wait_limit(), d.arrived.recv())
            .await
            .expect("the held call reached d");
    }

    reg.register(e.endpoint.clone()).await.unwrap();
    reg.register(d.endpoint.clone().with_health(Health::Draining))
        .await
        .unwrap();
    spreads_over(&ch, &["e"]).await;
    let before = d.calls.load(Ordering::SeqCst);
    assert_eq!(before, 2);
    let by = calls(&ch, 200).await;
    assert_eq!(by, BTreeMap::from([("e".to_string(), 200)]));
    assert_eq!(d.calls.load(Ordering::SeqCst), before, "d got a new call");

    // The calls in flight on d finish, answered by d.
    d.release.add_permits(2);
    for h in held {
        let reply = tokio::time::timeout(wait_limit(), h)
            .await
            .expect("the held call finished")
            .unwrap()
            .expect("the held call succeeded");
        assert_eq!(reply.into_inner().server, "d");
    }
}
