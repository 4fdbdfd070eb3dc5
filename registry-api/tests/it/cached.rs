//! `CachedRegistry` and `Polling`: outages, stream drops, resumes, and the
//! conformance suite through the combinators.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rand::RngExt;
use waypost::testing::{ep, eventually, next_event, Faulty};
use waypost::{
    cached::{CachedConfig, CachedRegistry},
    coalescing::Coalescing,
    memory::MemoryRegistry,
    polling::{Polling, PollingConfig},
    ErrorKind, Event, Registry, Snapshot, Version, Watch,
};

fn fast() -> CachedConfig {
    CachedConfig::default().with_reconnect(Duration::from_millis(1), Duration::from_millis(5))
}

#[tokio::test]
async fn outage_serves_last_known_good_then_resumes() {
    let cached = CachedRegistry::with_config(Faulty::new(MemoryRegistry::new()), fast()).unwrap();
    cached.wait_until_ready().await;
    cached.register(ep("s", "a", 1)).await.unwrap();
    cached.register(ep("s", "b", 2)).await.unwrap();
    assert_eq!(cached.cache_age(), Some(Duration::ZERO));

    cached.get_ref().set_down(true);
    eventually("the cache to notice the outage", || async {
        cached.cache_age().filter(|a| !a.is_zero())
    })
    .await;
    // Reads go on from the last-known-good state; writes say why they fail.
    assert_eq!(cached.list("s").await.unwrap().len(), 2);
    assert_eq!(cached.snapshot().await.unwrap().len(), 2);
    let err = cached.register(ep("s", "c", 3)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);

    // The backend changes while the cache is cut off, then comes back.
    cached
        .get_ref()
        .get_ref()
        .register(ep("s", "c", 3))
        .await
        .unwrap();
    let before = cached.get_ref().watch_froms().len();
    cached.get_ref().set_down(false);
    eventually("the cache to catch up", || async {
        (cached.list("s").await.unwrap().len() == 3).then_some(())
    })
    .await;
    assert_eq!(cached.cache_age(), Some(Duration::ZERO));
    let froms = cached.get_ref().watch_froms();
    assert!(froms.len() > before);
    assert!(
        froms[1..].iter().all(Option::is_some),
        "a reconnect did not resume from a version: {froms:?}"
    );
}

#[tokio::test]
async fn before_the_first_snapshot_reads_go_to_the_inner_registry() {
    let inner = Faulty::new(MemoryRegistry::new());
    inner.get_ref().register(ep("s", "a", 1)).await.unwrap();
    inner.set_down(true);
    let cached = CachedRegistry::with_config(inner, fast()).unwrap();
    assert!(!cached.is_ready());
    assert_eq!(cached.cache_age(), None);
    // The inner registry is down and there is no cache yet: the error shows.
    let err = cached.list("s").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    cached.get_ref().set_down(false);
    cached.wait_until_ready().await;
    assert_eq!(cached.list("s").await.unwrap(), vec![ep("s", "a", 1)]);
}

/// A write made while the cache's first snapshot is still on its way
/// returns once the cache holds it, so a watch opened after it starts from
/// a state with the write and then sees the next change as a change (the
/// README's one-screen code: register, watch, deregister, see `Removed`).
#[tokio::test]
async fn a_write_before_the_first_snapshot_returns_once_the_cache_holds_it() {
    let inner = Faulty::new(MemoryRegistry::new());
    inner.hold_watches(true);
    let cached = Arc::new(CachedRegistry::with_config(inner, fast()).unwrap());
    let release = {
        let cached = Arc::clone(&cached);
        tokio::spawn(async move {
            eventually("the write to reach the backend", || async {
                let held = cached.get_ref().get_ref().list("s").await.unwrap();
                (!held.is_empty()).then_some(())
            })
            .await;
            cached.get_ref().hold_watches(false);
        })
    };
    cached.register(ep("s", "a", 1)).await.unwrap();
    assert!(
        cached.is_ready(),
        "the write returned before the cache had a snapshot"
    );
    release.await.unwrap();

    let mut events = cached.watch(None);
    cached.deregister(&ep("s", "a", 1).key()).await.unwrap();
    match next_event(&mut events, "the first snapshot").await {
        Event::Snapshot(s) => assert_eq!(s.len(), 1, "the snapshot misses the write: {s:?}"),
        other => panic!("expected a snapshot first, got {other:?}"),
    }
    match next_event(&mut events, "the deregistration").await {
        Event::Removed { key, .. } => assert_eq!(key, ep("s", "a", 1).key()),
        other => panic!("expected the deregistration, got {other:?}"),
    }
}

/// 100 random stream drops while the backend changes: local subscribers see
/// every change exactly once, in order, and the cache ends equal to the
/// backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_stream_drops_lose_and_repeat_nothing() {
    // Room enough that neither the backend's history nor the local buffer
    // runs out: this test is about upstream drops only.
    let cached = Arc::new(
        CachedRegistry::with_config(
            Faulty::new(MemoryRegistry::with_history(1 << 16)),
            fast().with_buffer(1 << 16),
        )
        .unwrap(),
    );
    cached.wait_until_ready().await;
    let mut local = cached.watch(None);
    let Event::Snapshot(start) = next_event(&mut local, "snapshot").await else {
        panic!("no snapshot first");
    };
    let cutting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let cached = Arc::clone(&cached);
        let cutting = Arc::clone(&cutting);
        tokio::spawn(async move {
            let inner = cached.get_ref().get_ref();
            // Write until the cutter is done (bounded all the same).
            for i in 0..30_000u64 {
                if i >= 600 && !cutting.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let id = format!("k{}", i % 37);
                if i % 5 == 4 {
                    inner.deregister(&ep("s", &id, 1).key()).await.unwrap();
                } else {
                    inner
                        .register(ep("s", &id, (i % 60_000 + 1) as u16))
                        .await
                        .unwrap();
                }
                if i % 3 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let cutter = {
        let cached = Arc::clone(&cached);
        let cutting = Arc::clone(&cutting);
        tokio::spawn(async move {
            for round in 1..=100 {
                // Cut only a live stream: wait for the reconnect first.
                eventually("the cache to reconnect", || async {
                    (cached.get_ref().watch_froms().len() >= round).then_some(())
                })
                .await;
                let pause = rand::rng().random_range(0..400u64);
                tokio::time::sleep(Duration::from_micros(pause)).await;
                cached.get_ref().cut_streams();
            }
            cutting.store(false, std::sync::atomic::Ordering::SeqCst);
        })
    };
    cutter.await.unwrap();
    writer.await.unwrap();
    let inner_now = cached.get_ref().get_ref().snapshot().await.unwrap();
    let mut state: Snapshot = start.clone();
    let mut versions = Vec::new();
    while !(state.same_endpoints(&inner_now) && state.version() == inner_now.version()) {
        let ev = next_event(&mut local, "the local watch to catch up").await;
        assert!(
            !matches!(ev, Event::Snapshot(_)),
            "a resumable upstream should never force a snapshot"
        );
        versions.push(ev.version().0);
        state.apply(&ev);
    }
    // The memory backend numbers every real change; no-op writes (deregister
    // of an absent key) have none. Seen versions must be strictly increasing
    // (nothing twice, nothing reordered) and match the backend's history.
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "repeated or reordered"
    );
    assert_eq!(
        versions.len() as u64,
        inner_now.version().0 - start.version().0,
        "lost changes"
    );
    let cache = cached.snapshot().await.unwrap();
    assert!(cache.same_endpoints(&inner_now));
    let watches = cached.get_ref().watch_froms().len();
    assert!(watches > 100, "only {watches} watch calls for 100 drops");
}

#[tokio::test]
async fn local_watchers_resume_from_the_cache_history() {
    let cached = CachedRegistry::with_config(MemoryRegistry::new(), fast()).unwrap();
    cached.register(ep("s", "a", 1)).await.unwrap();
    let mut w = cached.watch(None);
    let Event::Snapshot(s) = next_event(&mut w, "snapshot").await else {
        panic!()
    };
    drop(w);
    cached.register(ep("s", "b", 2)).await.unwrap();
    let mut w = cached.watch(Some(s.version()));
    match next_event(&mut w, "the missed change").await {
        Event::Added { endpoint, version } => {
            assert_eq!(endpoint, ep("s", "b", 2));
            assert!(version > s.version());
        }
        other => panic!("expected the missed Added, got {other:?}"),
    }
}

mod cached_memory {
    use super::*;
    type Reg = CachedRegistry<MemoryRegistry>;
    async fn make() -> Reg {
        let c =
            CachedRegistry::with_config(MemoryRegistry::new(), fast().with_history(64)).unwrap();
        c.wait_until_ready().await;
        c
    }
    async fn lose_history(reg: &Reg) {
        waypost::testing::overflow_history(reg, 70).await;
    }
    waypost::conformance_tests!(make, lose_history);
}

mod cached_coalescing_memory {
    use super::*;
    type Reg = CachedRegistry<Coalescing<MemoryRegistry>>;
    async fn make() -> Reg {
        let c = CachedRegistry::with_config(
            Coalescing::new(MemoryRegistry::new()),
            fast().with_history(64),
        )
        .unwrap();
        c.wait_until_ready().await;
        c
    }
    async fn lose_history(reg: &Reg) {
        waypost::testing::overflow_history(reg, 70).await;
    }
    waypost::conformance_tests!(make, lose_history);
}

mod polling_memory {
    use super::*;
    type Reg = Polling<MemoryRegistry>;
    async fn make() -> Reg {
        Polling::with_config(
            MemoryRegistry::new(),
            PollingConfig::default()
                .with_interval(Duration::from_millis(10))
                .with_history(64),
        )
        .unwrap()
    }
    async fn lose_history(reg: &Reg) {
        waypost::testing::overflow_history(reg, 70).await;
    }
    waypost::conformance_tests!(make, lose_history);
}

/// A failed poll is reported on the stream (not hidden), the stream goes
/// on, and the first item after recovery is a fresh snapshot holding what
/// changed meanwhile, at a higher version.
#[tokio::test]
async fn polling_reports_failed_polls_then_sends_a_fresh_snapshot() {
    let poll = Polling::with_config(
        Faulty::new(MemoryRegistry::new()),
        PollingConfig::default().with_interval(Duration::from_millis(5)),
    )
    .unwrap();
    let mut w = poll.watch(None);
    let Event::Snapshot(state) = next_event(&mut w, "snapshot").await else {
        panic!()
    };
    let first = state.version();
    assert!(
        first > Version(1_600_000_000_000_000),
        "versions start at the clock"
    );
    poll.get_ref().set_down(true);
    let reported = tokio::time::timeout(waypost::testing::wait_limit(), w.next())
        .await
        .expect("a failed poll was not reported");
    match reported {
        Some(Err(e)) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        other => panic!("expected the failure on the stream, got {other:?}"),
    }
    poll.get_ref()
        .get_ref()
        .register(ep("s", "a", 1))
        .await
        .unwrap();
    poll.get_ref().set_down(false);
    loop {
        match tokio::time::timeout(waypost::testing::wait_limit(), w.next()).await {
            Ok(Some(Err(_))) => continue, // more failed polls before the recovery
            Ok(Some(Ok(Event::Snapshot(s)))) => {
                assert!(s.version() > first);
                assert_eq!(s.list("s"), vec![ep("s", "a", 1)]);
                break;
            }
            other => panic!("after a failure the next item must be a snapshot, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn hub_cuts_off_a_stalled_subscriber_and_serves_the_rest() {
    let hub = Arc::new(waypost::backend::Hub::new(64, 1024));
    let total = 1000u64;
    let stalled = hub.subscribe(None);
    let mut active = Vec::new();
    for _ in 0..100 {
        let mut sub = hub.subscribe(None);
        active.push(tokio::spawn(async move {
            let mut versions = Vec::new();
            while let Some(ev) = sub.next().await {
                let ev = ev.expect("an active subscriber was cut off");
                if let Event::Removed { version, .. } = ev {
                    versions.push(version.0);
                    if version.0 == total {
                        break;
                    }
                }
            }
            versions
        }));
    }
    for v in 1..=total {
        hub.publish([Event::Removed {
            version: Version(v),
            key: ep("s", &v.to_string(), 1).key(),
        }]);
        if v % 16 == 0 {
            // Let the active subscribers run; the stalled one never does.
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
    }
    for task in active {
        let versions = task.await.unwrap();
        assert_eq!(versions, (1..=total).collect::<Vec<_>>());
    }
    let items: Vec<_> = stalled.collect().await;
    let (last, before) = items.split_last().unwrap();
    assert!(matches!(before[0], Ok(Event::Snapshot(_))));
    assert!(before.iter().all(Result::is_ok));
    let err = last.as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert!(err.to_string().contains("resubscribe"), "{err}");
    // Finished subscribers are dropped at the next publish.
    hub.publish([Event::Removed {
        version: Version(total + 1),
        key: ep("s", "x", 1).key(),
    }]);
    assert_eq!(hub.subscriber_count(), 0);
}

/// A change applied with the cache's `Writer` (beside the inner registry)
/// is seen at once, numbered on the cache's own sequence, and the inner
/// registry's echo of the same value is not seen again.
#[tokio::test]
async fn local_changes_are_seen_once_with_local_versions() {
    let (cached, local) =
        CachedRegistry::with_local_writes(MemoryRegistry::new(), fast().with_local_versions(true))
            .unwrap();
    cached.wait_until_ready().await;
    let mut w = cached.watch(None);
    let Event::Snapshot(s) = next_event(&mut w, "snapshot").await else {
        panic!()
    };
    assert!(
        s.version() > Version(1_600_000_000_000_000),
        "local versions start at the clock"
    );
    let e = ep("s", "a", 1);
    let published = local.apply(Event::Added {
        version: Version::ZERO,
        endpoint: e.clone(),
    });
    assert_eq!(published.len(), 1);
    // Visible at once, before the inner registry has it.
    assert_eq!(cached.list("s").await.unwrap(), vec![e.clone()]);
    assert!(cached.get_ref().list("s").await.unwrap().is_empty());
    let Event::Added { version: v1, .. } = next_event(&mut w, "the optimistic add").await else {
        panic!()
    };
    assert!(v1 > s.version());
    // The inner write arrives through the watch and is recognised as a repeat.
    cached.get_ref().register(e.clone()).await.unwrap();
    cached.get_ref().register(ep("s", "b", 2)).await.unwrap();
    match next_event(&mut w, "the next real change").await {
        Event::Added { endpoint, version } => {
            assert_eq!(endpoint, ep("s", "b", 2), "the repeat of a was not dropped");
            assert_eq!(version, v1.next());
        }
        other => panic!("{other:?}"),
    }
}

/// `resync` reads the inner registry's whole state again: what the cache
/// believed and the inner registry does not hold is removed, and local
/// watchers get that difference.
#[tokio::test]
async fn resync_replaces_what_the_cache_believed() {
    let (cached, local) =
        CachedRegistry::with_local_writes(MemoryRegistry::new(), fast().with_local_versions(true))
            .unwrap();
    cached.wait_until_ready().await;
    let real = ep("s", "real", 1);
    cached.get_ref().register(real.clone()).await.unwrap();
    let phantom = ep("s", "phantom", 1);
    local.apply(Event::Added {
        version: Version::ZERO,
        endpoint: phantom.clone(),
    });
    eventually("the cache to hold both", || async {
        (cached.list("s").await.unwrap().len() == 2).then_some(())
    })
    .await;
    let mut w = cached.watch(None);
    let Event::Snapshot(_) = next_event(&mut w, "snapshot").await else {
        panic!()
    };
    tokio::time::timeout(waypost::testing::wait_limit(), cached.resync())
        .await
        .expect("the resync did not finish");
    assert_eq!(cached.list("s").await.unwrap(), vec![real]);
    match next_event(&mut w, "the phantom's removal").await {
        Event::Removed { key, .. } => assert_eq!(key, phantom.key()),
        other => panic!("{other:?}"),
    }
}

mod cached_memory_local_versions {
    use super::*;
    type Reg = CachedRegistry<MemoryRegistry>;
    async fn make() -> Reg {
        let c = CachedRegistry::with_config(
            MemoryRegistry::new(),
            fast().with_history(64).with_local_versions(true),
        )
        .unwrap();
        c.wait_until_ready().await;
        c
    }
    async fn lose_history(reg: &Reg) {
        waypost::testing::overflow_history(reg, 70).await;
    }
    waypost::conformance_tests!(make, lose_history);
}
