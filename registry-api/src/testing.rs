//! The conformance suite every backend runs against its real server
//! (feature `testing`).
//!
//! Each check is a public async function taking the registry under test. It
//! reads [`Capabilities`](crate::Capabilities) from the registry and decides from them what to
//! demand (exact event sequences from a native watch, convergence from a
//! polling one; atomicity only where claimed). Every check works in
//! services of its own with random names, so checks may share one registry
//! and run concurrently.
//!
//! [`conformance_tests!`](crate::conformance_tests) turns the whole suite into
//! one `#[tokio::test]` per check:
//!
//! ```ignore
//! async fn make() -> MyRegistry { MyRegistry::open_for_test().await }
//! async fn lose_history(reg: &MyRegistry) { reg.compact().await }
//! registry_api::conformance_tests!(make, lose_history);
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::{future, StreamExt};
use rand::RngExt;

use crate::error::{Error, ErrorKind, Result};
use crate::limits::encoded_len;
use crate::limits::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_NAME_LEN};
use crate::model::{Endpoint, EndpointKey, Event, Health, Op, Protocol, Version};
use crate::snapshot::Snapshot;
use crate::traits::{Batch, EventStream, Registry, Watch};

/// How long a check waits for a condition before it fails. Override with
/// the environment variable `REGISTRY_TEST_TIMEOUT_SECS`.
pub fn wait_limit() -> Duration {
    std::env::var("REGISTRY_TEST_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(30))
}

/// A service name no other check uses: `prefix-` plus 12 random hex digits.
pub fn unique(prefix: &str) -> String {
    let n: u64 = rand::rng().random();
    format!("{prefix}-{:012x}", n & 0xffff_ffff_ffff)
}

/// A plain endpoint for tests: `127.0.0.1:port`.
pub fn ep(service: &str, id: &str, port: u16) -> Endpoint {
    Endpoint::new(service, id, "127.0.0.1", port)
}

/// Poll `check` until it returns `Some`, failing with `what` after
/// [`wait_limit`]. Waits 10 ms to 200 ms between tries.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + wait_limit();
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {:?} waiting for {what}",
            wait_limit()
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The next item of `stream` within [`wait_limit`]; panics on timeout, on
/// the end of the stream, or on an error item.
pub async fn next_event(stream: &mut EventStream, what: &str) -> Event {
    match tokio::time::timeout(wait_limit(), stream.next()).await {
        Ok(Some(Ok(ev))) => ev,
        Ok(Some(Err(e))) => panic!("watch failed while waiting for {what}: {e}"),
        Ok(None) => panic!("watch ended while waiting for {what}"),
        Err(_) => panic!("timed out after {:?} waiting for {what}", wait_limit()),
    }
}

/// The next event that concerns `service` (a snapshot always does).
pub async fn next_for(stream: &mut EventStream, service: &str, what: &str) -> Event {
    loop {
        let ev = next_event(stream, what).await;
        match &ev {
            Event::Snapshot(_) => return ev,
            other if other.key().is_some_and(|k| k.service == service) => return ev,
            _ => {}
        }
    }
}

/// The endpoints of `service` in `snap`, keyed by id.
pub fn service_state(snap: &Snapshot, service: &str) -> BTreeMap<String, Endpoint> {
    snap.service(service)
        .map(|e| (e.id.clone(), e.clone()))
        .collect()
}

/// Read `stream` until the endpoints of `service` equal `want`, applying
/// every event; returns the events seen for that service.
pub async fn follow_until(
    stream: &mut EventStream,
    state: &mut Snapshot,
    service: &str,
    want: &[Endpoint],
) -> Vec<Event> {
    let want: BTreeMap<String, Endpoint> = want.iter().map(|e| (e.id.clone(), e.clone())).collect();
    let mut seen = Vec::new();
    while service_state(state, service) != want {
        let ev = next_for(stream, service, &format!("{service} to reach {want:?}")).await;
        state.apply(&ev);
        seen.push(ev);
    }
    seen
}

fn sorted(mut v: Vec<Endpoint>) -> Vec<Endpoint> {
    v.sort_by_key(|e| e.key());
    v
}

fn expect_invalid(res: Result<()>, field: &str, case: &str) {
    match res {
        Err(Error::InvalidInput {
            field: f, reason, ..
        }) => {
            assert_eq!(f, field, "{case}: wrong field named (reason: {reason})");
            let msg = Error::invalid(f.clone(), reason).to_string();
            assert!(
                msg.contains(field),
                "{case}: message {msg:?} does not name {field}"
            );
        }
        other => panic!("{case}: expected InvalidInput naming {field}, got {other:?}"),
    }
}

/// Register twice under one key: the second value replaces the first.
pub async fn register_is_upsert<R: Registry + ?Sized>(reg: &R) {
    let svc = unique("upsert");
    reg.register(ep(&svc, "a", 1000)).await.expect("register");
    let updated = ep(&svc, "a", 1001).with_label("rev", "2");
    reg.register(updated.clone()).await.expect("register again");
    assert_eq!(reg.list(&svc).await.expect("list"), vec![updated]);
}

/// Deregister removes exactly the named endpoint.
pub async fn deregister_removes<R: Registry + ?Sized>(reg: &R) {
    let svc = unique("dereg");
    let (a, b) = (ep(&svc, "a", 1000), ep(&svc, "b", 1001));
    reg.register(a.clone()).await.expect("register a");
    reg.register(b.clone()).await.expect("register b");
    reg.deregister(&a.key()).await.expect("deregister a");
    assert_eq!(reg.list(&svc).await.expect("list"), vec![b]);
    let snap = reg.snapshot().await.expect("snapshot");
    assert!(!snap.contains(&a.key()), "snapshot still has {}", a.key());
}

/// Deregistering a key that never existed succeeds and changes nothing.
pub async fn deregister_unknown_is_ok<R: Registry + ?Sized>(reg: &R) {
    let svc = unique("dereg-unknown");
    reg.register(ep(&svc, "a", 1000)).await.expect("register");
    reg.deregister(&EndpointKey::new(&svc, "nope"))
        .await
        .expect("deregister of an unknown id");
    reg.deregister(&EndpointKey::new(unique("no-such-service"), "x"))
        .await
        .expect("deregister in an unknown service");
    assert_eq!(reg.list(&svc).await.expect("list").len(), 1);
}

/// `list` of a service nobody registered is empty, not an error.
pub async fn list_unknown_service_is_empty<R: Registry + ?Sized>(reg: &R) {
    let got = reg
        .list(&unique("never-registered"))
        .await
        .expect("list unknown");
    assert!(got.is_empty(), "unknown service listed {got:?}");
}

/// `list("foo")` sees neither `foo_other`, `foo/bar`, `fo` nor `foo-`.
pub async fn list_is_scoped_to_service<R: Registry + ?Sized>(reg: &R) {
    let base = unique("scope");
    let names = [
        base.clone(),
        format!("{base}_other"),
        format!("{base}/bar"),
        format!("{base}-"),
        base[..base.len() - 1].to_string(),
    ];
    for (i, name) in names.iter().enumerate() {
        reg.register(ep(name, "x", 2000 + i as u16))
            .await
            .expect("register");
    }
    for (i, name) in names.iter().enumerate() {
        let got = reg.list(name).await.expect("list");
        assert_eq!(got, vec![ep(name, "x", 2000 + i as u16)], "list({name:?})");
    }
}

/// A snapshot holds every registered endpoint, and its version grows with
/// each change.
pub async fn snapshot_has_everything_and_versions_grow<R: Registry + ?Sized>(reg: &R) {
    let svc = unique("snap");
    let before = reg.snapshot().await.expect("snapshot").version();
    let eps: Vec<Endpoint> = (0..5)
        .map(|i| ep(&svc, &format!("e{i}"), 3000 + i))
        .collect();
    let mut last = before;
    for e in &eps {
        reg.register(e.clone()).await.expect("register");
        let v = reg.snapshot().await.expect("snapshot").version();
        assert!(v >= last, "version went back from {last} to {v}");
        last = v;
    }
    let snap = reg.snapshot().await.expect("snapshot");
    assert!(
        snap.version() > before,
        "version did not grow: {before} then {}",
        snap.version()
    );
    assert_eq!(sorted(snap.list(&svc)), eps);
}

/// Every field survives a round trip through the backend unchanged.
pub async fn roundtrip_preserves_all_fields<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("roundtrip");
    let full = Endpoint::new(&svc, "pod-0", "::1", 65535)
        .with_protocol(Protocol::Grpc)
        .with_cluster("eu-1")
        .with_node("node-7")
        .with_health(Health::Unhealthy)
        .with_label("zone", "eu-west-1a")
        .with_label("unicode", "ünï ✓ \"quoted\" / slash")
        .with_label("empty", "");
    let plain = ep(&svc, "pod-1", 1).with_cluster("");
    reg.register(full.clone()).await.expect("register full");
    reg.register(plain.clone()).await.expect("register plain");
    let want = vec![full.clone(), plain.clone()];
    assert_eq!(reg.list(&svc).await.expect("list"), want, "list");
    let snap = reg.snapshot().await.expect("snapshot");
    assert_eq!(snap.get(&full.key()), Some(&full), "snapshot");
    let mut w = reg.watch(None);
    let mut state = Snapshot::default();
    follow_until(&mut w, &mut state, &svc, &want).await;
}

/// A batch applies every op in order; a later op on the same key wins.
pub async fn batch_applies_in_order<R: Batch + ?Sized>(reg: &R) {
    let svc = unique("batch");
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.expect("register a");
    let b2 = ep(&svc, "b", 3);
    let ops = vec![
        Op::Register(ep(&svc, "b", 2)),
        Op::Register(ep(&svc, "c", 2)),
        Op::Deregister(a.key()),
        Op::Register(b2.clone()),
        Op::Deregister(ep(&svc, "c", 2).key()),
        Op::Register(ep(&svc, "d", 4)),
        Op::Deregister(ep(&svc, "d", 4).key()),
        Op::Register(ep(&svc, "d", 5)),
        Op::Deregister(EndpointKey::new(&svc, "never")),
    ];
    reg.apply(ops).await.expect("apply");
    assert_eq!(
        reg.list(&svc).await.expect("list"),
        vec![b2, ep(&svc, "d", 5)]
    );
    reg.apply(Vec::new()).await.expect("empty batch");
}

/// An invalid op anywhere in a batch fails the whole call, names
/// `ops[i].field`, and writes nothing.
pub async fn batch_invalid_op_writes_nothing<R: Batch + ?Sized>(reg: &R) {
    let svc = unique("batch-invalid");
    let keep = ep(&svc, "keep", 1);
    reg.register(keep.clone()).await.expect("register");
    let ops = vec![
        Op::Register(ep(&svc, "new", 2)),
        Op::Deregister(keep.key()),
        Op::Register(ep(&svc, "bad", 0)),
    ];
    expect_invalid(reg.apply(ops).await, "ops[2].port", "batch with port 0");
    assert_eq!(reg.list(&svc).await.expect("list"), vec![keep]);
}

/// Where the backend claims isolated reads, a concurrent reader sees all
/// of a batch or none of it. Returns without checking otherwise.
pub async fn batch_is_atomic<R: Batch + ?Sized>(reg: &R) {
    let caps = reg.capabilities();
    if !caps.isolated_reads {
        return;
    }
    let svc = unique("atomic");
    let n = caps.max_batch.clamp(2, 20);
    let rounds = 10;
    let done = std::sync::atomic::AtomicBool::new(false);
    let writer = async {
        for r in 0..rounds {
            let ops = (0..n)
                .map(|i| Op::Register(ep(&svc, &format!("r{r}-{i}"), 1000 + i as u16)))
                .collect();
            reg.apply(ops).await.expect("apply");
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let reader = async {
        let mut reads = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
            let len = reg.list(&svc).await.expect("list").len();
            assert_eq!(len % n, 0, "list saw a partial batch: {len} endpoints");
            let len = reg
                .snapshot()
                .await
                .expect("snapshot")
                .service(&svc)
                .count();
            assert_eq!(len % n, 0, "snapshot saw a partial batch: {len} endpoints");
            reads += 1;
            tokio::task::yield_now().await;
        }
    };
    future::join(writer, reader).await;
    assert_eq!(reg.list(&svc).await.expect("list").len(), n * rounds);
}

/// A watch from `None` starts with a snapshot holding what exists.
pub async fn watch_starts_with_snapshot<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("watch-snap");
    let eps = vec![ep(&svc, "a", 1), ep(&svc, "b", 2)];
    for e in &eps {
        reg.register(e.clone()).await.expect("register");
    }
    let mut w = reg.watch(None);
    match next_event(&mut w, "the first event").await {
        Event::Snapshot(s) => {
            // A polling backend may take a cycle to see the writes; it must
            // still start with a snapshot, then converge.
            let mut state = s;
            follow_until(&mut w, &mut state, &svc, &eps).await;
        }
        other => panic!("watch(None) started with {other:?}, not a snapshot"),
    }
}

/// The changes a scenario makes, and what a native watch must report.
fn scenario(svc: &str) -> (Vec<Op>, Vec<(&'static str, String)>, Vec<Endpoint>) {
    let ops = vec![
        Op::Register(ep(svc, "a", 1)),
        Op::Register(ep(svc, "b", 2)),
        Op::Register(ep(svc, "a", 11)),
        Op::Deregister(EndpointKey::new(svc, "b")),
        Op::Register(ep(svc, "c", 3)),
    ];
    let expected = [
        ("added", "a"),
        ("added", "b"),
        ("updated", "a"),
        ("removed", "b"),
        ("added", "c"),
    ]
    .iter()
    .map(|(k, id)| (*k, id.to_string()))
    .collect();
    (ops, expected, vec![ep(svc, "a", 11), ep(svc, "c", 3)])
}

async fn run_ops<R: Registry + ?Sized>(reg: &R, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Register(e) => reg.register(e.clone()).await.expect("register"),
            Op::Deregister(k) => reg.deregister(k).await.expect("deregister"),
        }
    }
}

fn summary(events: &[Event]) -> Vec<(&'static str, String)> {
    events
        .iter()
        .filter_map(|e| e.key().map(|k| (e.type_name(), k.id)))
        .collect()
}

fn assert_in_order(events: &[Event], expected: &[(&'static str, String)], after: Version) {
    assert_eq!(
        summary(events),
        expected,
        "events out of order, missing, repeated or of the wrong kind"
    );
    let mut last = after;
    for e in events {
        assert!(
            e.version() > after && e.version() >= last,
            "version {} is not after {last}",
            e.version()
        );
        last = e.version();
    }
}

/// A watch delivers every change after its snapshot, in order, exactly once
/// (native watch); a polling watch converges on the final state.
pub async fn watch_delivers_changes_in_order_once<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("watch-order");
    let mut w = reg.watch(None);
    let first = next_event(&mut w, "the first snapshot").await;
    let Event::Snapshot(mut state) = first else {
        panic!("watch(None) started with {first:?}");
    };
    let start = state.version();
    let (ops, expected, fin) = scenario(&svc);
    run_ops(reg, &ops).await;
    let seen = follow_until(&mut w, &mut state, &svc, &fin).await;
    if reg.capabilities().native_watch {
        assert_in_order(&seen, &expected, start);
        // Exactly once: the next event for this service is the marker, not
        // a repeat of something already delivered.
        let marker = ep(&svc, "marker", 9);
        reg.register(marker.clone()).await.expect("register marker");
        match next_for(&mut w, &svc, "the marker").await {
            Event::Added { endpoint, .. } => assert_eq!(endpoint, marker),
            other => panic!("expected the marker's Added, got {other:?}"),
        }
    }
}

/// A watch resumed from the last version it saw loses nothing and repeats
/// nothing; without resumable history it starts over with a snapshot.
pub async fn watch_resume_loses_nothing<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("watch-resume");
    let first = ep(&svc, "first", 1);
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    reg.register(first.clone()).await.expect("register");
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&first)).await;
    let resume_at = state.version();
    drop(w);
    let missed = vec![ep(&svc, "m1", 2), ep(&svc, "m2", 3)];
    for e in &missed {
        reg.register(e.clone()).await.expect("register while away");
    }
    reg.deregister(&first.key())
        .await
        .expect("deregister while away");
    let mut w = reg.watch(Some(resume_at));
    let seen = follow_until(&mut w, &mut state, &svc, &missed).await;
    let caps = reg.capabilities();
    if caps.resumable_watch && caps.native_watch {
        assert_eq!(
            summary(&seen),
            vec![
                ("added", "m1".to_string()),
                ("added", "m2".to_string()),
                ("removed", "first".to_string())
            ],
            "resumed watch from {resume_at}"
        );
        assert!(
            seen.iter().all(|e| e.version() > resume_at),
            "resumed watch repeated an event at or before {resume_at}"
        );
    }
}

/// When the history after `from` is gone (`lose_history` makes sure of
/// it), the watch starts with a fresh snapshot holding the current state.
pub async fn watch_fresh_snapshot_when_history_gone<R, F, Fut>(reg: &R, lose_history: F)
where
    R: Registry + Watch + ?Sized,
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let svc = unique("watch-gone");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.expect("register a");
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;
    let old = state.version();
    drop(w);
    let b = ep(&svc, "b", 2);
    reg.register(b.clone()).await.expect("register b");
    lose_history().await;
    let mut w = reg.watch(Some(old));
    match next_event(&mut w, "a fresh snapshot").await {
        Event::Snapshot(mut s) => {
            assert!(s.version() >= old, "fresh snapshot is older than {old}");
            follow_until(&mut w, &mut s, &svc, &[a, b]).await;
        }
        other => panic!("history after {old} is gone, but the watch sent {other:?}"),
    }
}

/// Two watchers see the same changes.
pub async fn two_watchers_agree<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("two-watchers");
    let mut w1 = reg.watch(None);
    let mut w2 = reg.watch(None);
    let mut s1 = match next_event(&mut w1, "snapshot 1").await {
        Event::Snapshot(s) => s,
        other => panic!("watcher 1 started with {other:?}"),
    };
    let mut s2 = match next_event(&mut w2, "snapshot 2").await {
        Event::Snapshot(s) => s,
        other => panic!("watcher 2 started with {other:?}"),
    };
    let (ops, _, fin) = scenario(&svc);
    run_ops(reg, &ops).await;
    let e1 = follow_until(&mut w1, &mut s1, &svc, &fin).await;
    let e2 = follow_until(&mut w2, &mut s2, &svc, &fin).await;
    if reg.capabilities().native_watch {
        assert_eq!(summary(&e1), summary(&e2), "the two watchers disagree");
    }
}

/// Many writers on disjoint keys at once: no key is lost.
pub async fn concurrent_writers_lose_nothing<R: Registry + ?Sized>(reg: &R) {
    let svc = unique("concurrent");
    let writers = 8;
    let per = 25;
    let tasks = (0..writers).map(|w| {
        let svc = svc.clone();
        async move {
            for i in 0..per {
                reg.register(ep(&svc, &format!("w{w}-{i}"), 1000 + i))
                    .await
                    .expect("register");
            }
        }
    });
    future::join_all(tasks).await;
    let got = reg.list(&svc).await.expect("list");
    assert_eq!(got.len(), writers * per as usize, "keys were lost");
}

/// Each bad field is refused with `InvalidInput` naming it, and nothing
/// already stored changes.
pub async fn invalid_input_names_field<R: Registry + ?Sized>(reg: &R) {
    let svc = unique("invalid");
    let good = ep(&svc, "good", 80);
    reg.register(good.clone()).await.expect("register");
    let long = "x".repeat(MAX_NAME_LEN + 1);
    let max_labels = reg.capabilities().max_labels;
    let mut too_many = good.clone();
    for i in 0..=max_labels {
        too_many.labels.insert(format!("k{i}"), "v".into());
    }
    let cases: Vec<(&str, Endpoint)> = vec![
        (
            "service",
            Endpoint {
                service: String::new(),
                ..good.clone()
            },
        ),
        (
            "id",
            Endpoint {
                id: long.clone(),
                ..good.clone()
            },
        ),
        (
            "id",
            Endpoint {
                id: "has space".into(),
                ..good.clone()
            },
        ),
        (
            "address",
            Endpoint {
                address: "a\u{0}b".into(),
                ..good.clone()
            },
        ),
        (
            "port",
            Endpoint {
                port: 0,
                ..good.clone()
            },
        ),
        (
            "cluster",
            Endpoint {
                cluster: "c\nd".into(),
                ..good.clone()
            },
        ),
        (
            "node",
            Endpoint {
                node: long.clone(),
                ..good.clone()
            },
        ),
        ("labels", too_many),
        (
            "labels[\"zone\"]",
            good.clone()
                .with_label("zone", "x".repeat(MAX_LABEL_VALUE_LEN + 1)),
        ),
        (
            "labels[\"bad\\tkey\"]",
            good.clone().with_label("bad\tkey", "v"),
        ),
    ];
    for (field, bad) in cases {
        expect_invalid(reg.register(bad).await, field, &format!("bad {field}"));
    }
    assert_eq!(
        reg.list(&svc).await.expect("list"),
        vec![good],
        "stored data changed"
    );
}

/// Values exactly at each limit are stored; one past is refused.
pub async fn limits_accepted_and_one_past_rejected<R: Registry + ?Sized>(reg: &R) {
    let prefix = unique("limits");
    let svc = format!("{prefix}{}", "s".repeat(MAX_NAME_LEN - prefix.len()));
    let at = Endpoint::new(
        svc.clone(),
        "i".repeat(MAX_NAME_LEN),
        "a".repeat(MAX_NAME_LEN),
        65535,
    )
    .with_node("n".repeat(MAX_NAME_LEN))
    .with_cluster("c".repeat(MAX_NAME_LEN));
    reg.register(at.clone()).await.expect("names at the limit");
    let past = Endpoint {
        id: "i".repeat(MAX_NAME_LEN + 1),
        ..at.clone()
    };
    expect_invalid(reg.register(past).await, "id", "id one past the limit");

    let small = unique("limits-labels");
    let max_labels = reg.capabilities().max_labels;
    let mut many = ep(&small, "many", 1);
    for i in 0..max_labels {
        many.labels.insert(format!("k{i:02}"), format!("v{i}"));
    }
    reg.register(many.clone())
        .await
        .expect("labels at the count limit");
    let mut big = ep(&small, "big", 2).with_label(
        "k".repeat(MAX_LABEL_KEY_LEN),
        "v".repeat(MAX_LABEL_VALUE_LEN),
    );
    reg.register(big.clone())
        .await
        .expect("label key and value at the limit");
    big.labels
        .insert("k".repeat(MAX_LABEL_KEY_LEN + 1), "v".into());
    let field = format!(
        "labels[{}]",
        crate::backend::quote(&"k".repeat(MAX_LABEL_KEY_LEN + 1))
    );
    expect_invalid(
        reg.register(big).await,
        &field,
        "label key one past the limit",
    );

    // Total size: fill label values until the endpoint is exactly at the
    // backend's limit (the API's, or less where the backend says so).
    let limit = reg.capabilities().max_encoded_len;
    let mut full = ep(&small, "full", 3);
    let mut i = 0;
    while encoded_len(&full) < limit && full.labels.len() < max_labels {
        let key = format!("f{i:02}");
        let room = limit.saturating_sub(encoded_len(&full) + key.len());
        full.labels
            .insert(key, "v".repeat(room.min(MAX_LABEL_VALUE_LEN)));
        i += 1;
    }
    if encoded_len(&full) == limit && full.labels.len() < max_labels {
        reg.register(full.clone())
            .await
            .expect("endpoint at the size limit");
        // One more byte: a label with a one-byte key and an empty value.
        let over = full.clone().with_label("x", "");
        expect_invalid(
            reg.register(over).await,
            "endpoint",
            "one byte past the size limit",
        );
    }
    let got = reg.list(&small).await.expect("list");
    assert!(
        got.contains(&many),
        "the endpoint with {max_labels} labels is missing"
    );
    assert_eq!(reg.list(&svc).await.expect("list"), vec![at]);
}

/// Run every check that needs only `Registry + Watch + Batch`, one after
/// the other; `lose_history` must make the registry forget the changes
/// made so far (for backends without resumable history it may do nothing).
pub async fn run_all<R, F, Fut>(reg: &R, lose_history: F)
where
    R: Batch + Watch + ?Sized,
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    register_is_upsert(reg).await;
    deregister_removes(reg).await;
    deregister_unknown_is_ok(reg).await;
    list_unknown_service_is_empty(reg).await;
    list_is_scoped_to_service(reg).await;
    snapshot_has_everything_and_versions_grow(reg).await;
    roundtrip_preserves_all_fields(reg).await;
    batch_applies_in_order(reg).await;
    batch_invalid_op_writes_nothing(reg).await;
    batch_is_atomic(reg).await;
    watch_starts_with_snapshot(reg).await;
    watch_delivers_changes_in_order_once(reg).await;
    watch_resume_loses_nothing(reg).await;
    two_watchers_agree(reg).await;
    concurrent_writers_lose_nothing(reg).await;
    invalid_input_names_field(reg).await;
    limits_accepted_and_one_past_rejected(reg).await;
    watch_fresh_snapshot_when_history_gone(reg, lose_history).await;
}

/// Kinds of error a check may assert on, re-exported for backends' tests.
pub use crate::error::ErrorKind as Kind;

/// Assert that `res` failed with `kind`.
pub fn assert_kind<T: std::fmt::Debug>(res: Result<T>, kind: ErrorKind) -> Error {
    match res {
        Err(e) if e.kind() == kind => e,
        other => panic!("expected a {kind} error, got {other:?}"),
    }
}

/// One `#[tokio::test]` per conformance check.
///
/// `$make` is an `async fn() -> R` returning a fresh registry (or a shared
/// one: checks use services of their own); `$lose_history` is an
/// `async fn(&R)` that makes the registry forget its change history. The
/// calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a
/// dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($make:path, $lose_history:path) => {
        $crate::conformance_tests!(@each $make;
            register_is_upsert, deregister_removes, deregister_unknown_is_ok,
            list_unknown_service_is_empty, list_is_scoped_to_service,
            snapshot_has_everything_and_versions_grow, roundtrip_preserves_all_fields,
            batch_applies_in_order, batch_invalid_op_writes_nothing, batch_is_atomic,
            watch_starts_with_snapshot, watch_delivers_changes_in_order_once,
            watch_resume_loses_nothing, two_watchers_agree,
            concurrent_writers_lose_nothing, invalid_input_names_field,
            limits_accepted_and_one_past_rejected);
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn conformance_watch_fresh_snapshot_when_history_gone() {
            let reg = $make().await;
            $crate::testing::watch_fresh_snapshot_when_history_gone(&reg, || $lose_history(&reg))
                .await;
        }
    };
    (@each $make:path; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let reg = $make().await;
                $crate::testing::$check(&reg).await;
            }
        )*
    };
}

/// A wrapper that injects faults into any registry, for testing combinators
/// and consumers: failing writes, a backend that is down, watch streams
/// cut at will, and a record of the versions watches were resumed from.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use registry_api::{ErrorKind, Registry, testing::Faulty, memory::MemoryRegistry};
/// let reg = Faulty::new(MemoryRegistry::new());
/// reg.fail_writes(1);
/// let ep = registry_api::testing::ep("s", "a", 1);
/// assert_eq!(reg.register(ep.clone()).await.unwrap_err().kind(), ErrorKind::Unavailable);
/// reg.register(ep).await.unwrap();
/// # });
/// ```
pub struct Faulty<R> {
    inner: R,
    state: std::sync::Mutex<FaultState>,
    cut: tokio::sync::watch::Sender<u64>,
    latency: std::sync::Mutex<Duration>,
}

#[derive(Default)]
struct FaultState {
    fail_writes: usize,
    down: bool,
    refuse: Option<Error>,
    panic_writes: bool,
    poison: Vec<(EndpointKey, Error)>,
    max_ok_batch: Option<usize>,
    watch_froms: Vec<Option<Version>>,
    batches: Vec<usize>,
    write_calls: usize,
}

impl<R> Faulty<R> {
    /// Wrap `inner` with no faults.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            state: std::sync::Mutex::new(FaultState::default()),
            cut: tokio::sync::watch::channel(0).0,
            latency: std::sync::Mutex::new(Duration::ZERO),
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `n` write calls fail with `Unavailable`.
    pub fn fail_writes(&self, n: usize) {
        self.st().fail_writes = n;
    }

    /// While set, every write (and `probe`) fails with `error`: a backend
    /// that refuses writes for good (read-only, corrupt, table gone).
    pub fn refuse_writes(&self, error: Option<Error>) {
        self.st().refuse = error;
    }

    /// While set, every write panics (a bug in a backend): for testing that
    /// a task dying of it is noticed.
    pub fn panic_writes(&self, on: bool) {
        self.st().panic_writes = on;
    }

    /// Every write that touches `key` fails with `error` (a poison op).
    pub fn poison(&self, key: EndpointKey, error: Error) {
        self.st().poison.push((key, error));
    }

    /// Batches of more than `n` ops fail with `Unavailable` (a chunk too
    /// large to commit before the backend's timeout); `None` lifts it.
    pub fn fail_batches_over(&self, n: Option<usize>) {
        self.st().max_ok_batch = n;
    }

    /// While down, every call fails with `Unavailable`, open watch streams
    /// are cut and new ones fail at once.
    pub fn set_down(&self, down: bool) {
        self.st().down = down;
        if down {
            self.cut_streams();
        }
    }

    /// End every open watch stream with an `Unavailable` error.
    pub fn cut_streams(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// Every call sleeps this long first (a slow backend).
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    /// The `from` argument of every `watch` call so far.
    pub fn watch_froms(&self) -> Vec<Option<Version>> {
        self.st().watch_froms.clone()
    }

    /// The size of every `apply` call that reached the inner registry.
    pub fn batches(&self) -> Vec<usize> {
        self.st().batches.clone()
    }

    /// How many write calls (register, deregister, apply) were made.
    pub fn write_calls(&self) -> usize {
        self.st().write_calls
    }

    /// The wrapped registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    async fn gate(&self, write: bool) -> Result<()> {
        self.gate_ops(write, &[]).await
    }

    /// The faults a call meets; `ops` are the writes it carries.
    async fn gate_ops(&self, write: bool, ops: &[Op]) -> Result<()> {
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut st = self.st();
        if write {
            st.write_calls += 1;
        }
        if st.down {
            return Err(Error::unavailable("injected: backend down"));
        }
        if !write {
            return Ok(());
        }
        if st.panic_writes {
            drop(st);
            panic!("injected: the backend panicked while writing");
        }
        if let Some(e) = &st.refuse {
            return Err(e.clone());
        }
        if st.fail_writes > 0 {
            st.fail_writes -= 1;
            return Err(Error::unavailable("injected: write failed"));
        }
        if let Some((_, e)) = st
            .poison
            .iter()
            .find(|(k, _)| ops.iter().any(|op| op.key() == *k))
        {
            return Err(e.clone());
        }
        if st.max_ok_batch.is_some_and(|n| ops.len() > n) {
            return Err(Error::unavailable(format!(
                "injected: a batch of {} ops timed out",
                ops.len()
            )));
        }
        Ok(())
    }
}

impl<R: Registry> std::fmt::Display for Faulty<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

impl<R: Registry> std::fmt::Debug for Faulty<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty")
            .field("inner", &self.inner)
            .finish()
    }
}

#[async_trait::async_trait]
impl<R: Registry> Registry for Faulty<R> {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.gate_ops(true, &[Op::Register(endpoint.clone())])
            .await?;
        self.inner.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.gate_ops(true, &[Op::Deregister(key.clone())]).await?;
        self.inner.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.gate(false).await?;
        self.inner.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.gate(false).await?;
        self.inner.snapshot().await
    }
    fn capabilities(&self) -> crate::Capabilities {
        self.inner.capabilities()
    }
    async fn probe(&self) -> Result<()> {
        if let Some(e) = &self.st().refuse {
            return Err(e.clone());
        }
        self.gate(false).await?;
        self.inner.probe().await
    }
}

#[async_trait::async_trait]
impl<R: Batch> Batch for Faulty<R> {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.gate_ops(true, &ops).await?;
        let n = ops.len();
        self.inner.apply(ops).await?;
        self.st().batches.push(n);
        Ok(())
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
}

#[async_trait::async_trait]
impl<R: crate::Heartbeat> crate::Heartbeat for Faulty<R> {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.gate(false).await?;
        self.inner.heartbeat(node).await
    }
}

impl<R: Watch> Watch for Faulty<R> {
    fn watch(&self, from: Option<Version>) -> EventStream {
        let down = {
            let mut st = self.st();
            st.watch_froms.push(from);
            st.down
        };
        if down {
            let err = Error::unavailable("injected: backend down");
            return futures::stream::once(async move { Err(err) }).boxed();
        }
        let mut cut = self.cut.subscribe();
        cut.borrow_and_update();
        let until = async move {
            let _ = cut.changed().await;
        };
        let tail =
            futures::stream::once(async { Err(Error::unavailable("injected: watch stream cut")) });
        self.inner.watch(from).take_until(until).chain(tail).boxed()
    }
}

/// A registry that keeps something alive beside it (a temp directory, a
/// server fixture, a peer node) and forwards every trait method to it, so a
/// `make()` for [`conformance_tests!`](crate::conformance_tests) can return
/// one value.
///
/// ```
/// use registry_api::{testing::Guarded, memory::MemoryRegistry};
/// let dir = std::env::temp_dir(); // stands for a tempfile::TempDir
/// let reg = Guarded::new(MemoryRegistry::new(), dir);
/// assert_eq!(reg.to_string(), "Memory");
/// ```
pub struct Guarded<R> {
    inner: R,
    _guard: Box<dyn std::any::Any + Send + Sync>,
}

impl<R> Guarded<R> {
    /// `inner`, with `guard` dropped only after it.
    pub fn new(inner: R, guard: impl std::any::Any + Send + Sync) -> Self {
        Self {
            inner,
            _guard: Box::new(guard),
        }
    }

    /// The registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The guard, if it is a `G`.
    pub fn guard<G: 'static>(&self) -> Option<&G> {
        self._guard.downcast_ref::<G>()
    }
}

impl<R: Registry> std::fmt::Display for Guarded<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

impl<R: Registry> std::fmt::Debug for Guarded<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.inner, f)
    }
}

#[async_trait::async_trait]
impl<R: Registry> Registry for Guarded<R> {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.inner.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.inner.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.inner.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }
    fn capabilities(&self) -> crate::Capabilities {
        self.inner.capabilities()
    }
    async fn probe(&self) -> Result<()> {
        self.inner.probe().await
    }
}

#[async_trait::async_trait]
impl<R: Batch> Batch for Guarded<R> {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.inner.apply(ops).await
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
}

impl<R: Watch> Watch for Guarded<R> {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.inner.watch(from)
    }
}

#[async_trait::async_trait]
impl<R: crate::Heartbeat> crate::Heartbeat for Guarded<R> {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.inner.heartbeat(node).await
    }
}
