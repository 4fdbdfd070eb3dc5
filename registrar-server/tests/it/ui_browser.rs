//! The dashboard at `/ui` in a real browser: headless Chromium
//! driven over WebDriver (chromedriver started here on a free loopback
//! port). The page loads, a registration appears without a reload, an
//! unhealthy endpoint is shown as such, a removal disappears, the filters
//! work, and it fits a phone's width.
//!
//! Chromium and chromedriver come from Debian's `chromium` and
//! `chromium-driver` packages (`scripts/test` installs them); without them
//! the test fails, naming the packages.
//!
//! Set `REGISTRAR_UI_SCREENSHOT=docs/registrar-ui.png` (relative to the
//! repository root) to save the screenshot there.

use crate::common;

use std::path::Path;
use std::process::Stdio;

use common::dashboard::{endpoint, start, Server, LIMIT};
use fantoccini::{Client, ClientBuilder, Locator};
use waypost::testing::eventually;
use waypost::Health;

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

/// Endpoints in the large registry.
const LARGE: usize = 100_000;
/// Endpoints in the registry measured beside it, as the baseline.
const SMALL: usize = 1_000;

/// A registry of `n` endpoints over 500 services (at most) and 200 nodes.
async fn registry_of(n: usize) -> waypost::memory::MemoryRegistry {
    let backend = waypost::memory::MemoryRegistry::new();
    for i in 0..n {
        let ep = endpoint(
            &format!("svc-{:03}", i % 500),
            &format!("pod-{i:06}"),
            8080,
            &format!("node-{:03}", i % 200),
            Health::Healthy,
        );
        waypost::Registry::register(&backend, ep).await.unwrap();
    }
    backend
}

/// What the page took with a registry of some size, in milliseconds.
struct Times {
    first_paint: u64,
    change: u64,
    filter: u64,
}

/// Now, in milliseconds since the Unix epoch (the browser's `Date.now()`
/// reads the same clock).
fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// When (`Date.now()` in the page) the JavaScript condition `cond` first
/// holds, `arguments[0]` being `want`: checked in the page every 2 ms, so
/// the time is the page's, not the test's polling. Bounded by the
/// browser's script timeout.
async fn when(browser: &Client, cond: &str, want: &str) -> u64 {
    let script = format!(
        "const want = arguments[0]; const done = arguments[arguments.length - 1];\
         (function check() {{ if ({cond}) {{ done(Date.now()); }} else {{ setTimeout(check, 2); }} }})();"
    );
    let at = browser
        .execute_async(&script, vec![serde_json::json!(want)])
        .await
        .unwrap();
    at.as_u64().unwrap_or_else(|| panic!("not a time: {at}"))
}

/// The condition: the endpoints' count reads `want`.
const COUNT_IS: &str = "document.getElementById('endpoints-count').textContent === want";
/// The condition: the first endpoint row is `want`.
const FIRST_ROW_IS: &str =
    "(document.querySelector('#endpoints tbody tr') || {dataset: {}}).dataset.key === want";

/// Open the dashboard of a registry of `n` endpoints; time its first
/// paint (the endpoints table and its count), a registration shown
/// without a reload, and a filter to one service's 200 (`n / 500`) rows,
/// in milliseconds.
async fn measure(browser: &Client, n: usize) -> Times {
    let config = waypost_registrar_server::RegistrarConfig::new("cluster-a");
    let server = common::dashboard::start_with(true, config, registry_of(n).await).await;
    let opened = unix_ms();
    browser.goto(&server.url("/ui")).await.unwrap();
    let want = if n > 500 {
        format!("({n}, the first 500 shown: filter to narrow)")
    } else {
        format!("({n})")
    };
    let first_paint = when(browser, COUNT_IS, &want).await - opened;
    let shown = rows(browser).await;
    assert_eq!(shown.len(), n.min(500));
    assert_eq!(shown[0], "svc-000/pod-000000");
    assert_eq!(
        text_of(browser, "#services-count").await,
        format!("({})", n.min(500))
    );

    // A registration that sorts first shows without a reload: the page
    // watches for it before it is made.
    let (seen, registered) = tokio::join!(when(browser, FIRST_ROW_IS, "aaa/new"), async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let at = unix_ms();
        server
            .register(endpoint("aaa", "new", 9090, "node-1", Health::Healthy))
            .await;
        at
    });
    let change = seen - registered;
    // The filter narrows the registry to one service's endpoints.
    let filter = browser.find(Locator::Css("#filter")).await.unwrap();
    let typed = unix_ms();
    filter.send_keys("svc-042 ").await.unwrap();
    let filter = when(browser, COUNT_IS, &format!("({} of {})", n / 500, n + 1)).await - typed;
    server.stop().await;
    Times {
        first_paint,
        change,
        filter,
    }
}

/// With 100,000 endpoints the page still loads (the snapshot comes in
/// pages), shows its first rows and the counts, and a registration and a
/// filter show without a reload. Prints the times beside those of a
/// registry of 1,000 in the same run (BENCHMARKS.md quotes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_stays_live_with_100k_endpoints() {
    let driver = Driver::start().await;
    let browser = driver.browser().await;
    // A first look warms the browser up (its first page load is slower).
    measure(&browser, SMALL).await;
    let small = measure(&browser, SMALL).await;
    let large = measure(&browser, LARGE).await;
    for (what, s, l) in [
        (
            "first paint after opening the page",
            small.first_paint,
            large.first_paint,
        ),
        ("a registration shown", small.change, large.change),
        ("a filter to 200 rows applied", small.filter, large.filter),
    ] {
        println!(
            "dashboard, headless Chromium: {what}: {SMALL} endpoints {s} ms, \
             {LARGE} endpoints {l} ms ({:.1}x)",
            l as f64 / s.max(1) as f64
        );
    }
    let _ = browser.close().await;
    drop(driver);
}
