//! Quick start: register endpoints, watch the changes, read them back.
//!
//! Run with `cargo run --example quickstart`.

use futures::StreamExt;
use registry_api::{Endpoint, Event, MemoryRegistry, Protocol, Registry, Watch};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reg = MemoryRegistry::new();
    let mut events = reg.watch(None);

    reg.register(
        Endpoint::new("payments", "pod-a", "127.0.0.1", 8080)
            .with_protocol(Protocol::Grpc)
            .with_node("node-1"),
    )
    .await?;
    reg.register(Endpoint::new("payments", "pod-b", "127.0.0.2", 8080).with_node("node-2"))
        .await?;
    reg.deregister(&Endpoint::new("payments", "pod-a", "127.0.0.1", 8080).key())
        .await?;

    for _ in 0..4 {
        match events.next().await {
            Some(Ok(Event::Snapshot(s))) => println!("snapshot at v{}: {} endpoints", s.version(), s.len()),
            Some(Ok(ev)) => println!("v{} {} {}", ev.version(), ev.type_name(), ev.key().map(|k| k.to_string()).unwrap_or_default()),
            Some(Err(e)) => return Err(e.into()),
            None => break,
        }
    }
    for ep in reg.list("payments").await? {
        println!("payments: {} at {}:{} ({})", ep.id, ep.address, ep.port, ep.health);
    }
    Ok(())
}
