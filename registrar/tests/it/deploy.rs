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

// The Kubernetes manifests, the Envoy and gRPC bootstraps and the
// DynamoDB table definitions.
//
// `kubectl kustomize` renders the manifests (Debian's `kubernetes-client`
// package has kubectl; the components need kubectl 1.21 or later), and
// Python's `yaml` module (PyYAML, which moto brings) turns YAML into JSON
// for the checks.

use serde_json::Value;

/// The kustomizations the registrar's manifests are applied from: the
/// base, the base with each component (`components/<name>`), and the
/// complete overlay.
fn kustomizations() -> Vec<(String, PathBuf)> {
    let root = repo();
    let mut out = vec![
        (
            "deploy/kubernetes".to_string(),
            root.join("deploy/kubernetes"),
        ),
        (
            "deploy/overlays/complete".to_string(),
            root.join("deploy/overlays/complete"),
        ),
    ];
    let mut components: Vec<PathBuf> = std::fs::read_dir(root.join("deploy/kubernetes/components"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").exists())
        .collect();
    components.sort();
    for c in components {
        let name = c.file_name().unwrap().to_string_lossy().into_owned();
        out.push((format!("deploy/kubernetes + components/{name}"), c));
    }
    out
}

/// `path` relative to `from` (both absolute): kustomize takes no absolute
/// paths.
fn relative(path: &Path, from: &Path) -> String {
    let up = from.components().count() - 1;
    let rest = path.strip_prefix("/").unwrap().to_string_lossy();
    format!("{}{rest}", "../".repeat(up))
}

/// `kubectl kustomize` of `dir`; panics with its output unless it
/// succeeds, naming the Debian package when kubectl is missing.
fn kustomize(dir: &Path) -> String {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run kubectl ({e}): install Debian's `kubernetes-client` package \
                 (scripts/test does when it is missing)"
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed (components need kubectl 1.21 or later):\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Render `name`: a kustomization directory, or a component applied to
/// the base through a kustomization made for it.
fn render(name: &str, dir: &Path) -> String {
    if !name.contains("components/") {
        return kustomize(dir);
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = repo().join("deploy/kubernetes");
    std::fs::write(
        tmp.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {}\ncomponents:\n  - {}\n",
            relative(&base, tmp.path()),
            relative(dir, tmp.path())
        ),
    )
    .unwrap();
    kustomize(tmp.path())
}

/// The YAML documents of `text` as JSON (through Python's `yaml`).
fn yaml_docs(text: &str) -> Vec<Value> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d is not None], sys.stdout)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e})"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "YAML that does not parse (or no PyYAML: `pip install pyyaml`; moto brings it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The one object of `kind` in `docs`.
fn one<'a>(docs: &'a [Value], kind: &str, what: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(
        found.len(),
        1,
        "{what}: one {kind} expected, found {}",
        found.len()
    );
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The registrar's container in a rendered Deployment.
fn registrar_container(deployment: &Value) -> &Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "registrar")
        .expect("a container named registrar")
}

/// The port of an address flag's value (`--xds-addr=0.0.0.0:18000`).
fn addr_port(arg: &str) -> Option<u64> {
    let (flag, value) = arg.split_once('=')?;
    if !flag.ends_with("-addr") {
        return None;
    }
    value.rsplit_once(':')?.1.parse().ok()
}

#[test]
fn kubernetes_manifests_render_with_flags_the_registrar_accepts() {
    let help = super::docs::all_help();
    let base_args = {
        let docs = yaml_docs(&render(
            "deploy/kubernetes",
            &repo().join("deploy/kubernetes"),
        ));
        strings(&registrar_container(one(&docs, "Deployment", "base"))["args"])
    };
    for (name, dir) in kustomizations() {
        let docs = yaml_docs(&render(&name, &dir));
        let deployment = one(&docs, "Deployment", &name);
        let container = registrar_container(deployment);
        let args = strings(&container["args"]);
        assert_eq!(
            args.first().map(String::as_str),
            Some("serve"),
            "{name}: {args:?}"
        );
        let flags: Vec<&str> = args[1..].iter().map(String::as_str).collect();
        for arg in &flags {
            let flag = arg.split('=').next().unwrap();
            assert!(
                flag.starts_with("--") && super::docs::accepted(flag, &help),
                "{name}: `registrar serve` does not accept {flag}"
            );
        }
        // The values parse too: clap checks each value before `--help`.
        let out = Command::new(env!("CARGO_BIN_EXE_registrar"))
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: registrar {args:?} --help: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        // Each address flag's port is a port of the container, and of the
        // Service; each container port has its flag.
        let ports: BTreeSet<u64> = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_u64().unwrap())
            .collect();
        let flagged: BTreeSet<u64> = flags.iter().filter_map(|a| addr_port(a)).collect();
        assert_eq!(
            ports, flagged,
            "{name}: container ports and address flags differ"
        );
        let service = of_kind(&docs, "Service")
            .into_iter()
            .find(|s| s["metadata"]["name"] == "aether-registrar")
            .expect("the registrar's Service");
        let served: BTreeSet<u64> = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["port"].as_u64().unwrap())
            .collect();
        assert_eq!(
            served, ports,
            "{name}: Service ports and container ports differ"
        );

        // Two replicas, replaced one at a time without surge (two stream
        // readers per shard), a disruption budget of one.
        let spec = &deployment["spec"];
        assert_eq!(spec["replicas"], 2, "{name}");
        assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 0, "{name}");
        assert_eq!(
            spec["strategy"]["rollingUpdate"]["maxUnavailable"], 1,
            "{name}"
        );
        let pdb = one(&docs, "PodDisruptionBudget", &name);
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{name}");
        let sa = one(&docs, "ServiceAccount", &name);
        let role = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
            .as_str()
            .unwrap_or_default();
        assert!(
            role.starts_with("arn:aws:iam::"),
            "{name}: IRSA role {role:?}"
        );
        assert_eq!(
            deployment["spec"]["template"]["spec"]["serviceAccountName"], sa["metadata"]["name"],
            "{name}"
        );

        // A component adds to the base's arguments; it removes none.
        for arg in &base_args {
            assert!(args.contains(arg), "{name} lost the base's {arg}");
        }
        if name.ends_with("components/xds") {
            assert!(
                args.iter().any(|a| a.starts_with("--xds-addr=")),
                "{args:?}"
            );
        }
        if name.ends_with("components/http-api") {
            assert!(
                args.iter().any(|a| a.starts_with("--http-api-addr=")),
                "{args:?}"
            );
        }
        let monitors = of_kind(&docs, "PodMonitor");
        let annotated = !deployment["spec"]["template"]["metadata"]["annotations"]
            ["prometheus.io/scrape"]
            .is_null();
        // Scraped one way: annotations, or a PodMonitor of the health port.
        assert!(
            annotated == monitors.is_empty(),
            "{name}: scraped twice or never"
        );
        for m in monitors {
            assert_eq!(m["apiVersion"], "monitoring.coreos.com/v1");
            assert_eq!(m["spec"]["podMetricsEndpoints"][0]["port"], "health");
        }
    }
}

/// The files the spiffe-helper writes: `(svid, key, bundle)`, full paths.
fn helper_files() -> (String, String, String) {
    let docs = yaml_docs(
        &std::fs::read_to_string(repo().join("deploy/kubernetes/spiffe-helper.yaml")).unwrap(),
    );
    let conf = one(&docs, "ConfigMap", "spiffe-helper.yaml")["data"]["helper.conf"]
        .as_str()
        .unwrap()
        .to_string();
    let value = |key: &str| {
        conf.lines()
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
            .unwrap_or_else(|| panic!("no {key} in helper.conf"))
    };
    let dir = value("cert_dir");
    (
        format!("{dir}/{}", value("svid_file_name")),
        format!("{dir}/{}", value("svid_key_file_name")),
        format!("{dir}/{}", value("svid_bundle_file_name")),
    )
}

/// Every string under the key `key` anywhere in `v` (YAML as JSON).
fn all_under(v: &Value, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    strings_under(v, key, &mut out);
    out
}

#[test]
fn the_registrar_envoy_and_grpc_read_the_helpers_svid_files() {
    let (svid, key, bundle) = helper_files();
    // The registrar.
    let docs = yaml_docs(&kustomize(&repo().join("deploy/kubernetes")));
    let args = strings(&registrar_container(one(&docs, "Deployment", "base"))["args"]);
    for want in [
        format!("--tls-ca={bundle}"),
        format!("--tls-cert={svid}"),
        format!("--tls-key={key}"),
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    let xds_port = {
        let dir = repo().join("deploy/kubernetes/components/xds");
        let docs = yaml_docs(&render("deploy/kubernetes + components/xds", &dir));
        strings(&registrar_container(one(&docs, "Deployment", "xds"))["args"])
            .iter()
            .find(|a| a.starts_with("--xds-addr="))
            .and_then(|a| addr_port(a))
            .expect("the xds component's --xds-addr")
    };

    // Envoy: the ADS cluster dials the Service's xDS port with TLS, its
    // secrets come from the SDS files the ConfigMap holds, and those name
    // the helper's files.
    let envoy = repo().join("deploy/envoy");
    let boot = &yaml_docs(&std::fs::read_to_string(envoy.join("bootstrap.yaml")).unwrap())[0];
    let ads = &boot["dynamic_resources"]["ads_config"];
    let cluster_name = ads["grpc_services"][0]["envoy_grpc"]["cluster_name"].clone();
    let cluster = boot["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == cluster_name)
        .expect("the ADS cluster");
    let addr = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"];
    assert_eq!(addr["address"], "aether-registrar.aether-system.svc");
    assert_eq!(addr["port_value"], xds_port);
    let tls = &cluster["transport_socket"];
    assert_eq!(tls["name"], "envoy.transport_sockets.tls");
    let ctx = &tls["typed_config"]["common_tls_context"];
    assert_eq!(strings(&ctx["alpn_protocols"]), ["h2"]);
    let generated = yaml_docs(&kustomize(&envoy));
    let configmap = one(&generated, "ConfigMap", "deploy/envoy");
    let mut secrets = BTreeSet::new();
    for sds in all_under(ctx, "path") {
        let file = sds
            .strip_prefix("/etc/envoy/")
            .expect("SDS files under /etc/envoy");
        assert!(
            configmap["data"][file].is_string(),
            "{file} not in the ConfigMap"
        );
        for res in yaml_docs(&std::fs::read_to_string(envoy.join(file)).unwrap())[0]["resources"]
            .as_array()
            .unwrap()
        {
            secrets.insert(res["name"].as_str().unwrap().to_string());
            let mut files = all_under(res, "filename");
            files.sort();
            let want: Vec<String> = if res["tls_certificate"].is_object() {
                vec![svid.clone(), key.clone()]
            } else {
                vec![bundle.clone()]
            };
            assert_eq!(files, want, "{file}");
        }
    }
    let mut named: Vec<String> = all_under(ctx, "name");
    named.sort();
    assert_eq!(named, secrets.into_iter().collect::<Vec<_>>());
    assert_eq!(
        ctx["combined_validation_context"]["default_validation_context"]
            ["match_typed_subject_alt_names"][0]["matcher"]["exact"],
        "spiffe://example.org/ns/aether-system/sa/aether-registrar"
    );

    // Proxyless gRPC: the same address, `tls` credentials from the same
    // files.
    let grpc: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grpc/xds-bootstrap.json")).unwrap(),
    )
    .unwrap();
    let server = &grpc["xds_servers"][0];
    assert_eq!(
        server["server_uri"],
        format!("dns:///aether-registrar.aether-system.svc:{xds_port}")
    );
    let creds = &server["channel_creds"][0];
    assert_eq!(creds["type"], "tls");
    assert_eq!(creds["config"]["certificate_file"], svid.as_str());
    assert_eq!(creds["config"]["private_key_file"], key.as_str());
    assert_eq!(creds["config"]["ca_certificate_file"], bundle.as_str());
}
