//! etcd-specific behaviour against a real etcd (the `waypost_fixtures`
//! fixture): key layout, the batch rule, leases, compaction and restarts during a watch.

use crate::common;

use std::time::{Duration, Instant};

use common::{addr, client, compact, config, restart, start_etcd, CutProxy};
use waypost::testing::{
    ep, eventually, expect_invalid, follow_until, next_event, next_for, next_for_with, next_item,
    service_state, unique, wait_limit, OnErr,
};
use waypost::{Batch, EndpointKey, ErrorKind, Event, Heartbeat, Op, Registry, Watch};
use waypost_etcd::etcd_client::{GetOptions, PutOptions};
use waypost_etcd::{EtcdConfig, EtcdRegistry};

async fn connect(cfg: EtcdConfig) -> EtcdRegistry {
    EtcdRegistry::connect(cfg).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_isolation_and_escaping() {
    let etcd = start_etcd().await;
    let cfg = config(etcd.endpoint());
    let prefix = cfg.prefix.clone();
    let reg = connect(cfg).await;
    assert_eq!(reg.to_string(), format!("Etcd({prefix})"));

    let names = ["foo", "foo_other", "foo/bar", "foo%2Fbar", "fo", "foo-"];
    for (i, name) in names.iter().enumerate() {
        reg.register(ep(name, "x", 1000 + i as u16))
            .await
            .expect("register");
    }
    let odd_id = ep("foo", "a/b%c", 2000);
    reg.register(odd_id.clone()).await.expect("register odd id");
    for (i, name) in names.iter().enumerate() {
        let mut want = vec![ep(name, "x", 1000 + i as u16)];
        if *name == "foo" {
            want.insert(0, odd_id.clone());
        }
        assert_eq!(reg.list(name).await.expect("list"), want, "list({name:?})");
    }

    // The stored keys: one escaped segment per name.
    let mut raw = client(&etcd).await;
    let resp = raw
        .get(
            format!("{prefix}/services/foo/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .expect("raw get");
    let keys: Vec<&str> = resp
        .kvs()
        .iter()
        .map(|kv| kv.key_str().expect("utf8"))
        .collect();
    assert_eq!(
        keys,
        vec![
            format!("{prefix}/services/foo/a%2Fb%25c"),
            format!("{prefix}/services/foo/x")
        ]
    );
    let value: serde_json::Value =
        serde_json::from_slice(resp.kvs()[1].value()).expect("value is JSON");
    assert_eq!(value["v"], 1);
    assert_eq!(value["service"], "foo");

    // A registry whose prefix extends ours sees none of it, and we see
    // none of its.
    let other = connect(config(etcd.endpoint()).with_prefix(format!("{prefix}_other"))).await;
    assert!(other.snapshot().await.expect("snapshot").is_empty());
    other.register(ep("foo", "y", 9)).await.expect("register");
    assert_eq!(reg.list("foo").await.expect("list").len(), 2);
    assert_eq!(
        reg.snapshot().await.expect("snapshot").len(),
        names.len() + 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_over_max_batch_is_refused_and_one_within_is_one_txn_of_its_net_effect() {
    let etcd = start_etcd().await;
    let reg = connect(config(etcd.endpoint()).with_max_batch(22)).await;
    assert_eq!(reg.max_batch(), 22);
    let svc = unique("batch");
    let mut ops: Vec<Op> = (0..18)
        .map(|i| Op::Register(ep(&svc, &format!("k{i:02}"), 100 + i)))
        .collect();
    // Repeated keys: the later op wins, and etcd never sees a key twice
    // in one Txn (it would refuse it).
    ops.push(Op::Register(ep(&svc, "k00", 2)));
    ops.push(Op::Deregister(EndpointKey::new(&svc, "k01")));
    ops.push(Op::Register(ep(&svc, "k01", 3)));
    ops.push(Op::Deregister(EndpointKey::new(&svc, "k02")));
    let before = reg.snapshot().await.expect("snapshot").version();
    // One op more than max_batch: refused, nothing written.
    let mut too_many = ops.clone();
    too_many.push(Op::Register(ep(&svc, "k99", 9)));
    expect_invalid(reg.apply(too_many).await, "ops", "23 ops, max_batch 22");
    assert_eq!(reg.snapshot().await.expect("snapshot").version(), before);
    assert!(reg.list(&svc).await.expect("list").is_empty());
    reg.apply(ops).await.expect("apply");
    let after = reg.snapshot().await.expect("snapshot").version();
    // 18 distinct keys within max_batch: one Txn, one revision.
    assert_eq!(after.0 - before.0, 1, "revisions {before} -> {after}");
    let mut want: Vec<_> = (3..18)
        .map(|i| ep(&svc, &format!("k{i:02}"), 100 + i))
        .collect();
    want.insert(0, ep(&svc, "k01", 3));
    want.insert(0, ep(&svc, "k00", 2));
    assert_eq!(reg.list(&svc).await.expect("list"), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_nodes_lose_their_endpoints_and_heartbeating_ones_keep_them() {
    let etcd = start_etcd().await;
    let ttl = Duration::from_secs(2);
    let reg = connect(config(etcd.endpoint()).with_lease_ttl(ttl)).await;
    let svc = unique("lease");
    let dead = [
        ep(&svc, "d1", 1).with_node("dead"),
        ep(&svc, "d2", 2).with_node("dead"),
    ];
    let live = ep(&svc, "l1", 3).with_node("live");
    let free = ep(&svc, "f1", 4);
    let start = Instant::now();
    for e in dead.iter().chain([&live, &free]) {
        reg.register(e.clone()).await.expect("register");
    }
    assert_eq!(reg.list(&svc).await.expect("list").len(), 4);
    assert_ne!(reg.lease_of("dead").await, reg.lease_of("live").await);

    let deadline = Instant::now() + wait_limit();
    let mut dead_gone_after = None;
    // Heartbeat `live` only, for three TTLs and until `dead` is gone.
    while dead_gone_after.is_none() || start.elapsed() < ttl * 3 {
        assert!(
            Instant::now() < deadline,
            "dead node's endpoints never expired"
        );
        reg.heartbeat("live").await.expect("heartbeat");
        let eps = reg.list(&svc).await.expect("list");
        assert!(eps.contains(&live), "a heartbeating node lost its endpoint");
        assert!(eps.contains(&free), "an endpoint without node expired");
        if dead_gone_after.is_none() && !eps.iter().any(|e| e.node == "dead") {
            dead_gone_after = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone = dead_gone_after.expect("dead endpoints gone");
    assert!(
        gone >= ttl / 2,
        "dead endpoints vanished after {gone:?}, before the TTL"
    );
    // Removed by liveness: its next heartbeat is NotFound and writes
    // nothing back; the node registers again.
    let err = reg
        .heartbeat("dead")
        .await
        .expect_err("heartbeat of a removed node");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(!reg
        .list(&svc)
        .await
        .expect("list")
        .iter()
        .any(|e| e.node == "dead"));
    reg.register(dead[0].clone()).await.expect("register again");
    reg.heartbeat("dead")
        .await
        .expect("heartbeat after registering");
    assert!(reg.list(&svc).await.expect("list").contains(&dead[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_granted_again_and_the_endpoints_rewritten() {
    let etcd = start_etcd().await;
    let reg = connect(config(etcd.endpoint()).with_lease_ttl(Duration::from_secs(3))).await;
    let svc = unique("lost");
    let (a, b) = (
        ep(&svc, "a", 1).with_node("n"),
        ep(&svc, "b", 2).with_node("n"),
    );
    reg.register(a.clone()).await.expect("register a");
    reg.register(b.clone()).await.expect("register b");
    let mut raw = client(&etcd).await;

    // 1. Revoked behind our back; the node goes on heartbeating.
    let first = reg.lease_of("n").await.expect("lease");
    raw.lease_revoke(first).await.expect("revoke");
    assert!(
        reg.list(&svc).await.expect("list").is_empty(),
        "revoke deleted nothing"
    );
    let second = eventually("the endpoints to come back under a new lease", || async {
        reg.heartbeat("n").await.expect("heartbeat");
        let lease = reg.lease_of("n").await?;
        (lease != first && reg.list(&svc).await.ok()? == vec![a.clone(), b.clone()])
            .then_some(lease)
    })
    .await;
    let resp = raw
        .get(reg.key_of(&a.key()), None::<GetOptions>)
        .await
        .expect("raw get");
    assert_eq!(resp.kvs()[0].lease(), second, "key is not on the new lease");

    // 2. Revoked again; the next register for the node finds out.
    raw.lease_revoke(second).await.expect("revoke");
    let c = ep(&svc, "c", 3).with_node("n");
    reg.register(c.clone())
        .await
        .expect("register c after the lease was lost");
    assert_eq!(
        reg.list(&svc).await.expect("list"),
        vec![a.clone(), b.clone(), c.clone()]
    );

    // 3. Revoked again, and the caller does nothing at all: the registry
    // notices by itself while the node counts as alive.
    let third = reg.lease_of("n").await.expect("lease");
    assert_ne!(third, second);
    raw.lease_revoke(third).await.expect("revoke");
    eventually(
        "the registry to restore the endpoints on its own",
        || async {
            (reg.list(&svc).await.ok()? == vec![a.clone(), b.clone(), c.clone()]).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_a_watch_is_disconnected_sends_a_fresh_snapshot() {
    let etcd = start_etcd().await;
    let proxy = CutProxy::start(addr(&etcd)).await.expect("proxy");
    let cfg = config(&proxy.url()).with_request_timeout(Duration::from_secs(2));
    let writer = connect(config(etcd.endpoint()).with_prefix(cfg.prefix.clone())).await;
    let reg = connect(cfg).await;
    let svc = unique("compacted");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    let (a, b, c) = (ep(&svc, "a", 1), ep(&svc, "b", 2), ep(&svc, "c", 3));
    writer.register(a.clone()).await.expect("register a");
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;

    proxy.refuse();
    writer.register(b.clone()).await.expect("register b");
    writer.deregister(&a.key()).await.expect("deregister a");
    compact(&etcd).await;
    proxy.heal();

    // The cut is reported (as failures), then a fresh snapshot follows.
    let mut errors = OnErr::count();
    match next_for_with(
        &mut w,
        &svc,
        &mut errors,
        "a fresh snapshot after compaction",
    )
    .await
    {
        Event::Snapshot(s) => state = s,
        other => panic!("history was compacted, but the watch sent {other:?}"),
    }
    assert_eq!(
        service_state(&state, &svc)
            .into_values()
            .collect::<Vec<_>>(),
        vec![b.clone()]
    );
    writer.register(c.clone()).await.expect("register c");
    let seen = follow_until(&mut w, &mut state, &svc, &[b.clone(), c.clone()]).await;
    assert!(
        matches!(seen.as_slice(), [Event::Added { endpoint, .. }] if *endpoint == c),
        "after the snapshot: {seen:?}"
    );
    let truth = writer.snapshot().await.expect("snapshot");
    assert_eq!(service_state(&state, &svc), service_state(&truth, &svc));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_etcd_killed_then_sends_a_fresh_snapshot_and_goes_on() {
    let mut etcd = start_etcd().await;
    let reg = connect(config(etcd.endpoint()).with_request_timeout(Duration::from_secs(2))).await;
    let svc = unique("restart");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    let (a, b, c) = (ep(&svc, "a", 1), ep(&svc, "b", 2), ep(&svc, "c", 3));
    reg.register(a.clone()).await.expect("register a");
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;

    etcd.kill();
    assert_eq!(
        reg.register(b.clone()).await.map_err(|e| e.kind()),
        Err(ErrorKind::Unavailable),
        "a write while etcd is down"
    );
    // The outage is reported on the stream, which goes on.
    let err = match next_item(&mut w, "the outage to be reported").await {
        Err(e) => e,
        Ok(ev) => panic!("etcd is down, but the watch sent {ev:?}"),
    };
    assert!(err.is_retryable(), "{err}");
    restart(&mut etcd);

    // After the failures: a fresh snapshot (holding what was written
    // before), then the changes.
    let mut errors = 1;
    let snap = loop {
        match next_item(&mut w, "a fresh snapshot after the restart").await {
            Err(_) => errors += 1,
            Ok(Event::Snapshot(s)) => break s,
            Ok(ev) => panic!("after a reported failure the watch sent {ev:?} before a snapshot"),
        }
    };
    assert!(snap.version() >= state.version());
    assert_eq!(
        service_state(&snap, &svc).into_values().collect::<Vec<_>>(),
        vec![a.clone()],
        "the snapshot after the restart"
    );
    state = snap;
    // The client reconnects by itself; writes may fail until it has.
    eventually("a write after the restart", || async {
        reg.register(b.clone()).await.ok()
    })
    .await;
    reg.deregister(&a.key()).await.expect("deregister a");
    reg.register(c.clone()).await.expect("register c");
    let seen = follow_until(&mut w, &mut state, &svc, &[b.clone(), c.clone()]).await;
    let kinds: Vec<_> = seen.iter().map(|e| (e.type_name(), e.key())).collect();
    assert_eq!(
        kinds,
        vec![
            ("added", Some(b.key())),
            ("removed", Some(a.key())),
            ("added", Some(c.key()))
        ],
        "the watch lost or repeated a change after the restart"
    );
    let truth = reg.snapshot().await.expect("snapshot");
    assert_eq!(service_state(&state, &svc), service_state(&truth, &svc));
    println!("etcd outage: {errors} failures reported, then a snapshot and every change");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_writes_nothing_and_reports_an_outage() {
    let mut etcd = start_etcd().await;
    let cfg = config(etcd.endpoint())
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1));
    let reg = connect(cfg.clone()).await;
    let mut raw = client(&etcd).await;
    let before = raw
        .get("/", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .expect("count");
    reg.probe().await.expect("probe of a healthy etcd");
    let after = raw
        .get("/", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .expect("count");
    let rev = |r: &waypost_etcd::etcd_client::GetResponse| r.header().map(|h| h.revision());
    assert_eq!(rev(&after), rev(&before), "the probe made a revision");
    assert_eq!(after.count(), before.count(), "the probe created a key");
    let under = raw
        .get(
            cfg.prefix.clone(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count under the prefix");
    assert_eq!(under.count(), 0, "the probe left a key under the prefix");

    etcd.kill();
    let err = reg.probe().await.expect_err("probe while etcd is down");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    restart(&mut etcd);
    eventually("the probe to pass after the restart", || async {
        reg.probe().await.ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_of_a_read_only_user_is_unauthorized() {
    use waypost_etcd::etcd_client::{Permission, PermissionType};
    let etcd = start_etcd().await;
    let cfg = config(etcd.endpoint());
    let prefix = cfg.prefix.clone();
    let mut raw = client(&etcd).await;
    raw.user_add("root", "root-pw", None)
        .await
        .expect("add root");
    raw.user_grant_role("root", "root")
        .await
        .expect("grant root");
    raw.role_add("reader").await.expect("add role");
    raw.role_grant_permission(
        "reader",
        Permission::new(PermissionType::Read, prefix.clone()).with_prefix(),
    )
    .await
    .expect("grant read");
    raw.role_add("writer").await.expect("add role");
    raw.role_grant_permission(
        "writer",
        Permission::new(PermissionType::Readwrite, prefix.clone()).with_prefix(),
    )
    .await
    .expect("grant readwrite");
    raw.user_add("ro", "ro-pw", None).await.expect("add ro");
    raw.user_grant_role("ro", "reader")
        .await
        .expect("grant reader");
    raw.user_add("rw", "rw-pw", None).await.expect("add rw");
    raw.user_grant_role("rw", "writer")
        .await
        .expect("grant writer");
    raw.auth_enable().await.expect("enable auth");

    let rw = connect(cfg.clone().with_user("rw", "rw-pw")).await;
    rw.probe().await.expect("probe of a user who may write");
    let ro = connect(cfg.clone().with_user("ro", "ro-pw")).await;
    assert!(ro.list("any").await.is_ok(), "the read-only user can read");
    let err = ro.probe().await.expect_err("probe of a read-only user");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains("write check"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_is_unavailable_and_names_the_endpoint() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let cfg = EtcdConfig::new([url.clone()])
        .with_connect_timeout(Duration::from_millis(500))
        .with_request_timeout(Duration::from_secs(1));
    let err = EtcdRegistry::connect(cfg)
        .await
        .expect_err("nothing listens there");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains(&url), "{err}");

    let err = EtcdRegistry::connect(EtcdConfig::new(Vec::<String>::new()))
        .await
        .expect_err("no endpoints");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_that_are_not_endpoints_are_skipped() {
    let etcd = start_etcd().await;
    let cfg = config(etcd.endpoint());
    let prefix = cfg.prefix.clone();
    let reg = connect(cfg).await;
    let svc = unique("corrupt");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    let mut raw = client(&etcd).await;
    let base = format!("{prefix}/services/{svc}");
    for (key, value) in [
        (format!("{base}/garbage"), "not json".to_string()),
        (
            format!("{base}/future"),
            format!(r#"{{"v":9,"service":"{svc}","id":"future"}}"#),
        ),
        (format!("{base}/too/deep"), "{}".to_string()),
    ] {
        raw.put(key, value, None::<PutOptions>)
            .await
            .expect("raw put");
    }
    let good = ep(&svc, "good", 1);
    reg.register(good.clone()).await.expect("register");
    assert_eq!(reg.list(&svc).await.expect("list"), vec![good.clone()]);
    assert_eq!(
        reg.snapshot()
            .await
            .expect("snapshot")
            .service(&svc)
            .count(),
        1
    );
    let seen = follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&good)).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_do_not_disturb_an_idle_watch() {
    let etcd = start_etcd().await;
    let reg =
        connect(config(etcd.endpoint()).with_progress_interval(Duration::from_millis(50))).await;
    let svc = unique("progress");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    // Changes outside the prefix move etcd's revision; the watch gets
    // progress notifications for them while it sees no event.
    let mut raw = client(&etcd).await;
    for i in 0..5 {
        raw.put(format!("/elsewhere/{i}"), "x", None::<PutOptions>)
            .await
            .expect("raw put");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.expect("register");
    let seen = follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;
    assert!(
        matches!(seen.as_slice(), [Event::Added { endpoint, .. }] if *endpoint == a),
        "{seen:?}"
    );
    // Resuming from the version of that change sends nothing old.
    let resume_at = seen[0].version();
    drop(w);
    let b = ep(&svc, "b", 2);
    reg.register(b.clone()).await.expect("register");
    let mut w = reg.watch(Some(resume_at));
    match next_for(&mut w, &svc, "the change after the resume point").await {
        Event::Added { endpoint, .. } => assert_eq!(endpoint, b),
        other => panic!("expected b's Added, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_are_used_and_refusals_are_unauthorized() {
    let etcd = start_etcd().await;
    let mut raw = client(&etcd).await;
    raw.user_add("root", "root-pw", None)
        .await
        .expect("add root");
    raw.user_grant_role("root", "root")
        .await
        .expect("grant root");
    raw.auth_enable().await.expect("enable auth");

    let reg = connect(config(etcd.endpoint()).with_user("root", "root-pw")).await;
    let svc = unique("auth");
    reg.register(ep(&svc, "a", 1))
        .await
        .expect("register as root");
    assert_eq!(reg.list(&svc).await.expect("list").len(), 1);

    let err = EtcdRegistry::connect(config(etcd.endpoint()).with_user("root", "wrong"))
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    let err = EtcdRegistry::connect(config(etcd.endpoint()))
        .await
        .expect_err("no user while auth is on");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
}
