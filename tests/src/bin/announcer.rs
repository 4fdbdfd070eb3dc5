//! A stand-in for a service process, for tests that kill one: announces one
//! endpoint (`announced/<id>`, node `<node>`) in a SQLite file or on etcd,
//! heartbeating every 200 ms, prints `registered` once it is, and runs
//! until it is killed.
//!
//! ```text
//! announcer sqlite <path> <id> <node>
//! announcer etcd <endpoint> <prefix> <id> <node>
//! ```

use std::sync::Arc;
use std::time::Duration;

use waypost::announce::{announce, AnnounceConfig};
use waypost::stack::Stack;
use waypost::Endpoint;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (registry, id, node): (Arc<dyn Stack>, &str, &str) =
        match args.as_slice() {
            [kind, path, id, node] if kind == "sqlite" => (
                Arc::new(waypost_sqlite::SqliteRegistry::open_path(path).await?),
                id,
                node,
            ),
            [kind, endpoint, prefix, id, node] if kind == "etcd" => {
                let cfg = waypost_etcd::EtcdConfig::new(vec![endpoint.clone()])
                    .with_prefix(prefix.clone())
                    .with_lease_ttl(Duration::from_secs(2));
                (
                    Arc::new(waypost_etcd::EtcdRegistry::connect(cfg).await?),
                    id,
                    node,
                )
            }
            _ => return Err(
                "usage: announcer sqlite <path> <id> <node> | etcd <endpoint> <prefix> <id> <node>"
                    .into(),
            ),
        };
    let me = Endpoint::new("announced", id, "127.0.0.1", 4242).with_node(node);
    let cfg = AnnounceConfig::default().with_heartbeat_every(Duration::from_millis(200));
    let announced = announce(registry, vec![me], cfg)?;
    announced.registered().await;
    println!("registered");
    std::future::pending::<()>().await;
    Ok(())
}
