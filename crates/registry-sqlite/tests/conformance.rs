//! The conformance suite of `registry-api`, each check on a fresh
//! temporary database file.

use async_trait::async_trait;
use registry_api::{
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Op, Registry, Result, Snapshot,
    Version, Watch,
};
use registry_sqlite::{SqliteConfig, SqliteRegistry};

/// A registry on a new file in its own temporary directory, which is
/// removed when the registry is dropped.
#[derive(Debug)]
struct TempRegistry {
    reg: SqliteRegistry,
    _dir: tempfile::TempDir,
}

impl std::fmt::Display for TempRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reg.fmt(f)
    }
}

#[async_trait]
impl Registry for TempRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.reg.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.reg.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.reg.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.reg.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.reg.capabilities()
    }
}

#[async_trait]
impl Batch for TempRegistry {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.reg.apply(ops).await
    }
    fn max_batch(&self) -> usize {
        self.reg.max_batch()
    }
}

impl Watch for TempRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.reg.watch(from)
    }
}

async fn make() -> TempRegistry {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = SqliteConfig::new(dir.path().join("registry.db")).with_sweep_interval(None);
    let reg = SqliteRegistry::open(cfg)
        .await
        .expect("open a fresh registry");
    TempRegistry { reg, _dir: dir }
}

/// Drop every change from the log: older versions can no longer resume.
async fn lose_history(reg: &TempRegistry) {
    reg.reg.compact(0).await.expect("compact");
}

registry_api::conformance_tests!(make, lose_history);

/// The whole suite on one registry, checks one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all() {
    let reg = make().await;
    registry_api::testing::run_all(&reg, || lose_history(&reg)).await;
    assert!(reg.snapshot().await.expect("snapshot").len() > 100);
    assert_eq!(
        reg.reg.integrity_check().await.expect("integrity"),
        vec!["ok"]
    );
    let caps = reg.capabilities();
    assert!(caps.native_watch && caps.resumable_watch && caps.atomic_batch);
    assert!(caps.persistent && caps.native_liveness);
    assert!(reg.to_string().starts_with("Sqlite(") && reg.to_string().ends_with("registry.db)"));
}
