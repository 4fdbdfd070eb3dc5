//! The one place where SQLite, sqlx and file-system errors become
//! [`registry_api::Error`]s. Every message names the database file and
//! what was being done (usually with the key or node involved).

use std::path::Path;

use registry_api::Error;

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

/// Map an sqlx error met while doing `what` on the database at `path`.
///
/// - busy (another process holds the write lock past `busy_timeout`), I/O
///   errors, a full disk, a file that cannot be opened, a closed or
///   exhausted pool → `Unavailable` (retryable);
/// - a table locked within this process, a violated constraint →
///   `Conflict` (retryable);
/// - read-only file or directory, permission denied → `Unauthorized`;
/// - not a database, corrupt file, undecodable row → `Internal`, saying
///   the file is not an SQLite database or is corrupt;
/// - anything else → `Internal`.
pub(crate) fn map_sqlx(err: sqlx::Error, path: &Path, what: &str) -> Error {
    let p = path.display();
    match &err {
        sqlx::Error::Database(db) => {
            let ext: i32 = db.code().and_then(|c| c.parse().ok()).unwrap_or(-1);
            let msg = db.message().to_string();
            match ext & 0xff {
                code::BUSY => Error::unavailable(format!(
                    "{what} on {p}: the database is busy (another connection or process held \
                     the write lock longer than busy_timeout): {msg}"
                ))
                .with_source(err),
                code::LOCKED => Error::Conflict {
                    what: format!("{what} on {p}: a table is locked: {msg}"),
                },
                code::CONSTRAINT => Error::Conflict {
                    what: format!("{what} on {p}: constraint failed: {msg}"),
                },
                code::READONLY | code::PERM | code::AUTH => Error::Unauthorized {
                    message: format!("{what} on {p}: not allowed to write: {msg}"),
                    source: None,
                }
                .with_source(err),
                code::CORRUPT | code::NOTADB => Error::internal(format!(
                    "{what} on {p}: the file is not an SQLite database or is corrupt: {msg}"
                ))
                .with_source(err),
                code::CANTOPEN => Error::unavailable(format!(
                    "{what} on {p}: unable to open the database file (check that the \
                     directory exists and is writable): {msg}"
                ))
                .with_source(err),
                code::IOERR | code::FULL => {
                    Error::unavailable(format!("{what} on {p}: I/O error: {msg}")).with_source(err)
                }
                _ => Error::internal(format!("{what} on {p}: SQLite error {ext}: {msg}"))
                    .with_source(err),
            }
        }
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
        std::io::ErrorKind::PermissionDenied => Error::Unauthorized {
            message: format!("{what} {p}: permission denied"),
            source: None,
        }
        .with_source(err),
        std::io::ErrorKind::NotFound => Error::NotFound {
            what: format!("{what} {p}: {err}"),
        },
        _ => Error::unavailable(format!("{what} {p}: {err}")).with_source(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::ErrorKind;

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
    }
}
