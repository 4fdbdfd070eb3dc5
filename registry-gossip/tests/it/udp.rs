//! Real UDP on loopback: a small cluster converges, a stopped node's
//! entries disappear, packets with a wrong key are dropped, and the native
//! traits (watch of remote writes, heartbeat, name events) behave.

use futures::StreamExt;
use waypost::testing::{ep, eventually, next_event};
use waypost::{ErrorKind, Event, Heartbeat, Registry, Watch};
use waypost_gossip::{GossipConfig, GossipRegistry, NameEvent};

async fn start(name: &str, seeds: &[&GossipRegistry]) -> GossipRegistry {
    let cfg = GossipConfig::fast()
        .with_node_name(name)
        .with_seeds(seeds.iter().map(|s| s.local_addr()));
    GossipRegistry::start(cfg).await.unwrap()
}

async fn joined(nodes: &[&GossipRegistry]) {
    let n = nodes.len();
    eventually("membership to complete", || async {
        nodes
            .iter()
            .all(|r| r.members().len() == n - 1)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_converge() {
    let a = start("a", &[]).await;
    let b = start("b", &[&a]).await;
    let c = start("c", &[&b]).await;
    joined(&[&a, &b, &c]).await;
    assert!(a.local_addr().ip().is_loopback());
    for (i, n) in [&a, &b, &c].iter().enumerate() {
        for j in 0..10u16 {
            n.register(ep("conv", &format!("n{i}-{j}"), 1000 + j))
                .await
                .unwrap();
        }
    }
    b.deregister(&ep("conv", "n0-0", 1000).key())
        .await
        .unwrap_or(());
    eventually("all three to hold the same 29 or 30 endpoints", || async {
        let sa = a.snapshot().await.ok()?;
        let sb = b.snapshot().await.ok()?;
        let sc = c.snapshot().await.ok()?;
        let n = sa.service("conv").count();
        (n >= 29 && sa.same_endpoints(&sb) && sb.same_endpoints(&sc)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_node_entries_disappear() {
    let a = start("a", &[]).await;
    let b = start("b", &[&a]).await;
    let c = start("c", &[&a]).await;
    let d = start("d", &[&a]).await;
    joined(&[&a, &b, &c, &d]).await;
    c.register(ep("stop", "crash", 1)).await.unwrap();
    d.register(ep("stop", "leave", 2)).await.unwrap();
    eventually("a and b to see both", || async {
        let la = a.list("stop").await.ok()?.len();
        let lb = b.list("stop").await.ok()?.len();
        (la == 2 && lb == 2).then_some(())
    })
    .await;
    // One crashes, one leaves gracefully.
    drop(c);
    d.leave().await;
    // Bounded: SWIM's 100 ms probes and 300 ms suspicion, well inside the
    // suite's wait limit.
    let started = std::time::Instant::now();
    eventually("their entries to disappear on the survivors", || async {
        let la = a.list("stop").await.ok()?;
        let lb = b.list("stop").await.ok()?;
        (la.is_empty() && lb.is_empty()).then_some(())
    })
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    assert_eq!(a.members().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_auth_key_is_dropped_and_counted() {
    let keyed = |name: &str, key: &str| {
        GossipConfig::fast()
            .with_node_name(name)
            .with_auth_key(key.as_bytes().to_vec())
    };
    let a = GossipRegistry::start(keyed("a", "secret")).await.unwrap();
    let b = GossipRegistry::start(keyed("b", "secret").with_seeds([a.local_addr()]))
        .await
        .unwrap();
    joined(&[&a, &b]).await;
    b.register(ep("auth", "ok", 1)).await.unwrap();
    eventually("a to get b's write", || async {
        (a.list("auth").await.ok()?.len() == 1).then_some(())
    })
    .await;
    // A node with the wrong key never gets in, and its datagrams are
    // dropped and counted.
    let before = a.stats().auth_failures;
    let mallory = GossipRegistry::start(keyed("mallory", "guess").with_seeds([a.local_addr()]))
        .await
        .unwrap();
    mallory.register(ep("auth", "evil", 2)).await.unwrap();
    eventually("a to count failed tags", || async {
        (a.stats().auth_failures > before).then_some(())
    })
    .await;
    // A raw forged datagram: right framing, no valid tag.
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.send_to(b"G\x02\x00forged-without-a-tag-xxxxxxxx", a.local_addr())
        .unwrap();
    let seen = a.stats().auth_failures;
    eventually("the forged datagram to be counted", || async {
        (a.stats().auth_failures > seen).then_some(())
    })
    .await;
    // An unkeyed (version 1) datagram: dropped and counted as such.
    let old = a.stats().version_mismatch;
    raw.send_to(b"G\x01\x00old-format", a.local_addr()).unwrap();
    eventually("the old-format datagram to be counted", || async {
        (a.stats().version_mismatch > old).then_some(())
    })
    .await;
    assert!(mallory.members().is_empty());
    assert_eq!(a.members().len(), 1);
    assert_eq!(a.list("auth").await.unwrap().len(), 1);
    assert!(a.stats().malformed == 0, "{:?}", a.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_writes_show_up_in_watch_and_name_events() {
    let a = start("a", &[]).await;
    let b = start("b", &[&a]).await;
    joined(&[&a, &b]).await;
    let mut w = a.watch(None);
    assert!(matches!(
        next_event(&mut w, "snapshot").await,
        Event::Snapshot(_)
    ));
    let mut names = a.name_events();
    b.register(ep("remote", "x", 7)).await.unwrap();
    match next_event(&mut w, "b's write").await {
        Event::Added { endpoint, .. } => assert_eq!(endpoint, ep("remote", "x", 7)),
        other => panic!("expected Added, got {other:?}"),
    }
    b.register_name("printer", "actor-p").await.unwrap();
    let ev = tokio::time::timeout(waypost::testing::wait_limit(), names.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ev,
        NameEvent::Registered {
            name: "printer".into(),
            actor_addr: "actor-p".into(),
            node: "b".into()
        }
    );
    b.unregister_name("printer").await.unwrap();
    let ev = tokio::time::timeout(waypost::testing::wait_limit(), names.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ev,
        NameEvent::Unregistered {
            name: "printer".into(),
            previous_addr: "actor-p".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_is_swim_membership() {
    let a = start("a", &[]).await;
    let b = start("b", &[&a]).await;
    joined(&[&a, &b]).await;
    let caps = a.capabilities();
    assert!(caps.native_liveness && caps.native_watch && !caps.atomic_writes);
    a.heartbeat("a").await.unwrap();
    a.heartbeat("b").await.unwrap();
    let err = a.heartbeat("nobody").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    // A node that owns an endpoint here is known too (the rule of
    // `waypost::Heartbeat`), though it is not a member.
    a.register(ep("svc", "owned", 1).with_node("owner"))
        .await
        .unwrap();
    a.heartbeat("owner").await.unwrap();
    assert_eq!(a.to_string(), format!("Gossip({})", a.local_addr()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_failure_is_mapped() {
    let a = start("a", &[]).await;
    let err = GossipRegistry::start(GossipConfig::fast().with_bind(a.local_addr()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let bad = GossipConfig::fast().with_swim_timings(
        std::time::Duration::from_millis(10),
        std::time::Duration::from_millis(20),
        std::time::Duration::from_millis(30),
    );
    let err = GossipRegistry::start(bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_too_big_for_a_datagram_travel_by_anti_entropy() {
    let a = start("a", &[]).await;
    let b = start("b", &[&a]).await;
    joined(&[&a, &b]).await;
    let mut big = ep("big", "x", 1);
    for i in 0..12 {
        big = big.with_label(format!("k{i}"), "v".repeat(1000));
    }
    assert!(waypost::limits::encoded_len(&big) > 10_000);
    a.register(big.clone()).await.unwrap();
    eventually("b to receive the 12 KB endpoint", || async {
        (b.list("big").await.ok()? == vec![big.clone()]).then_some(())
    })
    .await;
    assert!(b.stats().entries_repaired >= 1);
}
