//! Opening a registry: checks before SQLite touches the file, the
//! connection pool, and schema migrations.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use registry_api::{Error, Result};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::{watch, Mutex};

use crate::config::SqliteConfig;
use crate::core::Inner;
use crate::error::{io, map_sqlx};
use crate::layout::MIGRATIONS;
use crate::liveness::sweep_loop;
use crate::watch::poll_log;

/// The first 16 bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Open (creating if needed) the database at `cfg.path`, migrate it,
/// recompute liveness, and start the background tasks.
pub(crate) async fn open(cfg: SqliteConfig) -> Result<Arc<Inner>> {
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
    Ok(inner)
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
