//! The conformance suite over `MemoryRegistry`.

#![allow(clippy::unwrap_used)]

use registry_api::{memory::MemoryRegistry, Registry};

const HISTORY: usize = 64;

async fn make() -> MemoryRegistry {
    MemoryRegistry::with_history(HISTORY)
}

/// Push the history window past everything written so far.
async fn lose_history(reg: &MemoryRegistry) {
    let svc = registry_api::testing::unique("filler");
    for i in 0..=HISTORY as u16 {
        reg.register(registry_api::testing::ep(&svc, "x", i + 1))
            .await
            .expect("filler write");
    }
}

registry_api::conformance_tests!(make, lose_history);

/// The whole suite on one shared registry, checks one after the other.
#[tokio::test]
async fn run_all_on_one_registry() {
    let reg = make().await;
    registry_api::testing::run_all(&reg, || lose_history(&reg)).await;
    assert!(reg.snapshot().await.expect("snapshot").len() > 100);
}

/// Through `Arc<dyn ...>` too: the traits are object-safe and forwarded.
#[tokio::test]
async fn suite_through_trait_objects() {
    let reg: std::sync::Arc<MemoryRegistry> = std::sync::Arc::new(make().await);
    registry_api::testing::register_is_upsert(&reg).await;
    let dynreg: std::sync::Arc<dyn Registry> = reg.clone();
    registry_api::testing::list_is_scoped_to_service(&*dynreg).await;
    let boxed: Box<dyn Registry> = Box::new(make().await);
    registry_api::testing::deregister_removes(&boxed).await;
}
