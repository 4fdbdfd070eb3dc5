//! [`SqliteRegistry`]: the backend and its trait implementations. The
//! work is done in the other modules; this one only forwards.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use waypost::{
    backend::{check_batch, check_name, validate_endpoint},
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Heartbeat, Op, Registry, Result,
    Snapshot, Version, Watch,
};

use crate::admin;
use crate::config::SqliteConfig;
use crate::database::Database;
use crate::endpoints;
use crate::liveness::{self, sweep_loop, SqliteSweepReport};
use crate::nodes::{self, NodeRecord};
use crate::watch::poll_log;

/// A registry in one SQLite file; see the crate documentation.
///
/// Cloning is cheap and shares the connection pool, the in-process
/// notification channel and the background tasks. The background tasks
/// stop when the last clone is dropped or [`SqliteRegistry::close`] is called.
#[derive(Clone)]
pub struct SqliteRegistry {
    db: Arc<Database>,
}

impl SqliteRegistry {
    /// Open (creating if needed) the database at `cfg.path`, migrate its
    /// schema, recompute node liveness from `last_seen`, and start the log
    /// poller and (if configured) the liveness sweeper.
    ///
    /// A path that is a directory, a file that is not an SQLite database,
    /// or a location that cannot be created gives an error naming the
    /// path; a file that is not a database is left untouched.
    ///
    /// Before anything is written the file must be sound and ours: an
    /// existing file is first looked at through a read-only connection,
    /// and another application's SQLite database is refused
    /// (`InvalidInput`) without being touched; then, in one `BEGIN
    /// IMMEDIATE` transaction, `PRAGMA quick_check(100)` must find no
    /// problem (else `Internal`, "corrupt"), the schema is migrated, a
    /// no-op write to `meta` must succeed (else `Unauthorized`: the file
    /// or its mount is read-only), and a file without our
    /// `application_id` (new, or from a previous release) is marked.
    pub async fn open(cfg: SqliteConfig) -> Result<Self> {
        let db = admin::open(cfg).await?;
        db.spawn(poll_log(Arc::downgrade(&db), db.cfg.poll_interval));
        if let Some(every) = db.cfg.sweep_interval {
            db.spawn(sweep_loop(Arc::downgrade(&db), every));
        }
        Ok(Self { db })
    }

    /// [`SqliteRegistry::open`] with the default settings at `path`.
    pub async fn open_path(path: impl Into<PathBuf>) -> Result<Self> {
        Self::open(SqliteConfig::new(path)).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.db.cfg.path
    }

    /// The settings this registry was opened with.
    pub fn config(&self) -> &SqliteConfig {
        &self.db.cfg
    }

    /// The version of the latest change in the file (from any process).
    pub async fn version(&self) -> Result<Version> {
        self.db.version().await
    }

    /// The latest version this handle knows of without reading the file:
    /// its own last commit, or the last one the log poller saw from other
    /// processes (the poller runs while a watch is open). Parked watchers
    /// wake when it moves.
    pub fn known_version(&self) -> Version {
        Version(*self.db.notify.borrow())
    }

    /// Trim the change log to its last `keep` changes now (writes trim it
    /// to `log_len` by themselves). Watches resumed from before the trimmed
    /// part get a fresh snapshot. Versions are unaffected.
    pub async fn compact(&self, keep: u64) -> Result<()> {
        admin::compact(&self.db, keep).await
    }

    /// Register a node with its address and role: it is healthy and seen
    /// now. A later
    /// [`Heartbeat::heartbeat`] keeps it alive.
    pub async fn register_node(&self, id: &str, address: &str, role: &str) -> Result<()> {
        check_name("node", id, true)?;
        check_name("address", address, false)?;
        check_name("role", role, false)?;
        let role = if role.is_empty() { "compute" } else { role };
        liveness::beat(&self.db, id, Some((address, role))).await
    }

    /// Every node the liveness tables know, ordered by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        nodes::records(&self.db, None).await
    }

    /// One node, if known.
    pub async fn node(&self, id: &str) -> Result<Option<NodeRecord>> {
        Ok(nodes::records(&self.db, Some(id)).await?.pop())
    }

    /// Run the liveness sweep now, at the configured clock's time: nodes
    /// silent for at least `suspect_after` are marked unhealthy with their
    /// endpoints; nodes silent for at least `remove_after` are removed with
    /// their endpoints. One transaction. Silence is timed on the clock's
    /// monotonic reading, from when this process saw the node's heartbeat
    /// count change (see [`crate::Clock`]).
    pub async fn sweep(&self) -> Result<SqliteSweepReport> {
        liveness::sweep_at(&self.db, None).await
    }

    /// Run the liveness sweep as if the monotonic clock read `now` (a time
    /// ahead of the clock judges every node that much more silent).
    pub async fn sweep_at(&self, now: Instant) -> Result<SqliteSweepReport> {
        liveness::sweep_at(&self.db, Some(now)).await
    }

    /// `PRAGMA integrity_check`: `["ok"]` for a sound file, otherwise the
    /// problems SQLite found.
    pub async fn integrity_check(&self) -> Result<Vec<String>> {
        admin::integrity_check(&self.db).await
    }

    /// Stop the background tasks and close every connection, waiting for
    /// them to finish. Later calls on any clone fail with `Unavailable`.
    pub async fn close(&self) {
        self.db.close().await;
    }
}

impl fmt::Display for SqliteRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sqlite({})", self.db.cfg.path.display())
    }
}

impl fmt::Debug for SqliteRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteRegistry")
            .field("path", &self.db.cfg.path)
            .field("revision", &*self.db.notify.borrow())
            .finish()
    }
}

#[async_trait]
impl Registry for SqliteRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        validate_endpoint(&endpoint)?;
        let what = format!("register {}", endpoint.key());
        endpoints::commit_ops(&self.db, vec![Op::Register(endpoint)], &what)
            .await
            .map(drop)
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        let what = format!("deregister {key}");
        endpoints::commit_ops(&self.db, vec![Op::Deregister(key.clone())], &what)
            .await
            .map(drop)
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        endpoints::list(&self.db, service).await
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        endpoints::snapshot(&self.db).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_atomic_writes(true)
            .with_isolated_reads(true)
            .with_max_batch(self.db.cfg.max_batch)
            .with_native_liveness(true)
    }

    /// Checks, changing nothing anyone can see, that a write would be
    /// accepted: the file and its `-wal` and `-shm` open for writing (not
    /// a read-only mount, an immutable file, or missing permissions), and
    /// SQLite takes the write lock and would write `meta` (`BEGIN
    /// IMMEDIATE`, a no-op `UPDATE`, `ROLLBACK`). A full disk is not
    /// detected: only a real write finds it (as a transient `Unavailable`).
    async fn probe(&self) -> Result<()> {
        admin::probe(&self.db).await
    }
}

#[async_trait]
impl Batch for SqliteRegistry {
    /// The batch rule first ([`check_batch`]): more than `max_batch` ops, or
    /// an invalid op, are refused and nothing is written. Then one
    /// transaction.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        check_batch(&ops, self.db.cfg.max_batch)?;
        if ops.is_empty() {
            return Ok(());
        }
        let what = format!("apply a batch of {} ops", ops.len());
        endpoints::commit_ops(&self.db, ops, &what).await.map(drop)
    }

    fn max_batch(&self) -> usize {
        self.db.cfg.max_batch
    }
}

#[async_trait]
impl Heartbeat for SqliteRegistry {
    /// Record that `node` is alive now: marks it healthy (creating its
    /// node row on its first heartbeat), and revives the endpoints
    /// liveness had marked unhealthy (not those registered unhealthy by
    /// their owner). `NotFound` for a node that owns no endpoint and has no
    /// node row (never registered, or removed by liveness with its
    /// endpoints): it should register again.
    async fn heartbeat(&self, node: &str) -> Result<()> {
        check_name("node", node, true)?;
        liveness::beat(&self.db, node, None).await
    }
}

impl Watch for SqliteRegistry {
    /// Native watch from the change log: a snapshot first (unless `from`
    /// is still in the log), then every change in order, each once. Local
    /// writes wake the watch at once; other processes' writes within
    /// `poll_interval`. A watcher that falls behind the log's `log_len`
    /// gets a fresh snapshot.
    ///
    /// A failed read (of the log, or of a snapshot) is reported as an `Err`
    /// item, and the stream goes on retrying by itself: after 100 ms, then
    /// doubling up to 5 s, with jitter, each failed attempt reported; the
    /// first `Ok` item after a failure is a fresh `Snapshot`. A watcher
    /// waiting for changes learns of a failure through the log poller (the
    /// file could not be read within `poll_interval`). Closing the registry
    /// ends its streams after one `Err` item.
    fn watch(&self, from: Option<Version>) -> EventStream {
        crate::watch::watch(&self.db, from)
    }
}

/// SqliteRegistry implements all four traits, with a native watch and
/// liveness: [`waypost::stack::stack`] adds nothing around it.
impl waypost::stack::IntoStack for SqliteRegistry {
    fn into_stack(
        self,
        cfg: &waypost::stack::StackConfig,
    ) -> waypost::Result<std::sync::Arc<dyn waypost::stack::Stack>> {
        waypost::stack::by_capabilities(self, cfg)
    }
}
