//! Three gRPC greeter servers announce themselves in a SQLite registry; a
//! client calls "greeter" through a channel balanced over the healthy
//! endpoints. One server shuts down gracefully (it leaves the registry
//! before it stops), one is killed (its heartbeats stop; liveness marks it
//! unhealthy after 1 s), and the output shows where the requests go.
//!
//! Run with `cargo run --example grpc_service`; it finishes by itself in
//! about 5 s and leaves nothing behind (the registry is in a temporary
//! directory).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use examples::greeter::{self, GreeterClient, HelloRequest};
use waypost::announce::{announce, AnnounceConfig, Announcement};
use waypost::channel::{balanced_channel, ChannelConfig};
use waypost::{Endpoint, Protocol};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A node silent this long is unhealthy (the default is 30 s).
const SUSPECT_AFTER: Duration = Duration::from_secs(1);

struct Server {
    id: String,
    announced: Announcement,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn start(id: &str, registry: &Arc<SqliteRegistry>) -> Result<Server, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, task) = greeter::serve(id, listener, async move {
        let _ = stopped.await;
    })?;
    let me = Endpoint::new("greeter", id, "127.0.0.1", addr.port())
        .with_protocol(Protocol::Grpc)
        .with_node(id);
    let cfg = AnnounceConfig::default().with_heartbeat_every(Duration::from_millis(200));
    let announced = announce(Arc::clone(registry), vec![me], cfg)?;
    announced.registered().await;
    println!("{id} serves on {addr} and is registered");
    Ok(Server {
        id: id.to_string(),
        announced,
        stop,
        task,
    })
}

/// Send `n` requests; count the answers by server, and the failures.
async fn round(
    client: &mut GreeterClient<waypost::channel::BalancedChannel>,
    n: usize,
) -> (BTreeMap<String, usize>, usize) {
    let mut by_server = BTreeMap::new();
    let mut failed = 0;
    for i in 0..n {
        let req = HelloRequest {
            name: format!("call-{i}"),
        };
        match client.say_hello(req).await {
            Ok(reply) => *by_server.entry(reply.into_inner().server).or_insert(0) += 1,
            Err(_) => failed += 1,
        }
    }
    (by_server, failed)
}

/// Send requests until none is answered by `gone` for `quiet` requests in
/// a row; how long that took.
async fn until_avoided(
    client: &mut GreeterClient<waypost::channel::BalancedChannel>,
    gone: &str,
    started: Instant,
) -> Result<Duration, BoxError> {
    let mut quiet = 0;
    while quiet < 30 {
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!("requests still reach {gone} after 10 s").into());
        }
        let req = HelloRequest { name: "x".into() };
        match client.say_hello(req).await {
            Ok(r) if r.get_ref().server == gone => quiet = 0,
            Err(_) => quiet = 0,
            Ok(_) => quiet += 1,
        }
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let cfg = SqliteConfig::new(dir.path().join("registry.db"))
        .with_suspect_after(SUSPECT_AFTER)
        .with_remove_after(Duration::from_secs(60))
        .with_sweep_interval(Some(Duration::from_millis(100)));
    let registry = Arc::new(SqliteRegistry::open(cfg).await?);

    let mut servers = Vec::new();
    for id in ["g1", "g2", "g3"] {
        servers.push(start(id, &registry).await?);
    }

    // The client: healthy "greeter" endpoints, kept current by a watch.
    let channel = balanced_channel(
        Arc::clone(&registry),
        "greeter",
        ChannelConfig::default().with_timeout(Duration::from_secs(1)),
    )?;
    let mut client = GreeterClient::new(channel);
    let ready = Instant::now();
    loop {
        let (by, _) = round(&mut client, 30).await;
        if by.len() == 3 {
            println!("30 requests reach every server: {by:?}");
            break;
        }
        if ready.elapsed() > Duration::from_secs(10) {
            return Err(format!("not every server got requests: {by:?}").into());
        }
    }

    // g1 shuts down gracefully: it leaves the registry, then stops.
    let g1 = servers.remove(0);
    let left = Instant::now();
    g1.announced.shutdown().await?;
    let _ = g1.stop.send(());
    let _ = g1.task.await;
    let took = until_avoided(&mut client, &g1.id, left).await?;
    let (by, failed) = round(&mut client, 30).await;
    println!(
        "g1 left gracefully: requests avoid it after {took:?}; next 30: {by:?}, {failed} failed"
    );

    // g3 is killed: no deregistration, its heartbeats just stop.
    let g3 = servers.remove(1);
    let killed = Instant::now();
    g3.task.abort();
    g3.announced.abandon(); // a killed process deregisters nothing
    let took = until_avoided(&mut client, &g3.id, killed).await?;
    let (by, failed) = round(&mut client, 30).await;
    println!(
        "g3 was killed: liveness marked it unhealthy after {SUSPECT_AFTER:?} of silence; \
         requests avoid it after {took:?}; next 30: {by:?}, {failed} failed"
    );

    for s in servers {
        s.announced.shutdown().await?;
        let _ = s.stop.send(());
    }
    Ok(())
}
