//! The HTTP/JSON API of `registrar serve`: served by default beside gRPC
//! (its address on the line the binary prints), and every request counted
//! and timed in `/metrics`. The API itself is tested in process by
//! `waypost-registrar-server` (`registrar-server/tests/it/http_api.rs`).

use crate::common;

use common::fast_client;
use common::http::{ids, set, web, LIMIT};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use waypost::testing::eventually;
use waypost::Registry;

/// The binary serves the HTTP API (and DNS, with its feature) by default;
/// the line it prints names their addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_http_api_by_default() {
    let served = common::serve_binary(&[]).await;
    let field = |name: &str| {
        served
            .line
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_string)
    };
    let http = field("http-api=").unwrap_or_else(|| panic!("no http-api= in {:?}", served.line));
    #[cfg(feature = "dns")]
    assert!(field("dns=").is_some(), "{}", served.line);
    let agent = fast_client(&served.url(), "default", "node-1");
    agent.register(web("a", "10.0.0.1")).await.unwrap();
    let body = eventually("web/a from the binary's HTTP API", || async {
        let (code, body) = common::http_get(&http, "/v1/health/service/web?passing").await;
        let body: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && ids(&body) == set(&["a"])).then_some(body)
    })
    .await;
    assert_eq!(body[0]["Service"]["Port"], 8080);
}

/// Every request is counted by route (the pattern, not the path), method
/// and status, and timed; blocking queries and SSE streams show while
/// they are open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_and_open_ones_shown_in_metrics() {
    use tokio::io::AsyncWriteExt;
    let served = common::serve_binary(&[]).await;
    let http = served.field("http-api=");
    let scrape = || async { common::parse(&common::http_get(&served.health, "/metrics").await.1) };
    let agent = fast_client(&served.url(), "default", "node-1");
    agent.register(web("a", "10.0.0.1")).await.unwrap();
    eventually("web/a over HTTP", || async {
        let (code, body) = common::http_get(&http, "/v1/services/web").await;
        (code == 200 && body.contains("10.0.0.1")).then_some(())
    })
    .await;
    assert_eq!(common::http_get(&http, "/no/such/route").await.0, 404);
    for _ in 0..2 {
        assert_eq!(common::http_get(&http, "/v1/services").await.0, 200);
    }

    // A blocking query that waits (its index is the current one), and an
    // SSE stream, held open.
    let index = get_index(&http, "/v1/health/service/web").await;
    let blocked = {
        let path = format!("/v1/health/service/web?index={index}&wait=10m");
        let http = http.clone();
        tokio::spawn(async move { common::http_get(&http, &path).await })
    };
    let mut sse = tokio::net::TcpStream::connect(&http).await.unwrap();
    sse.write_all(format!("GET /v1/watch HTTP/1.1\r\nHost: {http}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let route = ("route", "/v1/health/service/{name}");
    eventually("a blocking query and an SSE stream open", || async {
        let m = scrape().await;
        (m.find("registrar_http_blocking_queries", &[route]) == Some(1.0)
            && m.find("registrar_http_sse_streams", &[("route", "/v1/watch")]) == Some(1.0))
        .then_some(())
    })
    .await;
    agent.register(web("b", "10.0.0.2")).await.unwrap();
    let (code, _) = tokio::time::timeout(LIMIT, blocked)
        .await
        .expect("the blocking query did not return after the change")
        .unwrap();
    assert_eq!(code, 200);
    drop(sse);
    let m = eventually("both closed", || async {
        let m = scrape().await;
        (m.find("registrar_http_blocking_queries", &[route]) == Some(0.0)
            && m.find("registrar_http_sse_streams", &[("route", "/v1/watch")]) == Some(0.0))
        .then_some(m)
    })
    .await;

    let requests = |route: &str, status: &str| {
        m.find(
            "registrar_http_requests_total",
            &[("route", route), ("method", "GET"), ("status", status)],
        )
    };
    assert_eq!(requests("/v1/services", "200"), Some(2.0));
    assert_eq!(requests("unmatched", "404"), Some(1.0));
    assert!(requests("/v1/services/{service}", "200") >= Some(1.0));
    assert!(requests("/v1/health/service/{name}", "200") >= Some(2.0));
    assert_eq!(
        m.types["registrar_http_request_duration_seconds"],
        "histogram"
    );
    let timed = |blocking: &str| {
        m.find(
            "registrar_http_request_duration_seconds_count",
            &[
                ("route", "/v1/health/service/{name}"),
                ("blocking", blocking),
            ],
        )
    };
    assert_eq!(timed("true"), Some(1.0));
    assert!(timed("false") >= Some(1.0));
    // No series per path asked for: the labels stay few.
    assert!(!m.values.keys().any(|s| s.contains("/no/such/route")));
}

/// The `X-Consul-Index` of the answer to `GET path`.
async fn get_index(http: &str, path: &str) -> u64 {
    let client = Client::builder(TokioExecutor::new()).build_http::<String>();
    let uri: hyper::Uri = format!("http://{http}{path}").parse().unwrap();
    let resp = client.get(uri).await.unwrap();
    resp.headers()["X-Consul-Index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}
