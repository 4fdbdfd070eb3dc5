//! The registry-api conformance suite against Cloud Map on `moto`, through
//! `Polling` (50 ms), each check with an emulator and a namespace of its own.
//!
//! Every check of `registry_api::conformance_tests!` runs here except
//! `limits_accepted_and_one_past_rejected`: it stores a 16 KiB endpoint,
//! while Cloud Map takes at most 5,000 characters of attributes per
//! instance. `limits_at_cloud_map_sizes` below checks the same limits with
//! Cloud Map's numbers.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Harness, HISTORY};
use registry_api::limits::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_NAME_LEN};
use registry_api::testing::{ep, follow_until, next_event, unique};
use registry_api::{Endpoint, Error, Event, Registry, Watch};
use registry_cloudmap::layout;

async fn make() -> Harness {
    Harness::start().await
}

/// Write more changes than the polling hub keeps, and wait until the hub
/// has seen them: the history after any earlier version is then gone.
async fn lose_history(h: &Harness) {
    let svc = unique("filler");
    let fill: Vec<Endpoint> = (0..HISTORY as u16 + 2)
        .map(|i| ep(&svc, &format!("f{i:02}"), i + 1))
        .collect();
    for e in &fill {
        h.register(e.clone()).await.expect("filler write");
    }
    let mut w = h.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the filler snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    follow_until(&mut w, &mut state, &svc, &fill).await;
}

macro_rules! checks {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let reg = make().await;
            registry_api::testing::$check(&*reg).await;
        }
    )*};
}

checks!(
    register_is_upsert,
    deregister_removes,
    deregister_unknown_is_ok,
    list_unknown_service_is_empty,
    list_is_scoped_to_service,
    snapshot_has_everything_and_versions_grow,
    roundtrip_preserves_all_fields,
    batch_applies_in_order,
    batch_invalid_op_writes_nothing,
    batch_is_atomic,
    watch_starts_with_snapshot,
    watch_delivers_changes_in_order_once,
    watch_resume_loses_nothing,
    two_watchers_agree,
    concurrent_writers_lose_nothing,
    invalid_input_names_field,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_watch_fresh_snapshot_when_history_gone() {
    let reg = make().await;
    registry_api::testing::watch_fresh_snapshot_when_history_gone(&*reg, || lose_history(&reg))
        .await;
}

fn field_of(res: registry_api::Result<()>, case: &str) -> String {
    match res {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("{case}: expected InvalidInput, got {other:?}"),
    }
}

fn attributes_len(e: &Endpoint) -> usize {
    layout::encode(e)
        .unwrap()
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum()
}

/// `limits_accepted_and_one_past_rejected` with Cloud Map's limits: values
/// at each limit are stored, one past is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_at_cloud_map_sizes() {
    let reg = make().await;
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
    assert_eq!(field_of(reg.register(past).await, "id past"), "id");

    let small = unique("limits-labels");
    let max_labels = reg.capabilities().max_labels;
    assert_eq!(max_labels, layout::MAX_LABELS);
    let mut many = ep(&small, "many", 1);
    for i in 0..max_labels {
        many.labels.insert(format!("k{i:02}"), format!("v{i}"));
    }
    reg.register(many.clone())
        .await
        .expect("labels at the count limit");
    let mut too_many = many.clone();
    too_many.id = "too-many".into();
    too_many.labels.insert("one-more".into(), "v".into());
    assert_eq!(field_of(reg.register(too_many).await, "labels"), "labels");

    let mut big = ep(&small, "big", 2).with_label(
        "k".repeat(MAX_LABEL_KEY_LEN),
        "v".repeat(MAX_LABEL_VALUE_LEN),
    );
    reg.register(big.clone())
        .await
        .expect("label key and value at the limit");
    let key = "k".repeat(MAX_LABEL_KEY_LEN + 1);
    big.labels.insert(key.clone(), "v".into());
    assert_eq!(
        field_of(reg.register(big.clone()).await, "key past"),
        format!("labels[{}]", registry_api::backend::quote(&key))
    );

    // Total attribute size: exactly Cloud Map's 5,000 characters, then one more.
    let mut full = ep(&small, "full", 3);
    let mut i = 0;
    while attributes_len(&full) < layout::MAX_ATTRIBUTES_LEN {
        let key = format!("f{i:02}");
        full.labels.insert(key.clone(), String::new());
        let room = layout::MAX_ATTRIBUTES_LEN.saturating_sub(attributes_len(&full));
        // The empty value is stored as "%" (1 character).
        full.labels
            .insert(key, "v".repeat((room + 1).min(MAX_LABEL_VALUE_LEN)));
        i += 1;
    }
    assert_eq!(attributes_len(&full), layout::MAX_ATTRIBUTES_LEN);
    reg.register(full.clone())
        .await
        .expect("attributes at the size limit");
    let mut over = full.clone();
    let last = over.labels.keys().last().cloned().unwrap();
    over.labels.get_mut(&last).unwrap().push('v');
    assert_eq!(field_of(reg.register(over).await, "size past"), "endpoint");

    let got = reg.list(&small).await.expect("list");
    assert_eq!(got, vec![big_without(&big, &key), full, many]);
    assert_eq!(reg.list(&svc).await.expect("list"), vec![at]);
}

fn big_without(big: &Endpoint, key: &str) -> Endpoint {
    let mut b = big.clone();
    b.labels.remove(key);
    b
}
