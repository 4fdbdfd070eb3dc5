//! Load balancing with `tower::balance` over endpoints from a registry.
//!
//! Run with `cargo run --example tower_balance`. Three tiny TCP echo
//! services on 127.0.0.1 come and go; each registers itself in a registry,
//! and a `tower::balance::p2c::Balance` is fed by `waypost::discover::discover`
//! (a registry watch as a `tower::discover::Discover`). The example prints
//! every change the balancer is told about and, for each phase, which
//! service answered each request: traffic moves to a new endpoint as soon
//! as it is registered and away from one as soon as it is deregistered or
//! marked unhealthy. It finishes by itself in about a second.

use std::collections::BTreeMap;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::TryStreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::{service_fn, Service, ServiceExt};
use waypost::{discover::discover, memory::MemoryRegistry, Endpoint, Health, Registry};

/// Any error, from the registry, a socket or the balancer.
type BoxError = Box<dyn Error + Send + Sync>;

/// Requests sent in each phase.
const REQUESTS: usize = 12;

/// A line-based echo server on a free loopback port: answers each line
/// with `<name>: <line>`.
async fn echo_server(name: &'static str) -> Result<(SocketAddr, JoinHandle<()>), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = conn.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if write
                        .write_all(format!("{name}: {line}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    Ok((addr, task))
}

/// One request: connect, send a line, read the answer.
async fn ask(addr: String, line: String) -> std::io::Result<String> {
    let conn = TcpStream::connect(&addr).await?;
    let (read, mut write) = conn.into_split();
    write.write_all(format!("{line}\n").as_bytes()).await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    Ok(answer.trim_end().to_string())
}

fn endpoint(name: &str, addr: SocketAddr) -> Endpoint {
    Endpoint::new("echo", name, addr.ip().to_string(), addr.port())
}

/// Send [`REQUESTS`] requests; print who answered each, and a tally.
async fn phase<S>(title: &str, balancer: &mut S) -> Result<(), BoxError>
where
    S: Service<String, Response = String>,
    S::Error: Into<BoxError>,
{
    println!("\n== {title}");
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut order = Vec::new();
    for i in 1..=REQUESTS {
        let svc = balancer.ready().await.map_err(Into::into)?;
        let answer = svc.call(format!("request {i}")).await.map_err(Into::into)?;
        let who = answer.split(':').next().unwrap_or_default().to_string();
        order.push(who.clone());
        *tally.entry(who).or_default() += 1;
    }
    println!("   answered by: {}", order.join(" "));
    let tally: Vec<String> = tally.iter().map(|(k, v)| format!("{k} x{v}")).collect();
    println!("   tally: {}", tally.join(", "));
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), BoxError> {
    let registry = Arc::new(MemoryRegistry::new());

    // The balancer: one tower service per healthy `echo` endpoint, each a
    // client that connects to the endpoint's address, weighed by its
    // requests in flight.
    let discovery = discover(Arc::clone(&registry), |ep: &Endpoint| {
        let addr = format!("{}:{}", ep.address, ep.port);
        PendingRequests::new(
            service_fn(move |line: String| ask(addr.clone(), line)),
            CompleteOnResponse::default(),
        )
    })
    .service("echo")
    .inspect_ok(|change| match change {
        Change::Insert(key, _) => println!("   [discover] insert {key}"),
        Change::Remove(key) => println!("   [discover] remove {key}"),
    });
    let mut balancer = Balance::new(discovery);

    let (addr1, server1) = echo_server("echo-1").await?;
    let (addr2, _server2) = echo_server("echo-2").await?;
    let (addr3, _server3) = echo_server("echo-3").await?;
    println!("echo servers: echo-1 on {addr1}, echo-2 on {addr2}, echo-3 on {addr3}");

    registry.register(endpoint("echo-1", addr1)).await?;
    registry.register(endpoint("echo-2", addr2)).await?;
    phase("echo-1 and echo-2 registered", &mut balancer).await?;

    registry.register(endpoint("echo-3", addr3)).await?;
    phase("echo-3 registered: it gets traffic at once", &mut balancer).await?;

    registry
        .deregister(&endpoint("echo-1", addr1).key())
        .await?;
    server1.abort();
    phase(
        "echo-1 deregistered and stopped: no more traffic to it",
        &mut balancer,
    )
    .await?;

    registry
        .register(endpoint("echo-2", addr2).with_health(Health::Unhealthy))
        .await?;
    phase(
        "echo-2 marked unhealthy: out of the balancer",
        &mut balancer,
    )
    .await?;

    registry.register(endpoint("echo-2", addr2)).await?;
    phase("echo-2 healthy again: back in", &mut balancer).await?;

    println!("\ndone");
    Ok(())
}
