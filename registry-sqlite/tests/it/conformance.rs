//! The conformance suite of `waypost` on SQLite, the only place it
//! runs for this backend: each check on a fresh temporary database file.

use waypost::testing::Guarded;
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

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

waypost::conformance_tests!(make, lose_history);

/// What the suite relies on: the capabilities SQLite claims, and a file
/// that stays sound under the suite's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_integrity() {
    use waypost::Registry;
    let reg = make().await;
    waypost::testing::batch_applies_in_order(&reg).await;
    waypost::testing::concurrent_writers_lose_nothing(&reg).await;
    assert_eq!(
        reg.get_ref().integrity_check().await.expect("integrity"),
        vec!["ok"]
    );
    let caps = reg.capabilities();
    assert!(caps.native_watch && caps.resumable_watch && caps.atomic_writes && caps.isolated_reads);
    assert!(caps.native_liveness);
    assert!(reg.to_string().starts_with("Sqlite(") && reg.to_string().ends_with("registry.db)"));
}
