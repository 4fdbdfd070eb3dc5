//! The HTTP/JSON API over loopback with a real HTTP client: Consul's
//! health and catalog endpoints (with blocking queries and `?passing`),
//! and `GET /services?status=running` (`Service` records as a node registry lists them).

use crate::common;

use std::collections::BTreeSet;

use common::fast_client;
use common::http::{get, ids, set, web, LIMIT};
use common::protocols::start;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use waypost::testing::eventually;
use waypost::{Endpoint, EndpointKey, Health, Registry};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_health_and_catalog_follow_registrations() {
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    agent
        .register(
            web("a", "10.0.0.1")
                .with_label("tags", "primary,v2")
                .with_label("zone", "z1"),
        )
        .await
        .unwrap();
    agent
        .register(web("b", "10.0.0.2").with_health(Health::Unhealthy))
        .await
        .unwrap();
    agent
        .register(Endpoint::new("db", "d1", "10.0.1.1", 5432).with_node("node-1"))
        .await
        .unwrap();

    let all = eventually("both web endpoints over HTTP", || async {
        let a = get(&stack, "/v1/health/service/web").await;
        (ids(&a.body) == set(&["a", "b"])).then_some(a)
    })
    .await;
    assert_eq!(all.status, 200);
    assert!(all.index.unwrap() > 0);
    let a = all
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Service"]["ID"] == "a")
        .unwrap();
    assert_eq!(a["Service"]["Service"], "web");
    assert_eq!(a["Service"]["Address"], "10.0.0.1");
    assert_eq!(a["Service"]["Port"], 8080);
    assert_eq!(a["Service"]["Tags"], serde_json::json!(["primary", "v2"]));
    assert_eq!(a["Service"]["Meta"]["zone"], "z1");
    assert_eq!(a["Node"]["Node"], "node-1");
    assert_eq!(a["Checks"][0]["Status"], "passing");
    let b = all
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["Service"]["ID"] == "b")
        .unwrap();
    assert_eq!(b["Checks"][0]["Status"], "critical");

    // ?passing leaves the unhealthy one out; ?tag filters on Tags.
    let passing = get(&stack, "/v1/health/service/web?passing").await;
    assert_eq!(ids(&passing.body), set(&["a"]));
    let passing = get(&stack, "/v1/health/service/web?passing=true").await;
    assert_eq!(ids(&passing.body), set(&["a"]));
    let tagged = get(&stack, "/v1/health/service/web?tag=v2").await;
    assert_eq!(ids(&tagged.body), set(&["a"]));
    // An unknown service: an empty array, as Consul answers.
    let none = get(&stack, "/v1/health/service/nothing").await;
    assert_eq!((none.status, none.body), (200, serde_json::json!([])));

    let catalog = get(&stack, "/v1/catalog/services").await;
    assert_eq!(
        catalog.body,
        serde_json::json!({"db": [], "web": ["primary", "v2"]})
    );

    // Deregistered: gone from both.
    agent
        .deregister(&EndpointKey::new("web", "a"))
        .await
        .unwrap();
    eventually("web/a gone over HTTP", || async {
        let a = get(&stack, "/v1/health/service/web").await;
        (ids(&a.body) == set(&["b"])).then_some(())
    })
    .await;
    let passing = get(&stack, "/v1/health/service/web?passing").await;
    assert_eq!(ids(&passing.body), set(&[]));
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_query_returns_after_a_change_with_the_new_index() {
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    agent.register(web("a", "10.0.0.1")).await.unwrap();
    let first = eventually("web/a over HTTP", || async {
        let a = get(&stack, "/v1/health/service/web").await;
        (ids(&a.body) == set(&["a"])).then_some(a)
    })
    .await;
    let index = first.index.unwrap();

    // Asks to wait ten minutes; the change must end it long before.
    let blocked = {
        let path = format!("/v1/health/service/web?index={index}&wait=10m");
        let http = stack.http;
        tokio::spawn(async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<String>();
            let uri: hyper::Uri = format!("http://{http}{path}").parse().unwrap();
            let resp = client.get(uri).await.unwrap();
            let index: u64 = resp.headers()["X-Consul-Index"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (index, serde_json::from_slice::<Value>(&bytes).unwrap())
        })
    };
    agent.register(web("b", "10.0.0.2")).await.unwrap();
    let (new_index, body) = tokio::time::timeout(LIMIT, blocked)
        .await
        .expect("the blocking query did not return after the change")
        .unwrap();
    assert!(new_index > index, "{new_index} after {index}");
    assert_eq!(ids(&body), set(&["a", "b"]));

    // Nothing changes: the wait elapses and the same index comes back.
    let same = get(
        &stack,
        &format!("/v1/health/service/web?index={new_index}&wait=200ms"),
    )
    .await;
    assert_eq!(same.index, Some(new_index));
    // An index from the future (a restarted registrar numbers anew):
    // answered at once rather than after the wait.
    let future = get(
        &stack,
        &format!("/v1/catalog/services?index={}&wait=10m", new_index + 1000),
    )
    .await;
    assert_eq!(future.index, Some(new_index));
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_status_running_lists_the_healthy_in_the_documents_shape() {
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    agent
        .register(
            Endpoint::new("app", "svc-1", "10.0.0.1", 9000)
                .with_node("node-1")
                .with_label("instance_id", "i-1")
                .with_label("pid", "4242")
                .with_label("deploy_url", "http://example.invalid/app.tar"),
        )
        .await
        .unwrap();
    agent
        .register(
            Endpoint::new("app", "svc-2", "10.0.0.2", 9000)
                .with_node("node-1")
                .with_health(Health::Unhealthy),
        )
        .await
        .unwrap();
    let running = eventually("svc-1 running over HTTP", || async {
        let a = get(&stack, "/services?status=running").await;
        (a.body.as_array().unwrap().len() == 1).then_some(a)
    })
    .await;
    let s = &running.body[0];
    assert_eq!(s["id"], "svc-1");
    assert_eq!(s["instance_id"], "i-1");
    assert_eq!(s["node_id"], "node-1");
    assert_eq!(s["port"], 9000);
    assert_eq!(s["pid"], 4242);
    assert_eq!(s["status"], "running");
    assert_eq!(s["deploy_url"], "http://example.invalid/app.tar");
    assert_eq!(s["address"], "10.0.0.1");
    let everything = eventually("both over HTTP", || async {
        let a = get(&stack, "/services").await;
        (a.body.as_array().unwrap().len() == 2).then_some(a)
    })
    .await;
    assert_eq!(everything.body[1]["status"], "unhealthy");
    stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_are_400_naming_the_parameter() {
    let stack = start().await;
    let bad = get(&stack, "/v1/health/service/web?index=soon").await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body["error"].as_str().unwrap().contains("index"),
        "{}",
        bad.body
    );
    let bad = get(&stack, "/v1/catalog/services?index=1&wait=forever").await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body["error"].as_str().unwrap().contains("wait"),
        "{}",
        bad.body
    );
    stack.stop().await.unwrap();
}

/// With `curl` when it is installed: the header and the JSON as a
/// command-line user sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_sees_the_index_header_and_the_json() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: curl is not installed");
        return;
    }
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    agent.register(web("a", "10.0.0.1")).await.unwrap();
    eventually("web/a over HTTP", || async {
        let a = get(&stack, "/v1/health/service/web").await;
        (ids(&a.body) == set(&["a"])).then_some(())
    })
    .await;
    let out = tokio::time::timeout(
        LIMIT,
        tokio::process::Command::new("curl")
            .args(["-s", "-i", "--max-time", "20"])
            .arg(format!(
                "http://{}/v1/health/service/web?passing",
                stack.http
            ))
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains("x-consul-index: "), "{text}");
    assert!(text.contains("\"id\":\"a\""), "{text}");
    stack.stop().await.unwrap();
}

/// A non-loopback address is refused without --insecure, naming the
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_http_api_is_refused_without_insecure() {
    let mut server =
        waypost_registrar_server::Opening::new(waypost_registrar_server::RegistrarConfig::new("t"));
    server.protocols.http_api = Some(tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap());
    let err = common::protocols::refusal(server).await;
    assert!(err.to_string().contains("http_api_addr"), "{err}");
    assert!(err.to_string().contains("--insecure"), "{err}");
}

/// One source of truth: what the HTTP API shows for every service in its
/// catalog is what gRPC's `ListAllEndpoints` returns (same endpoints, same
/// health, `?passing` exactly the healthy ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_agrees_with_list_all_endpoints() {
    use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
    use waypost_registrar_client::proto::registrar::v1::ListAllEndpointsRequest;
    type Row = (String, String, String, u64, bool);

    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    for i in 0..12u16 {
        let svc = ["web", "db", "cache"][usize::from(i % 3)];
        let health = if i % 4 == 0 {
            Health::Unhealthy
        } else {
            Health::Healthy
        };
        agent
            .register(
                Endpoint::new(svc, format!("e{i}"), format!("10.0.2.{i}"), 1000 + i)
                    .with_node("node-1")
                    .with_health(health),
            )
            .await
            .unwrap();
    }
    let over_http = |passing: bool| {
        let stack = &stack;
        async move {
            let catalog = get(stack, "/v1/catalog/services").await.body;
            let mut rows: BTreeSet<Row> = BTreeSet::new();
            for svc in catalog.as_object().unwrap().keys() {
                let q = if passing { "?passing" } else { "" };
                let body = get(stack, &format!("/v1/health/service/{svc}{q}"))
                    .await
                    .body;
                for e in body.as_array().unwrap() {
                    rows.insert((
                        e["Service"]["Service"].as_str().unwrap().to_string(),
                        e["Service"]["ID"].as_str().unwrap().to_string(),
                        e["Service"]["Address"].as_str().unwrap().to_string(),
                        e["Service"]["Port"].as_u64().unwrap(),
                        e["Checks"][0]["Status"] == "passing",
                    ));
                }
            }
            rows
        }
    };
    let all = eventually("12 endpoints over HTTP", || async {
        let rows = over_http(false).await;
        (rows.len() == 12).then_some(rows)
    })
    .await;
    let mut grpc = Grpc::connect(stack.url()).await.unwrap();
    let listed: BTreeSet<Row> = grpc
        .list_all_endpoints(ListAllEndpointsRequest {})
        .await
        .unwrap()
        .into_inner()
        .endpoints
        .into_iter()
        .map(|e| {
            (
                e.service_name,
                e.id,
                e.address,
                u64::from(e.port),
                e.health != 2, // UNHEALTHY
            )
        })
        .collect();
    assert_eq!(all, listed);
    let passing = over_http(true).await;
    let healthy: BTreeSet<Row> = listed.into_iter().filter(|r| r.4).collect();
    assert_eq!(passing, healthy);
    assert_eq!(passing.len(), 9);
    stack.stop().await.unwrap();
}
