//! Two clusters, two registrars, one shared SQLite file.
//!
//! Run with `cargo run --example two_clusters`. It starts two registrars in
//! this process on 127.0.0.1 (`cluster-a` and `cluster-b`), each with its
//! own connection to the same SQLite file in a temporary directory, and
//! three agents (`node-a1` on cluster-a's registrar, `node-b1` and `node-b2`
//! on cluster-b's). An agent registers through its own registrar; agents of
//! the other cluster see the endpoint through their registrar's sync with
//! the shared backend and its push stream. The example prints each agent's
//! watch events and how long each change took to cross over, then stops the
//! registrars gracefully. It finishes by itself in a few seconds.

use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use waypost::{Endpoint, Event, Registry, Watch};
use waypost_registrar_client::{ClientConfig, RegistrarClient};
use waypost_registrar_server::{serve, Backend, Registrar, RegistrarConfig};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

/// Give up on a change that has not crossed over after this long.
const PATIENCE: Duration = Duration::from_secs(10);

type BoxError = Box<dyn Error + Send + Sync>;

/// A registrar serving on free loopback ports.
struct Running {
    name: &'static str,
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<waypost::Result<()>>,
}

async fn start_registrar(
    cluster: &'static str,
    backend: Arc<dyn Backend>,
) -> Result<Running, BoxError> {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = grpc.local_addr()?;
    let registrar = Registrar::new(backend, RegistrarConfig::new(cluster))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(registrar, grpc, health, None, async move {
        let _ = stopped.await;
    }));
    println!("registrar of {cluster} serving gRPC on {addr}");
    Ok(Running {
        name: cluster,
        addr,
        stop,
        task,
    })
}

fn agent(registrar: &Running, node: &str) -> Result<RegistrarClient, BoxError> {
    let cfg = ClientConfig::new(format!("http://{}", registrar.addr), registrar.name, node)
        .with_reconnect(Duration::from_millis(50), Duration::from_secs(1));
    Ok(RegistrarClient::connect(cfg)?)
}

/// Print every event an agent's watch delivers.
fn print_events(name: &'static str, agent: &RegistrarClient) -> JoinHandle<()> {
    let mut events = agent.watch(None);
    tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            match ev {
                Ok(Event::Snapshot(s)) => {
                    println!("   [{name} watch] snapshot: {} endpoints", s.len())
                }
                Ok(Event::Added { endpoint: e, .. }) => {
                    println!("   [{name} watch] + {} (cluster {})", e.key(), e.cluster)
                }
                Ok(Event::Updated { endpoint: e, .. }) => {
                    println!("   [{name} watch] ~ {} (cluster {})", e.key(), e.cluster)
                }
                Ok(Event::Removed { key, .. }) => println!("   [{name} watch] - {key}"),
                Err(e) => println!("   [{name} watch] error: {e}"),
            }
        }
    })
}

/// Wait until `check` is true; print how long it took.
async fn until<F, Fut>(what: &str, check: F) -> Result<(), BoxError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        if start.elapsed() > PATIENCE {
            return Err(format!("gave up after {PATIENCE:?} waiting until {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("   ok: {what} after {:.1?}", start.elapsed());
    Ok(())
}

async fn has(agent: &RegistrarClient, service: &str, n: usize) -> bool {
    agent.list(service).await.is_ok_and(|l| l.len() == n)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shared.db");
    println!("shared backend: {}", path.display());
    let open = || async {
        // Each registrar has its own handle; changes made through the other
        // handle are picked up by polling the file's change log.
        let cfg = SqliteConfig::new(&path).with_poll_interval(Duration::from_millis(50));
        SqliteRegistry::open(cfg).await.map(Arc::new)
    };
    let reg_a = start_registrar("cluster-a", open().await?).await?;
    let reg_b = start_registrar("cluster-b", open().await?).await?;

    let a1 = agent(&reg_a, "node-a1")?;
    let b1 = agent(&reg_b, "node-b1")?;
    let b2 = agent(&reg_b, "node-b2")?;
    let watchers = [print_events("a1", &a1), print_events("b2", &b2)];

    println!("\n1. node-a1 registers payments/pod-a1 through cluster-a's registrar");
    let payments = Endpoint::new("payments", "pod-a1", "127.0.0.1", 8080)
        .with_node("node-a1")
        .with_cluster("cluster-a");
    a1.register(payments.clone()).await?;
    until("node-b1 (cluster-b) sees it", || has(&b1, "payments", 1)).await?;
    until("node-b2 (cluster-b) sees it", || has(&b2, "payments", 1)).await?;

    println!("\n2. node-b1 registers search/pod-b1 through cluster-b's registrar");
    let search = Endpoint::new("search", "pod-b1", "127.0.0.1", 9200)
        .with_node("node-b1")
        .with_cluster("cluster-b");
    b1.register(search.clone()).await?;
    until("node-a1 (cluster-a) sees it", || has(&a1, "search", 1)).await?;

    println!("\n3. node-a1 deregisters payments/pod-a1");
    a1.deregister(&payments.key()).await?;
    until("node-b1 sees it gone", || has(&b1, "payments", 0)).await?;
    until("node-b2 sees it gone", || has(&b2, "payments", 0)).await?;

    println!("\nwhat each agent holds in its local cache:");
    for (name, agent) in [("a1", &a1), ("b1", &b1), ("b2", &b2)] {
        let snap = agent.snapshot().await?;
        let listed: Vec<String> = snap
            .iter()
            .map(|e| format!("{} ({})", e.key(), e.cluster))
            .collect();
        println!("   {name}: {}", listed.join(", "));
    }

    println!("\nstopping the registrars (each drains its write queue first)");
    for w in watchers {
        w.abort();
    }
    drop((a1, b1, b2));
    for reg in [reg_a, reg_b] {
        let _ = reg.stop.send(());
        reg.task.await??;
        println!("   {} stopped", reg.name);
    }
    Ok(())
}
