//! Quick start: a registry in one SQLite file (`registry.db` in the
//! current directory), nothing to install.
//!
//! Run with `cargo run --example quickstart`, then run it again: the second
//! run starts from what the first one left in `registry.db`.
//!
//! It registers endpoints of three services on two nodes, follows every
//! change on a watch, keeps `node-1` heartbeating, lets `node-2` go silent
//! and shows its endpoints turn unhealthy (after 2 s) and disappear (after
//! 4 s), then prints the final state. It finishes by itself in about 7 s.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use waypost::{
    Batch, Endpoint, EndpointKey, Event, Health, Heartbeat, Op, Protocol, Registry, Snapshot, Watch,
};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

const FILE: &str = "registry.db";
/// The demo's liveness thresholds (the defaults are 30 s and 5 min).
const SUSPECT_AFTER: Duration = Duration::from_secs(2);
const REMOVE_AFTER: Duration = Duration::from_secs(4);
const SWEEP_EVERY: Duration = Duration::from_millis(500);
const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);
/// How long node-2 heartbeats before it goes silent.
const NODE2_LIVES: Duration = Duration::from_millis(1500);
/// The whole run gives up after this long.
const DEADLINE: Duration = Duration::from_secs(15);

/// service, id, node, address, port, protocol
const ENDPOINTS: &[(&str, &str, &str, &str, u16, Protocol)] = &[
    (
        "payments",
        "pay-1",
        "node-1",
        "127.0.0.1",
        9001,
        Protocol::Grpc,
    ),
    (
        "payments",
        "pay-2",
        "node-2",
        "127.0.0.2",
        9001,
        Protocol::Grpc,
    ),
    (
        "search",
        "search-1",
        "node-1",
        "127.0.0.1",
        9200,
        Protocol::Http,
    ),
    (
        "search",
        "search-2",
        "node-2",
        "127.0.0.2",
        9200,
        Protocol::Http,
    ),
    (
        "frontend",
        "web-1",
        "node-1",
        "127.0.0.1",
        8080,
        Protocol::Https,
    ),
];

fn endpoints() -> Vec<Endpoint> {
    ENDPOINTS
        .iter()
        .map(|&(svc, id, node, addr, port, proto)| {
            Endpoint::new(svc, id, addr, port)
                .with_node(node)
                .with_protocol(proto)
                .with_label("zone", if node == "node-1" { "zone-a" } else { "zone-b" })
        })
        .collect()
}

fn line(ep: &Endpoint) -> String {
    format!(
        "{:<20} {}:{:<5} {:<5} on {:<7} {}",
        ep.key().to_string(),
        ep.address,
        ep.port,
        ep.protocol.as_str(),
        if ep.node.is_empty() { "-" } else { &ep.node },
        ep.health.as_str()
    )
}

fn print_state(title: &str, snap: &Snapshot) {
    println!(
        "{title} (version {}, {} endpoints)",
        snap.version(),
        snap.len()
    );
    for ep in snap.iter() {
        println!("    {}", line(ep));
    }
}

fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) => format!("{:.1} s ago", d.as_secs_f64()),
        Err(_) => "just now".to_string(),
    }
}

async fn print_nodes(reg: &SqliteRegistry) -> waypost::Result<()> {
    let nodes = reg.nodes().await?;
    if nodes.is_empty() {
        println!("    (no nodes)");
    }
    for n in nodes {
        println!(
            "    node {:<7} {:<9} address {:<10} role {:<8} last heartbeat {}",
            n.id,
            n.status.as_str(),
            n.address,
            n.role,
            ago(n.last_seen)
        );
    }
    Ok(())
}

/// A watch event as a person wants to read it.
fn describe(ev: &Event, before: &Snapshot) -> String {
    let v = format!("v{}", ev.version());
    match ev {
        Event::Snapshot(s) => format!("{v:<5} snapshot: {} endpoints", s.len()),
        Event::Added { endpoint, .. } => format!("{v:<5} + {}", line(endpoint)),
        Event::Updated { endpoint, .. } => {
            let what = match before.get(&endpoint.key()) {
                Some(old) if old.health != endpoint.health => match endpoint.health {
                    Health::Unhealthy => {
                        format!("is now UNHEALTHY ({} went silent)", endpoint.node)
                    }
                    Health::Healthy => "is healthy again".to_string(),
                    Health::Draining => "is draining (takes nothing new)".to_string(),
                },
                _ => format!("changed: {}", line(endpoint)),
            };
            format!("{v:<5} ~ {:<20} {what}", endpoint.key().to_string())
        }
        Event::Removed { key, .. } => {
            let node = before.get(key).map(|e| e.node.as_str()).unwrap_or("?");
            format!(
                "{v:<5} - {:<20} removed ({node} silent for {REMOVE_AFTER:?})",
                key.to_string()
            )
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let fresh = !std::path::Path::new(FILE).exists();

    // 1. What the file holds, read with the default thresholds (30 s / 5 min).
    let first_look =
        SqliteRegistry::open(SqliteConfig::new(FILE).with_sweep_interval(None)).await?;
    let loaded = first_look.snapshot().await?;
    if fresh {
        println!("Created {FILE}: a new, empty registry.");
    } else {
        print_state(&format!("Loaded {FILE} from the last run"), &loaded);
        print_nodes(&first_look).await?;
    }
    first_look.close().await;
    drop(first_look);

    // 2. Reopen with the demo's short liveness thresholds. Opening
    //    recomputes node status from last_seen: nodes silent longer than
    //    the thresholds since the last run are marked or removed now.
    let cfg = SqliteConfig::new(FILE)
        .with_suspect_after(SUSPECT_AFTER)
        .with_remove_after(REMOVE_AFTER)
        .with_sweep_interval(Some(SWEEP_EVERY));
    let reg = SqliteRegistry::open(cfg).await?;
    let mut state = reg.snapshot().await?;
    println!(
        "\nOpened {reg} with liveness: unhealthy after {SUSPECT_AFTER:?} of silence, removed after {REMOVE_AFTER:?}."
    );
    if !fresh {
        let gone: Vec<_> = loaded.keys().filter(|k| !state.contains(k)).collect();
        if !gone.is_empty() {
            println!(
                "    On open, {} endpoints of nodes silent since the last run were removed; their nodes register them again below.",
                gone.len()
            );
        }
    }

    // 3. Follow every change from here on.
    let mut events = reg.watch(Some(state.version()));

    // 4. Two nodes join and register their endpoints (one transaction).
    reg.register_node("node-1", "127.0.0.1", "compute").await?;
    reg.register_node("node-2", "127.0.0.2", "compute").await?;
    reg.apply(endpoints().into_iter().map(Op::Register).collect())
        .await?;
    println!(
        "\nnode-1 and node-2 registered {} endpoints. Changes, as the watch reports them:",
        endpoints().len()
    );

    // 5. Heartbeats: node-1 all along, node-2 only for a moment.
    let beats = {
        let reg = reg.clone();
        tokio::spawn(async move {
            let begin = Instant::now();
            let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
            let mut node2 = true;
            loop {
                tick.tick().await;
                if let Err(e) = reg.heartbeat("node-1").await {
                    eprintln!("heartbeat of node-1 failed: {e}");
                }
                if node2 && begin.elapsed() < NODE2_LIVES {
                    if let Err(e) = reg.heartbeat("node-2").await {
                        eprintln!("heartbeat of node-2 failed: {e}");
                    }
                } else if node2 {
                    node2 = false;
                    println!(
                        "[{:>4.1}s] node-2 stops sending heartbeats",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        })
    };

    // 6. Print events until node-2's endpoints were marked unhealthy and
    //    then removed.
    let node2: BTreeSet<EndpointKey> = endpoints()
        .iter()
        .filter(|e| e.node == "node-2")
        .map(Endpoint::key)
        .collect();
    let mut saw_unhealthy = false;
    loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        let ev = match tokio::time::timeout(left, events.next()).await {
            Ok(Some(ev)) => ev?,
            Ok(None) => return Err("the watch ended".into()),
            Err(_) => return Err(format!("gave up after {DEADLINE:?}").into()),
        };
        println!(
            "[{:>4.1}s] {}",
            started.elapsed().as_secs_f64(),
            describe(&ev, &state)
        );
        state.apply(&ev);
        saw_unhealthy |= matches!(&ev, Event::Updated { endpoint, .. }
            if endpoint.node == "node-2" && endpoint.health == Health::Unhealthy);
        if saw_unhealthy && node2.iter().all(|k| !state.contains(k)) {
            break;
        }
    }
    beats.abort();

    // 7. The final state, as stored in the file.
    println!();
    print_state(&format!("Final state in {FILE}"), &reg.snapshot().await?);
    print_nodes(&reg).await?;
    reg.close().await;
    println!(
        "\nDone in {:.1} s. Run it again: the next run starts by loading this state from {FILE}.",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
