//! Administration of the registry's file: opening it safely (checking,
//! migrating and inspecting its schema), compacting the change log, the
//! write probe and the integrity check.
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

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};
use waypost::{Error, Result};

use crate::config::SqliteConfig;
use crate::database::Database;
use crate::error::{check_writable, io, map_sqlx, not_a_database, refine_write};
use crate::layout::{prepare, touch_meta, Found};
use crate::liveness::sweep_at;

/// Open (creating if needed) the database at `cfg.path`, check it,
/// migrate it and recompute liveness: steps 1 to 5 of the module docs.
/// No background task runs yet ([`Database::spawn`]).
pub(crate) async fn open(cfg: SqliteConfig) -> Result<Arc<Database>> {
    open_with(cfg, |opts| opts).await
}

/// [`open`], with the connection options adjusted by `tweak`
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
    if let Err(e) = start(&db).await {
        db.close().await;
        return Err(e);
    }
    Ok(db)
}

/// Steps 4 and 5 of the module docs.
async fn start(db: &Database) -> Result<()> {
    let what = "open the registry database";
    let mut tx = db.write_tx(what).await?;
    let res = prepare(tx.conn(), &db.cfg.path, what).await;
    tx.end(res, what).await?;
    let revision = db.version().await?;
    db.bump(revision.0);
    // Every node is noted now, with a full `suspect_after` of grace:
    // its stored status stands until this process has timed it.
    let report = sweep_at(db, None).await?;
    tracing::info!(
        path = %db.cfg.path.display(),
        %revision,
        suspected = report.nodes.suspected.len(),
        removed = report.nodes.removed.len(),
        "opened SQLite registry"
    );
    Ok(())
}

/// Trim the change log to its last `keep` changes.
pub(crate) async fn compact(db: &Database, keep: u64) -> Result<()> {
    let what = "compact the change log";
    let mut tx = db.write_tx(what).await?;
    let res = async {
        let (rev, floor) = db.counters(tx.conn(), what).await?;
        db.trim_log(tx.conn(), rev, floor, keep, what).await
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
pub(crate) async fn probe(db: &Database) -> Result<()> {
    let what = "probe that the database accepts writes";
    check_writable(&db.cfg.path, what)?;
    let mut tx = db.write_tx(what).await?;
    let res = touch_meta(tx.conn(), &db.cfg.path, what).await;
    tx.discard(res, what).await
}

/// `PRAGMA integrity_check`.
pub(crate) async fn integrity_check(db: &Database) -> Result<Vec<String>> {
    sqlx::query_scalar::<_, String>("PRAGMA integrity_check")
        .fetch_all(&db.readers)
        .await
        .map_err(|e| db.map(e, "integrity check"))
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
    use crate::endpoints::{commit_ops, snapshot};
    use waypost::{Endpoint, ErrorKind, Op};

    /// The disk-full path where no tmpfs can be mounted: the writer's
    /// connections cap the file with `max_page_count`, which SQLite
    /// reports as `FULL` on the statement that needs a new page (the
    /// tmpfs test in tests/faults.rs meets it on `COMMIT`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_file_fails_writes_transiently_and_they_succeed_once_it_may_grow() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("registry.db");
        let cfg = SqliteConfig::new(&path).with_sweep_interval(None);
        let db = open_with(cfg, |o| o.pragma("max_page_count", "40"))
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
            match commit_ops(&db, vec![Op::Register(padded(i))], "fill").await {
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
            commit_ops(&db, vec![Op::Register(padded(i))], "after")
                .await
                .expect("a write once the file may grow");
            acked.push(padded(i));
        }
        let snap = snapshot(&db).await.expect("snapshot");
        for e in &acked {
            assert!(snap.list("fill").contains(e), "{} is gone", e.key());
        }
        assert_eq!(integrity_check(&db).await.expect("check"), vec!["ok"]);
        db.close().await;
    }
}
