//! The registry-api conformance suite against a real etcd: each check gets
//! an etcd of its own, because `lose_history` compacts the whole server.

mod common;

use common::{Etcd, Harness};
use registry_api::testing::Guarded;
use registry_etcd::EtcdRegistry;

async fn make() -> Guarded<EtcdRegistry> {
    let h = Harness::start().await;
    Guarded::new(h.reg, h.etcd)
}

/// Compact etcd at its current revision.
async fn lose_history(h: &Guarded<EtcdRegistry>) {
    h.guard::<Etcd>().expect("the etcd fixture").compact().await;
}

registry_api::conformance_tests!(make, lose_history);

/// The whole suite on one registry, checks one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_on_one_registry() {
    let h = make().await;
    registry_api::testing::run_all(&h, || lose_history(&h)).await;
    let snap = registry_api::Registry::snapshot(&h)
        .await
        .expect("snapshot");
    assert!(snap.len() > 100, "only {} endpoints", snap.len());
}
