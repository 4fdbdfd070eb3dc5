//! The conformance suite on one node of a real two-node cluster over
//! loopback UDP.

#![allow(clippy::unwrap_used)]

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use registry_api::{
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Op, Registry, Result, Snapshot,
    Version, Watch,
};
use registry_gossip::{GossipConfig, GossipRegistry};

const HISTORY: usize = 64;

/// The node under test, and a peer that keeps the cluster real.
struct Pair {
    node: GossipRegistry,
    _peer: GossipRegistry,
}

/// Fast gossip, but SWIM timings that tolerate a loaded machine: the
/// checks are about the registry, not failure detection.
fn config() -> GossipConfig {
    GossipConfig::fast().with_swim_timings(
        Duration::from_millis(200),
        Duration::from_millis(100),
        Duration::from_secs(3),
    )
}

async fn make() -> Pair {
    let node = GossipRegistry::start(config().with_watch_history(HISTORY))
        .await
        .unwrap();
    let peer = GossipRegistry::start(config().with_seeds([node.local_addr()]))
        .await
        .unwrap();
    registry_api::testing::eventually("the pair to join", || async {
        (node.members().len() == 1 && peer.members().len() == 1).then_some(())
    })
    .await;
    Pair { node, _peer: peer }
}

/// Push the watch history window past everything written so far.
async fn lose_history(reg: &Pair) {
    let svc = registry_api::testing::unique("filler");
    for i in 0..=HISTORY as u16 {
        reg.register(registry_api::testing::ep(&svc, "x", i + 1))
            .await
            .unwrap();
    }
}

registry_api::conformance_tests!(make, lose_history);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_on_one_node() {
    let reg = make().await;
    registry_api::testing::run_all(&reg, || lose_history(&reg)).await;
}

impl fmt::Display for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.node.fmt(f)
    }
}

impl fmt::Debug for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.node.fmt(f)
    }
}

#[async_trait]
impl Registry for Pair {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.node.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.node.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.node.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.node.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.node.capabilities()
    }
}

impl Watch for Pair {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.node.watch(from)
    }
}

#[async_trait]
impl Batch for Pair {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.node.apply(ops).await
    }
}
