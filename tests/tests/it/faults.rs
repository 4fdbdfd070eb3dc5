//! The fault suite, bounded in time and count:
//! - etcd killed with SIGKILL in the middle of a 10k-op churn through
//!   `Cached(Coalescing(etcd))`, then restarted: the watch reports the
//!   outage (the cache's age grows), every acknowledged write is in etcd,
//!   nothing deregistered came back, the cache equals etcd and is current
//!   again, and reads never failed during the outage;
//! - a watch dropped 100 times at random points, on every backend with a
//!   resumable watch: no change missed, none delivered twice.
//!
//! (The registrar killed mid-burst is `waypost-registrar`'s `tests/it/crash.rs`.)

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::{RngExt, SeedableRng};
use waypost::testing::{ep, eventually, unique, Faulty};
use waypost::{
    cached::{CachedConfig, CachedRegistry},
    coalescing::{Coalescing, CoalescingConfig},
    Endpoint, Event, Registry, Snapshot, Watch,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_during_a_10k_churn_loses_nothing() {
    let mut etcd = waypost_fixtures::EtcdServer::start().unwrap();
    let cfg = waypost_etcd::EtcdConfig::new([etcd.endpoint().to_string()])
        .with_prefix(format!("/{}", unique("churn")))
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1));
    let backend = waypost_etcd::EtcdRegistry::connect(cfg.clone())
        .await
        .unwrap();
    let writer = Coalescing::with_config(
        backend,
        CoalescingConfig::default()
            .with_capacity(20_000)
            .with_retry(Duration::from_millis(20), Duration::from_millis(500)),
    )
    .unwrap();
    let cached = CachedRegistry::with_config(
        writer,
        CachedConfig::default()
            .with_write_wait(Duration::ZERO)
            .with_reconnect(Duration::from_millis(20), Duration::from_millis(500)),
    )
    .unwrap();
    cached.wait_until_ready().await;

    let svc = "churn";
    let keys = 400;
    let total = 10_000;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // What the backend must hold at the end: the last acknowledged op per key.
    let mut model: BTreeMap<String, Option<Endpoint>> = BTreeMap::new();
    let (mut acked, mut refused, mut reads, mut outage_reads) = (0usize, 0usize, 0usize, 0usize);
    let mut down = false;
    for i in 0..total {
        if i == 3_000 {
            etcd.kill();
            down = true;
            // The watch reports the outage: the cache says it is stale.
            eventually("the cache to report etcd's outage", || async {
                cached.cache_age().filter(|a| !a.is_zero())
            })
            .await;
        }
        if i == 6_000 {
            etcd.restart().unwrap();
            down = false;
        }
        let id = format!("k{}", rng.random_range(0..keys));
        let res = if rng.random_range(0..4) == 0 {
            let r = cached.deregister(&ep(svc, &id, 1).key()).await;
            if r.is_ok() {
                model.insert(id, None);
            }
            r
        } else {
            let e = ep(svc, &id, (i % 60_000 + 1) as u16);
            let r = cached.register(e.clone()).await;
            if r.is_ok() {
                model.insert(id, Some(e));
            }
            r
        };
        match res {
            Ok(()) => acked += 1,
            Err(e) => {
                assert_eq!(e.kind(), waypost::ErrorKind::Overloaded, "{e}");
                refused += 1;
            }
        }
        if i % 10 == 0 {
            // Reads never fail, also while etcd is down.
            cached.list(svc).await.unwrap();
            reads += 1;
            if down {
                outage_reads += 1;
            }
            tokio::task::yield_now().await;
        }
    }
    cached.get_ref().flush().await;
    let want: Vec<Endpoint> = model.values().flatten().cloned().collect();
    let direct = waypost_etcd::EtcdRegistry::connect(cfg).await.unwrap();
    let in_etcd = direct.list(svc).await.unwrap();
    assert_eq!(
        in_etcd.len(),
        want.len(),
        "etcd holds a different set of keys"
    );
    assert_eq!(
        in_etcd, want,
        "an acknowledged write is missing or a deregistered key came back"
    );
    eventually("the cache to equal etcd", || async {
        (cached.list(svc).await.ok()? == want).then_some(())
    })
    .await;
    // ...and, once a fresh snapshot came after the restart, that it is not.
    eventually("the cache to be current again", || async {
        (cached.cache_age() == Some(Duration::ZERO)).then_some(())
    })
    .await;
    println!(
        "churn: {total} ops ({acked} acknowledged, {refused} refused as overloaded), 1 outage of 3,000 ops, \
         {reads} reads ({outage_reads} during the outage, 0 failed), {} endpoints at the end, lost 0",
        want.len()
    );
}

/// Changes `service` at a steady pace until `stop`, each write a real change;
/// returns how many changes it made.
async fn churn<R: Registry + ?Sized>(
    reg: &R,
    service: &str,
    stop: &AtomicBool,
    max: usize,
) -> usize {
    let mut present: BTreeMap<String, u16> = BTreeMap::new();
    let mut changes = 0;
    let mut port = 0u16;
    while changes < max && (changes < 200 || !stop.load(Ordering::SeqCst)) {
        let id = format!("k{}", changes % 23);
        if changes % 5 == 4 && present.contains_key(&id) {
            reg.deregister(&ep(service, &id, 1).key()).await.unwrap();
            present.remove(&id);
        } else {
            port = port % 60_000 + 1;
            reg.register(ep(service, &id, port)).await.unwrap();
            present.insert(id, port);
        }
        changes += 1;
        if changes % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    changes
}

/// A consumer that resumes its watch from the last version it applied,
/// while the stream is cut 100 times at random points.
async fn hundred_drops<R: Registry + Watch>(backend: R) {
    let reg = Arc::new(Faulty::new(backend));
    let svc = unique("drops");
    let stop = Arc::new(AtomicBool::new(false));
    let cuts = Arc::new(AtomicUsize::new(0));

    // The first snapshot before any change, so every change is a delta.
    let mut first = reg.watch(None);
    let Some(Ok(Event::Snapshot(start))) = first.next().await else {
        panic!("{}: no snapshot first", reg.get_ref());
    };
    let mut last = Some(start.version());
    let mut state = Some(start);
    let mut snapshots = 1usize;
    drop(first);

    let cutter = {
        let (reg, stop, cuts) = (Arc::clone(&reg), Arc::clone(&stop), Arc::clone(&cuts));
        tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(42);
            for round in 2..=101 {
                // Cut only a live stream: wait for the consumer's next watch.
                eventually("the consumer to watch again", || async {
                    (reg.watch_froms().len() >= round).then_some(())
                })
                .await;
                tokio::time::sleep(Duration::from_micros(rng.random_range(0..20_000))).await;
                reg.cut_streams();
                cuts.fetch_add(1, Ordering::SeqCst);
            }
            stop.store(true, Ordering::SeqCst);
        })
    };
    let writer = {
        let (reg, stop, svc) = (Arc::clone(&reg), Arc::clone(&stop), svc.clone());
        tokio::spawn(async move { churn(reg.get_ref(), &svc, &stop, 20_000).await })
    };

    let (mut deltas, mut repeats) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut target: Option<Snapshot> = None;
    loop {
        let mut stream = reg.watch(last);
        while let Ok(Some(item)) =
            tokio::time::timeout(Duration::from_millis(300), stream.next()).await
        {
            let Ok(ev) = item else { break };
            last = Some(ev.version());
            match ev {
                Event::Snapshot(s) => {
                    snapshots += 1;
                    state = Some(s);
                }
                delta => {
                    let st = state.as_mut().expect("a delta before any snapshot");
                    let before = st.clone();
                    st.apply(&delta);
                    if delta.key().is_some_and(|k| k.service == svc) {
                        deltas += 1;
                        if st.same_endpoints(&before) {
                            repeats += 1;
                        }
                    }
                }
            }
        }
        if writer.is_finished() && target.is_none() {
            target = Some(reg.get_ref().snapshot().await.unwrap());
        }
        if let (Some(t), Some(s)) = (&target, &state) {
            if t.list(&svc) == s.list(&svc) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the consumer did not converge");
    }
    cutter.await.unwrap();
    let changes = writer.await.unwrap();
    let caps = reg.capabilities();
    assert_eq!(
        repeats,
        0,
        "{}: {repeats} events delivered twice",
        reg.get_ref()
    );
    if caps.native_watch && caps.resumable_watch {
        assert_eq!(
            snapshots,
            1,
            "{}: a resume fell back to a snapshot",
            reg.get_ref()
        );
        assert_eq!(deltas, changes, "{}: changes missed", reg.get_ref());
    }
    println!(
        "{}: {} drops, {changes} changes, {deltas} deltas received, {snapshots} snapshots, 0 repeated, 0 missed",
        reg.get_ref(),
        cuts.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_drops_memory() {
    hundred_drops(waypost::memory::MemoryRegistry::with_history(1 << 16)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_drops_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = waypost_sqlite::SqliteConfig::new(dir.path().join("drops.db")).with_log_len(1 << 16);
    hundred_drops(waypost_sqlite::SqliteRegistry::open(cfg).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_drops_etcd() {
    let etcd = waypost_fixtures::EtcdServer::start().unwrap();
    let cfg = waypost_etcd::EtcdConfig::new([etcd.endpoint().to_string()])
        .with_prefix(format!("/{}", unique("drops")));
    hundred_drops(waypost_etcd::EtcdRegistry::connect(cfg).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_drops_gossip() {
    use waypost_gossip::{GossipConfig, GossipRegistry};
    let node = GossipRegistry::start(GossipConfig::fast().with_watch_history(1 << 16))
        .await
        .unwrap();
    hundred_drops(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_drops_registrar_stream() {
    use waypost_registrar_server::{serve, Registrar, RegistrarConfig};
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc.local_addr().unwrap());
    let backend = Arc::new(waypost::liveness::Liveness::new(
        waypost::memory::MemoryRegistry::new(),
    ));
    let registrar =
        Registrar::new(backend, RegistrarConfig::new("drops").with_history(1 << 16)).unwrap();
    tokio::spawn(serve(
        registrar,
        grpc,
        health,
        None,
        futures::future::pending(),
    ));
    let raw = waypost_registrar_client::RpcClient::connect(
        waypost_registrar_client::ClientConfig::new(url, "drops", "n"),
    )
    .unwrap();
    hundred_drops(raw).await;
}
