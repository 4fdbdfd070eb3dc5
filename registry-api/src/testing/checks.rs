//! The checks of reads and writes one endpoint at a time: upsert,
//! deregister, list, snapshot, round trip, concurrent writers, validation
//! and limits.

use futures::future;

use super::support::{ep, expect_invalid, follow_until, skip, unique};
use crate::limits::{encoded_len, MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_NAME_LEN};
use crate::model::{Endpoint, EndpointKey, Health, Protocol};
use crate::snapshot::Snapshot;
use crate::traits::{Registry, Watch};

fn sorted(mut v: Vec<Endpoint>) -> Vec<Endpoint> {
    v.sort_by_key(|e| e.key());
    v
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

/// Every field survives a round trip through the backend unchanged (an
/// empty cluster becomes the writer's where capabilities say
/// `assigns_cluster`).
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
    let mut plain = ep(&svc, "pod-1", 1).with_cluster("");
    reg.register(full.clone()).await.expect("register full");
    reg.register(plain.clone()).await.expect("register plain");
    if reg.capabilities().assigns_cluster {
        let listed = reg.list(&svc).await.expect("list");
        let stored = listed.iter().find(|e| e.key() == plain.key());
        let cluster = stored.map(|e| e.cluster.clone()).unwrap_or_default();
        assert!(!cluster.is_empty(), "no cluster assigned: {stored:?}");
        plain.cluster = cluster;
    }
    let want = vec![full.clone(), plain.clone()];
    assert_eq!(reg.list(&svc).await.expect("list"), want, "list");
    let snap = reg.snapshot().await.expect("snapshot");
    assert_eq!(snap.get(&full.key()), Some(&full), "snapshot");
    let mut w = reg.watch(None);
    let mut state = Snapshot::default();
    follow_until(&mut w, &mut state, &svc, &want).await;
}

/// A draining endpoint, with a zone, a region and a weight, is stored and
/// returned as it was (list, snapshot and watch), and turns healthy again
/// when registered so.
pub async fn draining_round_trips<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("draining");
    let draining = ep(&svc, "pod-0", 80)
        .with_node("node-1")
        .with_health(Health::Draining)
        .with_zone("eu-west-1a")
        .with_region("eu-west-1")
        .with_weight(65535);
    let other = ep(&svc, "pod-1", 81).with_weight(2);
    reg.register(draining.clone())
        .await
        .expect("register draining");
    reg.register(other.clone()).await.expect("register other");
    let want = vec![draining.clone(), other.clone()];
    assert_eq!(reg.list(&svc).await.expect("list"), want, "list");
    let snap = reg.snapshot().await.expect("snapshot");
    assert_eq!(snap.get(&draining.key()), Some(&draining), "snapshot");
    let mut w = reg.watch(None);
    let mut state = Snapshot::default();
    follow_until(&mut w, &mut state, &svc, &want).await;
    let back = draining.clone().with_health(Health::Healthy);
    reg.register(back.clone())
        .await
        .expect("register healthy again");
    follow_until(&mut w, &mut state, &svc, &[back, other]).await;
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
        ("labels[\"weight\"]", good.clone().with_label("weight", "0")),
        (
            "labels[\"zone\"]",
            good.clone().with_label("zone", "eu west"),
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

/// Values exactly at each limit are stored; one past is refused naming the
/// field. The label count and the total size are the backend's
/// (`Capabilities::max_labels`, `max_encoded_len`: Cloud Map's are smaller
/// than the API's); names, label keys and values are the API's.
pub async fn limits_accepted_and_one_past_rejected<R: Registry + ?Sized>(reg: &R) {
    let caps = reg.capabilities();
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

    // Label count: `max_labels` is stored, one more is refused.
    let small = unique("limits-labels");
    let mut many = ep(&small, "many", 1);
    for i in 0..caps.max_labels {
        many.labels.insert(format!("k{i:02}"), format!("v{i}"));
    }
    reg.register(many.clone())
        .await
        .expect("labels at the count limit");
    let mut too_many = many.clone();
    too_many.id = "too-many".into();
    too_many.labels.insert("one-more".into(), "v".into());
    expect_invalid(
        reg.register(too_many).await,
        "labels",
        "one label past the count limit",
    );

    // Label key and value at their limits, then a key one byte longer.
    let mut big = ep(&small, "big", 2).with_label(
        "k".repeat(MAX_LABEL_KEY_LEN),
        "v".repeat(MAX_LABEL_VALUE_LEN),
    );
    reg.register(big.clone())
        .await
        .expect("label key and value at the limit");
    let stored_big = big.clone();
    let long_key = "k".repeat(MAX_LABEL_KEY_LEN + 1);
    big.labels.insert(long_key.clone(), "v".into());
    expect_invalid(
        reg.register(big).await,
        &format!("labels[{}]", crate::backend::quote(&long_key)),
        "label key one past the limit",
    );

    // Total size: fill label values until the endpoint is exactly at the
    // backend's limit, then one byte more.
    let limit = caps.max_encoded_len;
    let full = endpoint_of_size(ep(&small, "full", 3), limit, caps.max_labels);
    let mut want = vec![stored_big, many];
    if encoded_len(&full) == limit {
        reg.register(full.clone())
            .await
            .expect("endpoint at the size limit");
        want.push(full.clone());
        let over = one_byte_more(full);
        assert_eq!(encoded_len(&over), limit + 1);
        expect_invalid(
            reg.register(over).await,
            "endpoint",
            "one byte past the size limit",
        );
    } else {
        // Not reachable with `max_labels` labels of the longest value: the
        // count and value limits bind first. The largest endpoint there is
        // must then be stored.
        skip(
            "limits_accepted_and_one_past_rejected",
            &reg,
            &format!(
                "the size limit itself, because capabilities say max_labels = {} and \
                 max_encoded_len = {limit}: the largest endpoint is {} bytes",
                caps.max_labels,
                encoded_len(&full)
            ),
        );
        reg.register(full.clone())
            .await
            .expect("the largest endpoint the label limits allow");
        want.push(full);
    }
    assert_eq!(sorted(reg.list(&small).await.expect("list")), sorted(want));
    assert_eq!(reg.list(&svc).await.expect("list"), vec![at]);
}

/// `e` with labels `f00`, `f01`, … added until its [`encoded_len`] is
/// `size`, or `max_labels` labels of the longest value fall short of it.
pub(super) fn endpoint_of_size(mut e: Endpoint, size: usize, max_labels: usize) -> Endpoint {
    let mut i = 0;
    while encoded_len(&e) < size && e.labels.len() < max_labels {
        let key = format!("f{i:02}");
        let room = size.saturating_sub(encoded_len(&e) + key.len());
        e.labels
            .insert(key, "v".repeat(room.min(MAX_LABEL_VALUE_LEN)));
        i += 1;
    }
    e
}

/// `e` one byte larger without breaking any other limit: one more
/// character in a label value (or key) that has room for it.
fn one_byte_more(mut e: Endpoint) -> Endpoint {
    if let Some(v) = e
        .labels
        .values_mut()
        .find(|v| v.len() < MAX_LABEL_VALUE_LEN)
    {
        v.push('v');
        return e;
    }
    let key = e
        .labels
        .keys()
        .find(|k| k.len() < MAX_LABEL_KEY_LEN)
        .cloned()
        .expect("a label with room for one more byte");
    let value = e.labels.remove(&key).unwrap_or_default();
    e.labels.insert(format!("{key}x"), value);
    e
}
