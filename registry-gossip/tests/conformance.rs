//! The conformance suite on one node of a real two-node cluster over
//! loopback UDP.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use registry_api::testing::Guarded;
use registry_api::Registry;
use registry_gossip::{GossipConfig, GossipRegistry};

const HISTORY: usize = 64;

/// The node under test, with a peer that keeps the cluster real.
type Pair = Guarded<GossipRegistry>;

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
    Guarded::new(node, peer)
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
