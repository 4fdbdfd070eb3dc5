//! The Consul reads field tools call (nodes, one node, datacenters, a
//! node's checks, checks by state), `?filter=`, weights, refused query
//! parameters, checks registered apart from their service, and flap
//! damping of a check the registrar runs, over loopback; then py-consul
//! doing the same. Maintenance mode is `consul_maintenance.rs`.

use crate::common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use common::http::{get, put, send, Answer};
use common::protocols::{start, Stack};
use serde_json::{json, Value};
use waypost::testing::eventually;

async fn register(stack: &Stack, body: Value) -> Answer {
    let r = put(stack, "/v1/agent/service/register", body.clone()).await;
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r
}

pub fn service_ids(body: &Value) -> Vec<String> {
    let mut ids: Vec<String> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Service"]["ID"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// Two web instances (weights 5 and default) and an api instance whose
/// TTL check starts critical; returns once all three are read back.
pub async fn three_instances(stack: &Stack) {
    register(
        stack,
        json!({"Name": "web", "ID": "web-1", "Address": "127.0.0.1", "Port": 8080,
               "Tags": ["v1", "primary"], "Meta": {"zone": "z1"},
               "Weights": {"Passing": 5, "Warning": 1},
               "Check": {"TTL": "10m", "Status": "passing"}}),
    )
    .await;
    register(
        stack,
        json!({"Name": "web", "ID": "web-2", "Address": "127.0.0.2", "Port": 8080,
               "Tags": ["v1"], "Meta": {"zone": "z2"},
               "Check": {"TTL": "10m", "Status": "passing"}}),
    )
    .await;
    register(
        stack,
        json!({"Name": "api", "ID": "api-1", "Address": "127.0.0.3", "Port": 9090,
               "Check": {"TTL": "10m"}}),
    )
    .await;
    eventually("three instances", || async {
        let w = get(stack, "/v1/health/service/web").await;
        let a = get(stack, "/v1/health/service/api").await;
        (service_ids(&w.body).len() == 2 && service_ids(&a.body).len() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_datacenters_node_checks_and_states_read_as_consul_s() {
    let stack = start().await;
    three_instances(&stack).await;

    let dcs = get(&stack, "/v1/catalog/datacenters").await;
    assert_eq!((dcs.status, dcs.body.clone()), (200, json!(["test"])));

    // Without a node of their own, endpoints show their service as node.
    let nodes = get(&stack, "/v1/catalog/nodes").await;
    assert_eq!(nodes.status, 200, "{}", nodes.body);
    assert!(nodes.index.is_some());
    let names: Vec<&str> = nodes
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["Node"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "web"]);
    assert_eq!(nodes.body[1]["Datacenter"], "test");

    let node = get(&stack, "/v1/catalog/node/web").await;
    assert_eq!(node.body["Node"]["Node"], "web", "{}", node.body);
    let services = node.body["Services"].as_object().unwrap();
    assert_eq!(services.keys().collect::<Vec<_>>(), ["web-1", "web-2"]);
    assert_eq!(
        services["web-1"]["Weights"],
        json!({"Passing": 5, "Warning": 1})
    );
    assert_eq!(services["web-2"]["Weights"]["Passing"], 1);
    let none = get(&stack, "/v1/catalog/node/nope").await;
    assert_eq!((none.status, none.body.clone()), (200, Value::Null));
    assert!(none.index.is_some());

    let checks = get(&stack, "/v1/health/node/web").await;
    let ids: Vec<&str> = checks
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["CheckID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["service:web-1", "service:web-2"]);

    let critical = get(&stack, "/v1/health/state/critical").await;
    assert_eq!(
        critical.body.as_array().unwrap().len(),
        1,
        "{}",
        critical.body
    );
    assert_eq!(critical.body[0]["ServiceID"], "api-1");
    let passing = get(&stack, "/v1/health/state/passing").await;
    assert_eq!(passing.body.as_array().unwrap().len(), 2);
    let any = get(&stack, "/v1/health/state/any").await;
    assert_eq!(any.body.as_array().unwrap().len(), 3);
    let bad = get(&stack, "/v1/health/state/sick").await;
    assert_eq!(
        (bad.status, bad.body["field"].clone()),
        (400, json!("state"))
    );

    // A blocking read of the nodes returns on a change.
    let index = nodes.index.unwrap();
    let blocked = {
        let http = stack.http;
        tokio::spawn(async move {
            common::http::get_at(http, &format!("/v1/catalog/nodes?index={index}&wait=10m")).await
        })
    };
    register(
        &stack,
        json!({"Name": "db", "ID": "db-1", "Address": "127.0.0.4", "Port": 5432}),
    )
    .await;
    let answer = tokio::time::timeout(common::http::LIMIT, blocked)
        .await
        .unwrap()
        .unwrap();
    assert!(answer.index.unwrap() > index);
    assert_eq!(answer.body.as_array().unwrap().len(), 3);
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_round_trip_through_every_answer() {
    let stack = start().await;
    three_instances(&stack).await;
    let agent = get(&stack, "/v1/agent/service/web-1").await.body;
    assert_eq!(agent["Weights"], json!({"Passing": 5, "Warning": 1}));
    let health = get(
        &stack,
        "/v1/health/service/web?filter=Service.ID%20%3D%3D%20%22web-1%22",
    )
    .await;
    assert_eq!(
        health.body[0]["Service"]["Weights"]["Passing"], 5,
        "{}",
        health.body
    );
    let catalog = get(&stack, "/v1/catalog/service/web").await.body;
    let w1 = catalog
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["ServiceID"] == "web-1")
        .unwrap();
    assert_eq!(w1["ServiceWeights"]["Passing"], 5);
    // The registry's `weight` label holds it.
    let native = get(&stack, "/v1/services/web").await.body;
    let labels = native
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "web-1")
        .unwrap()["labels"]
        .clone();
    assert_eq!(labels["weight"], "5", "{labels}");
    // Out of range: refused, naming the field.
    let r = put(
        &stack,
        "/v1/agent/service/register",
        json!({"Name": "web", "ID": "web-3", "Address": "127.0.0.1", "Port": 1, "Weights": {"Passing": 0}}),
    )
    .await;
    assert_eq!(
        (r.status, r.body["field"].clone()),
        (400, json!("Weights.Passing"))
    );
    stack.stop().await.unwrap();
}

/// `path` with `filter` percent-encoded as its `?filter=`.
fn filtered(path: &str, filter: &str) -> String {
    let enc: String = filter
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("{path}?filter={enc}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_keep_what_they_match_on_each_route_and_refuse_what_they_cannot_read() {
    let stack = start().await;
    three_instances(&stack).await;
    for (filter, want) in [
        (r#"Service.Meta.zone == "z1""#, vec!["web-1"]),
        (r#"Service.Meta["zone"] != "z1""#, vec!["web-2"]),
        (r#""primary" in Service.Tags"#, vec!["web-1"]),
        (
            r#"Service.Tags not contains "primary" and Service.Service == "web""#,
            vec!["web-2"],
        ),
        (
            r#"Checks.Status == "passing" and (Service.ID == "web-1" or Service.ID == "web-2")"#,
            vec!["web-1", "web-2"],
        ),
        (r#"not Node.Node == "web""#, vec![]),
        (r#"Service.Meta.missing is empty"#, vec!["web-1", "web-2"]),
    ] {
        let a = get(&stack, &filtered("/v1/health/service/web", filter)).await;
        assert_eq!(a.status, 200, "{filter}: {}", a.body);
        assert_eq!(service_ids(&a.body), want, "{filter}");
    }
    let catalog = get(
        &stack,
        &filtered(
            "/v1/catalog/service/web",
            "ServiceMeta.zone == `z2` and ServiceTags contains v1",
        ),
    )
    .await;
    let ids: Vec<&str> = catalog
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ServiceID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["web-2"]);
    let services = get(
        &stack,
        &filtered("/v1/catalog/services", r#"ServiceName != "api""#),
    )
    .await;
    assert_eq!(services.body, json!({"web": ["primary", "v1"]}));
    let agent = get(
        &stack,
        &filtered("/v1/agent/services", r#"Service == "api""#),
    )
    .await;
    assert_eq!(
        agent.body.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["api-1"]
    );
    let checks = get(
        &stack,
        &filtered("/v1/health/state/any", r#"ServiceName == "api""#),
    )
    .await;
    assert_eq!(checks.body.as_array().unwrap().len(), 1);
    let nodes = get(&stack, &filtered("/v1/catalog/nodes", r#"Node == "api""#)).await;
    assert_eq!(nodes.body.as_array().unwrap().len(), 1);

    for (path, filter, names) in [
        (
            "/v1/health/service/web",
            r#"ServiceName == "web""#,
            "ServiceName",
        ),
        (
            "/v1/catalog/service/web",
            r#"Service.Service == "web""#,
            "Service.Service",
        ),
        (
            "/v1/health/service/web",
            r#"Service.ID matches "w.*""#,
            "matches",
        ),
        (
            "/v1/health/service/web",
            r#"Service.Tags == "v1""#,
            "Service.Tags",
        ),
        (
            "/v1/health/service/web",
            r#"Service.ID == "web-1" and"#,
            "at character",
        ),
    ] {
        let a = get(&stack, &filtered(path, filter)).await;
        assert_eq!(a.status, 400, "{path} {filter}: {}", a.body);
        assert_eq!(a.body["field"], "filter");
        let error = a.body["error"].as_str().unwrap();
        assert!(error.contains(names), "{filter}: {error}");
    }
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_parameters_are_implemented_ignored_by_name_or_refused_naming_them() {
    let stack = start().await;
    three_instances(&stack).await;
    for path in [
        "/v1/health/service/web?near=_agent",
        "/v1/catalog/service/web?node-meta=rack:r1",
        "/v1/catalog/nodes?peer=other",
        "/v1/agent/services?ns=default",
        "/v1/health/state/any?passing",
    ] {
        let a = get(&stack, path).await;
        assert_eq!(a.status, 400, "{path}: {}", a.body);
        let param = path.split('?').nth(1).unwrap().split('=').next().unwrap();
        assert_eq!(a.body["field"], param, "{path}: {}", a.body);
    }
    // Accepted and ignored: the consistency modes, cached, pretty, and
    // the agent's own datacenter where `dc` does not filter.
    for path in [
        "/v1/health/service/web?stale&consistent=1&cached&pretty",
        "/v1/agent/services?dc=test",
        "/v1/catalog/datacenters?stale",
        "/v1/status/leader?stale",
    ] {
        let a = get(&stack, path).await;
        assert_eq!(a.status, 200, "{path}: {}", a.body);
    }
    let other = get(&stack, "/v1/agent/services?dc=elsewhere").await;
    assert_eq!(
        (other.status, other.body["field"].clone()),
        (400, json!("dc"))
    );
    // On the reads, `dc` keeps a datacenter's entries.
    let none = get(&stack, "/v1/health/service/web?dc=elsewhere").await;
    assert_eq!((none.status, none.body.clone()), (200, json!([])));
    // Booleans as Go's ParseBool reads them.
    for v in ["True", "T", "1", "true"] {
        let a = get(&stack, &format!("/v1/health/service/api?passing={v}")).await;
        assert_eq!((a.status, a.body.clone()), (200, json!([])), "passing={v}");
    }
    let a = get(&stack, "/v1/health/service/api?passing=False").await;
    assert_eq!(service_ids(&a.body), ["api-1"]);
    let a = get(&stack, "/v1/health/service/api?passing=yes").await;
    assert_eq!((a.status, a.body["field"].clone()), (400, json!("passing")));
    stack.stop().await.unwrap();
}

/// A loopback HTTP service whose `/health` answers each request only when
/// the test releases it, with the status the test planned (200 when none
/// was), and counts the requests that arrived: while request `n + 1`
/// waits, the registrar has recorded the result of request `n` (it runs
/// a check again only once the previous run's result is written).
struct Gated {
    addr: std::net::SocketAddr,
    plan: Arc<Mutex<VecDeque<u16>>>,
    gate: Arc<tokio::sync::Semaphore>,
    arrived: tokio::sync::watch::Receiver<usize>,
}

impl Gated {
    async fn start() -> Self {
        let plan: Arc<Mutex<VecDeque<u16>>> = Arc::default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (count, arrived) = tokio::sync::watch::channel(0usize);
        let count = Arc::new(count);
        let app = {
            let (plan, gate) = (Arc::clone(&plan), Arc::clone(&gate));
            axum::Router::new().route(
                "/health",
                axum::routing::get(move || {
                    let (plan, gate, count) =
                        (Arc::clone(&plan), Arc::clone(&gate), Arc::clone(&count));
                    async move {
                        count.send_modify(|n| *n += 1);
                        gate.acquire().await.unwrap().forget();
                        let code = plan.lock().unwrap().pop_front().unwrap_or(200);
                        axum::http::StatusCode::from_u16(code).unwrap()
                    }
                }),
            )
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        Self {
            addr,
            plan,
            gate,
            arrived,
        }
    }

    /// Wait (bounded) until `n` requests have arrived.
    async fn arrivals(&mut self, n: usize) {
        tokio::time::timeout(common::http::LIMIT, self.arrived.wait_for(|a| *a >= n))
            .await
            .expect("the registrar did not run the check again")
            .unwrap();
    }

    /// Answer the waiting request with `code`, and wait until the next one
    /// arrives (so the answer's result is recorded).
    async fn answer(&mut self, code: u16) {
        let next = *self.arrived.borrow() + 1;
        self.plan.lock().unwrap().push_back(code);
        self.gate.add_permits(1);
        self.arrivals(next).await;
    }
}

/// The check's stored state (its label), as the registry's own route shows it.
async fn stored_check(stack: &Stack, service: &str, id: &str) -> Value {
    let eps = get(stack, &format!("/v1/services/{service}")).await.body;
    let label = eps[0]["labels"][format!("consul.check/{id}")]
        .as_str()
        .unwrap()
        .to_string();
    serde_json::from_str(&label).unwrap()
}

/// Wait (bounded) until the check's stored status and failure count are
/// `want`; the state then.
async fn stored_as(stack: &Stack, id: &str, want: (&str, u64)) -> Value {
    eventually(&format!("{id} stored as {want:?}"), || async {
        let c = stored_check(stack, "app", id).await;
        let got = (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["failures"].as_u64().unwrap_or(0),
        );
        (got.0 == want.0 && got.1 == want.1).then_some(c)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_with_failures_before_critical_3_turns_critical_on_the_third_failure_in_a_row() {
    let stack = start().await;
    let mut server = Gated::start().await;
    register(
        &stack,
        json!({"Name": "app", "ID": "app-1", "Address": "127.0.0.1", "Port": server.addr.port()}),
    )
    .await;
    // Registered apart from its service, as py-consul's check.register does.
    let r = put(
        &stack,
        "/v1/agent/check/register",
        json!({"Name": "app health", "CheckID": "app-http", "ServiceID": "app-1", "Status": "passing",
               "HTTP": format!("http://{}/health", server.addr), "Interval": "1s", "Timeout": "1m",
               "FailuresBeforeCritical": 3}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.arrivals(1).await;

    // One failure between passes: counted, never critical.
    server.answer(500).await;
    stored_as(&stack, "app-http", ("passing", 1)).await;
    server.answer(200).await;
    stored_as(&stack, "app-http", ("passing", 0)).await;
    // Three in a row: critical on the third.
    server.answer(500).await;
    server.answer(500).await;
    stored_as(&stack, "app-http", ("passing", 2)).await;
    let checks = get(&stack, "/v1/agent/checks").await.body;
    assert_eq!(checks["app-http"]["Status"], "passing");
    server.answer(500).await;
    let c = stored_as(&stack, "app-http", ("critical", 0)).await;
    assert!(c["output"].as_str().unwrap().contains("500"), "{c}");
    let critical = get(&stack, "/v1/health/state/critical").await.body;
    assert_eq!(critical[0]["CheckID"], "app-http", "{critical}");

    // Deregistered, the check goes and the service stays.
    let gone = send(&stack, "PUT", "/v1/agent/check/deregister/app-http", None).await;
    assert_eq!(gone.status, 200, "{}", gone.body);
    server.gate.add_permits(1_000);
    eventually("app-http gone", || async {
        let checks = get(&stack, "/v1/agent/checks").await.body;
        checks.get("app-http").is_none().then_some(())
    })
    .await;
    assert_eq!(get(&stack, "/v1/agent/service/app-1").await.status, 200);
    // Refused: a check of no service, a TTL check with damping.
    for (body, field) in [
        (json!({"Name": "n", "TTL": "5s"}), "ServiceID"),
        (
            json!({"Name": "n", "ServiceID": "app-1", "TTL": "5s", "FailuresBeforeCritical": 2}),
            "FailuresBeforeCritical",
        ),
    ] {
        let r = put(&stack, "/v1/agent/check/register", body.clone()).await;
        assert_eq!(
            (r.status, r.body["field"].clone()),
            (400, json!(field)),
            "{body}"
        );
    }
    let r = put(
        &stack,
        "/v1/agent/check/register",
        json!({"Name": "n", "ServiceID": "nope", "TTL": "5s"}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    stack.stop().await.unwrap();
}

/// py-consul (PyPI) reading nodes, checks by state and filtered health,
/// registering weights and a damped check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_consul_reads_nodes_states_filters_and_weights() {
    common::require_python("consul", "py-consul");
    let stack = start().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/consul_reads.py");
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg("-u")
            .arg(&script)
            .arg(stack.http.port().to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the py-consul script did not finish within 120 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "py-consul script failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("py-consul reads: ok"), "{stdout}\n{stderr}");
    stack.stop().await.unwrap();
}
