//! The registry's own HTTP routes over loopback with plain HTTP clients
//! (hyper, and `curl` for mTLS): services and endpoints with their
//! filters and blocking queries, writes and heartbeats with the gRPC
//! port's validation and authorization, the SSE watch with
//! `Last-Event-ID`, and conformance with `ListAllEndpoints`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::http::{get, put, send, send_with, Sse, LIMIT};
use common::protocols::start;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use waypost::testing::eventually;
use waypost::{Endpoint, EndpointKey, Health};

fn ids(body: &Value) -> BTreeSet<String> {
    body.as_array()
        .unwrap_or_else(|| panic!("not an array: {body}"))
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Every endpoint `ListAllEndpoints` returns over gRPC.
async fn listed(url: &str) -> BTreeMap<EndpointKey, Endpoint> {
    use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
    use waypost_registrar_client::proto::registrar::v1::ListAllEndpointsRequest;
    let mut grpc = Grpc::connect(url.to_string()).await.unwrap();
    grpc.list_all_endpoints(ListAllEndpointsRequest {})
        .await
        .unwrap()
        .into_inner()
        .endpoints
        .into_iter()
        .map(|p| waypost_registrar_client::endpoint_from_proto(p, "").unwrap())
        .map(|e| (e.key(), e))
        .collect()
}

fn endpoints(body: &Value) -> BTreeMap<EndpointKey, Endpoint> {
    serde_json::from_value::<Vec<Endpoint>>(body.clone())
        .unwrap()
        .into_iter()
        .map(|e| (e.key(), e))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_over_http_show_in_services_endpoints_and_list_all() {
    let stack = start().await;
    let a = put(
        &stack,
        "/v1/services/web/a",
        json!({"address": "10.0.0.1", "port": 8080, "node": "n1", "labels": {"zone": "z1"}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body["version"].as_str().unwrap().contains('.'),
        "{}",
        a.body
    );
    for (path, body) in [
        (
            "/v1/services/web/b",
            json!({"address": "10.0.0.2", "port": 8080, "node": "n1", "health": "unhealthy"}),
        ),
        (
            "/v1/services/web/c",
            json!({"address": "10.0.0.3", "port": 8080, "cluster": "west"}),
        ),
        (
            "/v1/services/db/d?ack=durable",
            json!({"service": "db", "id": "d", "address": "10.0.1.1", "port": 5432}),
        ),
    ] {
        let w = put(&stack, path, body).await;
        assert_eq!(w.status, 200, "{path}: {}", w.body);
    }

    let services = eventually("both services over HTTP", || async {
        let s = get(&stack, "/v1/services").await;
        (s.body.as_array().unwrap().len() == 2).then_some(s)
    })
    .await;
    assert_eq!(
        services.body,
        json!([
            {"service": "db", "endpoints": 1, "healthy": 1},
            {"service": "web", "endpoints": 3, "healthy": 2}
        ])
    );
    let west = get(&stack, "/v1/services?cluster=west").await;
    assert_eq!(
        west.body,
        json!([{"service": "web", "endpoints": 1, "healthy": 1}])
    );

    let web = get(&stack, "/v1/services/web").await;
    assert_eq!(ids(&web.body), set(&["a", "b", "c"]));
    let a = &web.body[0];
    assert_eq!(
        (&a["address"], &a["port"], &a["node"]),
        (&json!("10.0.0.1"), &json!(8080), &json!("n1"))
    );
    // Left out of the body: the registrar's own cluster ("test").
    assert_eq!(a["cluster"], "test");
    assert_eq!(a["labels"]["zone"], "z1");
    assert_eq!(a["health"], "healthy");
    let healthy = get(&stack, "/v1/services/web?healthy=true").await;
    assert_eq!(ids(&healthy.body), set(&["a", "c"]));
    let west = get(&stack, "/v1/services/web?cluster=west&healthy").await;
    assert_eq!(ids(&west.body), set(&["c"]));
    assert_eq!(get(&stack, "/v1/services/nothing").await.body, json!([]));

    // One source of truth: what the HTTP API lists is what
    // ListAllEndpoints returns, and the health filter keeps the same ones.
    let all = listed(&stack.url()).await;
    let mut over_http = endpoints(&web.body);
    over_http.extend(endpoints(&get(&stack, "/v1/services/db").await.body));
    assert_eq!(over_http, all);
    let healthy_listed: BTreeMap<EndpointKey, Endpoint> = all
        .iter()
        .filter(|(_, e)| e.service == "web" && e.health == Health::Healthy)
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    assert_eq!(endpoints(&healthy.body), healthy_listed);

    // A blocking query on the service returns once a write passes its
    // index, with the new index.
    let index = web.index.unwrap();
    let blocked = {
        let http = stack.http;
        tokio::spawn(async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<String>();
            let uri = format!("http://{http}/v1/services/web?index={index}&wait=10m");
            let resp = client.get(uri.parse().unwrap()).await.unwrap();
            let index: u64 = resp.headers()["X-Consul-Index"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (index, serde_json::from_slice::<Value>(&bytes).unwrap())
        })
    };
    let gone = send(&stack, "DELETE", "/v1/services/web/b", None).await;
    assert_eq!(gone.status, 200, "{}", gone.body);
    let (new_index, body) = tokio::time::timeout(LIMIT, blocked)
        .await
        .expect("the blocking query did not return after the delete")
        .unwrap();
    assert!(new_index > index, "{new_index} after {index}");
    let body = if ids(&body).contains("b") {
        // It returned on the version change before the state had it:
        // the next read has it.
        get(&stack, "/v1/services/web").await.body
    } else {
        body
    };
    assert_eq!(ids(&body), set(&["a", "c"]));
    // Deleting what is not there is answered the same (idempotent).
    let again = send(&stack, "DELETE", "/v1/services/web/b", None).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(listed(&stack.url()).await.len(), 3);
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_writes_are_refused_naming_the_field_and_change_nothing() {
    let stack = start().await;
    let ok = put(
        &stack,
        "/v1/services/web/a",
        json!({"address": "10.0.0.1", "port": 8080}),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let before = listed(&stack.url()).await;

    let cases = [
        (
            "/v1/services/web/a",
            json!({"address": "10.0.0.1", "port": 0}).to_string(),
            "port",
        ),
        (
            "/v1/services/web/a",
            json!({"address": "10.0.0.1", "port": 70000}).to_string(),
            "port",
        ),
        (
            "/v1/services/web/a",
            json!({"address": "10.0.0.1", "port": "80"}).to_string(),
            "port",
        ),
        (
            "/v1/services/web/a",
            json!({"address": "", "port": 80}).to_string(),
            "address",
        ),
        (
            "/v1/services/web/a",
            json!({"address": "h", "port": 80, "colour": 1}).to_string(),
            "colour",
        ),
        (
            "/v1/services/web/a",
            json!({"address": "h", "port": 80, "id": "z"}).to_string(),
            "id",
        ),
        (
            "/v1/services/web/a",
            json!({"address": "h", "port": 80, "health": "fine"}).to_string(),
            "health",
        ),
        (
            "/v1/services/Bad%20Name!/a",
            json!({"address": "h", "port": 80}).to_string(),
            "service",
        ),
        (
            "/v1/services/web/a?ack=maybe",
            json!({"address": "h", "port": 80}).to_string(),
            "ack",
        ),
        ("/v1/services/web/a", "{not json".to_string(), "body"),
    ];
    for (path, body, field) in cases {
        let a = send(&stack, "PUT", path, Some(body.clone())).await;
        assert_eq!(a.status, 400, "{path} {body}: {}", a.body);
        assert_eq!(a.body["field"], field, "{path} {body}: {}", a.body);
        let error = a.body["error"].as_str().unwrap();
        assert!(error.contains(field), "{path} {body}: {error}");
    }
    // A long bad value is quoted by a bounded prefix.
    let long = "x".repeat(10_000);
    let a = send(
        &stack,
        "PUT",
        &format!("/v1/services/web/a?ack={long}"),
        Some("{}".into()),
    )
    .await;
    assert_eq!(a.body["field"], "ack");
    assert!(a.body["error"].as_str().unwrap().len() < 300, "{}", a.body);
    // Over the body limit: 413.
    let huge = json!({"address": "h", "port": 80, "labels": {"big": "y".repeat(100_000)}});
    let a = put(&stack, "/v1/services/web/a", huge).await;
    assert_eq!(a.status, 413, "{}", a.body);
    // An ack header that is not a mode names the header.
    let a = send_with(
        &stack,
        "PUT",
        "/v1/services/web/a",
        Some(json!({"address": "h", "port": 80}).to_string()),
        &[("x-registrar-ack", "sometimes")],
    )
    .await;
    assert_eq!(
        (a.status, a.body["field"].as_str()),
        (400, Some("x-registrar-ack"))
    );

    assert_eq!(
        listed(&stack.url()).await,
        before,
        "a refused write changed the registry"
    );
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_of_an_unknown_node_is_404_until_it_registers() {
    let stack = start().await;
    let unknown = send(&stack, "POST", "/v1/nodes/n1/heartbeat", None).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(
        unknown.body["error"].as_str().unwrap().contains("n1"),
        "{}",
        unknown.body
    );
    let w = put(
        &stack,
        "/v1/services/web/a",
        json!({"address": "10.0.0.1", "port": 8080, "node": "n1"}),
    )
    .await;
    assert_eq!(w.status, 200, "{}", w.body);
    let beat = send(&stack, "POST", "/v1/nodes/n1/heartbeat", None).await;
    assert_eq!((beat.status, beat.body), (200, json!({"node": "n1"})));
    let bad = send(&stack, "POST", "/v1/nodes/bad%20node/heartbeat", None).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.body["field"], "node_name");
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sse_watch_sends_a_snapshot_then_changes_and_resumes() {
    // One endpoint per snapshot chunk: chunks but the last have empty ids.
    let stack = common::protocols::start_with(
        waypost_registrar_server::RegistrarConfig::new("test").with_snapshot_chunk(1),
    )
    .await;
    for id in ["a", "b"] {
        let w = put(
            &stack,
            &format!("/v1/services/web/{id}"),
            json!({"address": "10.0.0.1", "port": 8080}),
        )
        .await;
        assert_eq!(w.status, 200);
    }
    let mut sse = Sse::open(&stack, None).await;
    let (snap, _) = eventually("a snapshot with both", || async {
        let mut s = Sse::open(&stack, None).await;
        let (ids, id) = s.snapshot().await;
        (ids == set(&["a", "b"])).then_some((ids, id))
    })
    .await;
    assert_eq!(snap.len(), 2);
    let (first, _) = sse.snapshot().await;
    assert!(first.is_subset(&set(&["a", "b"])));

    // Changes arrive in order, each with its id.
    put(
        &stack,
        "/v1/services/web/c",
        json!({"address": "10.0.0.3", "port": 1}),
    )
    .await;
    let mut seen = Vec::new();
    let mut last_id = String::new();
    while !seen
        .iter()
        .any(|(t, id): &(String, String)| t == "added" && id == "c")
    {
        let ev = sse.next().await;
        let id = ev.data["endpoint"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        last_id = ev.id.clone().unwrap();
        assert_eq!(last_id, ev.data["version"].as_str().unwrap());
        seen.push((ev.event, id));
    }
    put(
        &stack,
        "/v1/services/web/c",
        json!({"address": "10.0.0.3", "port": 1, "health": "unhealthy"}),
    )
    .await;
    let ev = sse.next().await;
    assert_eq!(
        (ev.event.as_str(), &ev.data["endpoint"]["health"]),
        ("updated", &json!("unhealthy"))
    );
    last_id = ev.id.unwrap_or(last_id);
    drop(sse);

    // Changes while disconnected; resuming from the last id gets exactly
    // them, no snapshot.
    send(&stack, "DELETE", "/v1/services/web/a", None).await;
    put(
        &stack,
        "/v1/services/web/d",
        json!({"address": "10.0.0.4", "port": 1}),
    )
    .await;
    let mut resumed = Sse::open(&stack, Some(&last_id)).await;
    let removed = resumed.next().await;
    assert_eq!(removed.event, "removed", "{removed:?}");
    assert_eq!(
        (&removed.data["service"], &removed.data["id"]),
        (&json!("web"), &json!("a"))
    );
    assert_eq!(removed.data["endpoint"]["address"], "10.0.0.1");
    let added = resumed.next().await;
    assert_eq!(
        (added.event.as_str(), &added.data["endpoint"]["id"]),
        ("added", &json!("d"))
    );

    // An id the registrar cannot resume from: a fresh snapshot.
    let mut fresh = Sse::open(&stack, Some("999.1")).await;
    let (ids, _) = fresh.snapshot().await;
    assert_eq!(ids, set(&["b", "c", "d"]));
    assert_eq!(fresh.chunks, 3);
    stack.stop().await.unwrap();
}

/// The HTTP port over mTLS, with `curl`: callers are authenticated and
/// authorized as on the gRPC port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_on_the_http_port_is_authorized_as_the_grpc_api() {
    use common::pki::Pki;
    use waypost_registrar_server::{AuthzConfig, Opening, RegistrarConfig, ServeOptions};

    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("curl is needed (scripts/test installs it)");
    }
    let pki = Pki::new();
    let mut server = Opening::new(RegistrarConfig::new("default"));
    server.options = ServeOptions::default()
        .with_tls(pki.server_files.clone())
        .with_authz(AuthzConfig::new("example.org"));
    // Not loopback-only: mTLS is what protects it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    server.protocols.http_api = Some(listener);
    let (_, running) = common::protocols::serve(server).await;

    let curl = |files: Option<waypost_registrar_server::TlsFiles>,
                method: &str,
                path: &str,
                body: Option<Value>| {
        let ca = pki.ca_path();
        let url = format!("https://localhost:{}{path}", http.port());
        let method = method.to_string();
        async move {
            let mut cmd = tokio::process::Command::new("curl");
            cmd.args([
                "-s",
                "--max-time",
                "20",
                "-w",
                "\n%{http_code}",
                "-X",
                &method,
            ])
            .arg("--cacert")
            .arg(&ca)
            .args(["--resolve", &format!("localhost:{}:127.0.0.1", http.port())]);
            if let Some(f) = files {
                let (cert, key) = f.identity.unwrap();
                cmd.arg("--cert").arg(cert).arg("--key").arg(key);
            }
            if let Some(b) = body {
                cmd.args([
                    "-H",
                    "content-type: application/json",
                    "--data",
                    &b.to_string(),
                ]);
            }
            let out = tokio::time::timeout(LIMIT, cmd.arg(url).output())
                .await
                .unwrap()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
            (code.trim().parse::<u16>().unwrap_or(0), body.to_string())
        }
    };
    let n1 = pki.agent(&pki.ca, "n1", Some("spiffe://example.org/node/n1"));
    let reader = pki.agent(&pki.ca, "reader", Some("spiffe://example.org/ci/job"));
    let foreign = pki.agent(&pki.ca, "foreign", Some("spiffe://evil.org/node/n1"));
    let own = json!({"address": "10.0.0.1", "port": 80, "node": "n1"});
    let other = json!({"address": "10.0.0.2", "port": 80, "node": "n2"});

    let (code, body) = eventually("the HTTP API over mTLS", || {
        let curl = &curl;
        let n1 = n1.clone();
        let own = own.clone();
        async move {
            let r = curl(Some(n1), "PUT", "/v1/services/web/a", Some(own)).await;
            (r.0 != 0 && r.0 != 503).then_some(r)
        }
    })
    .await;
    assert_eq!(code, 200, "an agent writes its own node: {body}");
    let (code, body) = curl(
        Some(n1.clone()),
        "PUT",
        "/v1/services/web/b",
        Some(other.clone()),
    )
    .await;
    assert_eq!(code, 403, "another node's endpoint: {body}");
    assert!(body.contains("n2"), "{body}");
    assert_eq!(
        curl(Some(n1.clone()), "POST", "/v1/nodes/n1/heartbeat", None)
            .await
            .0,
        200
    );
    assert_eq!(
        curl(Some(n1.clone()), "POST", "/v1/nodes/n2/heartbeat", None)
            .await
            .0,
        403
    );

    let (code, body) = curl(Some(reader.clone()), "GET", "/v1/services/web", None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"id\":\"a\""), "{body}");
    assert_eq!(
        curl(Some(reader.clone()), "DELETE", "/v1/services/web/a", None)
            .await
            .0,
        403
    );
    assert_eq!(curl(None, "GET", "/v1/services", None).await.0, 401);
    assert_eq!(
        curl(Some(foreign), "GET", "/v1/services", None).await.0,
        403
    );
    // Plaintext HTTP to the TLS port gets no answer.
    let plain = tokio::process::Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("http://127.0.0.1:{}/v1/services", http.port()))
        .output()
        .await
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&plain.stdout), "200");
    let key = EndpointKey::new("web", "a");
    assert_eq!(
        curl(Some(n1), "DELETE", "/v1/services/web/a", None).await.0,
        200,
        "{key}"
    );

    running.stop().await.unwrap();
}

/// Draining over HTTP: a `PUT` with `"health": "draining"` is stored as
/// such, shown as `"draining"`, left out of `?healthy=true` and of the
/// healthy count; a weight out of range is refused naming the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_endpoint_shows_as_draining_and_not_among_the_healthy() {
    let stack = start().await;
    for (id, health) in [("a", "healthy"), ("b", "draining")] {
        let body = json!({"address": "10.0.0.1", "port": 8080, "health": health,
                          "labels": {"zone": "z1", "weight": "3"}});
        let w = put(&stack, &format!("/v1/services/web/{id}"), body).await;
        assert_eq!(w.status, 200, "{id}: {}", w.body);
    }
    let all = eventually("both endpoints over HTTP", || async {
        let s = get(&stack, "/v1/services/web").await;
        (s.body.as_array().is_some_and(|a| a.len() == 2)).then_some(s)
    })
    .await;
    let health: BTreeMap<String, String> = all
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().into(),
                e["health"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(health["b"], "draining", "{}", all.body);
    let healthy = get(&stack, "/v1/services/web?healthy=true").await;
    assert_eq!(ids(&healthy.body), set(&["a"]));
    let counts = get(&stack, "/v1/services").await;
    assert_eq!(
        counts.body,
        json!([{"service": "web", "endpoints": 2, "healthy": 1}])
    );

    let bad = put(
        &stack,
        "/v1/services/web/c",
        json!({"address": "10.0.0.1", "port": 8080, "labels": {"weight": "0"}}),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.body["field"], "labels[\"weight\"]", "{}", bad.body);
}
