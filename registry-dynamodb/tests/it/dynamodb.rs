//! DynamoDB-specific behaviour against moto: the batch rule, transactions
//! and merging, idempotency tokens, error mapping, TTL filtering (liveness: `liveness.rs`).

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{config, Harness, RecordingProxy, TRANSACT_TARGET};
use futures::StreamExt;
use waypost::polling::{Polling, PollingConfig};
use waypost::testing::{assert_kind, ep, eventually, follow_until, next_event, unique, wait_limit};
use waypost::{
    cached::{CachedConfig, CachedRegistry},
    coalescing::{Coalescing, CoalescingConfig},
    Batch, Endpoint, EndpointKey, ErrorKind, Event, EventStream, Op, Registry, Watch,
};
use waypost_dynamodb::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use waypost_dynamodb::{DynamoDbConfig, DynamoDbRegistry};
use waypost_fixtures::MotoServer;

/// The batch rule: 101 ops are refused before anything is sent; 100 ops
/// are one transaction, with a token of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_over_100_ops_is_refused_and_100_are_one_transaction() {
    let moto = common::shared_moto();
    let proxy = RecordingProxy::start(moto.url()).await;
    let cfg = config(&proxy.url);
    DynamoDbRegistry::create_table_if_missing(&cfg, false)
        .await
        .unwrap();
    let reg = DynamoDbRegistry::connect(cfg).await.unwrap();
    assert_eq!(reg.max_batch(), 100);
    let svc = unique("big-batch");
    let eps: Vec<Endpoint> = (0..200u16)
        .map(|i| ep(&svc, &format!("e{i:03}"), 1000 + i))
        .collect();
    let register =
        |eps: &[Endpoint]| -> Vec<Op> { eps.iter().cloned().map(Op::Register).collect() };
    let err = reg.apply(register(&eps[..101])).await.unwrap_err();
    waypost::testing::expect_invalid::<()>(Err(err), "ops", "101 ops");
    assert_eq!(proxy.count(TRANSACT_TARGET), 0, "a refused batch was sent");
    assert!(reg.list(&svc).await.unwrap().is_empty());
    let err = reg
        .apply_with_token(register(&eps[..101]), "token-1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(proxy.count(TRANSACT_TARGET), 0, "a refused batch was sent");

    reg.apply(register(&eps[..100])).await.unwrap();
    assert_eq!(proxy.count(TRANSACT_TARGET), 1, "100 ops, one transaction");
    reg.apply(register(&eps[100..])).await.unwrap();
    assert_eq!(proxy.count(TRANSACT_TARGET), 2);
    let tokens = proxy.string_fields("ClientRequestToken");
    assert_eq!(tokens.len(), 2, "one token per transaction: {tokens:?}");
    assert_ne!(tokens[0], tokens[1]);
    assert_eq!(reg.list(&svc).await.unwrap(), eps);
    assert_eq!(reg.snapshot().await.unwrap().list(&svc), eps);

    // Ops on one key are merged: 100 ops on 50 keys are one transaction.
    let mut ops = register(&eps[..50]);
    ops.extend(eps[..50].iter().map(|e| Op::Deregister(e.key())));
    reg.apply(ops).await.unwrap();
    assert_eq!(proxy.count(TRANSACT_TARGET), 3);
    assert_eq!(reg.list(&svc).await.unwrap(), eps[50..].to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ops_on_one_key_apply_their_net_effect() {
    let h = Harness::new(false).await;
    let svc = unique("net");
    // moto, like DynamoDB, refuses two actions on one item in a transaction:
    // without merging this batch would fail.
    let put = |e: &Endpoint| {
        let item = HashMap::from([
            ("service".to_string(), AttributeValue::S(e.service.clone())),
            ("id".to_string(), AttributeValue::S(e.id.clone())),
        ]);
        TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name(&h.cfg.table)
                    .set_item(Some(item))
                    .build()
                    .unwrap(),
            )
            .build()
    };
    let raw = h
        .reg
        .client()
        .transact_write_items()
        .transact_items(put(&ep(&svc, "a", 1)))
        .transact_items(put(&ep(&svc, "a", 2)))
        .send()
        .await;
    assert!(raw.is_err(), "the emulator took two actions on one item");

    let b = ep(&svc, "b", 3);
    h.reg.register(b.clone()).await.unwrap();
    h.reg
        .apply(vec![
            Op::Register(ep(&svc, "a", 1)),
            Op::Deregister(b.key()),
            Op::Register(ep(&svc, "a", 2)),
            Op::Register(ep(&svc, "b", 4)),
            Op::Register(ep(&svc, "c", 5)),
            Op::Deregister(EndpointKey::new(&svc, "c")),
        ])
        .await
        .unwrap();
    assert_eq!(
        h.reg.list(&svc).await.unwrap(),
        vec![ep(&svc, "a", 2), ep(&svc, "b", 4)]
    );
}

/// A retry carries the caller's token unchanged and the same parameters, so
/// DynamoDB (which applies one token's transaction at most once within 10
/// minutes) does not apply it twice. moto 5.2 ignores `ClientRequestToken`
/// (it applies every request), so what is checked here is the wire: the
/// token is sent, and a retry sends the identical request body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_transaction_sends_the_same_token_and_body() {
    let moto = common::shared_moto();
    let proxy = RecordingProxy::start(moto.url()).await;
    let cfg = config(&proxy.url);
    DynamoDbRegistry::create_table_if_missing(&cfg, false)
        .await
        .unwrap();
    let reg = DynamoDbRegistry::connect(cfg).await.unwrap();
    let svc = unique("token");
    let ops = vec![
        Op::Register(ep(&svc, "a", 1).with_label("zone", "z1")),
        Op::Deregister(EndpointKey::new(&svc, "gone")),
    ];
    reg.apply_with_token(ops.clone(), "retry-token-1")
        .await
        .unwrap();
    reg.apply_with_token(ops, "retry-token-1").await.unwrap();
    assert_eq!(
        proxy.string_fields("ClientRequestToken"),
        vec!["retry-token-1", "retry-token-1"]
    );
    let bodies = proxy.transact_bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        bodies[0], bodies[1],
        "a retry must send the same parameters"
    );

    let err = reg
        .apply_with_token(vec![Op::Register(ep(&svc, "b", 1))], "")
        .await;
    let err = assert_kind(err, ErrorKind::InvalidInput);
    assert!(err.to_string().contains("token"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_not_found_naming_it() {
    let moto = common::shared_moto();
    let cfg = config(moto.url());
    let err = assert_kind(
        DynamoDbRegistry::connect(cfg.clone()).await,
        ErrorKind::NotFound,
    );
    assert!(err.to_string().contains(&cfg.table), "{err}");

    // A table deleted under a connected registry.
    let h = Harness::new(false).await;
    h.reg
        .client()
        .delete_table()
        .table_name(&h.cfg.table)
        .send()
        .await
        .unwrap();
    let err = assert_kind(h.reg.list("any").await, ErrorKind::NotFound);
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    let err = assert_kind(h.reg.snapshot().await, ErrorKind::NotFound);
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    let err = assert_kind(h.reg.register(ep("s", "a", 1)).await, ErrorKind::NotFound);
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    let err = assert_kind(
        h.reg.apply(vec![Op::Register(ep("s", "a", 1))]).await,
        ErrorKind::NotFound,
    );
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_is_unavailable_naming_the_endpoint() {
    // A server of its own: this test kills it.
    let mut moto = MotoServer::start().unwrap();
    let cfg: DynamoDbConfig = config(moto.url())
        .with_max_attempts(2)
        .with_operation_timeout(Duration::from_secs(5));
    DynamoDbRegistry::create_table_if_missing(&cfg, true)
        .await
        .unwrap();
    let reg = DynamoDbRegistry::connect(cfg).await.unwrap();
    let svc = unique("dead");
    reg.register(ep(&svc, "a", 1)).await.unwrap();
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    follow_until(&mut w, &mut state, &svc, &[ep(&svc, "a", 1)]).await;

    moto.kill();
    let url = moto.url().to_string();
    let check = |res: waypost::Result<()>, what: &str| {
        let err = assert_kind(res, ErrorKind::Unavailable);
        assert!(err.is_retryable());
        assert!(err.to_string().contains(&url), "{what}: {err}");
    };
    check(reg.list(&svc).await.map(|_| ()), "list");
    check(reg.snapshot().await.map(|_| ()), "snapshot");
    check(reg.register(ep(&svc, "b", 2)).await, "register");
    check(
        reg.deregister(&EndpointKey::new(&svc, "a")).await,
        "deregister",
    );
    check(
        reg.apply(vec![Op::Register(ep(&svc, "c", 3))]).await,
        "apply",
    );
    // The watch reports the outage and does not end.
    let err = match next_item(&mut w, "the outage to be reported").await {
        Err(e) => e,
        Ok(ev) => panic!("the server is down, but the watch sent {ev:?}"),
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains(&url), "watch: {err}");
}

/// The next item of `w` within [`wait_limit`]: an event or a reported
/// failure. Panics on timeout or on the end of the stream.
async fn next_item(w: &mut EventStream, what: &str) -> waypost::Result<Event> {
    match tokio::time::timeout(wait_limit(), w.next()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("watch ended while waiting for {what}"),
        Err(_) => panic!("timed out after {:?} waiting for {what}", wait_limit()),
    }
}

/// Write `e` with the SDK, behind the registry's back (another program).
async fn put_directly(h: &Harness, e: &Endpoint) {
    let s = |v: &str| AttributeValue::S(v.to_string());
    h.reg
        .client()
        .put_item()
        .table_name(&h.cfg.table)
        .item("service", s(&e.service))
        .item("id", s(&e.id))
        .item("address", s(&e.address))
        .item("port", AttributeValue::N(e.port.to_string()))
        .send()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_table_is_reported_and_its_successor_followed_from_a_fresh_snapshot() {
    let h = Harness::new(true).await;
    let svc = unique("recreated");
    let (a, b) = (ep(&svc, "a", 1), ep(&svc, "b", 2));
    h.reg.register(a.clone()).await.unwrap();
    h.reg.register(b.clone()).await.unwrap();
    let mut w = h.reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    follow_until(&mut w, &mut state, &svc, &[a.clone(), b.clone()]).await;
    // A cache over another registry on the table (another process).
    let cached = CachedRegistry::with_config(
        DynamoDbRegistry::connect(h.cfg.clone()).await.unwrap(),
        CachedConfig::default()
            .with_write_wait(Duration::ZERO)
            .with_reconnect(Duration::from_millis(20), Duration::from_millis(500)),
    )
    .unwrap();
    cached.wait_until_ready().await;
    eventually("the cache to hold a and b", || async {
        (cached.list(&svc).await.ok()? == vec![a.clone(), b.clone()]).then_some(())
    })
    .await;

    // The table disappears: the watch says so.
    h.reg
        .client()
        .delete_table()
        .table_name(&h.cfg.table)
        .send()
        .await
        .unwrap();
    let err = match next_item(&mut w, "the lost table to be reported").await {
        Err(e) => e,
        Ok(ev) => panic!("the table is gone, but the watch sent {ev:?}"),
    };
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    let err = assert_kind(h.reg.probe().await, ErrorKind::NotFound);
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    eventually("the cache to know it is stale", || async {
        cached.cache_age().filter(|a| !a.is_zero())
    })
    .await;

    // It comes back (with a stream) and another program writes to it.
    assert!(DynamoDbRegistry::create_table_if_missing(&h.cfg, true)
        .await
        .unwrap());
    let (c, d, e) = (ep(&svc, "c", 3), ep(&svc, "d", 4), ep(&svc, "e", 5));
    put_directly(&h, &c).await;
    put_directly(&h, &d).await;
    // After the failures, a fresh snapshot of the new table: no phantoms.
    let mut errors = 1;
    let snap = loop {
        match next_item(&mut w, "a fresh snapshot of the new table").await {
            Err(_) => errors += 1,
            Ok(Event::Snapshot(s)) => break s,
            Ok(ev) => panic!("after a reported failure the watch sent {ev:?} before a snapshot"),
        }
    };
    let ids: Vec<String> = snap.list(&svc).into_iter().map(|e| e.id).collect();
    assert!(
        ids.iter().all(|id| id == "c" || id == "d"),
        "the snapshot of the new table holds {ids:?}"
    );
    state = snap;
    follow_until(&mut w, &mut state, &svc, &[c.clone(), d.clone()]).await;
    put_directly(&h, &e).await;
    let seen = follow_until(&mut w, &mut state, &svc, &[c.clone(), d.clone(), e.clone()]).await;
    assert!(
        matches!(seen.as_slice(), [Event::Added { endpoint, .. }] if *endpoint == e),
        "after the snapshot: {seen:?}"
    );
    let truth = h.reg.snapshot().await.unwrap();
    assert_eq!(state.list(&svc), truth.list(&svc));
    h.reg.probe().await.unwrap();
    eventually("the cache to equal the new table", || async {
        (cached.list(&svc).await.ok()? == vec![c.clone(), d.clone(), e.clone()]
            && cached.cache_age() == Some(Duration::ZERO))
        .then_some(())
    })
    .await;
    println!("table deleted and recreated: {errors} failures reported, then a fresh snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_recreated_between_two_checks_is_not_mistaken_for_the_old_one() {
    // Deleted and created again at once: the reader may never see the
    // table missing, and on moto the old stream ARN even resolves to the
    // new table's stream. The stream ARN tells them apart.
    let h = Harness::new(true).await;
    let svc = unique("swapped");
    let a = ep(&svc, "a", 1);
    h.reg.register(a.clone()).await.unwrap();
    let mut w = h.reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;
    h.reg
        .client()
        .delete_table()
        .table_name(&h.cfg.table)
        .send()
        .await
        .unwrap();
    assert!(DynamoDbRegistry::create_table_if_missing(&h.cfg, true)
        .await
        .unwrap());
    let b = ep(&svc, "b", 2);
    put_directly(&h, &b).await;
    let mut errors = 0;
    let snap = loop {
        match next_item(&mut w, "a fresh snapshot of the new table").await {
            Err(_) => errors += 1,
            Ok(Event::Snapshot(s)) => break s,
            Ok(ev) => panic!("the table was replaced, but the watch sent {ev:?} first"),
        }
    };
    assert!(errors >= 1, "the replaced table was not reported");
    assert!(
        !snap.contains(&a.key()),
        "a phantom endpoint of the old table survived"
    );
    state = snap;
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&b)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_table_reports_failed_polls() {
    // Without a stream the registry does not watch: its own watch says so,
    // naming the table, and `Polling` (as `stack()` adds it) polls it.
    let h = Harness::new(false).await;
    assert!(!h.reg.capabilities().native_watch);
    let mut own = h.reg.watch(None);
    let err = assert_kind(
        next_item(&mut own, "the watch's refusal").await,
        ErrorKind::InvalidInput,
    );
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    assert!(err.to_string().contains("waypost::stack::stack"), "{err}");
    assert!(own.next().await.is_none(), "the refusal ends the stream");
    let svc = unique("polled");
    h.reg.register(ep(&svc, "a", 1)).await.unwrap();
    let polling = PollingConfig::default()
        .with_interval(h.cfg.poll_interval)
        .with_history(h.cfg.watch_history);
    let second = DynamoDbRegistry::connect(h.cfg.clone()).await.unwrap();
    let polled = Polling::with_config(second, polling).unwrap();
    let mut w = polled.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    follow_until(&mut w, &mut state, &svc, &[ep(&svc, "a", 1)]).await;
    h.reg
        .client()
        .delete_table()
        .table_name(&h.cfg.table)
        .send()
        .await
        .unwrap();
    let err = match next_item(&mut w, "the failed poll to be reported").await {
        Err(e) => e,
        Ok(ev) => panic!("the table is gone, but the watch sent {ev:?}"),
    };
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(&h.cfg.table), "{err}");
    // Back (empty): a whole snapshot, without the old endpoint.
    assert!(DynamoDbRegistry::create_table_if_missing(&h.cfg, false)
        .await
        .unwrap());
    let snap = loop {
        match next_item(&mut w, "a fresh snapshot").await {
            Err(_) => {}
            Ok(Event::Snapshot(s)) => break s,
            Ok(ev) => panic!("after a reported failure the watch sent {ev:?} first"),
        }
    };
    assert!(snap.list(&svc).is_empty(), "{:?}", snap.list(&svc));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_checks_the_table_and_writes_nothing() {
    let h = Harness::new(true).await;
    let mut w = h.reg.watch(None);
    let Event::Snapshot(_) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    for _ in 0..3 {
        h.reg.probe().await.unwrap();
    }
    let scan = h
        .reg
        .client()
        .scan()
        .table_name(&h.cfg.table)
        .send()
        .await
        .unwrap();
    assert_eq!(scan.count(), 0, "the probe left items: {:?}", scan.items());
    // Nothing reached the stream either: the next change is the first.
    let svc = unique("after-probe");
    h.reg.register(ep(&svc, "a", 1)).await.unwrap();
    match next_event(&mut w, "the first change").await {
        Event::Added { endpoint, .. } => assert_eq!(endpoint, ep(&svc, "a", 1)),
        other => panic!("the probe made a change: {other:?}"),
    }
    // The same on a table without a stream.
    let plain = Harness::new(false).await;
    plain.reg.probe().await.unwrap();
    assert!(plain.reg.snapshot().await.unwrap().is_empty());

    plain
        .reg
        .client()
        .delete_table()
        .table_name(&plain.cfg.table)
        .send()
        .await
        .unwrap();
    let err = assert_kind(plain.reg.probe().await, ErrorKind::NotFound);
    assert!(err.to_string().contains(&plain.cfg.table), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_items_are_not_read() {
    let h = Harness::with_config(true, |c| c.with_item_ttl(Some(Duration::from_secs(3600)))).await;
    let svc = unique("ttl");
    let live = ep(&svc, "live", 1);
    h.reg.register(live.clone()).await.unwrap();
    // The write carries the TTL attribute.
    let got = h
        .reg
        .client()
        .get_item()
        .table_name(&h.cfg.table)
        .key("service", AttributeValue::S(svc.clone()))
        .key("id", AttributeValue::S("live".into()))
        .send()
        .await
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expires: u64 = match got.item().and_then(|i| i.get("expires_at")) {
        Some(AttributeValue::N(n)) => n.parse().unwrap(),
        other => panic!("no expires_at: {other:?}"),
    };
    assert!(expires > now + 3000 && expires <= now + 3601, "{expires}");

    let mut w = h.reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    // Another writer's item whose TTL passed; DynamoDB has not deleted it.
    let put = |id: &str, at: u64| {
        h.reg
            .client()
            .put_item()
            .table_name(&h.cfg.table)
            .item("service", AttributeValue::S(svc.clone()))
            .item("id", AttributeValue::S(id.into()))
            .item("address", AttributeValue::S("10.0.0.1".into()))
            .item("port", AttributeValue::N("80".into()))
            .item("expires_at", AttributeValue::N(at.to_string()))
            .send()
    };
    put("stale", now - 60).await.unwrap();
    put("fresh", now + 600).await.unwrap();
    let fresh = Endpoint::new(&svc, "fresh", "10.0.0.1", 80);
    let want = vec![fresh.clone(), live.clone()];
    assert_eq!(h.reg.list(&svc).await.unwrap(), want);
    assert_eq!(h.reg.snapshot().await.unwrap().list(&svc), want);
    // The watch, too, never shows the expired item.
    let seen = follow_until(&mut w, &mut state, &svc, &want).await;
    assert!(
        !seen
            .iter()
            .any(|e| e.key().is_some_and(|k| k.id == "stale")),
        "the watch showed the expired item: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_watch_sees_batches_and_other_writers() {
    let h = Harness::new(true).await;
    assert!(h.reg.capabilities().native_watch);
    let svc = unique("stream");
    let mut w = h.reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    let eps: Vec<Endpoint> = (0..150u16)
        .map(|i| ep(&svc, &format!("e{i:03}"), 1 + i))
        .collect();
    // Two batches (at most 100 ops each), two transactions.
    for chunk in eps.chunks(100) {
        h.reg
            .apply(chunk.iter().cloned().map(Op::Register).collect())
            .await
            .unwrap();
    }
    let seen = follow_until(&mut w, &mut state, &svc, &eps).await;
    assert_eq!(seen.len(), 150, "each endpoint added once");
    // A second registry on the same table (another process) writes; this
    // one's watch sees it.
    let other = DynamoDbRegistry::connect(h.cfg.clone()).await.unwrap();
    other.deregister(&eps[0].key()).await.unwrap();
    follow_until(&mut w, &mut state, &svc, &eps[1..]).await;
}

/// A registry on a fresh table behind a recording proxy.
async fn behind_proxy(
    max_attempts: u32,
) -> (DynamoDbRegistry, RecordingProxy, std::sync::Arc<MotoServer>) {
    behind_proxy_on(common::shared_moto(), max_attempts, false).await
}

async fn behind_proxy_on(
    moto: std::sync::Arc<MotoServer>,
    max_attempts: u32,
    stream: bool,
) -> (DynamoDbRegistry, RecordingProxy, std::sync::Arc<MotoServer>) {
    let proxy = RecordingProxy::start(moto.url()).await;
    let cfg = config(&proxy.url).with_max_attempts(max_attempts);
    DynamoDbRegistry::create_table_if_missing(&cfg, stream)
        .await
        .unwrap();
    let reg = DynamoDbRegistry::connect(cfg).await.unwrap();
    (reg, proxy, moto)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_ops_through_coalescing_are_transactions_of_at_most_100() {
    // A server of its own: moto copies every table of the server for each
    // transaction, so a shared one grows slow as other tests fill it.
    let moto = std::sync::Arc::new(MotoServer::start().unwrap());
    let (reg, proxy, _moto) = behind_proxy_on(moto, 3, false).await;
    let reg = Coalescing::with_config(
        reg,
        CoalescingConfig::default()
            .with_flush_interval(Duration::from_millis(20))
            .with_flush_ops(1000),
    )
    .unwrap();
    let svc = unique("coalesced");
    let eps: Vec<Endpoint> = (0..1000u16)
        .map(|i| ep(&svc, &format!("e{i:04}"), 1 + i))
        .collect();
    let tickets: Vec<_> = eps
        .iter()
        .map(|e| reg.submit(vec![Op::Register(e.clone())]).unwrap())
        .collect();
    reg.flush().await;
    for t in tickets {
        t.durable().await.unwrap();
    }
    let bodies = proxy.transact_bodies();
    let sizes: Vec<usize> = bodies
        .iter()
        .map(|b| b["TransactItems"].as_array().map(Vec::len).unwrap_or(0))
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 1000, "{sizes:?}");
    assert!(sizes.iter().all(|n| (1..=100).contains(n)), "{sizes:?}");
    assert!(
        sizes.len() >= 10 && sizes.len() < 100,
        "{} requests: {sizes:?}",
        sizes.len()
    );
    assert_eq!(proxy.count(TRANSACT_TARGET), sizes.len());
    assert_eq!(reg.list(&svc).await.unwrap(), eps);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_mapped_and_retried() {
    // The SDK retries a throttled call by itself.
    let (reg, proxy, _moto) = behind_proxy(3).await;
    let svc = unique("throttle");
    proxy.throttle_next(1);
    reg.apply(vec![Op::Register(ep(&svc, "a", 1))])
        .await
        .unwrap();
    assert_eq!(
        proxy.count(TRANSACT_TARGET),
        2,
        "one throttled call, one retry"
    );
    let tokens = proxy.string_fields("ClientRequestToken");
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0], tokens[1], "the retry must carry the same token");

    // Without SDK retries, the caller sees Throttled (retryable)...
    let (reg, proxy, _moto) = behind_proxy(1).await;
    proxy.throttle_next(1);
    let err = assert_kind(
        reg.apply(vec![Op::Register(ep(&svc, "b", 2))]).await,
        ErrorKind::Throttled,
    );
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains("ProvisionedThroughputExceeded"),
        "{err}"
    );
    assert!(reg.list(&svc).await.unwrap().is_empty());

    // ...and Coalescing's retry path gets the ops through.
    proxy.throttle_next(2);
    let reg = Coalescing::with_config(
        reg,
        CoalescingConfig::default()
            .with_flush_interval(Duration::from_millis(10))
            .with_retry(Duration::from_millis(10), Duration::from_millis(50)),
    )
    .unwrap();
    let ticket = reg.submit(vec![Op::Register(ep(&svc, "c", 3))]).unwrap();
    reg.flush().await;
    ticket.durable().await.unwrap();
    assert_eq!(reg.list(&svc).await.unwrap(), vec![ep(&svc, "c", 3)]);
    assert_eq!(
        proxy.count(TRANSACT_TARGET),
        4,
        "1 + 2 throttled + 1 applied"
    );
}

const GET_RECORDS: &str = "DynamoDBStreams_20120810.GetRecords";
const GET_SHARD_ITERATOR: &str = "DynamoDBStreams_20120810.GetShardIterator";
const SCAN: &str = "DynamoDB_20120810.Scan";

/// Read `w` until `service` holds `want`; every event must be a delta (no
/// snapshot) and name a key at most once.
async fn deltas_until(
    w: &mut waypost::EventStream,
    state: &mut waypost::Snapshot,
    svc: &str,
    want: &[Endpoint],
) {
    let seen = follow_until(w, state, svc, want).await;
    assert!(
        !seen.iter().any(|e| matches!(e, Event::Snapshot(_))),
        "the watch started over: {seen:?}"
    );
    let mut keys: Vec<_> = seen.iter().filter_map(Event::key).collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "an event was repeated: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_iterator_resumes_after_the_last_sequence_number() {
    let (reg, proxy, _moto) = behind_proxy_on(common::shared_moto(), 3, true).await;
    let svc = unique("expired");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.unwrap();
    deltas_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;
    assert_eq!(proxy.count("AFTER_SEQUENCE_NUMBER"), 0);

    proxy.fail_next(GET_RECORDS, "ExpiredIteratorException", 1);
    let b = ep(&svc, "b", 2);
    reg.register(b.clone()).await.unwrap();
    reg.deregister(&a.key()).await.unwrap();
    deltas_until(&mut w, &mut state, &svc, std::slice::from_ref(&b)).await;
    assert_eq!(
        proxy.count("AFTER_SEQUENCE_NUMBER"),
        1,
        "the shard should resume after its last sequence number"
    );
    assert_eq!(proxy.count(SCAN), 1, "no resync was needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_position_resyncs_from_a_fresh_snapshot() {
    let (reg, proxy, _moto) = behind_proxy_on(common::shared_moto(), 3, true).await;
    let svc = unique("trimmed");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("no snapshot first");
    };
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.unwrap();
    deltas_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;
    assert_eq!(proxy.count(SCAN), 1);

    // The iterator is gone, and so is the data after its sequence number.
    proxy.fail_next(GET_RECORDS, "ExpiredIteratorException", 1);
    proxy.fail_next(GET_SHARD_ITERATOR, "TrimmedDataAccessException", 1);
    let b = ep(&svc, "b", 2);
    reg.register(b.clone()).await.unwrap();
    reg.deregister(&a.key()).await.unwrap();
    eventually("a resync scan", || async {
        (proxy.count(SCAN) == 2).then_some(())
    })
    .await;
    let c = ep(&svc, "c", 3);
    reg.register(c.clone()).await.unwrap();
    // Watchers get the difference (b added, a removed) and go on (c).
    deltas_until(&mut w, &mut state, &svc, &[b, c]).await;
    assert_eq!(proxy.count(SCAN), 2, "exactly one resync");
}
