//! Faults met by a registry on a real file: a full disk, a store that is
//! or becomes read-only, corrupt pages, and a watch through a failure.
//! Tests that need root (mount, chattr) print why they skip elsewhere.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use registry_api::testing::ep;
use registry_api::{Batch, Endpoint, EndpointKey, ErrorKind, Heartbeat, Op, Registry};
use registry_sqlite::SqliteRegistry;

use support::{cfg, fill, Tmpfs};

/// An endpoint of about 8 KiB, so that a few writes fill a small disk.
fn padded(i: usize) -> Endpoint {
    let mut e = ep("fill", &format!("e{i:05}"), 1 + (i % 60_000) as u16);
    for l in 0..8 {
        e = e.with_label(format!("pad{l}"), format!("{i:05}-{}", "x".repeat(1000)));
    }
    e
}

fn names_path(err: &registry_api::Error, path: &Path) {
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
                 max_page_count variant (unit test core::tests::a_full_file_…) covers the \
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
        reg.register(padded(i)).await.expect("register with space");
        acked.push(padded(i));
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
