//! Six end-to-end checks of the name API over real UDP on loopback with 3
//! to 5 nodes, waiting on conditions with bounded timeouts: a name resolves
//! locally at once and everywhere after gossip; the later of two writes
//! wins everywhere and concurrent writes converge on one; an unregister
//! leaves a tombstone on every node; a dead node's names are tombstoned by
//! the survivors; a name can be re-registered after an unregister, on
//! another node or the same one; and five nodes converge on the same names.

use waypost::testing::eventually;
use waypost::EndpointKey;
use waypost_gossip::{GossipConfig, GossipRegistry, NodeId, NAME_SERVICE};

async fn cluster(n: usize) -> Vec<GossipRegistry> {
    let first = GossipRegistry::start(GossipConfig::fast().with_node_name("node-0"))
        .await
        .unwrap();
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for i in 1..n {
        let cfg = GossipConfig::fast()
            .with_node_name(format!("node-{i}"))
            .with_seeds([seed]);
        nodes.push(GossipRegistry::start(cfg).await.unwrap());
    }
    eventually("every node to see every other", || async {
        nodes
            .iter()
            .all(|r| r.members().len() == n - 1)
            .then_some(())
    })
    .await;
    nodes
}

/// Wait until every node resolves `name` to `addr` (or to nothing).
async fn all_resolve(nodes: &[&GossipRegistry], name: &str, addr: Option<&str>) {
    eventually(
        &format!("{name} to resolve to {addr:?} everywhere"),
        || async {
            nodes
                .iter()
                .all(|n| n.resolve_name(name).map(|b| b.actor_addr).as_deref() == addr)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_and_resolve() {
    let nodes = cluster(3).await;
    nodes[0]
        .register_name("worker-pool", "actor-0a1b")
        .await
        .unwrap();
    // Local at once.
    let b = nodes[0].resolve_name("worker-pool").unwrap();
    assert_eq!(b.actor_addr, "actor-0a1b");
    assert_eq!(b.node, "node-0");
    assert_eq!(nodes[0].resolve_name("nobody"), None);
    // And everywhere after gossip, with the owning node.
    let all: Vec<&GossipRegistry> = nodes.iter().collect();
    all_resolve(&all, "worker-pool", Some("actor-0a1b")).await;
    for n in &nodes {
        assert_eq!(n.resolve_name("worker-pool").unwrap().node, "node-0");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lww_conflict() {
    let nodes = cluster(3).await;
    let all: Vec<&GossipRegistry> = nodes.iter().collect();
    // Sequential: node 0 writes after it has seen node 1's write, so its
    // write is the latest and wins everywhere, although node 1's clock ran
    // ahead (a clock moving only on local writes would have stamped node
    // 0's write 1 and lost).
    for i in 0..5 {
        // Node 1's clock runs ahead of node 0's.
        nodes[1]
            .register_name(&format!("filler-{i}"), "actor-f")
            .await
            .unwrap();
    }
    nodes[1]
        .register_name("svc-x", "actor-from-1")
        .await
        .unwrap();
    all_resolve(&all, "svc-x", Some("actor-from-1")).await;
    nodes[0]
        .register_name("svc-x", "actor-from-0")
        .await
        .unwrap();
    all_resolve(&all, "svc-x", Some("actor-from-0")).await;

    // Concurrent: both write before hearing of the other; every node ends
    // with the same binding, the one with the greatest stamp.
    let (a, b) = tokio::join!(
        nodes[0].register_name("svc-y", "actor-a"),
        nodes[2].register_name("svc-y", "actor-c"),
    );
    a.unwrap();
    b.unwrap();
    let key = EndpointKey::new(NAME_SERVICE, "svc-y");
    let winner = eventually("svc-y to converge", || async {
        let entries: Vec<_> = nodes
            .iter()
            .map(|n| n.with_machine(|m| m.entry(&key)))
            .collect::<Option<_>>()?;
        entries
            .windows(2)
            .all(|w| w[0] == w[1])
            .then(|| entries[0].clone())
    })
    .await;
    let addr = winner.value.as_ref().unwrap().address.clone();
    assert!(addr == "actor-a" || addr == "actor-c", "{winner:?}");
    for n in &nodes {
        assert_eq!(n.resolve_name("svc-y").unwrap().actor_addr, addr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstone_propagation() {
    let nodes = cluster(4).await;
    let all: Vec<&GossipRegistry> = nodes.iter().collect();
    nodes[1].register_name("doomed", "actor-d").await.unwrap();
    all_resolve(&all, "doomed", Some("actor-d")).await;
    nodes[1].unregister_name("doomed").await.unwrap();
    assert_eq!(nodes[1].resolve_name("doomed"), None);
    all_resolve(&all, "doomed", None).await;
    // A tombstone, not a missing entry, on every node.
    let key = EndpointKey::new(NAME_SERVICE, "doomed");
    for n in &nodes {
        let e = n.with_machine(|m| m.entry(&key)).unwrap();
        assert!(e.is_tombstone() && !e.died, "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_death_tombstones() {
    let mut nodes = cluster(3).await;
    nodes[1].register_name("on-b", "actor-b").await.unwrap();
    nodes[0].register_name("on-a", "actor-a").await.unwrap();
    let all: Vec<&GossipRegistry> = nodes.iter().collect();
    all_resolve(&all, "on-b", Some("actor-b")).await;
    all_resolve(&all, "on-a", Some("actor-a")).await;
    // Kill node B: no goodbye, its socket just goes quiet.
    let b = nodes.remove(1);
    drop(b);
    let survivors: Vec<&GossipRegistry> = nodes.iter().collect();
    all_resolve(&survivors, "on-b", None).await;
    let key = EndpointKey::new(NAME_SERVICE, "on-b");
    for n in &nodes {
        let e = n.with_machine(|m| m.entry(&key)).unwrap();
        assert!(e.died && e.stamp.writer == NodeId::new("node-1"), "{e:?}");
        assert_eq!(n.resolve_name("on-a").unwrap().actor_addr, "actor-a");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_registration() {
    let nodes = cluster(3).await;
    let all: Vec<&GossipRegistry> = nodes.iter().collect();
    nodes[0].register_name("svc", "actor-old").await.unwrap();
    all_resolve(&all, "svc", Some("actor-old")).await;
    nodes[0].unregister_name("svc").await.unwrap();
    all_resolve(&all, "svc", None).await;
    // Re-registered elsewhere with a new address: wins everywhere.
    nodes[2].register_name("svc", "actor-new").await.unwrap();
    all_resolve(&all, "svc", Some("actor-new")).await;
    // And once more on the original node, after another unregister.
    nodes[2].unregister_name("svc").await.unwrap();
    all_resolve(&all, "svc", None).await;
    nodes[0].register_name("svc", "actor-newer").await.unwrap();
    all_resolve(&all, "svc", Some("actor-newer")).await;
    for n in &nodes {
        assert_eq!(n.resolve_name("svc").unwrap().node, "node-0");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_convergence() {
    let nodes = cluster(5).await;
    nodes[0].register_name("from-a", "actor-a").await.unwrap();
    for (i, n) in nodes.iter().enumerate().skip(1) {
        n.register_name(&format!("name-{i}"), &format!("actor-{i}"))
            .await
            .unwrap();
    }
    let all: Vec<&GossipRegistry> = nodes.iter().collect();
    all_resolve(&all, "from-a", Some("actor-a")).await;
    eventually("every node to hold the same five names", || async {
        let first = nodes[0].names();
        (first.len() == 5 && nodes.iter().all(|n| n.names() == first)).then_some(())
    })
    .await;
}
