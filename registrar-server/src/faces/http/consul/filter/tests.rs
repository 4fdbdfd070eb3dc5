//! The filter subset on entries shaped as Consul's answers.

#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

fn entry() -> Value {
    json!({
        "Node": {"Node": "n1", "Address": "10.0.0.1", "Datacenter": "east", "Meta": {}},
        "Service": {
            "ID": "web-1", "Service": "web", "Tags": ["v1", "primary"], "Port": 8080,
            "Meta": {"zone": "z1", "app.version": "2", "empty": ""},
            "Weights": {"Passing": 3, "Warning": 1}
        },
        "Checks": [
            {"CheckID": "a", "Status": "passing"},
            {"CheckID": "b", "Status": "critical"}
        ]
    })
}

fn holds(filter: &str) -> bool {
    Filter::parse(filter, HEALTH_SERVICE)
        .unwrap_or_else(|e| panic!("{filter}: {e}"))
        .matches(&entry())
}

fn refused(filter: &str, selectors: Selectors) -> FilterError {
    match Filter::parse(filter, selectors) {
        Err(e) => e,
        Ok(f) => panic!("{filter} parsed: {f:?}"),
    }
}

#[test]
fn equality_and_substrings_on_text() {
    assert!(holds(r#"Service.Service == "web""#));
    assert!(!holds(r#"Service.Service != "web""#));
    assert!(holds("Service.Service == `web`"));
    assert!(holds("Service.Service == web"));
    assert!(holds(r#"Service.ID contains "eb-""#));
    assert!(holds(r#""eb-" in Service.ID"#));
    assert!(holds(r#"Service.ID not contains "api""#));
    assert!(!holds(r#""eb" not in Service.ID"#));
    assert!(holds(r#"Node.Node == "n1" and Node.Datacenter == "east""#));
}

#[test]
fn lists_and_maps_hold_elements_and_keys() {
    assert!(holds(r#"Service.Tags contains "primary""#));
    assert!(holds(r#""v1" in Service.Tags"#));
    assert!(!holds(r#""v" in Service.Tags"#));
    assert!(holds(r#""v2" not in Service.Tags"#));
    assert!(holds(r#"Service.Meta contains "zone""#));
    assert!(holds(r#"Service.Meta.zone == "z1""#));
    assert!(holds(r#"Service.Meta["app.version"] == "2""#));
    assert!(holds("Service.Meta is not empty"));
    assert!(holds("Node.Meta is empty"));
    assert!(holds("Service.Meta.empty is empty"));
    assert!(holds(
        r#"Service.Port == 8080 and Service.Weights.Passing == 3"#
    ));
    assert!(!holds(r#"Service.Port != 8080"#));
}

#[test]
fn an_absent_value_reads_as_empty() {
    assert!(!holds(r#"Service.Meta.missing == "x""#));
    assert!(holds(r#"Service.Meta.missing != "x""#));
    assert!(holds("Service.Meta.missing is empty"));
    assert!(!holds(r#"Service.Meta.missing contains "x""#));
    assert!(holds(r#"Service.Meta.missing not contains "x""#));
}

#[test]
fn a_selector_through_a_list_of_checks_holds_for_any_of_them() {
    assert!(holds(r#"Checks.Status == "critical""#));
    assert!(holds(r#"Checks.Status != "passing""#));
    assert!(!holds(r#"Checks.Status == "warning""#));
    assert!(holds(r#"not Checks.Status == "warning""#));
}

#[test]
fn not_and_or_and_parentheses_bind_as_usual() {
    // `and` binds tighter than `or`.
    assert!(holds(
        r#"Service.Service == "api" and Service.Port == 1 or Service.ID == "web-1""#
    ));
    assert!(!holds(
        r#"Service.Service == "api" and (Service.Port == 1 or Service.ID == "web-1")"#
    ));
    assert!(holds(
        r#"not (Service.Service == "api" or Service.Port == 1)"#
    ));
    assert!(!holds(r#"not not Service.Service == "api""#));
    assert!(holds(r#"((("v1" in Service.Tags)))"#));
}

#[test]
fn quoted_strings_read_escapes_and_backticks_are_raw() {
    let e = json!({"Service": {"Meta": {"k": "a\"b\\n"}}});
    let f = Filter::parse(r#"Service.Meta.k == "a\"b\\n""#, HEALTH_SERVICE).unwrap();
    assert!(f.matches(&e));
    let raw = Filter::parse(r#"Service.Meta.k == `a"b\n`"#, HEALTH_SERVICE).unwrap();
    assert!(raw.matches(&e));
}

#[test]
fn each_route_takes_its_own_selectors() {
    let catalog = json!({"ServiceName": "web", "ServiceTags": ["v1"], "ServiceMeta": {"zone": "z1"}, "Node": "n1"});
    for f in [
        r#"ServiceName == "web""#,
        r#"ServiceTags contains "v1""#,
        r#"ServiceMeta.zone == "z1""#,
        r#"ServiceMeta["zone"] == "z1""#,
        r#"Node == "n1""#,
    ] {
        assert!(
            Filter::parse(f, CATALOG_SERVICE).unwrap().matches(&catalog),
            "{f}"
        );
    }
    assert!(matches!(
        refused(r#"Service.Service == "web""#, CATALOG_SERVICE),
        FilterError::UnknownSelector { .. }
    ));
    let agent = json!({"Service": "web", "Tags": ["v1"]});
    assert!(Filter::parse(r#"Service == "web""#, SERVICES)
        .unwrap()
        .matches(&agent));
    let check = json!({"Status": "critical", "ServiceName": "web"});
    assert!(
        Filter::parse(r#"Status == "critical" and ServiceName == "web""#, CHECKS)
            .unwrap()
            .matches(&check)
    );
}

#[test]
fn what_is_outside_the_subset_is_refused_naming_it() {
    let unknown = refused(r#"Service.Nope == "x""#, HEALTH_SERVICE);
    assert!(unknown.to_string().contains("Service.Nope"), "{unknown}");
    assert!(unknown.to_string().contains("Service.Tags"), "{unknown}");
    let matches = refused(r#"Service.ID matches "w.*""#, HEALTH_SERVICE);
    assert!(matches.to_string().contains("matches"), "{matches}");
    let not_matches = refused(r#"Service.ID not matches "w.*""#, HEALTH_SERVICE);
    assert!(
        not_matches.to_string().contains("not matches"),
        "{not_matches}"
    );
    let gt = refused("Service.Port > 80", HEALTH_SERVICE);
    assert!(gt.to_string().contains("\">\""), "{gt}");
    let eq_list = refused(r#"Service.Tags == "v1""#, HEALTH_SERVICE);
    assert!(
        matches!(eq_list, FilterError::Operator { kind: "a list", .. }),
        "{eq_list}"
    );
    let contains_number = refused("Service.Port contains 8", HEALTH_SERVICE);
    assert!(matches!(contains_number, FilterError::Operator { .. }));
    let not_a_number = refused(r#"Service.Port == "http""#, HEALTH_SERVICE);
    assert!(matches!(not_a_number, FilterError::Operator { .. }));
}

#[test]
fn syntax_errors_say_where() {
    for (filter, at) in [
        (r#"Service.ID == "web"#, 14),
        (r#"Service.ID == "a" and"#, 21),
        (r#"(Service.ID == "a""#, 18),
        (r#"Service.ID "a""#, 11),
        (r#"Service.ID == "a" Service.ID == "b""#, 18),
        ("Service.Tags is full", 16),
        (r#"Service.Meta["k" == "v""#, 17),
    ] {
        match refused(filter, HEALTH_SERVICE) {
            FilterError::Syntax { at: got, .. } => assert_eq!(got, at, "{filter}"),
            other => panic!("{filter}: {other}"),
        }
    }
    let deep = format!("{}Service.ID == \"a\"", "not ".repeat(40));
    assert!(matches!(
        refused(&deep, HEALTH_SERVICE),
        FilterError::Syntax { .. }
    ));
    let long = format!("Service.ID == \"{}\"", "a".repeat(MAX_FILTER_BYTES));
    assert!(matches!(
        refused(&long, HEALTH_SERVICE),
        FilterError::TooLong { .. }
    ));
}

#[test]
fn keep_filters_serializable_entries() {
    let f = Filter::parse(r#"Status == "critical""#, CHECKS).unwrap();
    let kept = keep(
        Some(&f),
        vec![json!({"Status": "passing"}), json!({"Status": "critical"})],
    );
    assert_eq!(kept, vec![json!({"Status": "critical"})]);
    assert_eq!(keep(None, vec![1, 2]).len(), 2);
}
