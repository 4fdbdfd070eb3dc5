//! [`Database`]: the registry's SQLite file, shared by every clone of a
//! [`crate::SqliteRegistry`] (connection pools, settings, the notification
//! channel, background tasks): opening it safely, its counters, and the
//! endpoint reads and writes. Transactions are [`crate::tx::Tx`]; liveness
//! and the change log's watch add their methods in their own modules.
//!
//! Opening, in order:
//! 1. the path: a directory is refused before SQLite opens it;
//! 2. an existing file is inspected through a read-only connection that
//!    sets no pragma: a file that is not an SQLite database, or is another
//!    application's, is refused before anything could switch it to WAL or
//!    add a table to it;
//! 3. the pools connect (WAL mode, `synchronous = NORMAL`);
//! 4. one write transaction checks and migrates the file
//!    ([`crate::layout::prepare`]);
//! 5. a first liveness sweep notes every node, giving each a full
//!    `suspect_after` from now (the time the file was closed cannot be
//!    told from a step of the wall clock). The registry then starts its
//!    background tasks (the change-log poller and the liveness sweep).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use waypost::backend::Silence;
use waypost::{Endpoint, EndpointKey, Error, Op, Result, Snapshot, Version};

use crate::config::SqliteConfig;
use crate::error::{check_writable, corrupt, io, map_sqlx, not_a_database, refine_write};
use crate::layout::{
    decode, delete_rows, encode, load_rows, log_rows, prepare, store_rows, to_i64, to_u64,
    touch_meta, EpRow, Found,
};
use crate::tx::Tx;

/// What every clone of a [`crate::SqliteRegistry`] shares.
pub(crate) struct Database {
    /// Connections for reads (`cfg.max_connections` of them).
    pub(crate) readers: SqlitePool,
    /// The one connection writes use. Its own pool, so that a write never
    /// runs on a connection opened for reads while the file was read-only
    /// (SQLite then opens it read-only for good), and so that a writer
    /// closed after a failure is replaced by a fresh one at the next write.
    pub(crate) writer: SqlitePool,
    pub(crate) cfg: SqliteConfig,
    /// Serializes this process's writers, so that only other processes
    /// ever wait in SQLite's busy handler.
    pub(crate) write_lock: Mutex<()>,
    /// The latest revision known to this handle: bumped after each local
    /// commit and by the log poller for other processes' commits.
    pub(crate) notify: watch::Sender<u64>,
    pub(crate) tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Each node's silence as this process sees it: the heartbeat count
    /// and `last_seen` it last saw, and when it saw them change.
    pub(crate) silence: std::sync::Mutex<Silence<(i64, i64)>>,
}

impl Drop for Database {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for t in tasks.drain(..) {
            t.abort();
        }
    }
}

impl Database {
    /// Open (creating if needed) the database at `cfg.path`, check it,
    /// migrate it and recompute liveness: steps 1 to 5 of the module docs.
    /// No background task runs yet ([`Database::spawn`]).
    pub(crate) async fn open(cfg: SqliteConfig) -> Result<Arc<Database>> {
        Self::open_with(cfg, |opts| opts).await
    }

    /// [`Database::open`], with the connection options adjusted by `tweak`
    /// (tests cap the file's size with `max_page_count`).
    async fn open_with(
        cfg: SqliteConfig,
        tweak: impl FnOnce(SqliteConnectOptions) -> SqliteConnectOptions,
    ) -> Result<Arc<Database>> {
        cfg.check()?;
        let path = cfg.path.clone();
        // Every step is there to write: an I/O error at open is checked
        // against the file's writability like one on a write.
        let refine = |e| refine_write(e, &path);
        if precheck(&path)? {
            inspect(&path, cfg.busy_timeout).await.map_err(refine)?;
        }
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode, NORMAL keeps every committed transaction across a
            // crash of the process; a power loss may lose the last commits
            // but never corrupts the file.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(cfg.busy_timeout);
        let opts = tweak(opts);
        let acquire_timeout = cfg.busy_timeout.max(Duration::from_secs(5)) * 2;
        let readers = SqlitePoolOptions::new()
            .max_connections(cfg.max_connections)
            .acquire_timeout(acquire_timeout)
            .connect_with(opts.clone())
            .await
            .map_err(|e| refine(map_sqlx(e, &path, "connect to the registry database")))?;
        // Opened by the first write (the open's own, just below).
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(acquire_timeout)
            .connect_lazy_with(opts);
        let db = Arc::new(Database::new(readers, writer, cfg));
        if let Err(e) = db.start().await {
            db.close().await;
            return Err(e);
        }
        Ok(db)
    }

    /// Steps 4 and 5 of the module docs.
    async fn start(&self) -> Result<()> {
        let what = "open the registry database";
        let mut tx = self.write_tx(what).await?;
        let res = prepare(tx.conn(), &self.cfg.path, what).await;
        tx.end(res, what).await?;
        let revision = self.version().await?;
        self.bump(revision.0);
        // Every node is noted now, with a full `suspect_after` of grace:
        // its stored status stands until this process has timed it.
        let report = self.sweep_at(None).await?;
        tracing::info!(
            path = %self.cfg.path.display(),
            %revision,
            suspected = report.nodes.suspected.len(),
            removed = report.nodes.removed.len(),
            "opened SQLite registry"
        );
        Ok(())
    }

    /// Run `task` until the database is dropped or closed.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(handle);
    }

    /// The shared state around freshly made pools.
    fn new(readers: SqlitePool, writer: SqlitePool, cfg: SqliteConfig) -> Self {
        let (notify, _) = watch::channel(0);
        Self {
            readers,
            writer,
            cfg,
            write_lock: Mutex::new(()),
            notify,
            tasks: std::sync::Mutex::new(Vec::new()),
            silence: std::sync::Mutex::new(Silence::new()),
        }
    }

    /// Map an sqlx error met while doing `what` on this registry's file.
    pub(crate) fn map(&self, e: sqlx::Error, what: &str) -> Error {
        map_sqlx(e, &self.cfg.path, what)
    }

    pub(crate) fn bump(&self, revision: u64) {
        self.notify.send_if_modified(|v| {
            if revision > *v {
                *v = revision;
                true
            } else {
                false
            }
        });
    }

    /// A write transaction (`BEGIN IMMEDIATE`), holding the in-process
    /// write lock until it ends.
    pub(crate) async fn write_tx(&self, what: &str) -> Result<Tx<'_>> {
        let guard = self.write_lock.lock().await;
        Tx::begin(&self.writer, &self.cfg.path, Some(guard), what).await
    }

    /// A read transaction (`BEGIN`): its reads see one state.
    pub(crate) async fn read_tx(&self, what: &str) -> Result<Tx<'_>> {
        Tx::begin(&self.readers, &self.cfg.path, None, what).await
    }

    /// `(revision, log_floor)`.
    pub(crate) async fn counters(
        &self,
        conn: &mut SqliteConnection,
        what: &str,
    ) -> Result<(u64, u64)> {
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

    pub(crate) async fn version(&self) -> Result<Version> {
        let what = "read the revision";
        let v: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'")
            .fetch_one(&self.readers)
            .await
            .map_err(|e| self.map(e, what))?;
        Ok(Version(to_u64(v)))
    }

    /// Record the new revision and trim the log to `log_len`.
    pub(crate) async fn finish(
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

    pub(crate) async fn trim_log(
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
    pub(crate) async fn commit_ops(&self, ops: Vec<Op>, what: &str) -> Result<Version> {
        let mut tx = self.write_tx(what).await?;
        let res = self.apply_ops(tx.conn(), ops, what).await;
        let (start, rev) = tx.end(res, what).await?;
        self.bump(rev);
        tracing::debug!(path = %self.cfg.path.display(), revision = rev, changes = rev - start, "{what}");
        Ok(Version(rev))
    }

    /// The work of [`Database::commit_ops`] inside its transaction: the
    /// revisions before and after.
    async fn apply_ops(
        &self,
        conn: &mut SqliteConnection,
        ops: Vec<Op>,
        what: &str,
    ) -> Result<(u64, u64)> {
        let (start, floor) = self.counters(conn, what).await?;
        let keys: BTreeSet<EndpointKey> = ops.iter().map(Op::key).collect();
        let mut state = load_rows(conn, &self.cfg.path, &keys, what).await?;
        // A node that registers an endpoint is alive: liveness tracks it
        // from now on, heartbeat or not.
        let nodes: BTreeSet<String> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Register(e) if !e.node.is_empty() => Some(e.node.clone()),
                _ => None,
            })
            .collect();
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
                    let json = encode(&ep)?;
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
        self.seen(conn, &nodes, what).await?;
        let mut gone = Vec::new();
        let mut rows = Vec::new();
        for (key, at) in dirty {
            match state.remove(&key).flatten() {
                None => gone.push(key),
                Some((ep, suspended)) => rows.push((ep, suspended, at)),
            }
        }
        delete_rows(conn, &self.cfg.path, &gone, what).await?;
        store_rows(conn, &self.cfg.path, &rows, what).await?;
        log_rows(conn, &self.cfg.path, &log, what).await?;
        self.finish(conn, start, floor, rev, what).await?;
        Ok((start, rev))
    }

    pub(crate) async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        let rows: Vec<EpRow> =
            sqlx::query_as("SELECT endpoint FROM endpoints WHERE service = ?1 ORDER BY id")
                .bind(service)
                .fetch_all(&self.readers)
                .await
                .map_err(|e| self.map(e, &format!("list {service}")))?;
        rows.into_iter()
            .map(|r| decode(&self.cfg.path, r))
            .collect()
    }

    pub(crate) async fn snapshot(&self) -> Result<Snapshot> {
        let what = "read a snapshot";
        // Both reads see the same state: one read transaction.
        let mut tx = self.read_tx(what).await?;
        let res = async {
            let (rev, _) = self.counters(tx.conn(), what).await?;
            let rows: Vec<EpRow> = sqlx::query_as("SELECT endpoint FROM endpoints")
                .fetch_all(tx.conn())
                .await
                .map_err(|e| self.map(e, what))?;
            Ok((rev, rows))
        }
        .await;
        let (rev, rows) = tx.end(res, what).await?;
        let eps = rows
            .into_iter()
            .map(|r| decode(&self.cfg.path, r))
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot::from_endpoints(Version(rev), eps))
    }

    /// Trim the change log to its last `keep` changes.
    pub(crate) async fn compact(&self, keep: u64) -> Result<()> {
        let what = "compact the change log";
        let mut tx = self.write_tx(what).await?;
        let res = async {
            let (rev, floor) = self.counters(tx.conn(), what).await?;
            self.trim_log(tx.conn(), rev, floor, keep, what).await
        }
        .await;
        tx.end(res, what).await
    }

    /// Whether a write would be accepted, changing nothing anyone can see:
    /// the database file and its `-wal` and `-shm` open for writing (the
    /// operating system's answer: a read-only mount, an immutable file,
    /// permissions), then `BEGIN IMMEDIATE` takes the write lock, a no-op
    /// `UPDATE` of `meta.revision` checks that SQLite will write this file
    /// and that its schema is there, and `ROLLBACK` undoes it. Nothing
    /// reaches the file. A full disk is not detected (only a real write
    /// finds it).
    pub(crate) async fn probe(&self) -> Result<()> {
        let what = "probe that the database accepts writes";
        check_writable(&self.cfg.path, what)?;
        let mut tx = self.write_tx(what).await?;
        let res = touch_meta(tx.conn(), &self.cfg.path, what).await;
        tx.discard(res, what).await
    }

    /// `PRAGMA integrity_check`.
    pub(crate) async fn integrity_check(&self) -> Result<Vec<String>> {
        sqlx::query_scalar::<_, String>("PRAGMA integrity_check")
            .fetch_all(&self.readers)
            .await
            .map_err(|e| self.map(e, "integrity check"))
    }

    /// Stop the background tasks, close every connection, and wake the
    /// watchers (their next read fails and ends their streams).
    pub(crate) async fn close(&self) {
        let tasks: Vec<_> = {
            let mut t = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            t.drain(..).collect()
        };
        for t in tasks {
            t.abort();
        }
        self.writer.close().await;
        self.readers.close().await;
        self.notify.send_modify(|_| {});
    }
}

/// Refuse, without writing anything, a path SQLite must not open.
/// `true` when a non-empty file is there (to be inspected).
fn precheck(path: &Path) -> Result<bool> {
    let p = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(Error::invalid(
            "path",
            format!("{p} is a directory, not an SQLite database file"),
        )),
        // Its content is SQLite's to judge ([`inspect`], read-only): reading
        // the header here through a descriptor of our own, then closing it,
        // would drop the POSIX locks SQLite holds on the file for any other
        // connection of this process (see `error::writable`).
        Ok(m) => Ok(m.len() > 0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => return Ok(false),
            };
            match std::fs::metadata(parent) {
                Ok(m) if m.is_dir() => Ok(false),
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
/// Step 2 of the module docs: look at an existing file through a read-only connection that
/// sets no pragma (no WAL switch, nothing written), and refuse it unless
/// it is ours.
async fn inspect(path: &Path, busy_timeout: Duration) -> Result<()> {
    let what = "inspect the database file before opening it";
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .create_if_missing(false)
        .busy_timeout(busy_timeout)
        .connect()
        .await
        .map_err(|e| not_a_database(map_sqlx(e, path, what), path))?;
    let found = Found::read(&mut conn, path, what)
        .await
        .map_err(|e| not_a_database(e, path));
    if let Err(e) = conn.close().await {
        tracing::debug!(path = %path.display(), error = %e, "closing the inspection connection");
    }
    found?.check_ours(path).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::ErrorKind;

    /// The disk-full path where no tmpfs can be mounted: the writer's
    /// connections cap the file with `max_page_count`, which SQLite
    /// reports as `FULL` on the statement that needs a new page (the
    /// tmpfs test in tests/faults.rs meets it on `COMMIT`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_file_fails_writes_transiently_and_they_succeed_once_it_may_grow() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("registry.db");
        let cfg = SqliteConfig::new(&path).with_sweep_interval(None);
        let db = Database::open_with(cfg, |o| o.pragma("max_page_count", "40"))
            .await
            .expect("open");
        let padded = |i: usize| {
            let mut e = Endpoint::new("fill", format!("e{i:04}"), "127.0.0.1", 80);
            for l in 0..8 {
                e = e.with_label(format!("pad{l}"), "x".repeat(1000));
            }
            e
        };
        let mut acked = Vec::new();
        let mut failures = 0;
        for i in 0..1_000 {
            match db.commit_ops(vec![Op::Register(padded(i))], "fill").await {
                Ok(_) => acked.push(padded(i)),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                    assert!(e.to_string().contains("full"), "{e}");
                    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
                    failures += 1;
                    if failures == 5 {
                        break;
                    }
                }
            }
        }
        assert_eq!(failures, 5, "40 pages never filled");
        // "Space is freed": the writer's connection (the pool holds one)
        // may grow the file again.
        {
            let mut conn = db.writer.acquire().await.expect("the writer");
            sqlx::raw_sql("PRAGMA max_page_count = 1000000")
                .execute(&mut *conn)
                .await
                .expect("raise the cap");
        }
        for i in 1_000..1_005 {
            db.commit_ops(vec![Op::Register(padded(i))], "after")
                .await
                .expect("a write once the file may grow");
            acked.push(padded(i));
        }
        let snap = db.snapshot().await.expect("snapshot");
        for e in &acked {
            assert!(snap.list("fill").contains(e), "{} is gone", e.key());
        }
        assert_eq!(db.integrity_check().await.expect("check"), vec!["ok"]);
        db.close().await;
    }
}
