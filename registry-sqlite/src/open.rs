//! Opening a registry: checks before SQLite touches the file, a check
//! that the file is ours and sound before anything is written, the
//! connection pool, and schema migrations.
//!
//! In order:
//! 1. the path: a directory, or a file without the SQLite header, is
//!    refused before SQLite opens it;
//! 2. an existing file is inspected through a read-only connection that
//!    sets no pragma: a file that is another application's SQLite
//!    database is refused before anything could switch it to WAL or add
//!    a table to it;
//! 3. the pool connects (WAL mode, `synchronous = NORMAL`);
//! 4. one write transaction (`BEGIN IMMEDIATE`) runs `PRAGMA quick_check(QUICK_CHECK_LIMIT)`,
//!    checks ownership again under the lock, applies the migrations the
//!    file lacks, makes a no-op write to `meta` (`BEGIN IMMEDIATE` alone
//!    succeeds on a file SQLite could only open read-only), and marks an
//!    unmarked file with our `application_id`;
//! 5. liveness is recomputed from `last_seen`, and the background tasks
//!    start.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use registry_api::{Error, Result};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

use crate::config::SqliteConfig;
use crate::core::{touch_meta, Inner};
use crate::error::{io, map_sqlx, refine_write};
use crate::layout::{APPLICATION_ID, MIGRATIONS, OUR_TABLES};
use crate::liveness::sweep_loop;
use crate::watch::poll_log;

/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The most problems `PRAGMA quick_check` reports at open. The check
/// reads every page (its cost grows with the file, a few milliseconds per
/// megabyte), but stops collecting problems at this many; one is enough
/// to refuse the file.
pub(crate) const QUICK_CHECK_LIMIT: u32 = 100;

/// Open (creating if needed) the database at `cfg.path`, check it, migrate
/// it, recompute liveness, and start the background tasks.
pub(crate) async fn open(cfg: SqliteConfig) -> Result<Arc<Inner>> {
    open_with(cfg, |opts| opts).await
}

/// [`open`], with the connection options adjusted by `tweak` (tests cap
/// the file's size with `max_page_count`).
async fn open_with(
    cfg: SqliteConfig,
    tweak: impl FnOnce(SqliteConnectOptions) -> SqliteConnectOptions,
) -> Result<Arc<Inner>> {
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
    let inner = Arc::new(Inner::new(readers, writer, cfg));
    if let Err(e) = start(&inner).await {
        inner.close().await;
        return Err(e);
    }
    let mut tasks = vec![tokio::spawn(poll_log(
        Arc::downgrade(&inner),
        inner.cfg.poll_interval,
    ))];
    if let Some(every) = inner.cfg.sweep_interval {
        tasks.push(tokio::spawn(sweep_loop(Arc::downgrade(&inner), every)));
    }
    *inner.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
    Ok(inner)
}

/// Steps 4 and 5 of the module docs.
async fn start(inner: &Inner) -> Result<()> {
    let what = "open the registry database";
    let mut tx = inner.write_tx(what).await?;
    let res = prepare(tx.conn(), &inner.cfg.path, what).await;
    tx.end(res, what).await?;
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
    Ok(())
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
        Ok(m) if m.len() > 0 => {
            let mut head = Vec::with_capacity(16);
            std::fs::File::open(path)
                .and_then(|f| f.take(16).read_to_end(&mut head))
                .map_err(|e| io(path, "cannot read the registry database", e))?;
            if head.as_slice() == SQLITE_HEADER {
                Ok(true)
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
        Ok(_) => Ok(false),
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

/// What a database file says about its owner.
struct Found {
    application_id: i32,
    /// Its tables, SQLite's own (`sqlite_…`) left out.
    tables: Vec<String>,
}

impl Found {
    async fn read(conn: &mut SqliteConnection, path: &Path, what: &str) -> Result<Self> {
        let application_id: i32 = sqlx::query_scalar("PRAGMA application_id")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, path, what))?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| map_sqlx(e, path, what))?;
        Ok(Self {
            application_id,
            tables,
        })
    }

    /// Whether the file is ours; `Ok(true)` when it still has to be
    /// marked (an empty database, or one written by a release before
    /// `application_id` was set), `Ok(false)` when it is marked already.
    /// Another application's database is refused, naming the path.
    fn check_ours(&self, path: &Path) -> Result<bool> {
        let p = path.display();
        match self.application_id {
            APPLICATION_ID => Ok(false),
            0 if self.tables.is_empty() => Ok(true),
            0 if OUR_TABLES
                .iter()
                .all(|t| self.tables.iter().any(|have| have == t)) =>
            {
                Ok(true)
            }
            0 => {
                let mut shown = self.tables.iter().take(5).cloned().collect::<Vec<_>>();
                if self.tables.len() > shown.len() {
                    shown.push("…".into());
                }
                Err(Error::invalid(
                    "path",
                    format!(
                        "{p} is another application's SQLite database (its tables: {}; no \
                         registry-sqlite schema); the file was left untouched",
                        shown.join(", ")
                    ),
                ))
            }
            other => Err(Error::invalid(
                "path",
                format!(
                    "{p} belongs to another application (its application_id is {other:#010x}, \
                     registry-sqlite files have {APPLICATION_ID:#010x}); the file was left \
                     untouched"
                ),
            )),
        }
    }
}

/// Step 2: look at an existing file through a read-only connection that
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
        .map_err(|e| map_sqlx(e, path, what))?;
    let found = Found::read(&mut conn, path, what).await;
    if let Err(e) = conn.close().await {
        tracing::debug!(path = %path.display(), error = %e, "closing the inspection connection");
    }
    found?.check_ours(path).map(drop)
}

/// Step 4, inside the open's write transaction.
async fn prepare(conn: &mut SqliteConnection, path: &Path, what: &str) -> Result<()> {
    let checking = format!("{what}: PRAGMA quick_check({QUICK_CHECK_LIMIT})");
    let problems: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "PRAGMA quick_check({QUICK_CHECK_LIMIT})"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| map_sqlx(e, path, &checking))?;
    if problems != ["ok"] {
        let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
        return Err(Error::internal(format!(
            "{checking} on {}: the file is corrupt: {} problem(s) found: {}; restore it from \
             a backup (nothing was written)",
            path.display(),
            problems.len(),
            shown.join("; ")
        )));
    }
    let owner = format!("{what}: check who owns the file");
    let unmarked = Found::read(conn, path, &owner).await?.check_ours(path)?;
    migrate(conn, path).await?;
    // BEGIN IMMEDIATE alone succeeds on a file SQLite had to open
    // read-only (an immutable file, a read-only mount); a write does not.
    touch_meta(conn, path, &format!("{what}: a no-op write to meta")).await?;
    if unmarked {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "PRAGMA application_id = {APPLICATION_ID}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx(e, path, what))?;
        tracing::info!(path = %path.display(), application_id = APPLICATION_ID, "marked the file as a registry-sqlite database");
    }
    Ok(())
}

/// Apply every migration the file lacks.
async fn migrate(conn: &mut SqliteConnection, path: &Path) -> Result<()> {
    let what = "migrate the schema";
    let err = |e| map_sqlx(e, path, what);
    sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let have: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        .fetch_one(&mut *conn)
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
        sqlx::raw_sql(*sql).execute(&mut *conn).await.map_err(err)?;
        sqlx::query("INSERT INTO schema_version (version) VALUES (?1)")
            .bind(i as i64 + 1)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        tracing::info!(path = %path.display(), version = i + 1, "applied schema migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::{Endpoint, ErrorKind, Op};

    fn found(id: i32, tables: &[&str]) -> Found {
        Found {
            application_id: id,
            tables: tables.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn ownership() {
        let p = Path::new("/x/r.db");
        assert!(!found(APPLICATION_ID, &["anything"])
            .check_ours(p)
            .expect("ours"));
        assert!(found(0, &[]).check_ours(p).expect("empty"));
        let previous = ["changes", "endpoints", "meta", "nodes", "schema_version"];
        assert!(found(0, &previous).check_ours(p).expect("previous release"));
        let err = found(0, &["invoices", "meta"])
            .check_ours(p)
            .expect_err("foreign");
        assert!(err.to_string().contains("/x/r.db") && err.to_string().contains("invoices"));
        let err = found(0x1234, &previous)
            .check_ours(p)
            .expect_err("marked by another");
        assert!(err.to_string().contains("0x00001234"), "{err}");
    }

    /// The disk-full path where no tmpfs can be mounted: the writer's
    /// connections cap the file with `max_page_count`, which SQLite
    /// reports as `FULL` on the statement that needs a new page (the
    /// tmpfs test in tests/faults.rs meets it on `COMMIT`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_file_fails_writes_transiently_and_they_succeed_once_it_may_grow() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("registry.db");
        let cfg = SqliteConfig::new(&path).with_sweep_interval(None);
        let inner = open_with(cfg, |o| o.pragma("max_page_count", "40"))
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
            match inner
                .commit_ops(vec![Op::Register(padded(i))], "fill")
                .await
            {
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
            let mut conn = inner.writer.acquire().await.expect("the writer");
            sqlx::raw_sql("PRAGMA max_page_count = 1000000")
                .execute(&mut *conn)
                .await
                .expect("raise the cap");
        }
        for i in 1_000..1_005 {
            inner
                .commit_ops(vec![Op::Register(padded(i))], "after")
                .await
                .expect("a write once the file may grow");
            acked.push(padded(i));
        }
        let snap = inner.snapshot().await.expect("snapshot");
        for e in &acked {
            assert!(snap.list("fill").contains(e), "{} is gone", e.key());
        }
        assert_eq!(inner.integrity_check().await.expect("check"), vec!["ok"]);
        inner.close().await;
    }
}
