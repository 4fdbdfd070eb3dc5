//! The conformance suite of `registry-api`, each check on a fresh
//! temporary database file.

use registry_api::testing::Guarded;
use registry_api::Registry;
use registry_sqlite::{SqliteConfig, SqliteRegistry};

/// A registry on a new file in its own temporary directory, which is
/// removed when the registry is dropped.
type TempRegistry = Guarded<SqliteRegistry>;

async fn make() -> TempRegistry {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = SqliteConfig::new(dir.path().join("registry.db")).with_sweep_interval(None);
    let reg = SqliteRegistry::open(cfg)
        .await
        .expect("open a fresh registry");
    Guarded::new(reg, dir)
}

/// Drop every change from the log: older versions can no longer resume.
async fn lose_history(reg: &TempRegistry) {
    reg.get_ref().compact(0).await.expect("compact");
}

registry_api::conformance_tests!(make, lose_history);

/// The whole suite on one registry, checks one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all() {
    let reg = make().await;
    registry_api::testing::run_all(&reg, || lose_history(&reg)).await;
    assert!(reg.snapshot().await.expect("snapshot").len() > 100);
    assert_eq!(
        reg.get_ref().integrity_check().await.expect("integrity"),
        vec!["ok"]
    );
    let caps = reg.capabilities();
    assert!(caps.native_watch && caps.resumable_watch && caps.atomic_writes && caps.isolated_reads);
    assert!(caps.native_liveness);
    assert!(reg.to_string().starts_with("Sqlite(") && reg.to_string().ends_with("registry.db)"));
}
