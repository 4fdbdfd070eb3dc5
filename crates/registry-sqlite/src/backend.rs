//! [`SqliteRegistry`]: the backend and its trait implementations.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use registry_api::{
    check_name, validate_endpoint, validate_ops, Batch, Capabilities, Endpoint, EndpointKey, Error,
    Event, EventStream, Health, Heartbeat, Op, Registry, Result, Snapshot, Version, Watch,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Sqlite, Transaction};
use tokio::sync::{watch, Mutex, MutexGuard};
use tokio::task::JoinHandle;

use crate::config::SqliteConfig;
use crate::error::{corrupt, io, map_sqlx};
use crate::schema::MIGRATIONS;

/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Changes read from the log per query while a watch catches up.
const PAGE: i64 = 1024;

/// The endpoint columns written on every change. Reads take only
/// `endpoint` (the whole endpoint as JSON): decoding one column is several
/// times cheaper than nine; the others are there for SQL queries (by node,
/// by health) and for people reading the file.
macro_rules! ep_cols {
    () => {
        "service, id, address, port, protocol, cluster, node, health, endpoint"
    };
}

/// `endpoint` (JSON).
type EpRow = (String,);

/// `endpoint` (JSON), `suspended`.
type EpRowSuspended = (String, i64);

/// Rows per multi-row statement (at most 11 parameters each, well under
/// SQLite's limit of 32 766).
const CHUNK: usize = 400;

/// `(?, ?), (?, ?), …`: `rows` groups of `cols` placeholders.
fn placeholders(rows: usize, cols: usize) -> String {
    let one = format!("({})", vec!["?"; cols].join(", "));
    vec![one; rows].join(", ")
}

type ChangeRow = (i64, String, String, String, Option<String>);

/// A node as the liveness tables hold it (the seed's `Node`).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node's name, as its endpoints carry it in `Endpoint::node`.
    pub id: String,
    /// Its routable address, if it registered one ([`SqliteRegistry::register_node`]).
    pub address: String,
    /// Its role (`compute` unless registered otherwise).
    pub role: String,
    /// `Healthy`, or `Unhealthy` once silent for `suspect_after`.
    pub status: Health,
    /// When its last heartbeat arrived (millisecond precision).
    pub last_seen: SystemTime,
}

/// What one liveness sweep changed.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Nodes newly marked unhealthy.
    pub suspected: Vec<String>,
    /// Nodes removed, with all their endpoints.
    pub removed: Vec<String>,
    /// Nodes found unhealthy although their last heartbeat is recent (the
    /// clock moved back); marked healthy again.
    pub recovered: Vec<String>,
    /// Endpoints whose health changed.
    pub endpoints_changed: usize,
    /// Endpoints removed with their node.
    pub endpoints_removed: usize,
}

impl SweepReport {
    /// Whether the sweep changed nothing.
    pub fn is_empty(&self) -> bool {
        self.suspected.is_empty()
            && self.removed.is_empty()
            && self.recovered.is_empty()
            && self.endpoints_changed == 0
            && self.endpoints_removed == 0
    }
}

/// A registry in one SQLite file; see the crate documentation.
///
/// Cloning is cheap and shares the connection pool, the in-process
/// notification channel and the background tasks. The background tasks
/// stop when the last clone is dropped or [`SqliteRegistry::close`] is called.
#[derive(Clone)]
pub struct SqliteRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    cfg: SqliteConfig,
    /// Serializes this process's writers, so that only other processes
    /// ever wait in SQLite's busy handler.
    write_lock: Mutex<()>,
    /// The latest revision known to this handle: bumped after each local
    /// commit and by the log poller for other processes' commits.
    notify: watch::Sender<u64>,
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for t in tasks.drain(..) {
            t.abort();
        }
    }
}

impl SqliteRegistry {
    /// Open (creating if needed) the database at `cfg.path`, migrate its
    /// schema, recompute node liveness from `last_seen`, and start the log
    /// poller and (if configured) the liveness sweeper.
    ///
    /// A path that is a directory, a file that is not an SQLite database,
    /// or a location that cannot be created gives an error naming the
    /// path; a file that is not a database is left untouched.
    pub async fn open(cfg: SqliteConfig) -> Result<Self> {
        cfg.check()?;
        precheck(&cfg.path)?;
        let path = cfg.path.clone();
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode, NORMAL keeps every committed transaction across a
            // crash of the process; a power loss may lose the last commits
            // but never corrupts the file.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(cfg.busy_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(cfg.max_connections)
            .acquire_timeout(cfg.busy_timeout.max(Duration::from_secs(5)) * 2)
            .connect_with(opts)
            .await
            .map_err(|e| map_sqlx(e, &path, "open the registry database"))?;
        migrate(&pool, &path).await?;
        let (tx, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            pool,
            cfg,
            write_lock: Mutex::new(()),
            notify: tx,
            tasks: std::sync::Mutex::new(Vec::new()),
        });
        let revision = inner.version().await?;
        inner.bump(revision.0);
        // Node status is recomputed from last_seen: whoever was silent
        // while nobody had the file open is marked or removed now.
        let report = inner.sweep_at(inner.cfg.clock.now()).await?;
        tracing::info!(
            path = %inner.cfg.path.display(),
            %revision,
            suspected = report.suspected.len(),
            removed = report.removed.len(),
            "opened SQLite registry"
        );
        let mut tasks = vec![tokio::spawn(poll_log(
            Arc::downgrade(&inner),
            inner.cfg.poll_interval,
        ))];
        if let Some(every) = inner.cfg.sweep_interval {
            tasks.push(tokio::spawn(sweep_loop(Arc::downgrade(&inner), every)));
        }
        *inner.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        Ok(Self { inner })
    }

    /// [`SqliteRegistry::open`] with the default settings at `path`.
    pub async fn open_path(path: impl Into<PathBuf>) -> Result<Self> {
        Self::open(SqliteConfig::new(path)).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.cfg.path
    }

    /// The settings this registry was opened with.
    pub fn config(&self) -> &SqliteConfig {
        &self.inner.cfg
    }

    /// The version of the latest change in the file (from any process).
    pub async fn version(&self) -> Result<Version> {
        self.inner.version().await
    }

    /// The latest version this handle knows of without reading the file:
    /// its own last commit, or the last one the log poller saw from other
    /// processes (the poller runs while a watch is open). Parked watchers
    /// wake when it moves.
    pub fn known_version(&self) -> Version {
        Version(*self.inner.notify.borrow())
    }

    /// Trim the change log to its last `keep` changes now (writes trim it
    /// to `log_len` by themselves). Watches resumed from before the trimmed
    /// part get a fresh snapshot. Versions are unaffected.
    pub async fn compact(&self, keep: u64) -> Result<()> {
        let inner = &self.inner;
        let what = "compact the change log";
        let (_guard, mut tx) = inner.write_tx(what).await?;
        let (rev, floor) = inner.counters(&mut tx, what).await?;
        inner.trim_log(&mut tx, rev, floor, keep, what).await?;
        tx.commit().await.map_err(|e| inner.map(e, what))
    }

    /// Register a node with its address and role (the seed's
    /// `/nodes/register`): it is healthy and seen now. A later
    /// [`Heartbeat::heartbeat`] keeps it alive.
    pub async fn register_node(&self, id: &str, address: &str, role: &str) -> Result<()> {
        check_name("node", id, true)?;
        check_name("address", address, false)?;
        check_name("role", role, false)?;
        let role = if role.is_empty() { "compute" } else { role };
        self.inner.beat(id, Some((address, role))).await
    }

    /// Every node the liveness tables know, ordered by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.inner.nodes(None).await
    }

    /// One node, if known.
    pub async fn node(&self, id: &str) -> Result<Option<NodeRecord>> {
        Ok(self.inner.nodes(Some(id)).await?.pop())
    }

    /// Run the liveness sweep now, at the configured clock's time.
    pub async fn sweep(&self) -> Result<SweepReport> {
        self.inner.sweep_at(self.inner.cfg.clock.now()).await
    }

    /// Run the liveness sweep as if the time were `now`: nodes silent for
    /// at least `suspect_after` are marked unhealthy with their endpoints;
    /// nodes silent for at least `remove_after` are removed with their
    /// endpoints. One transaction.
    pub async fn sweep_at(&self, now: SystemTime) -> Result<SweepReport> {
        self.inner.sweep_at(now).await
    }

    /// `PRAGMA integrity_check`: `["ok"]` for a sound file, otherwise the
    /// problems SQLite found.
    pub async fn integrity_check(&self) -> Result<Vec<String>> {
        sqlx::query_scalar::<_, String>("PRAGMA integrity_check")
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| self.inner.map(e, "integrity check"))
    }

    /// Stop the background tasks and close every connection, waiting for
    /// them to finish. Later calls on any clone fail with `Unavailable`.
    pub async fn close(&self) {
        let tasks: Vec<_> = {
            let mut t = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
            t.drain(..).collect()
        };
        for t in tasks {
            t.abort();
        }
        self.inner.pool.close().await;
        // Wake the watchers: their next read fails and ends their streams.
        self.inner.notify.send_modify(|_| {});
    }
}

/// Refuse, without writing anything, a path SQLite must not open.
fn precheck(path: &Path) -> Result<()> {
    let p = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(Error::invalid(
            "path",
            format!("{p} is a directory, not an SQLite database file"),
        )),
        Ok(m) if m.len() > 0 => {
            let mut head = Vec::with_capacity(16);
            std::fs::File::open(path)
                .and_then(|f| f.take(16).read_to_end(&mut head))
                .map_err(|e| io(path, "cannot read the registry database", e))?;
            if head.as_slice() == SQLITE_HEADER {
                Ok(())
            } else {
                Err(Error::invalid(
                    "path",
                    format!(
                        "{p} is not an SQLite database (it does not start with the SQLite \
                         header); the file was left untouched"
                    ),
                ))
            }
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => return Ok(()),
            };
            match std::fs::metadata(parent) {
                Ok(m) if m.is_dir() => Ok(()),
                Ok(_) => Err(Error::invalid(
                    "path",
                    format!("cannot create {p}: {} is not a directory", parent.display()),
                )),
                Err(e) => Err(io(path, "cannot create the registry database", e)),
            }
        }
        Err(e) => Err(io(path, "cannot read the registry database", e)),
    }
}

/// Apply every migration the file lacks, in one immediate transaction.
async fn migrate(pool: &SqlitePool, path: &Path) -> Result<()> {
    let what = "migrate the schema";
    let err = |e| map_sqlx(e, path, what);
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
    sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    let have: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    let known = MIGRATIONS.len() as i64;
    if have > known {
        return Err(Error::internal(format!(
            "{}: schema version {have} was written by a newer registry-sqlite (this one knows \
             up to {known})",
            path.display()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(have as usize) {
        sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(err)?;
        sqlx::query("INSERT INTO schema_version (version) VALUES (?1)")
            .bind(i as i64 + 1)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tracing::info!(path = %path.display(), version = i + 1, "applied schema migration");
    }
    tx.commit().await.map_err(err)
}

/// Wake the watchers of this handle when another process changed the file.
async fn poll_log(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.notify.receiver_count() == 0 {
            continue;
        }
        match inner.version().await {
            Ok(v) => inner.bump(v.0),
            Err(e) => tracing::warn!(error = %e, "polling the change log failed"),
        }
    }
}

async fn sweep_loop(inner: Weak<Inner>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; open already swept
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if let Err(e) = inner.sweep_at(inner.cfg.clock.now()).await {
            tracing::warn!(error = %e, "liveness sweep failed");
        }
    }
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

enum Catchup {
    Snapshot(Snapshot),
    Changes(Vec<Event>),
}

impl Inner {
    fn map(&self, e: sqlx::Error, what: &str) -> Error {
        map_sqlx(e, &self.cfg.path, what)
    }

    fn bump(&self, revision: u64) {
        self.notify.send_if_modified(|v| {
            if revision > *v {
                *v = revision;
                true
            } else {
                false
            }
        });
    }

    async fn write_tx(
        &self,
        what: &str,
    ) -> Result<(MutexGuard<'_, ()>, Transaction<'static, Sqlite>)> {
        let guard = self.write_lock.lock().await;
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.map(e, what))?;
        Ok((guard, tx))
    }

    /// `(revision, log_floor)`.
    async fn counters(&self, conn: &mut SqliteConnection, what: &str) -> Result<(u64, u64)> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT key, value FROM meta WHERE key IN ('revision', 'log_floor')")
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| self.map(e, what))?;
        let get = |k: &str| {
            rows.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| to_u64(*v))
                .ok_or_else(|| corrupt(&self.cfg.path, what, format!("meta.{k} is missing")))
        };
        Ok((get("revision")?, get("log_floor")?))
    }

    async fn version(&self) -> Result<Version> {
        let what = "read the revision";
        let v: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.map(e, what))?;
        Ok(Version(to_u64(v)))
    }

    fn decode(&self, row: EpRow) -> Result<Endpoint> {
        let ep: Endpoint = serde_json::from_str(&row.0)
            .map_err(|e| corrupt(&self.cfg.path, "read an endpoint", e))?;
        Ok(ep)
    }

    fn decode_change(&self, row: ChangeRow) -> Result<Event> {
        let (revision, kind, service, id, endpoint) = row;
        let version = Version(to_u64(revision));
        let what = format!("read change {revision} of the log");
        let endpoint = || -> Result<Endpoint> {
            let json = endpoint
                .as_deref()
                .ok_or_else(|| corrupt(&self.cfg.path, &what, "no endpoint"))?;
            serde_json::from_str(json).map_err(|e| corrupt(&self.cfg.path, &what, e))
        };
        Ok(match kind.as_str() {
            "added" => Event::Added {
                version,
                endpoint: endpoint()?,
            },
            "updated" => Event::Updated {
                version,
                endpoint: endpoint()?,
            },
            "removed" => Event::Removed {
                version,
                key: EndpointKey::new(service, id),
            },
            other => {
                return Err(corrupt(
                    &self.cfg.path,
                    &what,
                    format!("unknown kind {other:?}"),
                ))
            }
        })
    }

    /// The stored endpoint with `key` and its `suspended` flag.
    async fn get(
        &self,
        conn: &mut SqliteConnection,
        key: &EndpointKey,
        what: &str,
    ) -> Result<Option<(Endpoint, bool)>> {
        let row: Option<EpRowSuspended> = sqlx::query_as(
            "SELECT endpoint, suspended FROM endpoints WHERE service = ?1 AND id = ?2",
        )
        .bind(&key.service)
        .bind(&key.id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| self.map(e, what))?;
        row.map(|(json, susp)| Ok((self.decode((json,))?, susp != 0)))
            .transpose()
    }

    /// Store `ep` (with the `suspended` flag) and log the change; `false`
    /// when nothing changed.
    async fn upsert(
        &self,
        conn: &mut SqliteConnection,
        rev: &mut u64,
        ep: Endpoint,
        suspended: bool,
    ) -> Result<bool> {
        let key = ep.key();
        let what = || format!("register {key}");
        let old = self.get(conn, &key, &what()).await?;
        let kind = match &old {
            Some((o, s)) if *o == ep => {
                if *s != suspended {
                    sqlx::query(
                        "UPDATE endpoints SET suspended = ?3 WHERE service = ?1 AND id = ?2",
                    )
                    .bind(&key.service)
                    .bind(&key.id)
                    .bind(i64::from(suspended))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.map(e, &what()))?;
                }
                return Ok(false);
            }
            Some(_) => "updated",
            None => "added",
        };
        *rev += 1;
        let whole = serde_json::to_string(&ep)
            .map_err(|e| Error::internal(format!("encode {key}: {e}")))?;
        sqlx::query(concat!(
            "INSERT OR REPLACE INTO endpoints (",
            ep_cols!(),
            ", suspended, revision) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ))
        .bind(&ep.service)
        .bind(&ep.id)
        .bind(&ep.address)
        .bind(i64::from(ep.port))
        .bind(ep.protocol.as_str())
        .bind(&ep.cluster)
        .bind(&ep.node)
        .bind(ep.health.as_str())
        .bind(&whole)
        .bind(i64::from(suspended))
        .bind(to_i64(*rev))
        .execute(&mut *conn)
        .await
        .map_err(|e| self.map(e, &what()))?;
        self.log(conn, *rev, kind, &key, Some(whole), &what())
            .await?;
        Ok(true)
    }

    /// Remove `key` and log it; `false` when it did not exist.
    async fn remove(
        &self,
        conn: &mut SqliteConnection,
        rev: &mut u64,
        key: &EndpointKey,
    ) -> Result<bool> {
        let what = || format!("deregister {key}");
        let res = sqlx::query("DELETE FROM endpoints WHERE service = ?1 AND id = ?2")
            .bind(&key.service)
            .bind(&key.id)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map(e, &what()))?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        *rev += 1;
        self.log(conn, *rev, "removed", key, None, &what()).await?;
        Ok(true)
    }

    async fn log(
        &self,
        conn: &mut SqliteConnection,
        rev: u64,
        kind: &str,
        key: &EndpointKey,
        endpoint: Option<String>,
        what: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO changes (revision, kind, service, id, endpoint) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(to_i64(rev))
        .bind(kind)
        .bind(&key.service)
        .bind(&key.id)
        .bind(endpoint)
        .execute(&mut *conn)
        .await
        .map_err(|e| self.map(e, what))?;
        Ok(())
    }

    /// Record the new revision and trim the log to `log_len`.
    async fn finish(
        &self,
        conn: &mut SqliteConnection,
        start: u64,
        floor: u64,
        rev: u64,
        what: &str,
    ) -> Result<()> {
        if rev == start {
            return Ok(());
        }
        sqlx::query("UPDATE meta SET value = ?1 WHERE key = 'revision'")
            .bind(to_i64(rev))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        self.trim_log(conn, rev, floor, self.cfg.log_len, what)
            .await
    }

    async fn trim_log(
        &self,
        conn: &mut SqliteConnection,
        rev: u64,
        floor: u64,
        keep: u64,
        what: &str,
    ) -> Result<()> {
        if rev.saturating_sub(floor) <= keep {
            return Ok(());
        }
        let new_floor = rev - keep;
        sqlx::query("DELETE FROM changes WHERE revision <= ?1")
            .bind(to_i64(new_floor))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        sqlx::query("UPDATE meta SET value = ?1 WHERE key = 'log_floor'")
            .bind(to_i64(new_floor))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        Ok(())
    }

    /// Apply validated ops in one transaction; returns the new version.
    ///
    /// Set-based, so that a batch costs a few statements per few hundred
    /// ops: the touched keys are read at once, every op is applied in
    /// order in memory (each real change gets the next revision and a log
    /// entry, as a single write would), then the final rows and the log
    /// entries are written with multi-row statements.
    async fn commit_ops(&self, ops: Vec<Op>, what: &str) -> Result<Version> {
        let (_guard, mut tx) = self.write_tx(what).await?;
        let (start, floor) = self.counters(&mut tx, what).await?;
        let keys: BTreeSet<EndpointKey> = ops.iter().map(Op::key).collect();
        let mut state = self.load(&mut tx, &keys, what).await?;
        let mut rev = start;
        let mut log: Vec<(u64, &'static str, EndpointKey, Option<String>)> = Vec::new();
        let mut dirty: BTreeMap<EndpointKey, u64> = BTreeMap::new();
        for op in ops {
            let key = op.key();
            let slot = state.entry(key.clone()).or_insert(None);
            match op {
                Op::Register(ep) => {
                    let kind = match slot {
                        Some((old, suspended)) if *old == ep => {
                            if *suspended {
                                // The owner now vouches for this value.
                                *suspended = false;
                                dirty.entry(key).or_insert(start);
                            }
                            continue;
                        }
                        Some(_) => "updated",
                        None => "added",
                    };
                    rev += 1;
                    let json = serde_json::to_string(&ep)
                        .map_err(|e| Error::internal(format!("encode {key}: {e}")))?;
                    log.push((rev, kind, key.clone(), Some(json)));
                    *slot = Some((ep, false));
                }
                Op::Deregister(_) => {
                    if slot.is_none() {
                        continue;
                    }
                    rev += 1;
                    log.push((rev, "removed", key.clone(), None));
                    *slot = None;
                }
            }
            dirty.insert(key, rev);
        }
        let mut gone = Vec::new();
        let mut rows = Vec::new();
        for (key, at) in dirty {
            match state.remove(&key).flatten() {
                None => gone.push(key),
                Some((ep, suspended)) => rows.push((ep, suspended, at)),
            }
        }
        self.delete_many(&mut tx, &gone, what).await?;
        self.store_many(&mut tx, &rows, what).await?;
        self.log_many(&mut tx, &log, what).await?;
        self.finish(&mut tx, start, floor, rev, what).await?;
        tx.commit().await.map_err(|e| self.map(e, what))?;
        self.bump(rev);
        tracing::debug!(path = %self.cfg.path.display(), revision = rev, changes = rev - start, "{what}");
        Ok(Version(rev))
    }

    /// The stored value of each of `keys` (`None` when absent).
    async fn load(
        &self,
        conn: &mut SqliteConnection,
        keys: &BTreeSet<EndpointKey>,
        what: &str,
    ) -> Result<HashMap<EndpointKey, Option<(Endpoint, bool)>>> {
        let mut out: HashMap<EndpointKey, Option<(Endpoint, bool)>> =
            keys.iter().map(|k| (k.clone(), None)).collect();
        let keys: Vec<&EndpointKey> = keys.iter().collect();
        for chunk in keys.chunks(CHUNK) {
            let sql = format!(
                "SELECT endpoint, suspended FROM endpoints WHERE (service, id) IN (VALUES {})",
                placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query_as::<_, EpRowSuspended>(AssertSqlSafe(sql));
            for k in chunk {
                q = q.bind(&k.service).bind(&k.id);
            }
            let rows = q
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| self.map(e, what))?;
            for (json, susp) in rows {
                let ep = self.decode((json,))?;
                out.insert(ep.key(), Some((ep, susp != 0)));
            }
        }
        Ok(out)
    }

    async fn delete_many(
        &self,
        conn: &mut SqliteConnection,
        keys: &[EndpointKey],
        what: &str,
    ) -> Result<()> {
        for chunk in keys.chunks(CHUNK) {
            let sql = format!(
                "DELETE FROM endpoints WHERE (service, id) IN (VALUES {})",
                placeholders(chunk.len(), 2)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for k in chunk {
                q = q.bind(&k.service).bind(&k.id);
            }
            q.execute(&mut *conn).await.map_err(|e| self.map(e, what))?;
        }
        Ok(())
    }

    async fn store_many(
        &self,
        conn: &mut SqliteConnection,
        rows: &[(Endpoint, bool, u64)],
        what: &str,
    ) -> Result<()> {
        for chunk in rows.chunks(CHUNK) {
            let jsons = chunk
                .iter()
                .map(|(ep, _, _)| {
                    serde_json::to_string(ep)
                        .map_err(|e| Error::internal(format!("encode {}: {e}", ep.key())))
                })
                .collect::<Result<Vec<_>>>()?;
            let sql = format!(
                concat!(
                    "INSERT OR REPLACE INTO endpoints (",
                    ep_cols!(),
                    ", suspended, revision) VALUES {}"
                ),
                placeholders(chunk.len(), 11)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for ((ep, suspended, at), json) in chunk.iter().zip(&jsons) {
                q = q
                    .bind(&ep.service)
                    .bind(&ep.id)
                    .bind(&ep.address)
                    .bind(i64::from(ep.port))
                    .bind(ep.protocol.as_str())
                    .bind(&ep.cluster)
                    .bind(&ep.node)
                    .bind(ep.health.as_str())
                    .bind(json)
                    .bind(i64::from(*suspended))
                    .bind(to_i64(*at));
            }
            q.execute(&mut *conn).await.map_err(|e| self.map(e, what))?;
        }
        Ok(())
    }

    async fn log_many(
        &self,
        conn: &mut SqliteConnection,
        log: &[(u64, &'static str, EndpointKey, Option<String>)],
        what: &str,
    ) -> Result<()> {
        for chunk in log.chunks(CHUNK) {
            let sql = format!(
                "INSERT INTO changes (revision, kind, service, id, endpoint) VALUES {}",
                placeholders(chunk.len(), 5)
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (rev, kind, key, json) in chunk {
                q = q
                    .bind(to_i64(*rev))
                    .bind(*kind)
                    .bind(&key.service)
                    .bind(&key.id)
                    .bind(json.as_deref());
            }
            q.execute(&mut *conn).await.map_err(|e| self.map(e, what))?;
        }
        Ok(())
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        let rows: Vec<EpRow> =
            sqlx::query_as("SELECT endpoint FROM endpoints WHERE service = ?1 ORDER BY id")
                .bind(service)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.map(e, &format!("list {service}")))?;
        rows.into_iter().map(|r| self.decode(r)).collect()
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        let what = "read a snapshot";
        let mut tx = self.pool.begin().await.map_err(|e| self.map(e, what))?;
        // Both reads see the same state: one read transaction.
        let (rev, _) = self.counters(&mut tx, what).await?;
        let rows: Vec<EpRow> = sqlx::query_as("SELECT endpoint FROM endpoints")
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.map(e, what))?;
        tx.commit().await.map_err(|e| self.map(e, what))?;
        let eps = rows
            .into_iter()
            .map(|r| self.decode(r))
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot::from_endpoints(Version(rev), eps))
    }

    /// What a watcher at `from` needs next.
    async fn catch_up(&self, from: Option<u64>) -> Result<Catchup> {
        let Some(from) = from else {
            return Ok(Catchup::Snapshot(self.snapshot().await?));
        };
        let what = "read the change log";
        let mut tx = self.pool.begin().await.map_err(|e| self.map(e, what))?;
        let (rev, floor) = self.counters(&mut tx, what).await?;
        if from < floor || from > rev {
            drop(tx);
            return Ok(Catchup::Snapshot(self.snapshot().await?));
        }
        if from == rev {
            return Ok(Catchup::Changes(Vec::new()));
        }
        let rows: Vec<ChangeRow> = sqlx::query_as(
            "SELECT revision, kind, service, id, endpoint FROM changes \
             WHERE revision > ?1 ORDER BY revision LIMIT ?2",
        )
        .bind(to_i64(from))
        .bind(PAGE)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.map(e, what))?;
        tx.commit().await.map_err(|e| self.map(e, what))?;
        let events = rows
            .into_iter()
            .map(|r| self.decode_change(r))
            .collect::<Result<Vec<_>>>()?;
        Ok(Catchup::Changes(events))
    }

    /// Endpoints of `node` matching `filter` (an SQL condition chosen among
    /// fixed strings).
    async fn node_endpoints(
        &self,
        conn: &mut SqliteConnection,
        node: &str,
        sql: &'static str,
        what: &str,
    ) -> Result<Vec<Endpoint>> {
        let rows: Vec<EpRow> = sqlx::query_as(sql)
            .bind(node)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        rows.into_iter().map(|r| self.decode(r)).collect()
    }

    /// Bring back the endpoints liveness marked unhealthy.
    async fn revive(
        &self,
        conn: &mut SqliteConnection,
        rev: &mut u64,
        node: &str,
        what: &str,
    ) -> Result<usize> {
        let eps = self
            .node_endpoints(
                conn,
                node,
                "SELECT endpoint FROM endpoints WHERE node = ?1 AND suspended = 1",
                what,
            )
            .await?;
        let mut n = 0;
        for ep in eps {
            n += usize::from(
                self.upsert(conn, rev, ep.with_health(Health::Healthy), false)
                    .await?,
            );
        }
        Ok(n)
    }

    /// A heartbeat (`info: None`) or a node registration.
    async fn beat(&self, node: &str, info: Option<(&str, &str)>) -> Result<()> {
        let what = format!("heartbeat of node {node}");
        let now = millis(self.cfg.clock.now());
        let (_guard, mut tx) = self.write_tx(&what).await?;
        let (start, floor) = self.counters(&mut tx, &what).await?;
        let known: Option<String> = sqlx::query_scalar("SELECT status FROM nodes WHERE id = ?1")
            .bind(node)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e, &what))?;
        let q = match info {
            None => sqlx::query(
                "INSERT INTO nodes (id, status, last_seen) VALUES (?1, 'healthy', ?2) \
                 ON CONFLICT (id) DO UPDATE SET status = 'healthy', last_seen = excluded.last_seen",
            )
            .bind(node)
            .bind(now),
            Some((address, role)) => sqlx::query(
                "INSERT INTO nodes (id, status, last_seen, address, role) \
                 VALUES (?1, 'healthy', ?2, ?3, ?4) \
                 ON CONFLICT (id) DO UPDATE SET status = 'healthy', \
                 last_seen = excluded.last_seen, address = excluded.address, role = excluded.role",
            )
            .bind(node)
            .bind(now)
            .bind(address)
            .bind(role),
        };
        q.execute(&mut *tx).await.map_err(|e| self.map(e, &what))?;
        let mut rev = start;
        let revived = self.revive(&mut tx, &mut rev, node, &what).await?;
        self.finish(&mut tx, start, floor, rev, &what).await?;
        tx.commit().await.map_err(|e| self.map(e, &what))?;
        self.bump(rev);
        match known.as_deref() {
            None => tracing::info!(node, "node admitted"),
            Some("unhealthy") => tracing::info!(node, revived, "node is back"),
            _ => {}
        }
        Ok(())
    }

    async fn sweep_at(&self, now: SystemTime) -> Result<SweepReport> {
        let what = "liveness sweep";
        let now = millis(now);
        let suspect_at = now.saturating_sub(duration_ms(self.cfg.suspect_after));
        let remove_at = now.saturating_sub(duration_ms(self.cfg.remove_after));
        let mut report = SweepReport::default();
        let (_guard, mut tx) = self.write_tx(what).await?;
        let (start, floor) = self.counters(&mut tx, what).await?;
        let mut rev = start;
        let ids = |sql: &'static str, at: i64| sqlx::query_scalar::<_, String>(sql).bind(at);

        report.removed = ids(
            "SELECT id FROM nodes WHERE last_seen <= ?1 ORDER BY id",
            remove_at,
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.map(e, what))?;
        for node in &report.removed {
            let what = format!("remove silent node {node}");
            let keys: Vec<(String, String)> =
                sqlx::query_as("SELECT service, id FROM endpoints WHERE node = ?1")
                    .bind(node)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(|e| self.map(e, &what))?;
            for (service, id) in keys {
                let key = EndpointKey::new(service, id);
                report.endpoints_removed +=
                    usize::from(self.remove(&mut tx, &mut rev, &key).await?);
            }
            sqlx::query("DELETE FROM nodes WHERE id = ?1")
                .bind(node)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.map(e, &what))?;
        }

        report.suspected = ids(
            "SELECT id FROM nodes WHERE status = 'healthy' AND last_seen <= ?1 ORDER BY id",
            suspect_at,
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.map(e, what))?;
        for node in &report.suspected {
            let what = format!("mark silent node {node} unhealthy");
            sqlx::query("UPDATE nodes SET status = 'unhealthy' WHERE id = ?1")
                .bind(node)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.map(e, &what))?;
            let eps = self
                .node_endpoints(
                    &mut tx,
                    node,
                    "SELECT endpoint FROM endpoints WHERE node = ?1 AND health = 'healthy'",
                    &what,
                )
                .await?;
            for ep in eps {
                let ep = ep.with_health(Health::Unhealthy);
                report.endpoints_changed +=
                    usize::from(self.upsert(&mut tx, &mut rev, ep, true).await?);
            }
        }

        report.recovered = ids(
            "SELECT id FROM nodes WHERE status = 'unhealthy' AND last_seen > ?1 ORDER BY id",
            suspect_at,
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.map(e, what))?;
        for node in &report.recovered {
            sqlx::query("UPDATE nodes SET status = 'healthy' WHERE id = ?1")
                .bind(node)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.map(e, what))?;
            report.endpoints_changed += self.revive(&mut tx, &mut rev, node, what).await?;
        }

        self.finish(&mut tx, start, floor, rev, what).await?;
        tx.commit().await.map_err(|e| self.map(e, what))?;
        self.bump(rev);
        if !report.is_empty() {
            tracing::info!(
                path = %self.cfg.path.display(),
                suspected = ?report.suspected,
                removed = ?report.removed,
                recovered = ?report.recovered,
                endpoints_changed = report.endpoints_changed,
                endpoints_removed = report.endpoints_removed,
                "liveness sweep"
            );
        }
        Ok(report)
    }

    async fn nodes(&self, only: Option<&str>) -> Result<Vec<NodeRecord>> {
        let what = "list nodes";
        let rows: Vec<(String, String, String, String, i64)> = match only {
            None => {
                sqlx::query_as("SELECT id, address, role, status, last_seen FROM nodes ORDER BY id")
                    .fetch_all(&self.pool)
            }
            Some(id) => sqlx::query_as(
                "SELECT id, address, role, status, last_seen FROM nodes WHERE id = ?1",
            )
            .bind(id)
            .fetch_all(&self.pool),
        }
        .await
        .map_err(|e| self.map(e, what))?;
        rows.into_iter()
            .map(|(id, address, role, status, last_seen)| {
                Ok(NodeRecord {
                    status: status
                        .parse()
                        .map_err(|e| corrupt(&self.cfg.path, &format!("read node {id}"), e))?,
                    id,
                    address,
                    role,
                    last_seen: from_millis(last_seen),
                })
            })
            .collect()
    }
}

impl fmt::Display for SqliteRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sqlite({})", self.inner.cfg.path.display())
    }
}

impl fmt::Debug for SqliteRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteRegistry")
            .field("path", &self.inner.cfg.path)
            .field("revision", &*self.inner.notify.borrow())
            .finish()
    }
}

#[async_trait]
impl Registry for SqliteRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        validate_endpoint(&endpoint)?;
        let what = format!("register {}", endpoint.key());
        self.inner
            .commit_ops(vec![Op::Register(endpoint)], &what)
            .await
            .map(drop)
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        let what = format!("deregister {key}");
        self.inner
            .commit_ops(vec![Op::Deregister(key.clone())], &what)
            .await
            .map(drop)
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.inner.list(service).await
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            .with_atomic_batch(true)
            .with_max_batch(self.inner.cfg.max_batch)
            .with_native_liveness(true)
            .with_persistent(true)
    }
}

#[async_trait]
impl Batch for SqliteRegistry {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        if ops.is_empty() {
            return Ok(());
        }
        let what = format!("apply a batch of {} ops", ops.len());
        self.inner.commit_ops(ops, &what).await.map(drop)
    }

    fn max_batch(&self) -> usize {
        self.inner.cfg.max_batch
    }
}

#[async_trait]
impl Heartbeat for SqliteRegistry {
    /// Record that `node` is alive now: creates its node row if unknown
    /// (a node pruned earlier is re-admitted, without its old endpoints),
    /// marks it healthy, and revives the endpoints liveness had marked
    /// unhealthy (not those registered unhealthy by their owner).
    async fn heartbeat(&self, node: &str) -> Result<()> {
        check_name("node", node, true)?;
        self.inner.beat(node, None).await
    }
}

struct WatchState {
    inner: Weak<Inner>,
    rx: watch::Receiver<u64>,
    last: Option<u64>,
    pending: VecDeque<Event>,
    done: bool,
}

impl WatchState {
    async fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                self.last = Some(ev.version().0);
                return Some(Ok(ev));
            }
            if self.done {
                return None;
            }
            let inner = self.inner.upgrade()?;
            // Mark the current notification seen before reading, so a
            // commit after the read wakes us again.
            self.rx.borrow_and_update();
            match inner.catch_up(self.last).await {
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Ok(Catchup::Snapshot(s)) => self.pending.push_back(Event::Snapshot(s)),
                Ok(Catchup::Changes(evs)) if !evs.is_empty() => self.pending.extend(evs),
                Ok(Catchup::Changes(_)) => {
                    drop(inner);
                    if self.rx.changed().await.is_err() {
                        // The registry was dropped.
                        return None;
                    }
                }
            }
        }
    }
}

impl Watch for SqliteRegistry {
    /// Native watch from the change log: a snapshot first (unless `from`
    /// is still in the log), then every change in order, each once. Local
    /// writes wake the watch at once; other processes' writes within
    /// `poll_interval`. A watcher that falls behind the log's `log_len`
    /// gets a fresh snapshot. An `Err` item ends the stream.
    fn watch(&self, from: Option<Version>) -> EventStream {
        let state = WatchState {
            inner: Arc::downgrade(&self.inner),
            rx: self.inner.notify.subscribe(),
            last: from.map(|v| v.0),
            pending: VecDeque::new(),
            done: false,
        };
        stream::unfold(state, |mut st| async move {
            let item = st.next().await?;
            Some((item, st))
        })
        .boxed()
    }
}
