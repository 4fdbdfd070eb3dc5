//! The reading of registration bodies: py-consul's spelling, Consul's
//! field names in errors, checks and their damping, weights.

#![allow(clippy::unwrap_used)]

use super::*;

fn field(body: &str) -> String {
    match registration(body.as_bytes(), 0).unwrap_err() {
        Error::InvalidInput { field, .. } => field,
        other => panic!("{body}: {other:?}"),
    }
}

#[test]
fn py_consul_s_lower_case_body_reads_as_consul_s() {
    let r = registration(
        br#"{"name":"web","id":"web-1","address":"127.0.0.1","port":8080,
             "tags":["a","b"],"meta":{"zone":"z1"},
             "checks":[{"ttl":"10s"},{"http":"http://127.0.0.1:9/h","interval":"1m30s",
                        "DeregisterCriticalServiceAfter":"90m"}]}"#,
        5,
    )
    .unwrap();
    assert_eq!(
        (r.name.as_str(), r.id.as_str(), r.port),
        ("web", "web-1", 8080)
    );
    assert_eq!(r.tags, vec!["a", "b"]);
    assert_eq!(r.meta["zone"], "z1");
    assert_eq!(r.checks[0].0, "service:web-1:1");
    assert_eq!(r.checks[0].1.probe, Probe::Ttl { ttl_ms: 10_000 });
    assert_eq!(r.checks[0].1.status, Status::Critical);
    assert_eq!(r.checks[1].0, "service:web-1:2");
    match &r.checks[1].1.probe {
        Probe::Http {
            interval_ms,
            timeout_ms,
            method,
            ..
        } => assert_eq!(
            (*interval_ms, *timeout_ms, method.as_str()),
            (90_000, 10_000, "GET")
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.checks[1].1.deregister_after_ms, Some(90 * 60_000));
}

#[test]
fn one_check_is_service_colon_id_and_the_id_defaults_to_the_name() {
    let r = registration(
        br#"{"Name":"api","Port":1,"Check":{"TCP":"127.0.0.1:1","Interval":"10s","Timeout":"1s","Status":"passing"}}"#,
        0,
    )
    .unwrap();
    assert_eq!(r.id, "api");
    assert_eq!(r.checks[0].0, "service:api");
    assert_eq!(r.checks[0].1.status, Status::Passing);
    assert_eq!(r.checks[0].1.name, "Service 'api' check");
}

#[test]
fn errors_name_consul_s_field() {
    assert_eq!(field(r#"{"Port":1}"#), "Name");
    assert_eq!(field(r#"{"Name":"w","Port":70000}"#), "Port");
    assert_eq!(field(r#"{"Name":"w","Port":"80"}"#), "Port");
    assert_eq!(field(r#"{"Name":"w","Tags":["a,b"]}"#), "Tags[0]");
    assert_eq!(field(r#"{"Name":"w","Meta":{"k":1}}"#), "Meta[\"k\"]");
    assert_eq!(
        field(r#"{"Name":"w","Check":{"HTTP":"http://x","Interval":"soon"}}"#),
        "Check.Interval"
    );
    assert_eq!(
        field(r#"{"Name":"w","Check":{"HTTP":"http://x"}}"#),
        "Check.Interval"
    );
    assert_eq!(
        field(r#"{"Name":"w","Check":{"HTTP":"https://x","Interval":"5s"}}"#),
        "Check.HTTP"
    );
    assert_eq!(
        field(r#"{"Name":"w","Checks":[{"TTL":"5s"},{"Args":["true"],"Interval":"5s"}]}"#),
        "Checks[1].Args"
    );
    assert_eq!(
        field(r#"{"Name":"w","Check":{"Interval":"5s"}}"#),
        "Check.TTL"
    );
    assert_eq!(
        field(r#"{"Name":"w","Check":{"TTL":"5s","Status":"ok"}}"#),
        "Check.Status"
    );
    assert_eq!(field(r#"{"Name":"w","Kind":"connect-proxy"}"#), "Kind");
    assert_eq!(field("[1]"), "body");
    assert_eq!(field("{"), "body");
}

#[test]
fn an_update_names_its_status() {
    assert_eq!(
        update(br#"{"Status":"warning","Output":"slow"}"#).unwrap(),
        (Status::Warning, "slow".to_string())
    );
    assert!(update(br#"{"Status":"fine"}"#).is_err());
}

#[test]
fn weights_passing_is_kept_and_checked() {
    let r = registration(
        br#"{"Name":"web","Port":1,"Weights":{"Passing":10,"Warning":1}}"#,
        0,
    )
    .unwrap();
    assert_eq!(r.weight, Some(10));
    let r = registration(br#"{"name":"web","port":1,"weights":{"passing":3}}"#, 0).unwrap();
    assert_eq!(r.weight, Some(3));
    assert_eq!(
        registration(br#"{"Name":"web","Port":1}"#, 0)
            .unwrap()
            .weight,
        None
    );
    for bad in [
        r#"{"Name":"w","Port":1,"Weights":{"Passing":0}}"#,
        r#"{"Name":"w","Port":1,"Weights":{"Passing":65536}}"#,
    ] {
        assert_eq!(field(bad), "Weights.Passing", "{bad}");
    }
    assert_eq!(
        field(r#"{"Name":"w","Port":1,"Weights":{"Passing":"heavy"}}"#),
        "Weights.Passing"
    );
    assert_eq!(
        field(r#"{"Name":"w","Port":1,"Weights":{"Warning":-1}}"#),
        "Weights.Warning"
    );
}

#[test]
fn damping_is_read_from_a_check_and_refused_where_it_cannot_apply() {
    let r = registration(
        br#"{"Name":"w","Port":1,"Check":{"HTTP":"http://127.0.0.1:1/","Interval":"1s",
             "SuccessBeforePassing":2,"FailuresBeforeCritical":3}}"#,
        0,
    )
    .unwrap();
    let d = r.checks[0].1.damping;
    assert_eq!(
        (
            d.success_before_passing,
            d.failures_before_warning,
            d.failures_before_critical
        ),
        (2, 3, 3)
    );
    assert_eq!(
        field(
            r#"{"Name":"w","Check":{"TCP":"127.0.0.1:1","Interval":"1s","FailuresBeforeWarning":4,"FailuresBeforeCritical":3}}"#
        ),
        "Check.FailuresBeforeWarning"
    );
    assert_eq!(
        field(r#"{"Name":"w","Check":{"TTL":"5s","FailuresBeforeCritical":3}}"#),
        "Check.FailuresBeforeCritical"
    );
    assert_eq!(
        field(
            r#"{"Name":"w","Check":{"TCP":"127.0.0.1:1","Interval":"1s","SuccessBeforePassing":-1}}"#
        ),
        "Check.SuccessBeforePassing"
    );
}

#[test]
fn a_check_registered_apart_names_its_service_and_defaults_its_id_to_its_name() {
    let r = check_registration(
        br#"{"name":"db","serviceid":"web-1","tcp":"127.0.0.1:5432","interval":"5s","FailuresBeforeCritical":2}"#,
        0,
    )
    .unwrap();
    assert_eq!(
        (r.service_id.as_str(), r.check_id.as_str()),
        ("web-1", "db")
    );
    assert_eq!(r.check.damping.failures_before_critical, 2);
    let r =
        check_registration(br#"{"Name":"t","ID":"t-1","ServiceID":"a","TTL":"5s"}"#, 0).unwrap();
    assert_eq!(r.check_id, "t-1");
    let missing = |body: &str| match check_registration(body.as_bytes(), 0).unwrap_err() {
        Error::InvalidInput { field, .. } => field,
        other => panic!("{body}: {other:?}"),
    };
    assert_eq!(missing(r#"{"Name":"t","TTL":"5s"}"#), "ServiceID");
    assert_eq!(missing(r#"{"ServiceID":"a","TTL":"5s"}"#), "Name");
}
