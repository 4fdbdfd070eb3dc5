//! The dashboard at `/ui` over plain HTTP: off unless asked
//! for; the page and its assets; its event stream (a snapshot, then
//! changes, and the registrar's status, also before the backend is open).
//! The page in a browser is `ui_browser.rs`; `registrar serve --ui` is
//! `waypost-registrar`'s `tests/it/ui.rs`.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::dashboard::{endpoint, start, LIMIT};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use waypost::Health;
use waypost_registrar_server::{Opening, RegistrarConfig, ServeOptions};

/// GET `path` over HTTP/1.1: status, headers (lowercase names) and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    tokio::time::timeout(LIMIT, s.read_to_string(&mut buf))
        .await
        .expect("no response in time")
        .unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}
#[tokio::test]
async fn the_dashboard_is_off_unless_asked_for() {
    let server = start(false).await;
    let (code, _, _) = get(server.health, "/ui").await;
    assert_eq!(code, 404);
    let (code, _, _) = get(server.health, "/ui/events").await;
    assert_eq!(code, 404);
    let (code, _, body) = get(server.health, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    server.stop().await;
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_from_the_binary() {
    let server = start(true).await;
    let (code, head, body) = get(server.health, "/ui").await;
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'self'"),
        "{head}"
    );
    assert!(body.contains("<title>Registrar</title>"), "{body}");
    assert!(body.contains(r#"<script src="/ui/app.js""#), "{body}");
    assert!(
        !body.contains("http://") && !body.contains("https://"),
        "no outside links: {body}"
    );
    let (code, head, js) = get(server.health, "/ui/app.js").await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/javascript"), "{head}");
    assert!(js.contains("new EventSource(\"/ui/events\")"));
    let (code, head, css) = get(server.health, "/ui/style.css").await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/css"), "{head}");
    assert!(css.contains("@media"), "responsive rules");
    server.stop().await;
}

/// Server-Sent Events read off a raw connection.
struct Sse {
    lines: tokio::io::Lines<BufReader<tokio::net::TcpStream>>,
}

impl Sse {
    async fn open(addr: SocketAddr) -> Self {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req =
            format!("GET /ui/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut lines = BufReader::new(s).lines();
        let status = lines.next_line().await.unwrap().unwrap();
        assert!(status.contains(" 200 "), "{status}");
        Self { lines }
    }

    /// The next event: its name and data.
    async fn next_any(&mut self) -> (String, serde_json::Value) {
        tokio::time::timeout(LIMIT, async {
            let mut event = String::new();
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the stream ended");
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(data) = line.strip_prefix("data: ") {
                    return (event, serde_json::from_str(data).unwrap());
                }
            }
        })
        .await
        .expect("no event in time")
    }

    /// The next event named `name` (others are skipped): its data as JSON.
    async fn next(&mut self, name: &str) -> serde_json::Value {
        tokio::time::timeout(LIMIT, async {
            let mut event = String::new();
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the stream ended");
                // Chunked transfer: chunk sizes arrive as lines of their own.
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(data) = line.strip_prefix("data: ") {
                    if event == name {
                        return serde_json::from_str(data).unwrap();
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {name} event in time"))
    }
}

/// A snapshot comes in pages of `snapshot_chunk` endpoints, in key order,
/// the last one marked; the changes follow it.
#[tokio::test]
async fn the_first_snapshot_comes_in_pages() {
    let backend = waypost::memory::MemoryRegistry::new();
    for i in 0..5 {
        waypost::Registry::register(
            &backend,
            endpoint(
                "payments",
                &format!("pod-{i}"),
                8080,
                "node-1",
                Health::Healthy,
            ),
        )
        .await
        .unwrap();
    }
    let config = RegistrarConfig::new("cluster-a").with_snapshot_chunk(2);
    let server = common::dashboard::start_with(true, config, backend).await;
    let mut sse = Sse::open(server.health).await;
    let mut pages = Vec::new();
    loop {
        let page = sse.next("snapshot").await;
        let ids: Vec<String> = page["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        pages.push(ids);
        if page["last"] == true {
            break;
        }
        assert!(pages.len() < 5, "no last page: {pages:?}");
    }
    assert_eq!(
        pages,
        [
            vec!["pod-0", "pod-1"],
            vec!["pod-2", "pod-3"],
            vec!["pod-4"]
        ]
    );
    server.deregister("payments", "pod-0").await;
    let gone = sse.next("remove").await;
    assert_eq!(gone["id"], "pod-0", "{gone}");
    server.stop().await;
}

#[tokio::test]
async fn the_event_stream_sends_a_snapshot_then_changes_and_the_status() {
    let server = start(true).await;
    server
        .register(endpoint(
            "payments",
            "pod-a",
            8080,
            "node-1",
            Health::Healthy,
        ))
        .await;
    let mut sse = Sse::open(server.health).await;
    let snap = sse.next("snapshot").await;
    let eps = snap["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 1, "{snap}");
    assert_eq!(snap["last"], true, "{snap}");
    assert_eq!(eps[0]["id"], "pod-a");
    assert_eq!(eps[0]["labels"]["zone"], "eu-west-1a");

    server
        .register(endpoint(
            "payments",
            "pod-b",
            8081,
            "node-2",
            Health::Unhealthy,
        ))
        .await;
    let up = sse.next("upsert").await;
    assert_eq!(up["endpoint"]["id"], "pod-b", "{up}");
    assert_eq!(up["endpoint"]["health"], "unhealthy", "{up}");

    server.deregister("payments", "pod-a").await;
    let gone = sse.next("remove").await;
    assert_eq!(
        (gone["service"].as_str(), gone["id"].as_str()),
        (Some("payments"), Some("pod-a"))
    );

    server.registrar.heartbeat("node-2").await.unwrap();
    let status = tokio::time::timeout(LIMIT, async {
        loop {
            let st = sse.next("status").await;
            if st["heartbeats"]["node-2"].is_u64() {
                break st;
            }
        }
    })
    .await
    .expect("no status with node-2's heartbeat in time");
    assert_eq!(status["opened"], true, "{status}");
    assert_eq!(status["epoch"], server.registrar.epoch(), "{status}");
    assert_eq!(status["write_queue_capacity"], 10_000, "{status}");
    assert!(status["agent_streams"].is_u64(), "{status}");
    assert!(status["backend_up"].is_boolean(), "{status}");
    // The stream must not keep the health server from stopping.
    server.stop().await;
}

/// Before the backend is open, the stream says so in its status (and
/// sends nothing else).
#[tokio::test]
async fn before_the_backend_opens_the_status_says_so() {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = health.local_addr().unwrap();
    let mut server = Opening::new(RegistrarConfig::new("cluster-a"));
    server.options = ServeOptions::default().with_ui(true);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // `Opening::serve` is not `Send`: run it beside the checks.
    let serving = server.serve(
        || async {
            Err::<Arc<dyn waypost_registrar_server::Backend>, _>(waypost::Error::unavailable(
                "connection refused (test)",
            ))
        },
        grpc,
        health,
        async move {
            let _ = rx.await;
        },
    );
    let check = async move {
        let mut sse = Sse::open(addr).await;
        let (name, status) = sse.next_any().await;
        assert_eq!(name, "status", "{status}");
        assert_eq!(status["opened"], false, "{status}");
        assert_eq!(status["ready"], false, "{status}");
        let why = status["readiness"].as_str().unwrap();
        assert!(why.contains("cannot open the backend"), "{why}");
        let (name, _) = sse.next_any().await;
        assert_eq!(name, "status", "only the status before the backend is open");
        let _ = tx.send(());
    };
    let (served, ()) = tokio::time::timeout(LIMIT, async { tokio::join!(serving, check) })
        .await
        .expect("the server did not stop");
    served.unwrap();
}
