//! The monitoring files in `deploy/`: the Prometheus alert rules
//! pass `promtool check rules` and their unit tests (`promtool test rules`),
//! and the Grafana dashboard is JSON that queries only metrics the
//! registrar's metrics page (`docs/registrar/metrics.md`) lists, and all
//! of them.
//!
//! `promtool` comes from Debian's `prometheus` package (`scripts/test`
//! installs it); without it these tests fail, naming the package.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is in the workspace")
        .to_path_buf()
}

fn prometheus_dir() -> PathBuf {
    repo().join("deploy/prometheus")
}

/// Run `promtool` with `args` in `deploy/prometheus`; panics with its
/// output unless it succeeds.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Debian's `prometheus` package \
                 (scripts/test does when it is missing)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn alert_rules_pass_promtool_check() {
    let out = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let out = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The metric names `docs/registrar/metrics.md` lists in its "Metrics" section
/// (each in backquotes, labels cut off).
fn documented_metrics() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(repo().join("docs/registrar/metrics.md")).unwrap();
    let start = readme.find("\n## Metrics").expect("a Metrics section");
    let rest = &readme[start + 1..];
    let section = match rest[1..].find("\n## ") {
        Some(end) => &rest[..end + 1],
        None => rest,
    };
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|code| code.split('{').next().unwrap_or_default().to_string())
        .filter(|name| is_metric(name))
        .collect()
}

fn is_metric(name: &str) -> bool {
    (name.starts_with("registrar_") || name.starts_with("agent_registrar_"))
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The metric names in a PromQL expression (`registrar_…`,
/// `agent_registrar_…`).
fn metrics_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
        .filter(|t| is_metric(t))
        .map(str::to_string)
        .collect()
}

/// `name` as documented: itself, or a histogram's series of it.
fn documented_as(name: &str, known: &BTreeSet<String>) -> Option<String> {
    if known.contains(name) {
        return Some(name.to_string());
    }
    ["_bucket", "_count", "_sum"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|base| known.contains(*base))
        .map(str::to_string)
}

/// Every string under the key `key` anywhere in `v`.
fn strings_under(v: &serde_json::Value, key: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match x {
                    serde_json::Value::String(s) if k == key => out.push(s.clone()),
                    _ => strings_under(x, key, out),
                }
            }
        }
        serde_json::Value::Array(xs) => xs.iter().for_each(|x| strings_under(x, key, out)),
        _ => {}
    }
}

#[test]
fn grafana_dashboard_queries_the_documented_metrics() {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/registrar.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "registrar");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("a panel id")),
            "duplicate panel id in {p}"
        );
    }

    let known = documented_metrics();
    assert!(
        known.len() >= 15,
        "the README's metric list was not found: {known:?}"
    );
    let mut exprs = Vec::new();
    strings_under(&dash, "expr", &mut exprs);
    strings_under(&dash, "definition", &mut exprs);
    assert!(exprs.len() >= 20, "too few queries: {exprs:?}");
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        let names = metrics_in(expr);
        assert!(!names.is_empty(), "a query of no registrar metric: {expr}");
        for name in names {
            let base = documented_as(&name, &known)
                .unwrap_or_else(|| panic!("{name} (in `{expr}`) is not in the README's metrics"));
            queried.insert(base);
        }
    }
    let missing: Vec<_> = known.difference(&queried).collect();
    assert!(missing.is_empty(), "not on the dashboard: {missing:?}");
}

#[test]
fn alert_rules_use_documented_metrics() {
    let text = std::fs::read_to_string(prometheus_dir().join("alerts.yaml")).unwrap();
    let known = documented_metrics();
    let exprs: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect();
    assert_eq!(exprs.len(), 5, "{exprs:?}");
    for expr in exprs {
        let names = metrics_in(expr);
        assert!(!names.is_empty(), "{expr}");
        for name in names {
            assert!(
                documented_as(&name, &known).is_some(),
                "{name} (in `{expr}`) is not in the README's metrics"
            );
        }
    }
}
