//! A three-node gossip registry on loopback, no server anywhere.
//!
//! Run with `cargo run --example gossip_cluster`. It starts three
//! `GossipRegistry` nodes on 127.0.0.1 (UDP, fast test timings), joins them
//! through the first, binds actor names and registers an endpoint on each
//! node, and waits until every node resolves every name. Then it stops
//! `node-c` without a goodbye (as a crash would): SWIM on the survivors
//! notices it is gone and tombstones its entries, so its names disappear
//! from `node-a` and `node-b`. The name events seen by `node-a` are printed
//! as they come. It finishes by itself in a few seconds.

use std::error::Error;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use waypost::{Endpoint, Registry};
use waypost_gossip::{GossipConfig, GossipRegistry, NameEvent};

/// Give up on a state that has not spread after this long.
const PATIENCE: Duration = Duration::from_secs(10);

type BoxError = Box<dyn Error + Send + Sync>;

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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("   ok: {what} after {:.1?}", start.elapsed());
    Ok(())
}

fn names_of(node: &GossipRegistry) -> Vec<String> {
    let mut names: Vec<String> = node
        .names()
        .into_iter()
        .map(|b| format!("{}@{}", b.name, b.node))
        .collect();
    names.sort();
    names
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), BoxError> {
    let a = GossipRegistry::start(GossipConfig::fast().with_node_name("node-a")).await?;
    let seed = [a.local_addr()];
    let b = GossipRegistry::start(
        GossipConfig::fast()
            .with_node_name("node-b")
            .with_seeds(seed),
    )
    .await?;
    let c = GossipRegistry::start(
        GossipConfig::fast()
            .with_node_name("node-c")
            .with_seeds(seed),
    )
    .await?;
    println!(
        "nodes: node-a on udp {}, node-b on udp {}, node-c on udp {}",
        a.local_addr(),
        b.local_addr(),
        c.local_addr()
    );

    println!("\n1. joining");
    until("every node sees the two others", || async {
        [&a, &b, &c].iter().all(|n| n.members().len() == 2)
    })
    .await?;

    let mut events = a.name_events();
    let printer = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            match ev {
                NameEvent::Registered {
                    name,
                    actor_addr,
                    node,
                } => println!("   [node-a events] {name} -> {actor_addr} (owner {node})"),
                NameEvent::Unregistered {
                    name,
                    previous_addr,
                } => println!("   [node-a events] {name} gone (was {previous_addr})"),
            }
        }
    });

    println!("\n2. each node binds names and registers an endpoint");
    a.register_name("metrics-collector", "actor-a-1").await?;
    b.register_name("billing", "actor-b-1").await?;
    c.register_name("scheduler", "actor-c-1").await?;
    c.register_name("mailer", "actor-c-2").await?;
    for (node, port) in [(&a, 8081), (&b, 8082), (&c, 8083)] {
        let name = node.node_id().as_str().to_string();
        node.register(Endpoint::new("web", &name, "127.0.0.1", port).with_node(name.as_str()))
            .await?;
    }
    until("every node resolves all four names", || async {
        [&a, &b, &c].iter().all(|n| n.names().len() == 4)
    })
    .await?;
    until("every node lists three web endpoints", || async {
        for n in [&a, &b, &c] {
            if !n.list("web").await.is_ok_and(|l| l.len() == 3) {
                return false;
            }
        }
        true
    })
    .await?;
    println!("   node-b resolves: {}", names_of(&b).join(", "));

    println!("\n3. node-c stops without saying goodbye");
    drop(c);
    until("node-a and node-b see node-c's names disappear", || async {
        [&a, &b]
            .iter()
            .all(|n| n.resolve_name("scheduler").is_none() && n.resolve_name("mailer").is_none())
    })
    .await?;
    until("node-c's web endpoint is gone too", || async {
        a.list("web").await.is_ok_and(|l| l.len() == 2)
            && b.list("web").await.is_ok_and(|l| l.len() == 2)
    })
    .await?;
    println!("   node-a resolves: {}", names_of(&a).join(", "));
    println!("   node-b resolves: {}", names_of(&b).join(", "));
    println!("   members of node-a: {:?}", a.members());

    tokio::time::sleep(Duration::from_millis(100)).await; // let the events print
    printer.abort();
    println!("\n4. node-b leaves gracefully");
    b.leave().await;
    until("node-a sees billing disappear", || async {
        a.resolve_name("billing").is_none()
    })
    .await?;
    println!("   node-a resolves: {}", names_of(&a).join(", "));
    Ok(())
}
