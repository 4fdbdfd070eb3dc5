//! The one place where SQLite, sqlx and file-system errors become
//! [`waypost::Error`]s, and so the one place where transient and
//! permanent are decided. Every message names the database file and what
//! was being done (usually with the key or node involved).
//!
//! | SQLite result (primary code; extended codes seen) | met when | kind | transient |
//! | --- | --- | --- | --- |
//! | `BUSY` 5 (`BUSY_RECOVERY` 261, `BUSY_SNAPSHOT` 517) | another connection or process held the lock past `busy_timeout` | `Unavailable` | yes |
//! | `LOCKED` 6 | a lock held by another connection of this process | `Unavailable` | yes |
//! | `FULL` 13 | the disk (or tmpfs) is full (`ENOSPC`): seen on `COMMIT`, which SQLite then rolls back; or `max_page_count` was reached: seen on the statement | `Unavailable` | yes: writes succeed again once space is freed |
//! | `IOERR` 10 (`IOERR_WRITE` 778, `IOERR_FSYNC` 1034, `IOERR_TRUNCATE` 1546, …) on a read | an I/O error | `Unavailable` | yes |
//! | `IOERR` 10 / `CANTOPEN` 14 on a write, the files still writable | an I/O error | `Unavailable` | yes |
//! | `IOERR` 10 / `CANTOPEN` 14 on a write or at open, the file or its `-wal` or `-shm` not opening for writing (`EROFS`, `EPERM`, `EACCES`) | the store is read-only: a file and `-wal` made immutable (`chattr +i`) while open give `IOERR_WRITE` 778 on `COMMIT`; a read-only mount gives `CANTOPEN` 14 at open (no `-shm` can be created) | `Unauthorized` | no |
//! | `READONLY` 8 (`READONLY_DBMOVED` 1032, …), `PERM` 3, `AUTH` 23 | a connection SQLite had to open read-only: after `chattr +i`, a new connection gets `READONLY` 8 from `BEGIN IMMEDIATE` (its `-wal` opened read-only) or from the first write (its main file opened read-only, as at open; also a file of mode 0444 for a user other than root); the message names the file that does not open for writing | `Unauthorized` | no |
//! | `CORRUPT` 11, `NOTADB` 26 | a corrupt page, a file that is not a database | `Internal` | no |
//! | `CONSTRAINT` 19 | a violated constraint (a bug, or another writer's schema) | `Conflict` | bounded |
//! | `CANTOPEN` 14 on a read or at open | the file cannot be opened | `Unavailable` | yes |
//! | any other code | | `Internal` | no |
//! | sqlx: pool timed out, pool closed, worker stopped, socket I/O | | `Unavailable` | yes |
//! | sqlx: a row or column that does not decode | a corrupt record | `Internal` | no |
//!
//! SQLite reports most operating-system write failures as a generic
//! `IOERR_WRITE` (its `errno` is not reachable through sqlx): an immutable
//! file and a failing disk look the same. So on a write, an `IOERR` or
//! `CANTOPEN` is followed by one check of our own ([`writable`]): the
//! database file and its `-wal` and `-shm` companions are opened for
//! writing (nothing is written, nothing truncated). When the operating
//! system refuses (read-only file system, permission denied, immutable
//! file), the store became read-only and the error is permanent
//! `Unauthorized`; otherwise it stays a transient `Unavailable`.
//!
//! A tmpfs cannot be remounted read-only while SQLite holds the file open
//! for writing (the kernel answers `EBUSY`), so "the mount became
//! read-only" while running is not a state SQLite meets here; a file made
//! immutable is. On tmpfs, `chattr +i` does not stop writes through
//! descriptors already open (ext4 does), so there SQLite goes on writing.
//! `chattr +i` on the `-shm` is not survivable: SQLite writes it through
//! a memory map, and the process gets `SIGBUS`.

use std::path::{Path, PathBuf};

use waypost::Error;

/// SQLite primary result codes we tell apart (the low byte of an extended
/// code).
mod code {
    pub const PERM: i32 = 3;
    pub const BUSY: i32 = 5;
    pub const LOCKED: i32 = 6;
    pub const READONLY: i32 = 8;
    pub const IOERR: i32 = 10;
    pub const CORRUPT: i32 = 11;
    pub const FULL: i32 = 13;
    pub const CANTOPEN: i32 = 14;
    pub const CONSTRAINT: i32 = 19;
    pub const AUTH: i32 = 23;
    pub const NOTADB: i32 = 26;
}

/// The extended SQLite result code of `err`, if it is a database error.
fn sqlite_code(err: &sqlx::Error) -> Option<i32> {
    match err {
        sqlx::Error::Database(db) => Some(db.code().and_then(|c| c.parse().ok()).unwrap_or(-1)),
        _ => None,
    }
}

/// Map an sqlx error met while doing `what` on the database at `path`,
/// following the table in the module docs. A failure inside a write
/// transaction goes through [`refine_write`] as well.
pub(crate) fn map_sqlx(err: sqlx::Error, path: &Path, what: &str) -> Error {
    let p = path.display();
    if let Some(ext) = sqlite_code(&err) {
        let msg = match &err {
            sqlx::Error::Database(db) => db.message().to_string(),
            _ => String::new(),
        };
        return match ext & 0xff {
            code::BUSY => Error::unavailable(format!(
                "{what} on {p}: the database is busy (another connection or process held \
                 the lock longer than busy_timeout): {msg}"
            ))
            .with_source(err),
            code::LOCKED => Error::unavailable(format!(
                "{what} on {p}: a table is locked by another connection of this process: {msg}"
            ))
            .with_source(err),
            code::CONSTRAINT => Error::conflict(format!("{what} on {p}: constraint failed: {msg}")),
            code::READONLY | code::PERM | code::AUTH => Error::unauthorized(format!(
                "{what} on {p}: the database is read-only (SQLite code {ext}): {msg}"
            ))
            .with_source(err),
            code::CORRUPT | code::NOTADB => Error::internal(format!(
                "{what} on {p}: the file is not an SQLite database or is corrupt \
                 (SQLite code {ext}): {msg}"
            ))
            .with_source(err),
            code::FULL => Error::unavailable(format!(
                "{what} on {p}: the disk is full (SQLite code {ext}: {msg}); nothing was \
                 written, and writes succeed again once space is freed"
            ))
            .with_source(err),
            code::CANTOPEN => Error::unavailable(format!(
                "{what} on {p}: unable to open the database file (check that the \
                 directory exists and is writable; SQLite code {ext}): {msg}"
            ))
            .with_source(err),
            code::IOERR => Error::unavailable(format!(
                "{what} on {p}: I/O error (SQLite code {ext}): {msg}"
            ))
            .with_source(err),
            _ => Error::internal(format!("{what} on {p}: SQLite error {ext}: {msg}"))
                .with_source(err),
        };
    }
    match &err {
        sqlx::Error::Io(_) => {
            Error::unavailable(format!("{what} on {p}: I/O error: {err}")).with_source(err)
        }
        sqlx::Error::PoolTimedOut => Error::unavailable(format!(
            "{what} on {p}: no database connection became free in time"
        ))
        .with_source(err),
        sqlx::Error::PoolClosed => {
            Error::unavailable(format!("{what} on {p}: the registry was closed")).with_source(err)
        }
        sqlx::Error::WorkerCrashed => {
            Error::unavailable(format!("{what} on {p}: the SQLite worker thread stopped"))
                .with_source(err)
        }
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => Error::internal(format!(
            "{what} on {p}: unexpected data in the database (corrupt record?): {err}"
        ))
        .with_source(err),
        _ => Error::internal(format!("{what} on {p}: {err}")).with_source(err),
    }
}

/// Decide an error met inside a write transaction (a statement, `BEGIN
/// IMMEDIATE` or `COMMIT`) or at open: an `IOERR` or `CANTOPEN` becomes a
/// permanent `Unauthorized` when the store no longer opens for writing
/// ([`writable`]); a `READONLY` says which file refuses writes (a `-wal`
/// that SQLite created read-only, copying the mode of a read-only main
/// file, outlives a `chmod` of that file). Everything else is returned
/// unchanged.
pub(crate) fn refine_write(err: Error, path: &Path) -> Error {
    let code = sqlx_source(&err).and_then(sqlite_code).map(|c| c & 0xff);
    let said = match (&err, code) {
        (Error::Unavailable { message, .. }, Some(code::IOERR | code::CANTOPEN)) => message,
        (Error::Unauthorized { message, .. }, Some(code::READONLY)) => message,
        _ => return err,
    };
    match writable(path) {
        Err((file, e)) if refuses_writes(&e) => Error::unauthorized(format!(
            "{said}; the store is read-only: {} does not open for writing ({e}), so \
                 writes are refused until it is writable again",
            file.display()
        ))
        .with_source(e),
        _ => err,
    }
}

/// `err` as `InvalidInput` naming `path` when SQLite found the file is not
/// a database (`NOTADB`): the inspection reads it through a read-only
/// connection, so the file was left as it was.
pub(crate) fn not_a_database(err: Error, path: &Path) -> Error {
    let code = sqlx_source(&err).and_then(sqlite_code).map(|c| c & 0xff);
    if code != Some(code::NOTADB) {
        return err;
    }
    Error::invalid(
        "path",
        format!(
            "{} is not an SQLite database (SQLite says: file is not a database); the file \
             was left untouched",
            path.display()
        ),
    )
    .with_source(err)
}

/// The sqlx error an [`Error`] was mapped from, if any ([`Error::with_source`]
/// keeps it behind an `Arc`).
fn sqlx_source(err: &Error) -> Option<&sqlx::Error> {
    let src = std::error::Error::source(err)?;
    src.downcast_ref::<sqlx::Error>().or_else(|| {
        src.downcast_ref::<waypost::error::Cause>()
            .and_then(|shared| shared.downcast_ref::<sqlx::Error>())
    })
}

/// Whether an I/O error says the file may not be written (as opposed to
/// failing for a reason that may pass).
fn refuses_writes(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
    )
}

/// The database file and its `-wal` and `-shm` companions (those that
/// exist).
pub(crate) fn companions(path: &Path) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let p = PathBuf::from(name);
        if p.exists() {
            files.push(p);
        }
    }
    files
}

/// Ask the operating system whether the database file and its companions
/// may be written (`access(2)` with `W_OK`: permissions and a read-only
/// mount), without opening them: the first refusal, with the file it
/// concerns.
///
/// Never by opening the file: closing any descriptor of a file drops every
/// POSIX lock this process holds on it, SQLite's included, and another
/// process opening the database would then take itself for the only one,
/// reset the shared-memory file this process has mapped and kill it with
/// `SIGBUS` (which the probe every few seconds did to a registrar when
/// another process opened its file).
pub(crate) fn writable(path: &Path) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    for file in companions(path) {
        may_write(&file).map_err(|e| (file.clone(), e))?;
    }
    Ok(())
}

#[cfg(unix)]
fn may_write(file: &Path) -> std::io::Result<()> {
    rustix::fs::access(file, rustix::fs::Access::WRITE_OK).map_err(std::io::Error::from)
}

#[cfg(not(unix))]
fn may_write(file: &Path) -> std::io::Result<()> {
    if std::fs::metadata(file)?.permissions().readonly() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the file is read-only",
        ));
    }
    Ok(())
}

/// [`writable`] as a registry error for `what` (used by `probe`):
/// `Unauthorized` when the operating system refuses writes, otherwise the
/// kind of the I/O error.
pub(crate) fn check_writable(path: &Path, what: &str) -> Result<(), Error> {
    match writable(path) {
        Ok(()) => Ok(()),
        Err((file, e)) if refuses_writes(&e) => Err(Error::unauthorized(format!(
            "{what} on {}: {} does not open for writing ({e}): the store is read-only",
            path.display(),
            file.display()
        ))
        .with_source(e)),
        Err((file, e)) => Err(io(&file, &format!("{what}: cannot open for writing"), e)),
    }
}

/// A row that exists but cannot be turned back into a value.
pub(crate) fn corrupt(path: &Path, what: &str, detail: impl std::fmt::Display) -> Error {
    Error::internal(format!(
        "{what} on {}: corrupt record: {detail}",
        path.display()
    ))
}

/// A file-system error met before SQLite was involved.
pub(crate) fn io(path: &Path, what: &str, err: std::io::Error) -> Error {
    let p = path.display();
    match err.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            Error::unauthorized(format!("{what} {p}: {err}")).with_source(err)
        }
        std::io::ErrorKind::NotFound => Error::not_found(format!("{what} {p}: {err}")),
        _ => Error::unavailable(format!("{what} {p}: {err}")).with_source(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::ErrorKind;

    #[test]
    fn pool_errors_are_retryable_and_name_the_path() {
        let e = map_sqlx(sqlx::Error::PoolTimedOut, Path::new("/x/r.db"), "list a");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(e.to_string().contains("/x/r.db"), "{e}");
        let e = map_sqlx(sqlx::Error::RowNotFound, Path::new("/x/r.db"), "read");
        assert_eq!(e.kind(), ErrorKind::Internal);
        assert!(e.to_string().contains("corrupt"), "{e}");
    }

    #[test]
    fn io_errors_keep_their_kind() {
        let nf = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(io(Path::new("a"), "open", nf).kind(), ErrorKind::NotFound);
        let pd = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(
            io(Path::new("a"), "open", pd).kind(),
            ErrorKind::Unauthorized
        );
        let ro = std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem);
        assert!(refuses_writes(&ro));
        let eio = std::io::Error::other("EIO");
        assert!(!refuses_writes(&eio));
    }

    #[test]
    fn a_missing_file_is_not_refused_writes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("none.db");
        let err = check_writable(&missing, "probe").expect_err("missing");
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        std::fs::write(&missing, b"").expect("create");
        check_writable(&missing, "probe").expect("writable");
        // Not an sqlx error: refine_write leaves it alone.
        let e = Error::unavailable("x");
        assert_eq!(refine_write(e, &missing).kind(), ErrorKind::Unavailable);
    }
}
