//! Fault-injection helpers shared by the fault tests: a small tmpfs
//! mounted for one test, the immutable attribute set for one test, page
//! surgery on a closed database file. Every guard undoes its fault when
//! dropped, also when the test panics.

#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::time::Duration;

#[allow(unused_imports)]
pub use waypost_fixtures::fs::{
    fill, immutable_blocks_open_writers, run, with_suffix, Immutable, ReadOnlyFile, Tmpfs,
};

use sha2::{Digest, Sha256};
use waypost_sqlite::SqliteConfig;

/// Settings for fault tests: no background sweep, short busy timeout,
/// a fast log poller.
pub fn cfg(path: &Path) -> SqliteConfig {
    SqliteConfig::new(path)
        .with_sweep_interval(None)
        .with_busy_timeout(Duration::from_millis(200))
        .with_poll_interval(Duration::from_millis(20))
}

/// SHA-256 of a file's bytes.
pub fn sha256(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("read the file");
    Sha256::digest(&bytes).to_vec()
}

/// The page size and the root page of `table`, read with a plain
/// connection from a closed, checkpointed database file.
pub async fn root_page(path: &Path, table: &str) -> (u64, u64) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=ro", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to read the schema");
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("page size");
    let root: i64 = sqlx::query_scalar("SELECT rootpage FROM sqlite_master WHERE name = ?1")
        .bind(table)
        .fetch_one(&mut conn)
        .await
        .expect("root page");
    conn.close().await.expect("close");
    (page_size as u64, root as u64)
}

/// Overwrite page `page` (1-based) of the file at `path` with `bytes`
/// (garbage, or the page's saved content); returns what was there.
pub fn swap_page(path: &Path, page_size: u64, page: u64, bytes: Option<&[u8]>) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open the database file");
    let at = (page - 1) * page_size;
    let mut old = vec![0u8; page_size as usize];
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.read_exact(&mut old).expect("read the page");
    let garbage: Vec<u8> = (0..page_size)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(bytes.unwrap_or(&garbage))
        .expect("write the page");
    f.sync_all().expect("sync");
    old
}

/// `PRAGMA application_id` and `journal_mode` of a closed database file,
/// read with a plain read-only connection.
pub async fn header_of(path: &Path) -> (i32, String) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=ro", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to read the header");
    let id: i32 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(&mut conn)
        .await
        .expect("application_id");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .expect("journal_mode");
    conn.close().await.expect("close");
    (id, mode)
}

/// Run `sql` on the file at `path` with a plain read-write connection
/// that sets no pragma of its own (creating the file if needed).
pub async fn raw_exec(path: &Path, sql: &str) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to write");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .expect("run the SQL");
    conn.close().await.expect("close");
}

/// The names in a directory, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list the directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// One row of `sql`, run on the file at `path` with a plain connection.
pub async fn raw_query<T>(path: &Path, sql: &str) -> T
where
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow> + Send + Unpin,
{
    use sqlx::Connection;
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to query");
    let row: T = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&mut conn)
        .await
        .expect("run the query");
    conn.close().await.expect("close");
    row
}
