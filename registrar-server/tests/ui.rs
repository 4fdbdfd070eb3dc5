//! The dashboard at `/ui` (issue 20): off unless asked for; the page, its
//! assets and its event stream over plain HTTP; and the page itself in
//! headless Chromium driven over WebDriver (chromedriver started here on
//! a free loopback port): it loads, a registration appears without a
//! reload, an unhealthy endpoint is shown as such, a removal disappears,
//! the filter works, and it fits a phone's width.
//!
//! Chromium and chromedriver come from Debian's `chromium` and
//! `chromium-driver` packages (`scripts/test` installs them); without them
//! the browser test fails, naming the packages.
//!
//! Set `REGISTRAR_UI_SCREENSHOT=docs/registrar-ui.png` (relative to the
//! repository root) to save the browser test's screenshot there.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use registrar_server::{serve_with, Backend, Registrar, RegistrarConfig, ServeOptions};
use registry_api::testing::eventually;
use registry_api::{liveness::Liveness, memory::MemoryRegistry, Endpoint, Health, Op};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const LIMIT: Duration = Duration::from_secs(30);

/// A registrar on loopback with its health port.
struct Server {
    health: SocketAddr,
    registrar: Arc<Registrar>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<registry_api::Result<()>>,
}

async fn start(ui: bool) -> Server {
    let backend: Arc<dyn Backend> = Arc::new(Liveness::new(MemoryRegistry::new()));
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health_addr = health.local_addr().unwrap();
    let registrar = Registrar::new(backend, RegistrarConfig::new("cluster-a")).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_with(
        Arc::clone(&registrar),
        grpc,
        health,
        None,
        ServeOptions::default().with_ui(ui),
        async move {
            let _ = rx.await;
        },
    ));
    Server {
        health: health_addr,
        registrar,
        stop: Some(tx),
        task,
    }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.health)
    }

    async fn register(&self, ep: Endpoint) {
        self.registrar.write(Op::Register(ep), None).await.unwrap();
    }

    async fn deregister(&self, service: &str, id: &str) {
        let key = registry_api::EndpointKey::new(service, id);
        self.registrar
            .write(Op::Deregister(key), None)
            .await
            .unwrap();
    }

    /// Graceful stop; bounded, so an event stream that held the health
    /// server open would fail the test.
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(LIMIT, &mut self.task)
            .await
            .expect("the server did not stop (an open event stream held it?)")
            .unwrap()
            .unwrap();
    }
}

fn endpoint(service: &str, id: &str, port: u16, node: &str, health: Health) -> Endpoint {
    let mut ep = Endpoint::new(service, id, "10.0.0.5", port);
    ep.cluster = "cluster-a".into();
    ep.node = node.into();
    ep.health = health;
    ep.labels.insert("zone".into(), "eu-west-1a".into());
    ep
}

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

/// The binary: `serve --ui` serves the page and warns that it is open to
/// anyone; without the flag there is no `/ui`.
#[tokio::test]
async fn serve_ui_turns_it_on_with_a_warning() {
    let with = common::spawn_serve(&["--ui"]).await;
    let (code, body) = common::http_get(&with.health, "/ui").await;
    assert_eq!(code, 200, "{}", with.stderr());
    assert!(body.contains("<title>Registrar</title>"), "{body}");
    let log = with.stderr();
    assert!(
        log.contains("/ui") && log.contains("no authentication"),
        "{log}"
    );
    let without = common::spawn_serve(&[]).await;
    let (code, _) = common::http_get(&without.health, "/ui").await;
    assert_eq!(code, 404);
    assert!(!without.stderr().contains("no authentication"));
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

/// chromedriver on a free loopback port, killed (with the browsers it
/// started, its process group) when dropped.
struct Driver {
    child: std::process::Child,
    url: String,
}

impl Driver {
    async fn start() -> Self {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start chromedriver ({e}): install Debian's `chromium` and \
                         `chromium-driver` (scripts/test does when they are missing)"
                    )
                })
        };
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let addr = format!("127.0.0.1:{port}");
        eventually("chromedriver listens", || {
            let addr = addr.clone();
            async move { tokio::net::TcpStream::connect(addr).await.ok().map(drop) }
        })
        .await;
        driver
    }

    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    "--window-size=1280,1000"
                ]
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        tokio::time::timeout(
            LIMIT,
            ClientBuilder::new(connector)
                .capabilities(caps)
                .connect(&self.url),
        )
        .await
        .expect("no browser session in time")
        .expect("headless Chromium did not start")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium it started.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `data-key`s of the endpoint rows shown. Read in one script: the
/// page replaces its rows on every change, so element handles go stale.
async fn rows(browser: &Client) -> Vec<String> {
    let keys = browser
        .execute(
            "return Array.from(document.querySelectorAll('#endpoints tbody tr'))\
             .map(r => r.dataset.key);",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(keys).unwrap()
}

async fn shows(browser: &Client, what: &str, want: &[&str]) {
    eventually(what, || async move {
        let have = rows(browser).await;
        (have == want).then_some(())
    })
    .await;
}

/// The text and class of the element `css` selects; `None` while there is
/// none.
async fn element(browser: &Client, css: &str) -> Option<(String, String)> {
    let found = browser
        .execute(
            "const e = document.querySelector(arguments[0]);\
             return e === null ? null : [e.textContent, e.className];",
            vec![serde_json::json!(css)],
        )
        .await
        .unwrap();
    serde_json::from_value(found).unwrap()
}

async fn text_of(browser: &Client, css: &str) -> String {
    element(browser, css)
        .await
        .unwrap_or_else(|| panic!("nothing matches {css}"))
        .0
}

#[tokio::test]
async fn the_dashboard_in_headless_chromium() {
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
    server
        .register(endpoint(
            "checkout",
            "pod-c",
            9090,
            "node-1",
            Health::Healthy,
        ))
        .await;
    // Accepted once the registration is in the state or the backend.
    let registrar = &server.registrar;
    eventually("node-1's heartbeat is accepted", || async move {
        registrar.heartbeat("node-1").await.ok()
    })
    .await;
    let driver = Driver::start().await;
    let browser = driver.browser().await;
    // On a panic, dropping the driver kills the browser too.
    check_dashboard(&server, &browser).await;
    let _ = browser.close().await;
    drop(driver);
    server.stop().await;
}

async fn check_dashboard(server: &Server, browser: &Client) {
    browser.goto(&server.url("/ui")).await.unwrap();
    eventually("the page is live", || async move {
        let (text, _) = element(browser, "#link").await?;
        (text == "live").then_some(())
    })
    .await;
    shows(
        browser,
        "the first snapshot",
        &["checkout/pod-c", "payments/pod-a"],
    )
    .await;

    // A registration appears without a reload.
    server
        .register(endpoint(
            "payments",
            "pod-b",
            8081,
            "node-2",
            Health::Healthy,
        ))
        .await;
    shows(
        browser,
        "the registration",
        &["checkout/pod-c", "payments/pod-a", "payments/pod-b"],
    )
    .await;

    // An unhealthy one is shown as such.
    server
        .register(endpoint(
            "payments",
            "pod-b",
            8081,
            "node-2",
            Health::Unhealthy,
        ))
        .await;
    let row = r#"#endpoints tr[data-key="payments/pod-b"]"#;
    eventually("pod-b shown unhealthy", || async move {
        let (text, class) = element(browser, row).await?;
        (class.contains("unhealthy") && text.contains("unhealthy")).then_some(())
    })
    .await;
    let healthy = text_of(browser, r#"#endpoints tr[data-key="payments/pod-a"]"#).await;
    assert!(
        healthy.contains("healthy") && !healthy.contains("unhealthy"),
        "{healthy}"
    );
    let service = text_of(browser, r#"#services tr[data-service="payments"]"#).await;
    assert!(service.contains("degraded"), "{service}");

    // The filter: by words of any column, and by health.
    let filter = browser.find(Locator::Css("#filter")).await.unwrap();
    filter.send_keys("payments 8081").await.unwrap();
    shows(browser, "the text filter", &["payments/pod-b"]).await;
    filter.clear().await.unwrap();
    filter.send_keys("zone=eu-west").await.unwrap();
    shows(
        browser,
        "the label filter",
        &["checkout/pod-c", "payments/pod-a", "payments/pod-b"],
    )
    .await;
    filter.clear().await.unwrap();
    browser
        .find(Locator::Css("#health-filter option[value=unhealthy]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    shows(browser, "the health filter", &["payments/pod-b"]).await;
    browser
        .find(Locator::Css("#health-filter option[value='']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    shows(
        browser,
        "no filter",
        &["checkout/pod-c", "payments/pod-a", "payments/pod-b"],
    )
    .await;

    // A removal disappears.
    server.deregister("checkout", "pod-c").await;
    shows(
        browser,
        "the removal",
        &["payments/pod-a", "payments/pod-b"],
    )
    .await;

    // The registrar's own state and the nodes.
    eventually("the registrar's state", || async move {
        let ready = text_of(browser, "#st-ready").await;
        let epoch = text_of(browser, "#st-epoch").await;
        (ready == "ready" && epoch == server.registrar.epoch().to_string()).then_some(())
    })
    .await;
    let node = text_of(browser, r#"#nodes tr[data-node="node-1"]"#).await;
    assert!(node.contains("ago"), "node-1's heartbeat: {node}");
    let node = text_of(browser, r#"#nodes tr[data-node="node-2"]"#).await;
    assert!(
        node.contains("not seen here"),
        "node-2 never heartbeat: {node}"
    );

    if let Ok(path) = std::env::var("REGISTRAR_UI_SCREENSHOT") {
        let png = browser.screenshot().await.unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::write(root.join(path), png).unwrap();
    }

    // A phone's width: nothing wider than the screen but the tables,
    // which scroll inside their boxes.
    browser.set_window_size(390, 844).await.unwrap();
    let overflow = browser
        .execute(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(overflow.as_i64(), Some(0), "the page is wider than a phone");
}
