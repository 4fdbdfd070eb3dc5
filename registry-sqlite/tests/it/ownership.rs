//! Which files a registry opens: its own (marked with its
//! `application_id`), an empty one, one written by the previous release
//! (our schema, `application_id` 0, marked on open); not another
//! application's SQLite database, which is left byte for byte as it was;
//! not a file with a corrupt page, found at open.

use crate::support;

use std::path::Path;

use waypost::testing::ep;
use waypost::{ErrorKind, Registry};
use waypost_sqlite::SqliteRegistry;

use support::{cfg, header_of, names_in, raw_exec, root_page, sha256, swap_page};

/// `PRAGMA application_id` of waypost-sqlite files ("rgst").
const APPLICATION_ID: i32 = 0x7267_7374;

async fn refused(path: &Path) -> waypost::Error {
    let err = SqliteRegistry::open(cfg(path))
        .await
        .expect_err("the file must be refused");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error does not name {}: {err}",
        path.display()
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_applications_database_is_refused_and_left_byte_for_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "invoices.db",
            "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); \
             INSERT INTO invoices (total) VALUES (12.5), (99.0);",
        ),
        // Our table names, but marked by someone else.
        (
            "lookalike.db",
            "PRAGMA application_id = 305419896; \
             CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER); \
             CREATE TABLE schema_version (version INTEGER PRIMARY KEY);",
        ),
        // Unmarked, with a `meta` table but not our schema.
        (
            "half.db",
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); \
             INSERT INTO meta VALUES ('owner', 'someone else');",
        ),
    ];
    for (name, sql) in cases {
        let path = dir.path().join(name);
        raw_exec(&path, sql).await;
        let files_before = names_in(dir.path());
        let sha_before = sha256(&path);
        let (_, mode_before) = header_of(&path).await;
        let err = refused(&path).await;
        println!("{name}: {err}");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{name}: {err}");
        assert!(err.to_string().contains("another application"), "{err}");
        assert_eq!(sha256(&path), sha_before, "{name} was changed");
        assert_eq!(
            names_in(dir.path()),
            files_before,
            "files appeared next to {name}"
        );
        let (_, mode_after) = header_of(&path).await;
        assert_eq!(
            mode_after, mode_before,
            "{name} was switched to another journal mode"
        );
        assert_ne!(mode_after, "wal");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_the_previous_release_opens_and_is_marked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    reg.register(ep("old", "a", 1)).await.expect("register");
    reg.close().await;
    drop(reg);
    assert_eq!(
        header_of(&path).await.0,
        APPLICATION_ID,
        "a new file is marked"
    );

    // As the previous release left it: our schema, no application_id.
    raw_exec(&path, "PRAGMA application_id = 0").await;
    assert_eq!(header_of(&path).await.0, 0);
    let reg = SqliteRegistry::open(cfg(&path))
        .await
        .expect("a previous-release file opens");
    assert_eq!(
        reg.list("old").await.expect("list"),
        vec![ep("old", "a", 1)]
    );
    reg.register(ep("old", "b", 2))
        .await
        .expect("and takes writes");
    reg.close().await;
    drop(reg);
    assert_eq!(header_of(&path).await.0, APPLICATION_ID, "it was marked");

    // An empty file (0 bytes) is a new database: ours.
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("create an empty file");
    let reg = SqliteRegistry::open(cfg(&empty))
        .await
        .expect("an empty file opens");
    reg.close().await;
    assert_eq!(header_of(&empty).await.0, APPLICATION_ID);
}

/// Open must refuse a file whose page holding `table`'s root is garbage,
/// naming the path and the corruption, and must not write to it.
async fn corrupt_root_is_refused(table: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    for i in 0..20u16 {
        reg.register(ep("svc", &format!("e{i}"), 1 + i))
            .await
            .expect("register");
    }
    reg.close().await;
    drop(reg);
    assert!(
        !support::with_suffix(&path, "-wal").exists()
            || std::fs::metadata(support::with_suffix(&path, "-wal"))
                .map(|m| m.len())
                .unwrap_or(0)
                == 0,
        "the WAL was not checkpointed on close"
    );
    let (page_size, root) = root_page(&path, table).await;
    swap_page(&path, page_size, root, None);
    let sha_before = sha256(&path);
    let err = refused(&path).await;
    println!("{table} root page {root} corrupt: {err}");
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("corrupt") || msg.contains("malformed"),
        "the error does not say the file is corrupt: {msg}"
    );
    assert_eq!(sha256(&path), sha_before, "the corrupt file was written to");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_page_in_the_change_log_is_found_at_open() {
    corrupt_root_is_refused("changes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_page_in_the_endpoints_table_is_found_at_open() {
    corrupt_root_is_refused("endpoints").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_leaf_page_of_the_change_log_is_found_at_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    for i in 0..200u16 {
        let e = ep("svc", &format!("e{i}"), 1 + i).with_label("pad", "p".repeat(200));
        reg.register(e).await.expect("register");
    }
    reg.close().await;
    drop(reg);
    let (page_size, root) = root_page(&path, "changes").await;
    // The root of a log this long is an interior page (type 5); its
    // right-most child, a leaf, is at bytes 8..12.
    let page = swap_page_read(&path, page_size, root);
    assert_eq!(page[0], 5, "the change log's root is not an interior page");
    let leaf = u64::from(u32::from_be_bytes([page[8], page[9], page[10], page[11]]));
    swap_page(&path, page_size, leaf, None);
    let sha_before = sha256(&path);
    let err = refused(&path).await;
    println!("changes leaf page {leaf} corrupt: {err}");
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    assert!(err.to_string().contains("corrupt"), "{err}");
    assert_eq!(sha256(&path), sha_before, "the corrupt file was written to");
}

/// The bytes of page `page` (1-based).
fn swap_page_read(path: &Path, page_size: u64, page: u64) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("read the file");
    let at = ((page - 1) * page_size) as usize;
    bytes[at..at + page_size as usize].to_vec()
}
