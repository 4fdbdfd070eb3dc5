//! The shared state of a registry (pool, settings, notification channel,
//! background tasks), its transactions, and the endpoint reads and
//! writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use registry_api::{Endpoint, EndpointKey, Error, ErrorKind, Op, Result, Snapshot, Version};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::Sqlite;
use tokio::sync::{watch, Mutex, MutexGuard};
use tokio::task::JoinHandle;

use crate::config::SqliteConfig;
use crate::error::{check_writable, corrupt, map_sqlx, refine_write};
use crate::layout::{
    decode, delete_rows, encode, load_rows, log_rows, store_rows, to_i64, to_u64, EpRow, TOUCH_META,
};

/// What every clone of a [`crate::SqliteRegistry`] shares.
pub(crate) struct Inner {
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
}

/// One transaction on one pooled connection, ended explicitly by
/// [`Tx::end`] (commit when the work inside succeeded, roll back when it
/// failed) or [`Tx::discard`] (roll back).
///
/// `BEGIN`, `COMMIT` and `ROLLBACK` are plain statements here rather than
/// sqlx's `Transaction`, because sqlx 0.9 keeps its own transaction depth
/// beside SQLite's: when a `COMMIT` fails with `FULL` or `IOERR`, SQLite
/// has already rolled the transaction back, `Transaction::commit` returns
/// the error with the transaction still marked open, the `ROLLBACK` its
/// drop queues then fails ("no transaction is active"), the depth stays
/// at 1, and the connection goes back to the pool refusing every later
/// `begin_with` ("attempted to call begin_with at non-zero transaction
/// depth") until a restart.
///
/// The rules, so that no connection returns to its pool inside a
/// transaction or in a state that outlives the failure's cause:
/// - a failed `BEGIN` starts no transaction: the connection goes back,
///   unless the failure was permanent (below);
/// - after a failed statement or `COMMIT`, `ROLLBACK` is run. The
///   connection is closed instead of going back when that fails too
///   (SQLite may have rolled back by itself, or not: the state is
///   unknown), and when the failure was permanent (`Unauthorized`: the
///   connection may be one SQLite opened read-only; `Internal`: it may
///   cache a corrupt page). The pool opens a fresh one when needed, which
///   sees the file as it is by then;
/// - a `Tx` dropped before it ended (its future was cancelled, also while
///   `BEGIN` was on its way) closes its connection, which rolls back
///   whatever was open.
pub(crate) struct Tx<'a> {
    conn: PoolConnection<Sqlite>,
    path: &'a Path,
    /// From just before `BEGIN` until it fails or a `COMMIT`/`ROLLBACK`
    /// succeeds: while set, dropping the `Tx` closes the connection.
    open: bool,
    write: bool,
    /// The in-process write lock, held by write transactions.
    _guard: Option<MutexGuard<'a, ()>>,
}

impl<'a> Tx<'a> {
    async fn begin(
        pool: &SqlitePool,
        path: &'a Path,
        guard: Option<MutexGuard<'a, ()>>,
        what: &str,
    ) -> Result<Tx<'a>> {
        let write = guard.is_some();
        let refine = |e: Error| if write { refine_write(e, path) } else { e };
        let conn = pool
            .acquire()
            .await
            .map_err(|e| refine(map_sqlx(e, path, what)))?;
        let begin = if write { "BEGIN IMMEDIATE" } else { "BEGIN" };
        // Open from before BEGIN is sent: dropped while waiting for it
        // (cancelled), the connection may be inside the transaction.
        let mut tx = Tx {
            conn,
            path,
            open: true,
            write,
            _guard: guard,
        };
        if let Err(e) = sqlx::raw_sql(begin).execute(&mut *tx.conn).await {
            // SQLite starts no transaction when BEGIN fails, so the
            // connection may go back to the pool; not after a permanent
            // failure, though: `BEGIN IMMEDIATE` answers READONLY on a
            // connection whose WAL SQLite could only open read-only, and
            // it would stay so.
            tx.open = false;
            let e = refine(map_sqlx(e, path, what));
            if is_permanent(&e) {
                tx.close_connection(&e);
            }
            return Err(e);
        }
        Ok(tx)
    }

    /// The connection, inside the transaction.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }

    /// Commit if `res` is `Ok`, roll back if it is an error; `res`, or the
    /// error `COMMIT` met (after which the transaction is rolled back).
    pub(crate) async fn end<T>(mut self, res: Result<T>, what: &str) -> Result<T> {
        let value = match res {
            Ok(v) => v,
            Err(e) => {
                let e = self.refine(e);
                self.roll_back(&e).await;
                return Err(e);
            }
        };
        match sqlx::raw_sql("COMMIT").execute(&mut *self.conn).await {
            Ok(_) => {
                self.open = false;
                Ok(value)
            }
            Err(e) => {
                let e = self.refine(map_sqlx(e, self.path, what));
                self.roll_back(&e).await;
                Err(e)
            }
        }
    }

    /// Roll back, whatever `res` says (a probe changes nothing); `res`, or
    /// the error `ROLLBACK` met.
    pub(crate) async fn discard<T>(mut self, res: Result<T>, what: &str) -> Result<T> {
        let res = res.map_err(|e| self.refine(e));
        match &res {
            Err(e) => self.roll_back(e).await,
            Ok(_) => {
                if let Err(e) = sqlx::raw_sql("ROLLBACK").execute(&mut *self.conn).await {
                    let e = self.refine(map_sqlx(e, self.path, what));
                    self.close_connection(&e);
                    return Err(e);
                }
                self.open = false;
            }
        }
        res
    }

    fn refine(&self, e: Error) -> Error {
        if self.write {
            refine_write(e, self.path)
        } else {
            e
        }
    }

    /// After `cause`: `ROLLBACK`, and close the connection when that fails
    /// or `cause` is permanent (see the rules above).
    async fn roll_back(&mut self, cause: &Error) {
        match sqlx::raw_sql("ROLLBACK").execute(&mut *self.conn).await {
            Ok(_) => {
                self.open = false;
                if is_permanent(cause) {
                    self.close_connection(cause);
                }
            }
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "ROLLBACK after a failure failed");
                self.close_connection(cause);
            }
        }
    }

    /// Take the connection out of its pool: it is closed when this `Tx`
    /// drops, and the pool opens a fresh one when needed.
    fn close_connection(&mut self, cause: &Error) {
        tracing::info!(
            path = %self.path.display(),
            error = %cause,
            "closing a database connection after a failure; the next transaction gets a fresh one"
        );
        self.conn.close_on_drop();
        self.open = false;
    }
}

/// A failure after which a connection must not be reused: it may be one
/// SQLite opened read-only (`Unauthorized`), or cache a corrupt page
/// (`Internal`).
fn is_permanent(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Unauthorized | ErrorKind::Internal)
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            // Cancelled between BEGIN and its end: closing the connection
            // rolls back whatever is open.
            tracing::debug!(path = %self.path.display(), "transaction abandoned; closing its connection");
            self.conn.close_on_drop();
        }
    }
}

/// Run [`TOUCH_META`]: the write check of `probe` and of the open.
pub(crate) async fn touch_meta(conn: &mut SqliteConnection, path: &Path, what: &str) -> Result<()> {
    let done = sqlx::query(TOUCH_META)
        .execute(conn)
        .await
        .map_err(|e| map_sqlx(e, path, what))?;
    match done.rows_affected() {
        1 => Ok(()),
        _ => Err(corrupt(path, what, "meta.revision is missing")),
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for t in tasks.drain(..) {
            t.abort();
        }
    }
}

impl Inner {
    /// The shared state around a freshly connected pool.
    pub(crate) fn new(readers: SqlitePool, writer: SqlitePool, cfg: SqliteConfig) -> Self {
        let (notify, _) = watch::channel(0);
        Self {
            readers,
            writer,
            cfg,
            write_lock: Mutex::new(()),
            notify,
            tasks: std::sync::Mutex::new(Vec::new()),
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

    /// The work of [`Inner::commit_ops`] inside its transaction: the
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

    /// Record that `nodes` were seen now: new ones are admitted healthy; a
    /// known one keeps its status (an unhealthy one recovers at the next
    /// sweep, which revives its endpoints).
    async fn seen(
        &self,
        conn: &mut SqliteConnection,
        nodes: &BTreeSet<String>,
        what: &str,
    ) -> Result<()> {
        let now = crate::layout::millis(self.cfg.clock.now());
        for node in nodes {
            sqlx::query(
                "INSERT INTO nodes (id, status, last_seen) VALUES (?1, 'healthy', ?2) \
                 ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen",
            )
            .bind(node)
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        }
        Ok(())
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
