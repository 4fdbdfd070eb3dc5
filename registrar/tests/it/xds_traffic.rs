//! Zones, weights and draining through the xDS face, with proxyless gRPC
//! in Python (grpcio, `xds:///greeter`) calling greeter servers the
//! registry names: calls follow the localities' weights (the sums of
//! their healthy endpoints' weights), and a draining endpoint gets none.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use common::fast_client;
use common::xds::{bootstrap_json, serve_with_xds, Python};
use waypost::testing::wait_limit;
use waypost::{Endpoint, Health, Registry};

const SERVICE: &str = "greeter";
/// The calls a convergence check looks at: the last ones the client made.
const WINDOW: usize = 60;

fn greeter(id: &str, port: u16, zone: &str, weight: u32) -> Endpoint {
    Endpoint::new(SERVICE, id, "127.0.0.1", port)
        .with_node("node-1")
        .with_zone(zone)
        .with_weight(weight)
}

/// The client's calls, read as they come; every greeter that ever
/// answered.
struct Calls {
    client: Python,
    last: VecDeque<String>,
    answered: BTreeSet<String>,
}

impl Calls {
    async fn next(&mut self) -> String {
        let line = self.client.next_line().await;
        if let Some(id) = line.strip_prefix("ok ") {
            self.answered.insert(id.to_string());
        }
        if self.last.len() == WINDOW {
            self.last.pop_front();
        }
        self.last.push_back(line.clone());
        line
    }

    /// Read calls until each of `want` answered within the last
    /// [`WINDOW`], all of which succeeded and none of which was answered
    /// by another (bounded by twice the tests' wait limit: gRPC's own
    /// connection backoff may apply).
    async fn converge(&mut self, want: &[&str], what: &str) {
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let deadline = tokio::time::Instant::now() + wait_limit() * 2;
        loop {
            self.next().await;
            let ids: Option<BTreeSet<String>> = self
                .last
                .iter()
                .map(|l| l.strip_prefix("ok ").map(str::to_string))
                .collect();
            if self.last.len() == WINDOW && ids.as_ref() == Some(&want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: the last {WINDOW} calls were {:?}, want only {want:?}",
                self.last.iter().collect::<BTreeSet<_>>()
            );
        }
    }

    /// The next `n` calls, counted by the greeter that answered.
    async fn count(&mut self, n: usize) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for _ in 0..n {
            let line = self.next().await;
            let id = line.strip_prefix("ok ").unwrap_or(&line).to_string();
            *by.entry(id).or_insert(0) += 1;
        }
        by
    }
}

/// Zone `a` holds a1 (weight 3) and d1 (weight 5, draining); zone `b`
/// holds b1 (weight 1). The localities' weights are 3 and 1, so a1 gets
/// 3/4 of the calls and b1 1/4; d1 none. gRPC picks a locality at random
/// by weight for each call: over N = 1000 calls, a1's share is off 3/4 by
/// 0.1 or more with probability at most 2·exp(−2·N·0.1²) = 2·exp(−20)
/// < 5e-9 (Hoeffding). Then a1 drains too: zone `a` has no healthy
/// endpoint, and every call goes to b1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_grpc_follows_locality_weights_and_never_calls_a_draining_endpoint() {
    const N: usize = 1000;
    common::require_python("grpc", "grpcio");
    let (served, xds) = serve_with_xds().await;
    let agent = fast_client(&served.url(), "default", "node-1");
    let mut servers = Vec::new();
    let mut ports = BTreeMap::new();
    for id in ["a1", "b1", "d1"] {
        let (p, port) = Python::greeter(id).await;
        servers.push(p);
        ports.insert(id, port);
    }
    agent
        .register(greeter("a1", ports["a1"], "a", 3))
        .await
        .unwrap();
    agent
        .register(greeter("b1", ports["b1"], "b", 1))
        .await
        .unwrap();
    let d1 = greeter("d1", ports["d1"], "a", 5).with_health(Health::Draining);
    agent.register(d1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap.json");
    std::fs::write(&bootstrap, bootstrap_json(&xds, "python-client")).unwrap();
    let mut calls = Calls {
        client: Python::client(&format!("xds:///{SERVICE}"), &bootstrap),
        last: VecDeque::new(),
        answered: BTreeSet::new(),
    };

    calls.converge(&["a1", "b1"], "a1 and b1").await;
    let by = calls.count(N).await;
    let a1 = by.get("a1").copied().unwrap_or(0) as f64 / N as f64;
    assert!(
        (a1 - 0.75).abs() < 0.1,
        "a1 got {a1:.3} of the calls, want 0.75 ± 0.1: {by:?}"
    );
    assert_eq!(
        by.keys().collect::<Vec<_>>(),
        ["a1", "b1"],
        "only a1 and b1 answer, every call succeeds: {by:?}"
    );

    agent
        .register(greeter("a1", ports["a1"], "a", 3).with_health(Health::Draining))
        .await
        .unwrap();
    calls.converge(&["b1"], "a1 draining").await;
    assert!(
        !calls.answered.contains("d1"),
        "the draining d1 answered a call: {:?}",
        calls.answered
    );
}
