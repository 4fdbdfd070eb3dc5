//! `waypost::announce` on real backends: SQLite (a file), etcd (a
//! fixture server) and gossip (two nodes on loopback UDP). Registered
//! within one interval; back after the registry forgets it; gone when it
//! shuts down; and a killed service process's endpoint expires through the
//! backend's liveness (SQLite's sweeper, etcd's lease).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use waypost::announce::{announce, AnnounceConfig, Announcement};
use waypost::testing::{eventually, unique, wait_limit};
use waypost::{Endpoint, Health, Heartbeat, Registry};

const EVERY: Duration = Duration::from_millis(100);

fn cfg() -> AnnounceConfig {
    AnnounceConfig::default()
        .with_heartbeat_every(EVERY)
        .with_retry(Duration::from_millis(20), Duration::from_millis(200))
}

fn me(id: &str) -> Endpoint {
    Endpoint::new("announced", id, "127.0.0.1", 4242).with_node(format!("node-{id}"))
}

async fn registered_within_bound(a: &Announcement) {
    tokio::time::timeout(wait_limit(), a.registered())
        .await
        .expect("not registered");
}

async fn present<R: Registry + ?Sized>(reg: &R, e: &Endpoint) -> bool {
    reg.list(&e.service)
        .await
        .map(|l| l.iter().any(|x| x.key() == e.key()))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_pruned_then_back_then_gone() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Arc::new(
        waypost_sqlite::SqliteRegistry::open(
            waypost_sqlite::SqliteConfig::new(dir.path().join("r.db")).with_sweep_interval(None),
        )
        .await
        .unwrap(),
    );
    let e = me("sqlite");
    let a = announce(Arc::clone(&reg), vec![e.clone()], cfg()).unwrap();
    registered_within_bound(&a).await;
    assert!(present(&*reg, &e).await);
    // Ten minutes of silence, as the sweeper sees it: the node is pruned
    // with its endpoint.
    let report = reg
        .sweep_at(Instant::now() + Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(report.nodes.removed, vec![e.node.clone()]);
    eventually("the endpoint back after the prune", || async {
        present(&*reg, &e).await.then_some(())
    })
    .await;
    a.shutdown().await.unwrap();
    assert!(!present(&*reg, &e).await, "still registered after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_lease_revoked_then_back_then_gone() {
    let reg = Arc::new(waypost_fixtures::registries::etcd().await.unwrap());
    let server = reg.guard::<waypost_fixtures::EtcdServer>().unwrap();
    let e = me("etcd");
    let a = announce(Arc::clone(&reg), vec![e.clone()], cfg()).unwrap();
    registered_within_bound(&a).await;
    assert!(present(&*reg, &e).await);
    // Every lease revoked (an operator, a compaction of leases): etcd
    // deletes the keys attached to them.
    let mut client = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let leases = client.leases().await.unwrap();
    assert!(
        !leases.leases().is_empty(),
        "the announcement holds a lease"
    );
    for l in leases.leases() {
        client.lease_revoke(l.id()).await.unwrap();
    }
    eventually("the endpoint back after its lease was revoked", || async {
        present(&*reg, &e).await.then_some(())
    })
    .await;
    a.shutdown().await.unwrap();
    assert!(!present(&*reg, &e).await, "still registered after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_gossip_removed_elsewhere_then_back_then_gone() {
    use waypost_gossip::{GossipConfig, GossipRegistry};
    let cfg_g = || {
        GossipConfig::fast().with_swim_timings(
            Duration::from_millis(200),
            Duration::from_millis(150),
            Duration::from_secs(5),
        )
    };
    let a_node = Arc::new(
        GossipRegistry::start(cfg_g().with_node_name("gossip-a"))
            .await
            .unwrap(),
    );
    let b_node = GossipRegistry::start(cfg_g().with_seeds([a_node.local_addr()]))
        .await
        .unwrap();
    eventually("the pair to join", || async {
        (a_node.members().len() == 1 && b_node.members().len() == 1).then_some(())
    })
    .await;
    // On gossip an endpoint belongs to the node that announces it.
    let e = Endpoint::new("announced", "gossip", "127.0.0.1", 4242).with_node("gossip-a");
    let a = announce(Arc::clone(&a_node), vec![e.clone()], cfg()).unwrap();
    registered_within_bound(&a).await;
    eventually("the other node to see it", || async {
        present(&b_node, &e).await.then_some(())
    })
    .await;
    a_node.heartbeat("gossip-a").await.unwrap();
    // Removed from the other node: the removal spreads, and the
    // announcement puts it back.
    b_node.deregister(&e.key()).await.unwrap();
    eventually("the endpoint back on both nodes", || async {
        (present(&*a_node, &e).await && present(&b_node, &e).await).then_some(())
    })
    .await;
    a.shutdown().await.unwrap();
    assert!(
        !present(&*a_node, &e).await,
        "still registered after shutdown"
    );
    eventually("the other node to see it gone", || async {
        (!present(&b_node, &e).await).then_some(())
    })
    .await;
}

/// A service process, killed with SIGKILL after it registered.
struct Service(tokio::process::Child);

async fn spawn_service(args: &[&str]) -> Service {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_announcer"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(wait_limit(), lines.next_line())
        .await
        .expect("the service did not register in time")
        .unwrap();
    assert_eq!(line.as_deref(), Some("registered"));
    Service(child)
}

impl Service {
    async fn kill(mut self) {
        self.0.start_kill().unwrap();
        tokio::time::timeout(wait_limit(), self.0.wait())
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_service_turns_unhealthy_then_goes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.db");
    let reg = waypost_sqlite::SqliteRegistry::open(
        waypost_sqlite::SqliteConfig::new(&path).with_sweep_interval(None),
    )
    .await
    .unwrap();
    let id = unique("killed");
    let node = format!("node-{id}");
    let svc = spawn_service(&["sqlite", path.to_str().unwrap(), &id, &node]).await;
    let e = Endpoint::new("announced", &id, "127.0.0.1", 4242).with_node(&node);
    assert_eq!(reg.list("announced").await.unwrap(), vec![e.clone()]);
    svc.kill().await;
    // The node's last heartbeat, as this process sees it: its silence
    // starts at this sweep.
    reg.sweep().await.unwrap();
    // Silent for 31 s, as the sweeper sees it: unhealthy; for 5 min: gone.
    let now = Instant::now();
    let report = reg.sweep_at(now + Duration::from_secs(31)).await.unwrap();
    assert_eq!(report.nodes.suspected, vec![node.clone()]);
    assert_eq!(
        reg.list("announced").await.unwrap()[0].health,
        Health::Unhealthy
    );
    let report = reg.sweep_at(now + Duration::from_secs(301)).await.unwrap();
    assert_eq!(report.nodes.removed, vec![node]);
    assert!(reg.list("announced").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_service_goes_with_its_lease_on_etcd() {
    let server = waypost_fixtures::EtcdServer::start_async().await.unwrap();
    let prefix = format!("/{}", unique("killed"));
    let reg = waypost_etcd::EtcdRegistry::connect(
        waypost_etcd::EtcdConfig::new(vec![server.endpoint().to_string()]).with_prefix(&prefix),
    )
    .await
    .unwrap();
    let id = unique("killed");
    let svc = spawn_service(&["etcd", server.endpoint(), &prefix, &id, "node-k"]).await;
    assert_eq!(reg.list("announced").await.unwrap().len(), 1);
    svc.kill().await;
    // The lease (2 s) lapses without keep-alives: etcd deletes the key.
    eventually(
        "the killed service's endpoint to go with its lease",
        || async {
            reg.list("announced")
                .await
                .ok()
                .filter(Vec::is_empty)
                .map(drop)
        },
    )
    .await;
}
