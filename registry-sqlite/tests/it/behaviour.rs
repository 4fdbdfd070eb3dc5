//! Persistence, bad paths, error mapping, and two handles on one file.

use std::path::Path;
use std::time::Duration;

use waypost::testing::{ep, eventually, next_event};
use waypost::{
    Batch, Endpoint, ErrorKind, Event, Health, Heartbeat, Op, Registry, Snapshot, Version, Watch,
};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

fn cfg(path: &Path) -> SqliteConfig {
    SqliteConfig::new(path).with_sweep_interval(None)
}

async fn open(path: &Path) -> SqliteRegistry {
    SqliteRegistry::open(cfg(path)).await.expect("open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_endpoints_and_versions_and_continues_the_sequence() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = open(&path).await;
    reg.register(ep("api", "a", 1).with_node("n1").with_label("zone", "z1"))
        .await
        .expect("register");
    reg.register(ep("api", "b", 2)).await.expect("register");
    reg.apply(vec![
        Op::Register(ep("db", "x", 3)),
        Op::Deregister(ep("api", "b", 2).key()),
        Op::Register(ep("db", "y", 4).with_health(Health::Unhealthy)),
    ])
    .await
    .expect("apply");
    let before: Snapshot = reg.snapshot().await.expect("snapshot");
    assert_eq!(before.version(), Version(5));
    reg.close().await;
    drop(reg);

    let reg = open(&path).await;
    let after = reg.snapshot().await.expect("snapshot after reopen");
    assert_eq!(
        after.version(),
        before.version(),
        "version changed across restart"
    );
    assert!(
        after.same_endpoints(&before),
        "endpoints changed across restart"
    );
    assert_eq!(reg.version().await.expect("version"), Version(5));

    // The change log survived too: resuming from version 3 sends 4 and 5.
    let mut w = reg.watch(Some(Version(3)));
    let e4 = next_event(&mut w, "change 4").await;
    let e5 = next_event(&mut w, "change 5").await;
    assert!(
        matches!(&e4, Event::Removed { version: Version(4), key } if key.id == "b"),
        "{e4:?}"
    );
    assert!(
        matches!(&e5, Event::Added { version: Version(5), endpoint } if endpoint.id == "y"),
        "{e5:?}"
    );
    // New writes continue the sequence, and the resumed watch sees them.
    reg.register(ep("api", "c", 5))
        .await
        .expect("register after reopen");
    match next_event(&mut w, "change 6").await {
        Event::Added { version, endpoint } => {
            assert_eq!(version, Version(6));
            assert_eq!(endpoint.id, "c");
        }
        other => panic!("expected Added at 6, got {other:?}"),
    }

    // Even with the log emptied, versions never go back after a restart.
    reg.compact(0).await.expect("compact");
    reg.close().await;
    drop(reg);
    let reg = open(&path).await;
    assert_eq!(reg.version().await.expect("version"), Version(6));
    let mut w = reg.watch(Some(Version(5)));
    match next_event(&mut w, "a fresh snapshot").await {
        Event::Snapshot(s) => assert_eq!((s.version(), s.len()), (Version(6), 4)),
        other => panic!("history is gone, expected a snapshot, got {other:?}"),
    }
    reg.deregister(&ep("api", "a", 1).key())
        .await
        .expect("deregister");
    assert_eq!(reg.version().await.expect("version"), Version(7));
    // Re-registering an identical endpoint is not a change.
    reg.register(ep("api", "c", 5)).await.expect("same again");
    assert_eq!(reg.version().await.expect("version"), Version(7));
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("garbage.db");
    let bytes: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &bytes).expect("write garbage");
    let err = SqliteRegistry::open(cfg(&path))
        .await
        .expect_err("garbage must not open");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("not an SQLite database"), "{err}");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(
        std::fs::read(&path).expect("read back"),
        bytes,
        "the file was changed"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["garbage.db"], "SQLite left files next to it");
}

#[tokio::test]
async fn a_corrupt_database_gives_an_error_naming_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("corrupt.db");
    // The SQLite header followed by garbage: passes the header check, then
    // SQLite itself refuses it.
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend((0..4080u32).map(|i| (i.wrapping_mul(40503) >> 7) as u8));
    std::fs::write(&path, &bytes).expect("write");
    let err = SqliteRegistry::open(cfg(&path))
        .await
        .expect_err("corrupt must not open");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(!err.is_retryable(), "{err}");
    assert_eq!(
        std::fs::read(&path).expect("read back"),
        bytes,
        "the file was changed"
    );
}

#[tokio::test]
async fn a_directory_is_refused_with_its_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = SqliteRegistry::open(cfg(dir.path()))
        .await
        .expect_err("a directory");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.path().display().to_string()) && msg.contains("directory"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_unwritable_location_gives_an_error_naming_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Under a regular file: nothing can be created there, even by root.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").expect("write");
    let under_file = file.join("registry.db");
    let err = SqliteRegistry::open(cfg(&under_file))
        .await
        .expect_err("under a file");
    assert!(
        err.to_string().contains(&under_file.display().to_string()),
        "{err}"
    );
    // In a directory that does not exist.
    let missing = dir.path().join("no-such-dir").join("registry.db");
    let err = SqliteRegistry::open(cfg(&missing))
        .await
        .expect_err("missing dir");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
    // Where the kernel refuses to create files (procfs), so SQLite fails.
    #[cfg(target_os = "linux")]
    {
        let proc_path = Path::new("/proc/registry-sqlite-test.db");
        let err = SqliteRegistry::open(cfg(proc_path))
            .await
            .expect_err("procfs");
        assert!(
            err.to_string().contains("/proc/registry-sqlite-test.db"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_is_a_retryable_error_and_stores_nothing() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path).with_busy_timeout(Duration::from_millis(100)))
        .await
        .expect("open");
    reg.register(ep("api", "a", 1)).await.expect("register");
    let url = format!("sqlite://{}", path.display());
    let mut other = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("second connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("take the write lock");
    let err = reg.register(ep("api", "b", 2)).await.expect_err("locked");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("api/b"), "{err}");
    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("release");
    assert_eq!(
        reg.list("api").await.expect("list"),
        vec![ep("api", "a", 1)]
    );
    reg.register(ep("api", "b", 2))
        .await
        .expect("register once released");
    assert_eq!(reg.list("api").await.expect("list").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file_see_each_other_through_the_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let fast = |p: &Path| cfg(p).with_poll_interval(Duration::from_millis(20));
    // Two independent opens: no in-process channel is shared, only the file.
    let a = SqliteRegistry::open(fast(&path)).await.expect("open a");
    let b = SqliteRegistry::open(fast(&path)).await.expect("open b");
    let mut wb = b.watch(None);
    let Event::Snapshot(_) = next_event(&mut wb, "b's snapshot").await else {
        panic!("no snapshot");
    };
    a.register(ep("svc", "from-a", 1))
        .await
        .expect("register on a");
    // b never wrote: only its log poller can tell it about version 1.
    eventually("b's log poller to see a's write", || async {
        (b.known_version() == Version(1)).then_some(())
    })
    .await;
    match next_event(&mut wb, "a's write on b's watch").await {
        Event::Added { endpoint, version } => {
            assert_eq!(endpoint.id, "from-a");
            assert_eq!(version, Version(1));
        }
        other => panic!("expected Added, got {other:?}"),
    }
    let mut wa = a.watch(Some(Version(1)));
    b.deregister(&ep("svc", "from-a", 1).key())
        .await
        .expect("deregister on b");
    eventually("a's log poller to see b's write", || async {
        (a.known_version() == Version(2)).then_some(())
    })
    .await;
    match next_event(&mut wa, "b's write on a's watch").await {
        Event::Removed { key, version } => {
            assert_eq!((key.id.as_str(), version), ("from-a", Version(2)))
        }
        other => panic!("expected Removed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_behind_the_log_gets_a_fresh_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path).with_log_len(5))
        .await
        .expect("open");
    let mut w = reg.watch(None);
    let Event::Snapshot(s) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot")
    };
    assert_eq!(s.version(), Version::ZERO);
    for i in 1..=20u16 {
        reg.register(ep("svc", &format!("e{i}"), i))
            .await
            .expect("register");
    }
    match next_event(&mut w, "a fresh snapshot").await {
        Event::Snapshot(s) => assert_eq!((s.version(), s.len()), (Version(20), 20)),
        other => panic!("the log holds only 5 changes; expected a snapshot, got {other:?}"),
    }
    // Resuming within the log still works.
    let mut w = reg.watch(Some(Version(16)));
    let ev = next_event(&mut w, "change 17").await;
    assert_eq!(ev.version(), Version(17), "{ev:?}");
}

#[tokio::test]
async fn invalid_writes_store_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let reg = open(&dir.path().join("registry.db")).await;
    let bad = Endpoint::new("svc", "has space", "127.0.0.1", 1);
    let err = reg.register(bad).await.expect_err("invalid id");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = reg
        .apply(vec![
            Op::Register(ep("svc", "ok", 1)),
            Op::Register(ep("svc", "p", 0)),
        ])
        .await
        .expect_err("invalid batch");
    assert!(err.to_string().contains("ops[1].port"), "{err}");
    let err = reg.heartbeat("bad node").await.expect_err("invalid node");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(reg.version().await.expect("version"), Version::ZERO);
    assert!(reg.nodes().await.expect("nodes").is_empty());
}
