//! [`Tx`]: one SQLite transaction on one pooled connection, begun and
//! ended with plain statements, and the rules that keep a connection out
//! of its pool when its state after a failure is unknown.

use std::path::Path;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::Sqlite;
use tokio::sync::MutexGuard;
use waypost::{Error, ErrorKind, Result};

use crate::error::{map_sqlx, refine_write};

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
    /// `BEGIN` (`BEGIN IMMEDIATE` with the write lock `guard`) on a
    /// connection of `pool`.
    pub(crate) async fn begin(
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
