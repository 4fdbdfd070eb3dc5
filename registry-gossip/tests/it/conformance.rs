//! The conformance suite on one node of a real two-node cluster over
//! loopback UDP; the only place it runs for this backend.

use std::time::Duration;

use waypost::testing::{overflow_history, Guarded};
use waypost_gossip::{GossipConfig, GossipRegistry};

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
    waypost::testing::eventually("the pair to join", || async {
        (node.members().len() == 1 && peer.members().len() == 1).then_some(())
    })
    .await;
    Guarded::new(node, peer)
}

/// Push the watch history window past everything written so far.
async fn lose_history(reg: &Pair) {
    overflow_history(reg, HISTORY + 1).await;
}

waypost::conformance_tests!(make, lose_history);
