//! The conformance suite over `MemoryRegistry`: the only place it runs for
//! this backend.

use waypost::memory::MemoryRegistry;
use waypost::testing::overflow_history;

const HISTORY: usize = 64;

async fn make() -> MemoryRegistry {
    MemoryRegistry::with_history(HISTORY)
}

/// Push the history window past everything written so far.
async fn lose_history(reg: &MemoryRegistry) {
    overflow_history(reg, HISTORY + 1).await;
}

waypost::conformance_tests!(make, lose_history);

/// The checks take trait objects and smart pointers too: the traits are
/// object-safe and forwarded through `Arc` and `Box`.
#[tokio::test]
async fn checks_through_trait_objects() {
    use waypost::Registry;
    let reg: std::sync::Arc<MemoryRegistry> = std::sync::Arc::new(make().await);
    waypost::testing::register_is_upsert(&reg).await;
    let dynreg: std::sync::Arc<dyn Registry> = reg.clone();
    waypost::testing::list_is_scoped_to_service(&*dynreg).await;
    let boxed: Box<dyn Registry> = Box::new(make().await);
    waypost::testing::deregister_removes(&boxed).await;
    let hb: &dyn waypost::Heartbeat = &*reg;
    waypost::testing::heartbeat_unknown_node_is_not_found(&*reg, hb).await;
}
