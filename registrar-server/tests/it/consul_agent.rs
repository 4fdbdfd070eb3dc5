//! Consul's agent API over loopback: services registered with TTL, HTTP,
//! TCP and gRPC checks, checks the registrar runs and expires, reports,
//! `DeregisterCriticalServiceAfter`, refused bodies, and blocking queries
//! on one service's own index; then py-consul, a client nobody here wrote,
//! doing the same.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::http::{get, put, send, Answer, LIMIT};
use common::protocols::{start, Stack};
use serde_json::{json, Value};
use waypost::testing::eventually;

async fn register(stack: &Stack, body: Value) -> Answer {
    put(stack, "/v1/agent/service/register", body).await
}

/// The status of check `id` in `/v1/agent/checks`.
async fn check_status(stack: &Stack, id: &str) -> Option<String> {
    let checks = get(stack, "/v1/agent/checks").await.body;
    checks[id]["Status"].as_str().map(str::to_string)
}

async fn wait_status(stack: &Stack, id: &str, want: &str) -> Value {
    eventually(&format!("check {id} {want}"), || async {
        let checks = get(stack, "/v1/agent/checks").await.body;
        (checks[id]["Status"] == want).then(|| checks[id].clone())
    })
    .await
}

fn ids(body: &Value) -> Vec<String> {
    body.as_array()
        .unwrap()
        .iter()
        .map(|e| e["Service"]["ID"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_check_follows_its_reports_and_expires() {
    let stack = start().await;
    // py-consul's spelling: lower-case names, the check in `checks`.
    let r = register(
        &stack,
        json!({"name": "web", "id": "web-1", "address": "127.0.0.1", "port": 8080,
               "tags": ["v1"], "meta": {"zone": "z1"}, "checks": [{"ttl": "1s"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // A TTL check starts critical, as Consul's does.
    let c = wait_status(&stack, "service:web-1", "critical").await;
    assert_eq!(c["Type"], "ttl");
    assert_eq!(c["ServiceID"], "web-1");
    let passing = get(&stack, "/v1/health/service/web?passing").await;
    assert_eq!(ids(&passing.body), Vec::<String>::new());

    let r = send(
        &stack,
        "PUT",
        "/v1/agent/check/pass/service:web-1?note=fine",
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let healthy = eventually("web-1 passing", || async {
        let a = get(&stack, "/v1/health/service/web?passing").await;
        (ids(&a.body) == ["web-1"]).then_some(a)
    })
    .await;
    let entry = &healthy.body[0];
    assert_eq!(entry["Service"]["Tags"], json!(["v1"]));
    assert_eq!(
        entry["Service"]["Meta"],
        json!({"zone": "z1", "tags": "v1"})
    );
    assert_eq!(entry["Checks"][0]["CheckID"], "service:web-1");
    assert_eq!(entry["Checks"][0]["Output"], "fine");

    // No report for a second: critical, and a blocking query sees it.
    let index = healthy.index.unwrap();
    let expired = get(
        &stack,
        &format!("/v1/health/service/web?index={index}&wait=1m"),
    )
    .await;
    assert!(expired.index.unwrap() > index);
    assert_eq!(expired.body[0]["Checks"][0]["Status"], "critical");
    let output = expired.body[0]["Checks"][0]["Output"].as_str().unwrap();
    assert!(output.contains("TTL expired"), "{output}");

    // Reported again: back.
    send(&stack, "PUT", "/v1/agent/check/pass/service:web-1", None).await;
    wait_status(&stack, "service:web-1", "passing").await;
    let update = put(
        &stack,
        "/v1/agent/check/update/service:web-1",
        json!({"Status": "warning", "Output": "slow"}),
    )
    .await;
    assert_eq!(update.status, 200);
    wait_status(&stack, "service:web-1", "warning").await;
    // A warning serves, but is not `?passing`.
    let passing = get(&stack, "/v1/health/service/web?passing").await;
    assert_eq!(ids(&passing.body), Vec::<String>::new());
    assert_eq!(
        ids(&get(&stack, "/v1/health/service/web").await.body),
        ["web-1"]
    );

    let services = get(&stack, "/v1/agent/services").await.body;
    assert_eq!(services["web-1"]["Service"], "web");
    assert_eq!(services["web-1"]["Port"], 8080);
    let one = get(&stack, "/v1/agent/service/web-1").await;
    assert_eq!(
        (one.status, one.body["Address"].clone()),
        (200, json!("127.0.0.1"))
    );
    let catalog = get(&stack, "/v1/catalog/service/web").await.body;
    assert_eq!(catalog[0]["ServiceID"], "web-1");
    assert_eq!(catalog[0]["ServiceTags"], json!(["v1"]));
    let checks = get(&stack, "/v1/health/checks/web").await.body;
    assert_eq!(checks[0]["Status"], "warning");
    let leader = get(&stack, "/v1/status/leader").await.body;
    assert_eq!(leader, json!(stack.http.to_string()));

    let unknown = send(&stack, "PUT", "/v1/agent/check/pass/service:nope", None).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let gone = send(&stack, "PUT", "/v1/agent/service/deregister/web-1", None).await;
    assert_eq!(gone.status, 200, "{}", gone.body);
    eventually("web-1 gone", || async {
        let a = get(&stack, "/v1/health/service/web").await;
        ids(&a.body).is_empty().then_some(())
    })
    .await;
    assert_eq!(get(&stack, "/v1/agent/service/web-1").await.status, 404);
    stack.stop().await.unwrap();
}

/// A small HTTP service whose `/health` answers 200 until told to fail.
async fn health_server(failing: Arc<AtomicBool>) -> std::net::SocketAddr {
    use axum::http::StatusCode;
    let app = axum::Router::new().route(
        "/health",
        axum::routing::get(move || {
            let failing = Arc::clone(&failing);
            async move {
                if failing.load(Ordering::SeqCst) {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registrar_runs_http_tcp_and_grpc_checks() {
    use tonic_health::ServingStatus;

    let stack = start().await;
    let failing = Arc::new(AtomicBool::new(false));
    let http = health_server(Arc::clone(&failing)).await;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("greeter", ServingStatus::Serving)
        .await;
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc)),
    );

    let r = register(
        &stack,
        json!({"Name": "app", "ID": "app-1", "Address": "127.0.0.1", "Port": http.port(),
        "Checks": [
            {"HTTP": format!("http://{http}/health"), "Interval": "1s", "Timeout": "2s"},
            {"TCP": tcp_addr.to_string(), "Interval": "1s"},
            {"GRPC": format!("{grpc_addr}/greeter"), "Interval": "1s", "CheckID": "app-grpc"}
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    wait_status(&stack, "service:app-1:1", "passing").await;
    wait_status(&stack, "service:app-1:2", "passing").await;
    wait_status(&stack, "app-grpc", "passing").await;
    eventually("app-1 passing", || async {
        let a = get(&stack, "/v1/health/service/app?passing").await;
        (ids(&a.body) == ["app-1"]).then_some(())
    })
    .await;

    failing.store(true, Ordering::SeqCst);
    let c = wait_status(&stack, "service:app-1:1", "critical").await;
    assert!(c["Output"].as_str().unwrap().contains("500"), "{c}");
    let a = get(&stack, "/v1/health/service/app?passing").await;
    assert!(ids(&a.body).is_empty());
    failing.store(false, Ordering::SeqCst);
    wait_status(&stack, "service:app-1:1", "passing").await;

    drop(tcp);
    wait_status(&stack, "service:app-1:2", "critical").await;
    reporter
        .set_service_status("greeter", ServingStatus::NotServing)
        .await;
    let c = wait_status(&stack, "app-grpc", "critical").await;
    assert!(c["Output"].as_str().unwrap().contains("NOT_SERVING"), "{c}");
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_critical_past_its_deregister_after_removes_the_service() {
    let stack = start().await;
    let r = register(
        &stack,
        json!({"Name": "batch", "ID": "batch-1", "Address": "127.0.0.1", "Port": 9,
               "Check": {"TTL": "30s", "DeregisterCriticalServiceAfter": "1s"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Critical from the start, so gone a second later.
    eventually("batch-1 deregistered", || async {
        let s = get(&stack, "/v1/agent/services").await.body;
        s.get("batch-1").is_none().then_some(())
    })
    .await;
    assert_eq!(check_status(&stack, "service:batch-1").await, None);
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_name_the_field_and_registering_again_updates_in_place() {
    let stack = start().await;
    let good = json!({"Name": "web", "ID": "web-1", "Address": "127.0.0.1", "Port": 8080,
                      "Check": {"TTL": "1m"}});
    assert_eq!(register(&stack, good.clone()).await.status, 200);
    send(&stack, "PUT", "/v1/agent/check/pass/service:web-1", None).await;
    wait_status(&stack, "service:web-1", "passing").await;

    for (body, field) in [
        (json!({"ID": "web-1", "Port": 1}), "Name"),
        (
            json!({"Name": "web", "ID": "web-1", "Port": "8080"}),
            "Port",
        ),
        (
            json!({"Name": "web", "ID": "web-1", "Port": 0, "Address": "127.0.0.1"}),
            "Port",
        ),
        (
            json!({"Name": "web", "ID": "web-1", "Port": 1, "Meta": {"tags": "x"}}),
            "Meta[\"tags\"]",
        ),
        (
            json!({"Name": "web", "ID": "web-1", "Port": 1, "Check": {"HTTP": "http://127.0.0.1:1/"}}),
            "Check.Interval",
        ),
        (
            json!({"Name": "web", "ID": "web-1", "Port": 1, "Checks": [{"TTL": "1s"}, {"Args": ["true"], "Interval": "1s"}]}),
            "Checks[1].Args",
        ),
        (
            json!({"Name": "web", "ID": "web-1", "Port": 1, "Tags": ["a,b"]}),
            "Tags[0]",
        ),
        (
            json!({"Name": "web", "ID": "web-1", "Port": 1, "Address": "not an address"}),
            "Address",
        ),
    ] {
        let r = register(&stack, body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.body["field"], field, "{body}: {}", r.body);
    }
    let r = send(
        &stack,
        "PUT",
        "/v1/agent/service/register",
        Some("{".into()),
    )
    .await;
    assert_eq!((r.status, r.body["field"].clone()), (400, json!("body")));
    // Nothing of those was stored.
    let s = get(&stack, "/v1/agent/service/web-1").await.body;
    assert_eq!(s["Port"], 8080);
    assert_eq!(
        check_status(&stack, "service:web-1").await.as_deref(),
        Some("passing")
    );

    // The same ID again, on another port: updated in place, and the check
    // (same definition) keeps its state.
    let mut moved = good.clone();
    moved["Port"] = json!(9090);
    assert_eq!(register(&stack, moved).await.status, 200);
    eventually("web-1 on 9090", || async {
        let s = get(&stack, "/v1/agent/service/web-1").await.body;
        (s["Port"] == 9090).then_some(())
    })
    .await;
    assert_eq!(
        ids(&get(&stack, "/v1/health/service/web").await.body),
        ["web-1"]
    );
    assert_eq!(
        check_status(&stack, "service:web-1").await.as_deref(),
        Some("passing")
    );
    // Another service may not take the ID.
    let r = register(
        &stack,
        json!({"Name": "api", "ID": "web-1", "Address": "127.0.0.1", "Port": 1}),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.body);
    // The registry's own PUT names a missing field by its name.
    let r = put(&stack, "/v1/services/web/w2", json!({"port": 80})).await;
    assert_eq!((r.status, r.body["field"].clone()), (400, json!("address")));
    stack.stop().await.unwrap();
}

/// A blocking query on one service sleeps through changes to another:
/// its index is the service's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_query_on_one_service_sleeps_through_changes_to_others() {
    let stack = start().await;
    for (name, id) in [("web", "web-1"), ("api", "api-1")] {
        let r = register(
            &stack,
            json!({"Name": name, "ID": id, "Address": "127.0.0.1", "Port": 80}),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let first = eventually("both services", || async {
        let w = get(&stack, "/v1/health/service/web").await;
        let a = get(&stack, "/v1/health/service/api").await;
        (ids(&w.body).len() == 1 && ids(&a.body).len() == 1).then_some(w)
    })
    .await;
    let index = first.index.unwrap();
    let blocked = {
        let http = stack.http;
        tokio::spawn(async move {
            let path = format!("/v1/health/service/web?index={index}&wait=10m");
            common::http::get_at(http, &path).await
        })
    };
    register(
        &stack,
        json!({"Name": "api", "ID": "api-2", "Address": "127.0.0.1", "Port": 80}),
    )
    .await;
    eventually("api-2", || async {
        let a = get(&stack, "/v1/health/service/api").await;
        (ids(&a.body).len() == 2).then_some(())
    })
    .await;
    // `api` changed; `web`'s index did not.
    assert_eq!(
        get(&stack, "/v1/health/service/web").await.index,
        Some(index)
    );
    register(
        &stack,
        json!({"Name": "web", "ID": "web-2", "Address": "127.0.0.1", "Port": 80}),
    )
    .await;
    let answer = tokio::time::timeout(LIMIT, blocked)
        .await
        .expect("the blocking query did not return after web changed")
        .unwrap();
    // Had it returned on `api`'s change, web-2 would not be in it.
    assert_eq!(ids(&answer.body), ["web-1", "web-2"]);
    assert!(answer.index.unwrap() > index);
    stack.stop().await.unwrap();
}

/// py-consul (PyPI), as a Python service would use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_consul_registers_checks_and_watches_through_the_registrar() {
    common::require_python("consul", "py-consul");
    let stack = start().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/consul_client.py");
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
    assert!(stdout.contains("py-consul: ok"), "{stdout}\n{stderr}");
    stack.stop().await.unwrap();
}

/// VictoriaMetrics (Debian's `victoria-metrics`), whose `consul_sd_configs`
/// reads what Prometheus' reads, given only the server: it asks
/// `/v1/agent/self` for the datacenter, discovers an agent-registered
/// service with its tags, meta and health, and drops it once deregistered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn victoria_metrics_discovers_an_agent_registered_service() {
    let found = std::process::Command::new("victoria-metrics")
        .arg("-version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "victoria-metrics is not installed: `apt-get install victoria-metrics` (scripts/test does)"
    );
    let stack = start().await;
    let r = register(
        &stack,
        json!({"Name": "web", "ID": "web-1", "Address": "127.0.0.1", "Port": stack.http.port(),
               "Tags": ["v1"], "Meta": {"zone": "z1"}, "Check": {"TTL": "1m", "Status": "passing"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scrape.yml");
    std::fs::write(
        &config,
        format!(
            "scrape_configs:\n  - job_name: registry\n    scrape_interval: 1s\n    consul_sd_configs:\n      - server: {}\n        services: [web]\n",
            stack.http
        ),
    )
    .unwrap();
    let vm_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let _vm = tokio::process::Command::new("victoria-metrics")
        .arg(format!("-promscrape.config={}", config.display()))
        .arg(format!("-httpListenAddr={vm_addr}"))
        .arg(format!(
            "-storageDataPath={}",
            dir.path().join("data").display()
        ))
        .arg("-promscrape.consulSDCheckInterval=1s")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let targets = |want: usize| async move {
        let answer =
            tokio::time::timeout(LIMIT, common::http::try_get_at(vm_addr, "/api/v1/targets")).await;
        let body = answer.ok().flatten()?;
        let active = body["data"]["activeTargets"].as_array()?.clone();
        (active.len() == want).then_some(active)
    };
    let active = eventually("VictoriaMetrics to discover web-1", || targets(1)).await;
    let labels = &active[0]["discoveredLabels"];
    assert_eq!(labels["__meta_consul_service_id"], "web-1", "{labels}");
    assert_eq!(labels["__meta_consul_dc"], "test", "{labels}");
    assert_eq!(labels["__meta_consul_health"], "passing", "{labels}");
    assert_eq!(labels["__meta_consul_tags"], ",v1,", "{labels}");
    assert_eq!(
        labels["__meta_consul_service_metadata_zone"], "z1",
        "{labels}"
    );

    let gone = send(&stack, "PUT", "/v1/agent/service/deregister/web-1", None).await;
    assert_eq!(gone.status, 200);
    eventually("VictoriaMetrics to drop web-1", || targets(0)).await;
    stack.stop().await.unwrap();
}
