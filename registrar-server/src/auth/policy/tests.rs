#![allow(clippy::unwrap_used)]

use waypost::testing::ep;
use waypost::Endpoint;

use super::*;

const EXAMPLE: &str = r#"
[[rule]]
name = "operators"
ids = ["spiffe://example.org/ns/ops/sa/*"]
read = true
write = { services = ["*"], clusters = ["*"], nodes = ["*"] }

[[rule]]
name = "agents"
ids = ["spiffe://{trust_domain}/node/{node}"]
read = true
write = { addresses = ["10.0.0.0/8", "fd00::/8"] }

[[rule]]
name = "payments"
ids = ["spiffe://example.org/ns/payments/sa/deployer"]
write = { services = ["payments", "payments-*"], nodes = ["*"] }
"#;

fn policy() -> Policy {
    Policy::parse(EXAMPLE, "example.org", "east").unwrap()
}

fn check(p: &Policy, id: &str, e: &Endpoint) -> std::result::Result<(), Status> {
    let (rule, node) = p.find(id).expect("a rule matches");
    rule.check_write(id, node.as_deref(), e)
}

fn agent_ep() -> Endpoint {
    at(
        ep("api", "1", 80).with_node("n1").with_cluster("east"),
        "10.1.2.3",
    )
}

fn at(mut e: Endpoint, address: &str) -> Endpoint {
    e.address = address.to_string();
    e
}

#[test]
fn the_first_matching_rule_decides() {
    let p = policy();
    assert_eq!(
        p.rule_names().collect::<Vec<_>>(),
        ["operators", "agents", "payments"]
    );
    let (r, node) = p.find("spiffe://example.org/node/n1").unwrap();
    assert_eq!((r.name(), node.as_deref()), ("agents", Some("n1")));
    let (r, node) = p.find("spiffe://example.org/ns/ops/sa/alice").unwrap();
    assert_eq!((r.name(), node), ("operators", None));
    // `*` stops at `/`.
    assert!(p.find("spiffe://example.org/ns/ops/sa/alice/x").is_none());
    assert!(p.find("spiffe://example.org/node/").is_none());
    assert!(p.find("spiffe://example.org/else").is_none());
}

#[test]
fn agents_write_their_node_in_this_cluster_at_allowed_addresses() {
    let p = policy();
    let id = "spiffe://example.org/node/n1";
    check(&p, id, &agent_ep()).unwrap();
    check(&p, id, &at(agent_ep(), "fd00::1")).unwrap();
    let e = check(&p, id, &agent_ep().with_node("n2")).unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("rule \"agents\"") && e.message().contains("{node} = \"n1\""),
        "{}",
        e.message()
    );
    let e = check(&p, id, &agent_ep().with_cluster("west")).unwrap_err();
    assert!(e.message().contains("cluster \"west\""), "{}", e.message());
    for addr in ["192.168.1.1", "db.internal", "::1"] {
        let e = check(&p, id, &at(agent_ep(), addr)).unwrap_err();
        assert!(
            e.message().contains("address") && e.message().contains("10.0.0.0/8"),
            "{addr}: {}",
            e.message()
        );
    }
}

#[test]
fn a_service_account_writes_only_its_services() {
    let p = policy();
    let id = "spiffe://example.org/ns/payments/sa/deployer";
    let mine = ep("payments-api", "1", 80)
        .with_node("any")
        .with_cluster("east");
    check(&p, id, &mine).unwrap();
    let e = check(&p, id, &ep("auth", "1", 80).with_cluster("east")).unwrap_err();
    assert!(
        e.message().contains("service \"auth\"") && e.message().contains("\"payments-*\""),
        "{}",
        e.message()
    );
    let (rule, node) = p.find(id).unwrap();
    assert!(!rule.may_read(), "read defaults to false");
    assert!(rule.check_heartbeat(id, node.as_deref(), "n9").is_ok());
}

#[test]
fn bad_policies_are_refused_naming_the_rule() {
    let cases = [
        ("", "no [[rule]]"),
        ("[[rule]]\nname = \"a\"\nids = []\n", "`ids` is empty"),
        (
            "[[rule]]\nname = \"a\"\nids = [\"spiffe://other.org/x\"]\n",
            "not of the trust domain",
        ),
        (
            "[[rule]]\nname = \"a\"\nids = [\"spiffe://example.org/x\"]\nwrite = {}\n",
            "not every ID of the rule has {node}",
        ),
        (
            "[[rule]]\nname = \"a\"\nids = [\"spiffe://example.org/{node}\"]\nwrite = { addresses = [\"10.0.0.0/33\"] }\n",
            "address range \"10.0.0.0/33\"",
        ),
        (
            "[[rule]]\nname = \"a\"\nids = [\"spiffe://example.org/x\"]\nwrite = { services = [\"[\"], nodes = [\"*\"] }\n",
            "services \"[\"",
        ),
        (
            "[[rule]]\nname = \"a\"\nids = [\"spiffe://example.org/x\"]\n[[rule]]\nname = \"a\"\nids = [\"spiffe://example.org/y\"]\n",
            "two rules are named \"a\"",
        ),
        (
            "[[rule]]\nname = \"a\"\nids = [\"spiffe://example.org/x\"]\nwrite = { service = [\"x\"] }\n",
            "unknown field",
        ),
    ];
    for (text, want) in cases {
        let e = Policy::parse(text, "example.org", "east").unwrap_err();
        assert_eq!(e.kind(), waypost::ErrorKind::InvalidInput);
        let msg = e.to_string();
        assert!(msg.contains(want), "{text:?}: {msg}");
        if text.contains("name = \"a\"") && !want.starts_with("unknown") {
            assert!(msg.contains("\"a\""), "{msg}");
        }
    }
}

#[test]
fn a_policy_file_is_read_and_a_missing_one_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("authz.toml");
    std::fs::write(&path, EXAMPLE).unwrap();
    let p = Policy::load(&path, "spiffe://example.org", "east").unwrap();
    assert_eq!(p.rule_names().count(), 3);
    let e = Policy::load(&dir.path().join("nope.toml"), "example.org", "east").unwrap_err();
    assert!(e.to_string().contains("nope.toml"), "{e}");
}
