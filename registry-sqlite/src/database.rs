//! [`Database`]: the registry's SQLite file as every clone of a
//! [`crate::SqliteRegistry`] shares it: the connection pools, the settings,
//! the notification channel and the background tasks; transactions
//! ([`crate::tx::Tx`]) on its connections, the revision counters every
//! transaction reads and advances, and sqlx errors mapped with the file's
//! name.
//!
//! What is done with the file lives by concern, as functions over a
//! `&Database`: opening and administration in [`crate::admin`], endpoint
//! reads and writes in [`crate::endpoints`], the `nodes` table in
//! [`crate::nodes`], heartbeats and sweeps in [`crate::liveness`], and the
//! change log read as a stream in [`crate::watch`].

use sqlx::sqlite::{SqliteConnection, SqlitePool};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use waypost::backend::Silence;
use waypost::{Error, Result, Version};

use crate::config::SqliteConfig;
use crate::error::{corrupt, map_sqlx};
use crate::layout::{to_i64, to_u64};
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
    /// The shared state around freshly made pools.
    pub(crate) fn new(readers: SqlitePool, writer: SqlitePool, cfg: SqliteConfig) -> Self {
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

    /// Run `task` until the database is dropped or closed.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(handle);
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
