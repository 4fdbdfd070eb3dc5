//! Tests that need a second process: a crash in the middle of a batch, and
//! two processes sharing one file.
//!
//! The second process is this test binary again, run with
//! `REGISTRY_SQLITE_CHILD` set so that only `zz_child_helper` runs and does
//! the child's part; without the variable that test does nothing.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use waypost::testing::{ep, eventually, next_event, wait_limit};
use waypost::{Batch, Event, Op, Registry, Version, Watch};
use waypost_sqlite::{SqliteConfig, SqliteRegistry};

const CHILD_ENV: &str = "REGISTRY_SQLITE_CHILD";
const BATCH: usize = 60_000;
const BATCH_SERVICE: &str = "crash-batch";

fn cfg(path: &Path) -> SqliteConfig {
    SqliteConfig::new(path)
        .with_sweep_interval(None)
        .with_poll_interval(Duration::from_millis(50))
}

/// Start this test binary as a child doing `task` (see `zz_child_helper`).
fn spawn_child(task: &str, path: &Path) -> (Child, Lines<BufReader<ChildStdout>>) {
    let exe = std::env::current_exe().expect("current test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "processes::zz_child_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{task}\n{}", path.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the child process");
    let out = child.stdout.take().expect("child stdout");
    (child, BufReader::new(out).lines())
}

/// The next line of the child containing `prefix`, within the wait limit.
async fn line_from(lines: &mut Lines<BufReader<ChildStdout>>, prefix: &str) -> String {
    let wait = async {
        loop {
            match lines.next_line().await.expect("read the child's output") {
                Some(l) if l.contains(prefix) => return l,
                Some(_) => {}
                None => panic!("the child exited before printing {prefix:?}"),
            }
        }
    };
    tokio::time::timeout(wait_limit(), wait)
        .await
        .unwrap_or_else(|_| panic!("the child did not print {prefix:?} in time"))
}

fn wal_len(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(PathBuf::from(wal))
        .map(|m| m.len())
        .unwrap_or(0)
}

/// A large batch, with labels so that it spills to the WAL long before it
/// commits.
fn big_batch() -> Vec<Op> {
    (0..BATCH)
        .map(|i| {
            Op::Register(
                ep(BATCH_SERVICE, &format!("e{i:06}"), 1 + (i % 60_000) as u16)
                    .with_node("crash-node")
                    .with_label("padding", "p".repeat(600)),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_in_the_middle_of_a_batch_leaves_all_or_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let before = {
        let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
        reg.register(ep("kept", "k", 1)).await.expect("register");
        let v = reg.version().await.expect("version");
        reg.close().await;
        v
    };

    let (mut child, mut lines) = spawn_child("crash", &path);
    line_from(&mut lines, "BATCH STARTED").await;
    // Wait until the uncommitted batch has written at least 1 MiB of pages
    // to the WAL (or the child says it committed, which would be too late).
    let start_len = wal_len(&path);
    let committed_first = tokio::time::timeout(wait_limit(), async {
        loop {
            if wal_len(&path) > start_len + (1 << 20) {
                return false;
            }
            if let Ok(Ok(Some(l))) =
                tokio::time::timeout(Duration::from_millis(5), lines.next_line()).await
            {
                if l.contains("BATCH COMMITTED") {
                    return true;
                }
            }
        }
    })
    .await
    .expect("the batch neither grew the WAL nor committed in time");
    child.start_kill().expect("SIGKILL the child");
    let status = child.wait().await.expect("wait for the child");
    assert!(!status.success(), "the child was not killed: {status}");
    assert!(
        !committed_first,
        "the batch committed before the kill; make BATCH larger so the kill lands mid-batch"
    );

    let reg = SqliteRegistry::open(cfg(&path))
        .await
        .expect("reopen after the crash");
    assert_eq!(reg.integrity_check().await.expect("integrity"), vec!["ok"]);
    let n = reg.list(BATCH_SERVICE).await.expect("list").len();
    let v = reg.version().await.expect("version");
    assert!(
        n == 0 || n == BATCH,
        "a partial batch survived: {n} of {BATCH}"
    );
    if n == 0 {
        assert_eq!(v, before, "nothing of the batch, but the version moved");
    } else {
        assert_eq!(
            v.0,
            before.0 + BATCH as u64,
            "the whole batch, but not its versions"
        );
    }
    eprintln!("after SIGKILL mid-batch: {n} of {BATCH} endpoints (all or nothing), version {v}");
    assert_eq!(reg.list("kept").await.expect("list").len(), 1);
    // The file goes on working, and the version sequence continues.
    reg.register(ep("kept", "after", 2))
        .await
        .expect("write after the crash");
    assert_eq!(reg.version().await.expect("version"), v.next());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_see_each_others_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("registry.db");
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("open");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("the watch did not start with a snapshot");
    };

    let (mut child, mut lines) = spawn_child("share", &path);
    line_from(&mut lines, "CHILD WATCHING").await;
    // This process never wrote: only its log poller can learn of the
    // child's write (version 1) and wake the watch.
    eventually("the log poller to see the child's write", || async {
        (reg.known_version() >= Version(1)).then_some(())
    })
    .await;
    // The child's write reaches this process's watch through the log.
    loop {
        let ev = next_event(&mut w, "the child's endpoint").await;
        state.apply(&ev);
        if state.contains(&ep("shared", "from-child", 1).key()) {
            break;
        }
    }
    // And this process's write reaches the child's watch.
    reg.register(ep("shared", "from-parent", 2))
        .await
        .expect("register");
    line_from(&mut lines, "CHILD SAW from-parent").await;
    let status = tokio::time::timeout(wait_limit(), child.wait())
        .await
        .expect("the child did not exit")
        .expect("wait");
    assert!(status.success(), "child failed: {status}");
    let ids: Vec<String> = reg
        .list("shared")
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, vec!["from-child", "from-parent"]);
}

/// The child's side of the tests above; does nothing unless run as a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zz_child_helper() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (task, path) = spec.split_once('\n').expect("task and path");
    let path = PathBuf::from(path);
    let reg = SqliteRegistry::open(cfg(&path)).await.expect("child: open");
    match task {
        "crash" => {
            let ops = big_batch();
            println!("BATCH STARTED");
            reg.apply(ops).await.expect("child: apply");
            println!("BATCH COMMITTED");
            // Wait to be killed.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        "share" => {
            let mut w = reg.watch(Some(Version::ZERO));
            reg.register(ep("shared", "from-child", 1))
                .await
                .expect("child: register");
            println!("CHILD WATCHING");
            loop {
                let ev = next_event(&mut w, "the parent's endpoint").await;
                if let Event::Added { endpoint, .. } = &ev {
                    if endpoint.id == "from-parent" {
                        println!("CHILD SAW from-parent");
                        break;
                    }
                }
            }
            reg.close().await;
        }
        other => panic!("unknown child task {other:?}"),
    }
}
