//! Cloud Map specific behaviour against `moto`: what plain AWS consumers
//! see, Cloud Map's limits, write modes, revision skipping, rate limiting
//! and a dead server.

use crate::common;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use common::{config, connect, harness, quiet_config, raw, start_moto};
use waypost::testing::{ep, eventually, unique};
use waypost::{Batch, Endpoint, Error, ErrorKind, Op, Registry};
use waypost_cloudmap::aws_sdk_servicediscovery::types::CustomHealthStatus;
use waypost_cloudmap::aws_sdk_servicediscovery::types::HealthStatusFilter;
use waypost_cloudmap::{layout, ReadMode, WriteMode};
use waypost_fixtures::MotoServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_discover_instances_sees_standard_attributes() {
    let h = harness().await;
    let reg = raw(&h);
    assert_eq!(reg.to_string(), format!("CloudMap({})", reg.namespace()));
    let v4 = Endpoint::new("web", "pod-a", "10.1.2.3", 8080).with_label("zone", "eu-west-1a");
    let v6 = Endpoint::new("web", "pod-b", "2001:db8::7", 8443);
    let named = Endpoint::new("web", "pod-c", "db.internal", 5432);
    for e in [&v4, &v6, &named] {
        reg.register(e.clone()).await.unwrap();
    }
    // An ordinary consumer: DiscoverInstances by namespace and service name.
    let out = reg
        .client()
        .discover_instances()
        .namespace_name(reg.namespace())
        .service_name("web")
        .health_status(HealthStatusFilter::All)
        .send()
        .await
        .unwrap();
    let by_id = |id: &str| {
        out.instances()
            .iter()
            .find(|i| i.instance_id() == Some(id))
            .and_then(|i| i.attributes())
            .unwrap_or_else(|| panic!("instance {id} not discovered: {out:?}"))
            .clone()
    };
    let a = by_id("pod-a");
    assert_eq!(
        a.get("AWS_INSTANCE_IPV4").map(String::as_str),
        Some("10.1.2.3")
    );
    assert_eq!(a.get("AWS_INSTANCE_PORT").map(String::as_str), Some("8080"));
    assert_eq!(a.get("label.zone").map(String::as_str), Some("eu-west-1a"));
    assert_eq!(
        a.get("registry.cluster").map(String::as_str),
        Some("default")
    );
    let b = by_id("pod-b");
    assert_eq!(
        b.get("AWS_INSTANCE_IPV6").map(String::as_str),
        Some("2001:db8::7")
    );
    assert_eq!(b.get("AWS_INSTANCE_PORT").map(String::as_str), Some("8443"));
    let c = by_id("pod-c");
    assert_eq!(
        c.get("registry.host").map(String::as_str),
        Some("db.internal")
    );
    assert!(!c.contains_key("AWS_INSTANCE_IPV4"));
    assert_eq!(reg.list("web").await.unwrap(), vec![v4, v6, named]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_one_labels_is_invalid_input_naming_the_limit() {
    let h = harness().await;
    let svc = unique("labels");
    let mut e = ep(&svc, "a", 1);
    for i in 0..31 {
        e.labels.insert(format!("k{i:02}"), "v".into());
    }
    match h.register(e.clone()).await {
        Err(Error::InvalidInput { field, reason, .. }) => {
            assert_eq!(field, "labels");
            assert!(
                reason.contains("30") && reason.contains(&layout::MAX_LABELS.to_string()),
                "{reason}"
            );
        }
        other => panic!("expected InvalidInput naming labels, got {other:?}"),
    }
    // In a batch too, naming the op; nothing was written.
    let err = h
        .apply(vec![Op::Register(ep(&svc, "ok", 2)), Op::Register(e)])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { field, .. } if field == "ops[1].labels"),
        "{err:?}"
    );
    assert!(h.list(&svc).await.unwrap().is_empty());
    assert_eq!(h.capabilities().max_labels, layout::MAX_LABELS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_polls_the_operation_and_fire_and_forget_does_not() {
    let moto = start_moto();
    let waiting = connect(config(&moto)).await;
    let svc = unique("modes");
    waiting.register(ep(&svc, "w", 1)).await.unwrap();
    assert!(
        waiting.stats().operation_polls >= 1,
        "{:?}",
        waiting.stats()
    );

    let fire = connect(config(&moto).with_write_mode(WriteMode::FireAndForget)).await;
    // Creating the namespace is always waited for; the writes are not.
    let polls = fire.stats().operation_polls;
    let e = ep(&svc, "f", 2);
    fire.register(e.clone()).await.unwrap();
    fire.deregister(&ep(&svc, "never", 3).key()).await.unwrap();
    assert_eq!(fire.stats().operation_polls, polls, "{:?}", fire.stats());
    eventually("the fire-and-forget write to show up", || async {
        fire.list(&svc).await.unwrap().contains(&e).then_some(())
    })
    .await;
    fire.deregister(&e.key()).await.unwrap();
    eventually("the fire-and-forget removal to show up", || async {
        (!fire.list(&svc).await.unwrap().contains(&e)).then_some(())
    })
    .await;
    assert_eq!(fire.stats().operation_polls, polls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_killed_is_unavailable_naming_the_endpoint() {
    let mut h = harness().await;
    let svc = unique("dead");
    h.register(ep(&svc, "a", 1)).await.unwrap();
    let moto = h.guard_mut::<MotoServer>().expect("the moto fixture");
    let url = moto.url().to_string();
    moto.kill();
    let errors = [
        h.register(ep(&svc, "b", 2)).await.unwrap_err(),
        h.deregister(&ep(&svc, "a", 1).key()).await.unwrap_err(),
        h.list(&svc).await.unwrap_err(),
        h.snapshot().await.unwrap_err(),
    ];
    for e in errors {
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.is_retryable());
        assert!(e.to_string().contains(&url), "{e} does not name {url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_namespace_is_not_found_when_creation_is_off() {
    let moto = start_moto();
    let cfg = config(&moto).with_create_namespace(false);
    let ns = cfg.namespace.clone();
    let err = waypost_cloudmap::CloudMapRegistry::with_sdk_config(common::sdk_config(), cfg)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(&ns), "{err}");
    // Created once, then found by a second registry on the same namespace.
    let first = connect(config(&moto)).await;
    let mut cfg = config(&moto).with_create_namespace(false);
    cfg.namespace = first.namespace().to_string();
    let again = connect(cfg).await;
    assert_eq!(again.namespace_id(), first.namespace_id());
}

/// Snapshots read only services whose revision changed, and everything
/// every k-th time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_skip_unchanged_services_but_read_all_every_kth() {
    for mode in [ReadMode::Discover, ReadMode::List] {
        let moto = start_moto();
        let cfg = quiet_config(&moto).with_full_poll_every(3);
        let reg = connect(cfg.with_read_mode(mode)).await;
        let (a, b) = (unique("rev-a"), unique("rev-b"));
        reg.register(ep(&a, "1", 1)).await.unwrap();
        reg.register(ep(&b, "1", 1)).await.unwrap();

        let reads = |r: &waypost_cloudmap::CloudMapRegistry| r.stats().instance_reads;
        let before = reads(&reg);
        let s0 = reg.snapshot().await.unwrap(); // cycle 0: full
        assert_eq!(
            reads(&reg) - before,
            2,
            "{mode:?}: first snapshot reads both"
        );
        assert_eq!(s0.len(), 2);

        let before = reads(&reg);
        let s1 = reg.snapshot().await.unwrap(); // cycle 1: nothing changed
        assert_eq!(
            reads(&reg) - before,
            0,
            "{mode:?}: unchanged services were read"
        );
        assert!(reg.stats().skipped_services >= 2);
        assert_eq!(s1, s0, "{mode:?}: an unchanged snapshot changed");

        reg.register(ep(&a, "2", 2)).await.unwrap();
        let before = reads(&reg);
        let s2 = reg.snapshot().await.unwrap(); // cycle 2: only `a` changed
        assert_eq!(
            reads(&reg) - before,
            1,
            "{mode:?}: only the changed service is read"
        );
        assert_eq!(s2.list(&a).len(), 2);
        assert!(s2.version() > s1.version());

        let before = reads(&reg);
        reg.snapshot().await.unwrap(); // cycle 3: full again
        assert_eq!(
            reads(&reg) - before,
            2,
            "{mode:?}: the k-th snapshot reads everything"
        );
    }
}

/// A Cloud Map health-status change does not bump the revision: revision
/// skipping misses it, the full read every `full_poll_every`-th snapshot
/// sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_change_without_revision_bump_is_seen_on_the_full_cycle() {
    let moto = start_moto();
    let k = 4;
    let reg = connect(config(&moto).with_full_poll_every(k)).await;
    let svc = unique("health");
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.unwrap();
    let s = reg.snapshot().await.unwrap(); // cycle 0: full
    assert_eq!(s.get(&a.key()), Some(&a));
    let revision = || async {
        reg.client()
            .discover_instances_revision()
            .namespace_name(reg.namespace())
            .service_name(&svc)
            .send()
            .await
            .unwrap()
            .instances_revision()
    };
    let before = revision().await;
    let service_id = reg
        .client()
        .list_services()
        .send()
        .await
        .unwrap()
        .services()
        .iter()
        .find(|s| s.name() == Some(svc.as_str()))
        .and_then(|s| s.id())
        .unwrap()
        .to_string();
    reg.client()
        .update_instance_custom_health_status()
        .service_id(service_id)
        .instance_id("a")
        .status(CustomHealthStatus::Unhealthy)
        .send()
        .await
        .unwrap();
    assert_eq!(
        revision().await,
        before,
        "the health change moved the revision"
    );
    let unhealthy = a.clone().with_health(waypost::Health::Unhealthy);
    for cycle in 1..k {
        let s = reg.snapshot().await.unwrap();
        assert_eq!(
            s.get(&a.key()),
            Some(&a),
            "cycle {cycle} was expected to skip the service"
        );
    }
    let s = reg.snapshot().await.unwrap(); // cycle k: full
    assert_eq!(
        s.get(&a.key()),
        Some(&unhealthy),
        "cycle {k} did not see the health change"
    );
    assert_eq!(reg.list(&svc).await.unwrap(), vec![unhealthy]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_is_not_atomic_and_keeps_to_the_rate_limit() {
    let moto = start_moto();
    let per_second = NonZeroU32::new(20).unwrap();
    let burst = NonZeroU32::new(1).unwrap();
    let reg = connect(
        config(&moto)
            .with_rate_limit(per_second, burst)
            .with_concurrency(4),
    )
    .await;
    assert!(!reg.capabilities().atomic_writes);
    let svc = unique("rate");
    let ops: Vec<Op> = (0..8)
        .map(|i| Op::Register(ep(&svc, &format!("e{i}"), 100 + i)))
        .collect();
    let before = reg.stats().requests;
    let started = Instant::now();
    reg.apply(ops).await.unwrap();
    let elapsed = started.elapsed();
    let requests = reg.stats().requests - before;
    // 8 registrations and their operations, plus the service lookup/creation.
    assert!(requests >= 16, "{requests} requests");
    let floor = Duration::from_secs_f64((requests - 1) as f64 / 20.0);
    assert!(
        elapsed >= floor.mul_f64(0.9),
        "{requests} requests in {elapsed:?}, faster than 20/s"
    );
    assert_eq!(reg.list(&svc).await.unwrap().len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_and_foreign_instances() {
    let h = harness().await;
    let reg = raw(&h);
    // Names Cloud Map can't hold verbatim are hashed and read back unchanged.
    let odd = Endpoint::new("Payments/EU", "pod with:ü", "10.0.0.1", 80);
    let err = reg.register(odd.clone()).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidInput,
        "whitespace in the id is refused first"
    );
    let odd = Endpoint::new("Payments/EU", "pod%ü", "10.0.0.1", 80);
    reg.register(odd.clone()).await.unwrap();
    assert_eq!(reg.list("Payments/EU").await.unwrap(), vec![odd.clone()]);
    assert!(reg.snapshot().await.unwrap().contains(&odd.key()));
    // An instance registered by another tool, with only the standard attributes.
    let sid = reg
        .client()
        .create_service()
        .name("foreign")
        .namespace_id(reg.namespace_id())
        .send()
        .await
        .unwrap()
        .service()
        .and_then(|s| s.id())
        .unwrap()
        .to_string();
    reg.client()
        .register_instance()
        .service_id(&sid)
        .instance_id("i-1")
        .attributes("AWS_INSTANCE_IPV4", "192.0.2.44")
        .attributes("AWS_INSTANCE_PORT", "443")
        .send()
        .await
        .unwrap();
    reg.client()
        .register_instance()
        .service_id(&sid)
        .instance_id("no-port")
        .attributes("AWS_INSTANCE_IPV4", "192.0.2.45")
        .send()
        .await
        .unwrap();
    assert_eq!(
        reg.list("foreign").await.unwrap(),
        vec![Endpoint::new("foreign", "i-1", "192.0.2.44", 443)]
    );
}

/// Two registries on one server, one service name: each sees only its own
/// namespace (moto's `ListServices` ignores the namespace filter, so this
/// fails unless services are checked against the namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_isolated() {
    let moto = start_moto();
    let one = connect(config(&moto)).await;
    let two = connect(config(&moto)).await;
    assert_ne!(one.namespace_id(), two.namespace_id());
    let svc = unique("shared-name");
    one.register(ep(&svc, "from-one", 1)).await.unwrap();
    two.register(ep(&svc, "from-two", 2)).await.unwrap();
    assert_eq!(one.list(&svc).await.unwrap(), vec![ep(&svc, "from-one", 1)]);
    assert_eq!(two.list(&svc).await.unwrap(), vec![ep(&svc, "from-two", 2)]);
    let snap = one.snapshot().await.unwrap();
    assert_eq!(snap.to_vec(), vec![ep(&svc, "from-one", 1)]);
    two.deregister(&ep(&svc, "from-two", 2).key())
        .await
        .unwrap();
    assert_eq!(one.list(&svc).await.unwrap().len(), 1);
    let one_list = connect({
        let mut c = config(&moto).with_read_mode(ReadMode::List);
        c.namespace = one.namespace().to_string();
        c
    })
    .await;
    assert_eq!(
        one_list.list(&svc).await.unwrap(),
        vec![ep(&svc, "from-one", 1)]
    );
}

/// With `custom_health`, an unhealthy endpoint is hidden from consumers
/// asking Cloud Map for healthy instances, and still listed by us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_health_hides_unhealthy_endpoints_from_healthy_discovery() {
    let moto = start_moto();
    let reg = connect(config(&moto).with_custom_health(true)).await;
    let svc = unique("custom-health");
    let up = ep(&svc, "up", 1);
    let down = ep(&svc, "down", 2).with_health(waypost::Health::Unhealthy);
    reg.register(up.clone()).await.unwrap();
    reg.register(down.clone()).await.unwrap();
    let discover = |filter: HealthStatusFilter| {
        let (client, ns, svc) = (
            reg.client().clone(),
            reg.namespace().to_string(),
            svc.clone(),
        );
        async move {
            let out = client
                .discover_instances()
                .namespace_name(ns)
                .service_name(svc)
                .health_status(filter)
                .send()
                .await
                .unwrap();
            let mut ids: Vec<String> = out
                .instances()
                .iter()
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(discover(HealthStatusFilter::Healthy).await, vec!["up"]);
    assert_eq!(discover(HealthStatusFilter::All).await, vec!["down", "up"]);
    assert_eq!(reg.list(&svc).await.unwrap(), vec![down, up]);
}

/// An existing DNS namespace is used as it is: services are created
/// API-only, and endpoints (including host names) round-trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_dns_namespace_is_used() {
    let moto = start_moto();
    let creator = connect(config(&moto)).await;
    let name = format!("{}.example.com", unique("dns"));
    let op = creator
        .client()
        .create_public_dns_namespace()
        .name(&name)
        .send()
        .await
        .unwrap();
    assert!(op.operation_id().is_some());
    let mut cfg = config(&moto).with_create_namespace(false);
    cfg.namespace = name.clone();
    let reg = connect(cfg).await;
    let svc = unique("in-dns");
    let named = Endpoint::new(&svc, "a", "db.internal", 5432);
    reg.register(named.clone()).await.unwrap();
    assert_eq!(reg.list(&svc).await.unwrap(), vec![named.clone()]);
    let service = reg
        .client()
        .list_services()
        .send()
        .await
        .unwrap()
        .services()
        .iter()
        .find(|s| s.name() == Some(svc.as_str()))
        .cloned()
        .unwrap();
    let got = reg
        .client()
        .get_service()
        .id(service.id().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.service().and_then(|s| s.namespace_id()),
        Some(reg.namespace_id())
    );
    assert_eq!(
        got.service()
            .and_then(|s| s.r#type())
            .map(|t| t.as_str().to_string()),
        Some("HTTP".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reads_the_namespace_and_reports_it_missing() {
    let moto = start_moto();
    let reg = connect(quiet_config(&moto)).await;
    let before = reg.stats().requests;
    reg.probe().await.unwrap();
    assert_eq!(reg.stats().requests, before + 1, "one request per probe");
    // Through Polling, as servers use it.
    let polled = waypost::polling::Polling::new(reg.clone());
    polled.probe().await.unwrap();
    assert!(reg.snapshot().await.unwrap().is_empty(), "the probe wrote");

    // The namespace is deleted behind the registry's back.
    reg.client()
        .delete_namespace()
        .id(reg.namespace_id())
        .send()
        .await
        .unwrap();
    let err = reg.probe().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(reg.namespace()), "{err}");
    let err = polled.probe().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");

    // And a dead server is Unavailable.
    let mut moto = moto;
    moto.kill();
    let err = reg.probe().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

/// The sum of the lengths of an endpoint's attribute keys and values.
fn attributes_len(e: &Endpoint) -> usize {
    layout::encode(e)
        .unwrap()
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum()
}

/// `max_encoded_len` (4,700) is what Cloud Map's 5,000 characters of
/// attributes hold for any endpoint of printable ASCII: the largest
/// overhead (every reserved attribute present, 24 labels, most of them
/// with empty values) still fits.
#[test]
fn the_size_limit_fits_cloud_maps_attributes() {
    use waypost::limits::{encoded_len, MAX_LABEL_VALUE_LEN, MAX_NAME_LEN};
    // Every optional attribute present: a host name, a hashed id, a node,
    // the longest protocol and health names, a five-digit port.
    let mut e = Endpoint::new("s", "i".repeat(MAX_NAME_LEN), "host.example", 65535)
        .with_node("n")
        .with_protocol(waypost::Protocol::Grpc)
        .with_health(waypost::Health::Unhealthy);
    // Labels with empty values (stored as `%`), then values that fill the
    // rest up to exactly the size limit.
    for i in 0..layout::MAX_LABELS {
        e.labels.insert(format!("k{i:02}"), String::new());
    }
    for i in 0..layout::MAX_LABELS {
        let room = layout::MAX_ENCODED_LEN - encoded_len(&e);
        if room == 0 {
            break;
        }
        e.labels.insert(
            format!("k{i:02}"),
            "v".repeat(room.min(MAX_LABEL_VALUE_LEN)),
        );
    }
    assert_eq!(encoded_len(&e), layout::MAX_ENCODED_LEN);
    assert!(
        attributes_len(&e) <= layout::MAX_ATTRIBUTES_LEN,
        "{} characters of attributes",
        attributes_len(&e)
    );
}

/// Below the size limit, escaped characters (three each) can still take
/// the attributes past 5,000 characters: refused naming `endpoint`; exactly
/// 5,000 is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_attributes_past_5000_characters_are_refused() {
    use waypost::limits::encoded_len;
    const LABEL_PREFIX: usize = "label.".len();
    let h = harness().await;
    let svc = unique("escaped");
    let mut full = ep(&svc, "full", 3);
    // Values of spaces (`%20` each in Cloud Map), leaving 20 to 31
    // characters of room...
    for i in 0.. {
        let room = layout::MAX_ATTRIBUTES_LEN - attributes_len(&full);
        let key = format!("f{i:02}");
        let spaces = (room.saturating_sub(20 + LABEL_PREFIX + key.len()) / 3).min(341);
        if spaces == 0 {
            break;
        }
        full.labels.insert(key, " ".repeat(spaces));
    }
    // ...then one label of plain characters up to exactly 5,000.
    let room = layout::MAX_ATTRIBUTES_LEN - attributes_len(&full);
    full.labels
        .insert("zz".into(), "v".repeat(room - LABEL_PREFIX - 2));
    assert_eq!(attributes_len(&full), layout::MAX_ATTRIBUTES_LEN);
    assert!(encoded_len(&full) < layout::MAX_ENCODED_LEN);
    h.register(full.clone())
        .await
        .expect("attributes at the limit");
    let mut over = full.clone();
    over.labels.get_mut("zz").unwrap().push(' ');
    assert!(encoded_len(&over) < layout::MAX_ENCODED_LEN);
    waypost::testing::expect_invalid(h.register(over).await, "endpoint", "5,003 characters");
    assert_eq!(h.list(&svc).await.unwrap(), vec![full]);
}
