//! Faults met by a registry on a real file: a full disk, a store that is
//! or becomes read-only, corrupt pages, and a watch through a failure.
//! Tests that need root (mount, chattr) print why they skip elsewhere.

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use waypost::testing::{ep, eventually, next_event, wait_limit};
use waypost::{
    coalescing::{Coalescing, CoalescingConfig},
    Batch, Endpoint, EndpointKey, ErrorKind, Event, Heartbeat, Op, Registry, Watch,
};
use waypost_sqlite::SqliteRegistry;

use support::{
    cfg, fill, immutable_blocks_open_writers, raw_exec, raw_query, root_page, sha256, swap_page,
    with_suffix, Immutable, ReadOnlyFile, Tmpfs,
};

/// An endpoint of about 8 KiB, so that a few writes fill a small disk.
fn padded(i: usize) -> Endpoint {
    let mut e = ep("fill", &format!("e{i:05}"), 1 + (i % 60_000) as u16);
    for l in 0..8 {
        e = e.with_label(format!("pad{l}"), format!("{i:05}-{}", "x".repeat(1000)));
    }
    e
}

fn names_path(err: &waypost::Error, path: &Path) {
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error does not name {}: {err}",
        path.display()
    );
}

/// Every key of `acked` is in the registry with the value written.
async fn all_there(reg: &SqliteRegistry, acked: &[Endpoint]) {
    let snap = reg.snapshot().await.expect("snapshot");
    for e in acked {
        let got = snap.list(&e.service);
        assert!(
            got.iter().any(|g| g == e),
            "{} was answered Ok but is gone",
            e.key()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_transiently_and_they_succeed_once_space_is_freed() {
    let mnt = match Tmpfs::mount("1m") {
        Ok(m) => m,
        Err(why) => {
            println!(
                "SKIPPED a_full_disk_fails_writes…: cannot mount a tmpfs ({why}); the \
                 max_page_count variant (unit test open::tests::a_full_file_…) covers the \
                 transaction handling"
            );
            return;
        }
    };
    let path = mnt.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path).with_max_connections(2))
        .await
        .expect("open on the tmpfs");
    let mut acked: Vec<Endpoint> = Vec::new();
    for i in 0..5 {
        // The first belongs to `full-node`, whose heartbeat is tried below.
        let e = padded(i).with_node(if i == 0 { "full-node" } else { "" });
        reg.register(e.clone()).await.expect("register with space");
        acked.push(e);
    }
    let ballast = mnt.path().join("ballast");
    fill(&ballast);

    // Write until the disk refuses; every refusal is transient and says why.
    let mut failures = 0;
    let mut i = 5;
    while failures < 6 {
        assert!(
            i < 5_000,
            "5 000 writes of 8 KiB fitted on a full 1 MiB disk"
        );
        let e = padded(i);
        let res = if i % 2 == 0 {
            reg.register(e.clone()).await
        } else {
            reg.apply(vec![Op::Register(e.clone())]).await
        };
        match res {
            Ok(()) => acked.push(e),
            Err(err) => {
                if failures == 0 {
                    println!("a write on the full disk: {err}");
                }
                failures += 1;
                assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
                assert!(err.is_retryable(), "{err}");
                names_path(&err, &path);
                assert!(err.to_string().contains("full"), "{err}");
            }
        }
        i += 1;
    }
    if let Err(err) = reg.heartbeat("full-node").await {
        assert_eq!(err.kind(), ErrorKind::Unavailable, "heartbeat: {err}");
    }

    // Space comes back: the next writes succeed on the same handle, on
    // every pooled connection.
    std::fs::remove_file(&ballast).expect("remove the ballast");
    for j in 0..8 {
        let e = padded(10_000 + j);
        reg.register(e.clone())
            .await
            .unwrap_or_else(|err| panic!("write {j} after space was freed: {err}"));
        acked.push(e);
    }
    reg.probe().await.expect("probe after space was freed");
    all_there(&reg, &acked).await;
    assert_eq!(reg.integrity_check().await.expect("integrity"), vec!["ok"]);
    reg.close().await;
    drop(reg);

    // And they survive a restart.
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("reopen");
    all_there(&reg, &acked).await;
    let stored: BTreeSet<EndpointKey> = reg
        .list("fill")
        .await
        .expect("list")
        .iter()
        .map(Endpoint::key)
        .collect();
    assert!(stored.len() >= acked.len());
    reg.close().await;
}

/// A registry with a few endpoints at `path`, closed again.
async fn seed(path: &Path, n: usize) -> Vec<Endpoint> {
    let reg = SqliteRegistry::open(cfg(path)).await.expect("open to seed");
    let eps: Vec<Endpoint> = (0..n)
        .map(|i| ep("seed", &format!("s{i}"), 1 + i as u16))
        .collect();
    for e in &eps {
        reg.register(e.clone()).await.expect("seed");
    }
    reg.close().await;
    eps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_file_is_refused_at_open_naming_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let eps = seed(&path, 3).await;
    let guard = match ReadOnlyFile::set(&path) {
        Ok(g) => g,
        Err(why) => {
            println!("SKIPPED a_read_only_file_is_refused…: {why}");
            return;
        }
    };
    let before = sha256(&path);
    let err = SqliteRegistry::open(cfg(&path))
        .await
        .expect_err("a read-only file must not open");
    println!("open of a read-only file: {err}");
    names_path(&err, &path);
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(sha256(&path), before, "the refused file was changed");
    guard.clear();
    let reg = SqliteRegistry::open(cfg(&path))
        .await
        .expect("open once writable");
    all_there(&reg, &eps).await;
    reg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_mount_is_refused_at_open_naming_the_path() {
    let mnt = match Tmpfs::mount("4m") {
        Ok(m) => m,
        Err(why) => {
            println!("SKIPPED a_read_only_mount_is_refused…: cannot mount a tmpfs ({why})");
            return;
        }
    };
    let path = mnt.path().join("registry.db");
    let eps = seed(&path, 3).await;

    // While the registry is open the kernel refuses to remount read-only
    // (a file is open for writing). Should a kernel allow it, writes must
    // then fail for good.
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    match mnt.remount(true) {
        Err(why) => println!("remount read-only while open: refused ({why})"),
        Ok(()) => {
            let err = reg
                .register(ep("seed", "late", 9))
                .await
                .expect_err("a write on a read-only mount");
            println!("a write after a read-only remount: {err}");
            assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
            mnt.remount(false).expect("remount read-write");
        }
    }
    reg.close().await;
    drop(reg);

    mnt.remount(true)
        .expect("remount read-only with the registry closed");
    let err = SqliteRegistry::open(cfg(&path))
        .await
        .expect_err("a read-only mount must not open");
    println!("open on a read-only mount: {err}");
    names_path(&err, &path);
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(!err.is_retryable());
    mnt.remount(false).expect("remount read-write");
    let reg = SqliteRegistry::open(cfg(&path))
        .await
        .expect("open once writable");
    all_there(&reg, &eps).await;
    reg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_made_read_only_while_open_refuses_writes_for_good_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    if let Err(why) = immutable_blocks_open_writers(dir.path()) {
        println!("SKIPPED a_store_made_read_only_while_open…: {why}");
        return;
    }
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    // Owned by `n1`, whose heartbeat is tried below.
    let mut acked: Vec<Endpoint> = (0..5)
        .map(|i| ep("ro", &format!("a{i}"), 1 + i).with_node("n1"))
        .collect();
    for e in &acked {
        reg.register(e.clone())
            .await
            .expect("register while writable");
    }
    reg.probe().await.expect("probe while writable");

    // The file and its WAL become immutable (not the -shm: SQLite writes
    // it through a memory map, and an immutable mapped file faults).
    let guard = Immutable::set(&[path.clone(), with_suffix(&path, "-wal")])
        .expect("chattr +i (checked above)");
    // Before any write fails: the writer's connection is still the one
    // opened read-write, and BEGIN IMMEDIATE, a no-op UPDATE and ROLLBACK
    // all succeed on it; the probe must still see the store is read-only.
    let err = reg.probe().await.expect_err("probe while read-only");
    println!("probe of an immutable store: {err}");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    names_path(&err, &path);
    for attempt in 0..3 {
        let err = reg
            .register(ep("ro", &format!("late{attempt}"), 9))
            .await
            .expect_err("a write to an immutable store");
        println!("write {attempt} to an immutable store: {err}");
        assert_eq!(
            err.kind(),
            ErrorKind::Unauthorized,
            "attempt {attempt}: {err}"
        );
        assert!(!err.is_retryable() && !err.is_request_fault(), "{err}");
        names_path(&err, &path);
        assert!(err.to_string().contains("read-only"), "{err}");
    }
    let err = reg
        .apply(vec![Op::Register(ep("ro", "batch", 9))])
        .await
        .expect_err("a batch");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    let err = reg.heartbeat("n1").await.expect_err("a heartbeat");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    let err = reg.probe().await.expect_err("probe while read-only");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");

    // Through the write queue the failure is final, not retried forever.
    let queue = Coalescing::with_config(
        reg.clone(),
        CoalescingConfig::default().with_retry(Duration::from_millis(5), Duration::from_millis(20)),
    )
    .expect("queue");
    let ticket = queue
        .submit(vec![Op::Register(ep("ro", "queued", 9))])
        .expect("submit");
    let res = tokio::time::timeout(wait_limit(), ticket.durable())
        .await
        .expect("the queued write was retried instead of failing");
    let err = res.expect_err("queued write on a read-only store");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    queue.shutdown().await;

    // Reads go on, and nothing answered Ok was lost.
    all_there(&reg, &acked).await;

    guard.clear();
    reg.probe().await.expect("probe once writable again");
    let e = ep("ro", "after", 10);
    reg.register(e.clone())
        .await
        .expect("a write once writable again");
    acked.push(e);
    all_there(&reg, &acked).await;
    assert_eq!(reg.integrity_check().await.expect("integrity"), vec!["ok"]);
    assert_eq!(reg.list("ro").await.expect("list").len(), acked.len());
    reg.close().await;
}

/// The next item of a watch within the wait limit (`None`: it ended).
async fn next_item(w: &mut waypost::EventStream, what: &str) -> Option<waypost::Result<Event>> {
    tokio::time::timeout(wait_limit(), w.next())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_a_failed_read_and_recovers_with_a_fresh_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    for i in 0..5u16 {
        reg.register(ep("w", &format!("e{i}"), 1 + i))
            .await
            .expect("register");
    }
    let mut w = reg.watch(None);
    let Event::Snapshot(first) = next_event(&mut w, "the first snapshot").await else {
        panic!("a watch starts with a snapshot")
    };
    assert_eq!(first.len(), 5);

    // The fault: the root page of the change log turns to garbage. Only
    // in the main file: the WAL is checkpointed into it first.
    let busy: (i64, i64, i64) = raw_query(&path, "PRAGMA wal_checkpoint(TRUNCATE)").await;
    assert_eq!(busy.0, 0, "the checkpoint was blocked: {busy:?}");
    let (page_size, root) = root_page(&path, "changes").await;
    let saved = swap_page(&path, page_size, root, None);
    // Another process moves the revision on (a write to `meta` only): the
    // watch must read the log to follow, and meets the corrupt page.
    raw_exec(
        &path,
        "UPDATE meta SET value = value + 1 WHERE key = 'revision'",
    )
    .await;
    let err = match next_item(&mut w, "the failure").await {
        Some(Err(e)) => e,
        other => panic!("expected the failure to be reported, got {other:?}"),
    };
    println!("the watch reported: {err}");
    assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
    names_path(&err, &path);

    // Repaired (the page put back, and a write so that every connection
    // drops what it cached): the stream goes on by itself, and its next
    // good item is a fresh snapshot of everything.
    swap_page(&path, page_size, root, Some(&saved));
    raw_exec(
        &path,
        "UPDATE meta SET value = value WHERE key = 'log_floor'",
    )
    .await;
    let mut errors_after = 0;
    let snap = loop {
        match next_item(&mut w, "recovery").await {
            Some(Err(_)) => errors_after += 1,
            Some(Ok(Event::Snapshot(s))) => break s,
            Some(Ok(other)) => panic!("the first good item after a failure is {other:?}"),
            None => panic!("the watch ended instead of retrying"),
        }
    };
    println!("{errors_after} more failed attempt(s) reported before the recovery");
    let now = reg.snapshot().await.expect("snapshot");
    assert_eq!(snap.version(), now.version());
    assert_eq!(
        snap.version(),
        first.version().next(),
        "the bumped revision"
    );
    assert!(snap.same_endpoints(&now));
    assert_eq!(snap.len(), 5);

    // And it follows changes again.
    reg.register(ep("w", "after", 9)).await.expect("register");
    match next_event(&mut w, "a change after recovery").await {
        Event::Added { endpoint, version } => {
            assert_eq!(endpoint.id, "after");
            assert_eq!(version, snap.version().next());
        }
        other => panic!("expected Added, got {other:?}"),
    }
    assert_eq!(reg.integrity_check().await.expect("integrity"), vec!["ok"]);
    reg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_registry_ends_its_watches_after_one_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let reg = SqliteRegistry::open(cfg(&dir.path().join("registry.db")))
        .await
        .expect("open");
    let mut w = reg.watch(None);
    next_event(&mut w, "the snapshot").await;
    reg.close().await;
    match next_item(&mut w, "the close").await {
        Some(Err(e)) => assert!(e.to_string().contains("closed"), "{e}"),
        other => panic!("expected an error item, got {other:?}"),
    }
    assert!(next_item(&mut w, "the end").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_refused_inside_a_write_rolls_back_the_whole_batch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    reg.register(ep("t", "before", 1)).await.expect("register");
    // Someone's trigger refuses one key when its change is logged: the
    // batch's endpoint rows are written by then, in the same transaction.
    raw_exec(
        &path,
        "CREATE TRIGGER refuse_forbidden BEFORE INSERT ON changes \
         WHEN NEW.id = 'forbidden' BEGIN SELECT RAISE(ABORT, 'forbidden by a trigger'); END;",
    )
    .await;
    let before = reg.snapshot().await.expect("snapshot");
    for attempt in 0..3 {
        let err = reg
            .apply(vec![
                Op::Register(ep("t", &format!("ok{attempt}"), 2)),
                Op::Register(ep("t", "forbidden", 3)),
            ])
            .await
            .expect_err("the trigger refuses the batch");
        println!("a batch refused by a trigger: {err}");
        assert_eq!(err.kind(), ErrorKind::Conflict, "attempt {attempt}: {err}");
        assert!(err.to_string().contains("forbidden by a trigger"), "{err}");
    }
    let after = reg.snapshot().await.expect("snapshot");
    assert_eq!(
        after.version(),
        before.version(),
        "a refused batch moved the version"
    );
    assert!(
        after.same_endpoints(&before),
        "a refused batch left rows behind"
    );
    // The connection went back clean: the next writes succeed.
    reg.register(ep("t", "after", 4))
        .await
        .expect("a write after the refusal");
    reg.apply(vec![Op::Deregister(ep("t", "before", 1).key())])
        .await
        .expect("a batch after the refusal");
    assert_eq!(
        reg.list("t").await.expect("list"),
        vec![ep("t", "after", 4)]
    );
    reg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cancelled_mid_transaction_leaves_nothing_and_the_next_succeeds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    reg.register(ep("cancel", "before", 1))
        .await
        .expect("register");
    let wal_before = wal_len(&path);
    // A batch large enough to spill to the WAL long before it commits.
    let big: Vec<Op> = (0..60_000u32)
        .map(|i| {
            Op::Register(
                ep("cancel", &format!("e{i:06}"), 1 + (i % 60_000) as u16)
                    .with_label("pad", "p".repeat(600)),
            )
        })
        .collect();
    let task = tokio::spawn({
        let reg = reg.clone();
        async move { reg.apply(big).await }
    });
    // Inside its transaction (the WAL grows), the write is dropped.
    eventually("the batch to spill to the WAL", || async {
        (wal_len(&path) > wal_before + 1_000_000).then_some(())
    })
    .await;
    task.abort();
    match task.await {
        Err(e) if e.is_cancelled() => {}
        other => panic!("the batch was not cancelled mid-transaction: {other:?}"),
    }
    // The next writes succeed (on a fresh connection: the cancelled one
    // is closed, which rolls its transaction back).
    tokio::time::timeout(wait_limit(), reg.register(ep("cancel", "after", 2)))
        .await
        .expect("the write after a cancelled one hung")
        .expect("a write after a cancelled one");
    reg.apply(vec![Op::Register(ep("cancel", "after2", 3))])
        .await
        .expect("another write");
    // All or nothing: nothing of the cancelled batch.
    assert_eq!(
        reg.list("cancel").await.expect("list"),
        vec![
            ep("cancel", "after", 2),
            ep("cancel", "after2", 3),
            ep("cancel", "before", 1)
        ]
    );
    assert_eq!(reg.integrity_check().await.expect("integrity"), vec!["ok"]);
    reg.close().await;
}

/// The size of the file's WAL (0 when there is none).
fn wal_len(path: &Path) -> u64 {
    std::fs::metadata(with_suffix(path, "-wal"))
        .map(|m| m.len())
        .unwrap_or(0)
}
