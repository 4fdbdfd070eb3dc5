//! Test fixtures: one `moto_server` shared by the tests of a binary while
//! any of them runs, a table of its own per test, and a request-counting
//! proxy.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use waypost::polling::{Polling, PollingConfig};
use waypost::testing::Guarded;
use waypost_dynamodb::{DynamoDbConfig, DynamoDbRegistry};
use waypost_fixtures::MotoServer;

/// The `X-Amz-Target` of `TransactWriteItems`.
pub const TRANSACT_TARGET: &str = "DynamoDB_20120810.TransactWriteItems";

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
pub use waypost_fixtures::configs::dynamodb as config;

/// A registry on a table of its own, with its settings and the server it
/// uses. Not a registry itself: tests call `h.reg`, and [`Harness::guarded`]
/// makes the one wrapper (`Guarded`) where a registry owning its fixture
/// is needed.
pub struct Harness {
    pub reg: DynamoDbRegistry,
    pub cfg: DynamoDbConfig,
    pub moto: Arc<MotoServer>,
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
        Harness { reg, cfg, moto }
    }

    /// A registry of a new table in change log mode
    /// (`WatchMode::ChangeLog`), on the shared server.
    pub async fn changelog() -> Harness {
        Self::with_config(false, |c| {
            c.with_watch(waypost_dynamodb::WatchMode::ChangeLog)
        })
        .await
    }

    /// The registry, keeping the shared server alive as long as it lives.
    pub fn guarded(self) -> Guarded<DynamoDbRegistry> {
        Guarded::new(self.reg, self.moto)
    }

    /// The registry of a table without a stream as `waypost::stack`
    /// wraps it: polled (every `poll_interval`), keeping the server alive.
    pub fn polled(self) -> Guarded<Polling<DynamoDbRegistry>> {
        let polling = PollingConfig::default()
            .with_interval(self.cfg.poll_interval)
            .with_history(self.cfg.watch_history);
        let polled = Polling::with_config(self.reg, polling).expect("polling settings");
        Guarded::new(polled, self.moto)
    }
}

/// An HTTP/1.1 proxy on loopback in front of moto. It keeps a copy of every
/// request, so tests can count API calls (`X-Amz-Target` names one) and
/// read request fields, and it can answer the next calls of an API itself
/// with an error of its choice ([`RecordingProxy::fail_next`]).
pub struct RecordingProxy {
    pub url: String,
    sent: Arc<Mutex<Vec<u8>>>,
    faults: Faults,
    task: tokio::task::JoinHandle<()>,
}

/// Injected errors: (target, error type, how many more).
type Faults = Arc<Mutex<Vec<(String, String, usize)>>>;

/// The error to answer `req` with, if a fault matches it (and count it).
fn injected(faults: &Faults, req: &[u8]) -> Option<String> {
    let mut faults = faults.lock().unwrap();
    let hit = faults.iter_mut().find(|(target, _, left)| {
        *left > 0 && req.windows(target.len()).any(|w| w == target.as_bytes())
    })?;
    hit.2 -= 1;
    Some(hit.1.clone())
}

/// One HTTP message (head and body, by `Content-Length`) from `r`, with
/// `buf` holding what was read past it; `None` at the end of the stream.
async fn read_message(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Option<Vec<u8>> {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let total = end + 4 + len;
            while buf.len() < total {
                let n = r.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(buf.drain(..total).collect());
        }
        let n = r.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn error_response(error_type: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{error_type}","message":"injected by the test proxy"}}"#
    );
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/x-amz-json-1.0\r\n\
         x-amzn-requestid: test-proxy\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl RecordingProxy {
    pub async fn start(upstream_url: &str) -> RecordingProxy {
        Self::start_with(upstream_url, None).await
    }

    /// Like [`RecordingProxy::start`], but passing one request at a time
    /// to moto, whose transactions are not isolated from each other (a
    /// cancelled one restores a copy of the whole table taken before it,
    /// undoing what concurrent ones wrote): in this order, DynamoDB's
    /// serializable transactions would give the same results.
    pub async fn start_serial(upstream_url: &str) -> RecordingProxy {
        Self::start_with(upstream_url, Some(Arc::default())).await
    }

    async fn start_with(
        upstream_url: &str,
        serial: Option<Arc<tokio::sync::Mutex<()>>>,
    ) -> RecordingProxy {
        let upstream: SocketAddr = upstream_url
            .trim_start_matches("http://")
            .parse()
            .expect("moto url is http://ip:port");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(Mutex::new(Vec::new()));
        let faults: Faults = Arc::default();
        let (log, injector) = (Arc::clone(&sent), Arc::clone(&faults));
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (log, faults) = (Arc::clone(&log), Arc::clone(&injector));
                let serial = serial.clone();
                tokio::spawn(async move {
                    let mut cbuf = Vec::new();
                    while let Some(req) = read_message(&mut client, &mut cbuf).await {
                        let _turn = match &serial {
                            Some(m) => Some(m.lock().await),
                            None => None,
                        };
                        log.lock().unwrap().extend_from_slice(&req);
                        let resp = if let Some(error) = injected(&faults, &req) {
                            error_response(&error)
                        } else {
                            let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                                return;
                            };
                            if up.write_all(&req).await.is_err() {
                                return;
                            }
                            let mut ubuf = Vec::new();
                            let Some(resp) = read_message(&mut up, &mut ubuf).await else {
                                return;
                            };
                            resp
                        };
                        if client.write_all(&resp).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        RecordingProxy {
            url,
            sent,
            faults,
            task,
        }
    }

    /// Answer the next `n` calls whose request contains `target` (an
    /// `X-Amz-Target`) with `error_type` instead of passing them on.
    pub fn fail_next(&self, target: &str, error_type: &str, n: usize) {
        self.faults
            .lock()
            .unwrap()
            .push((target.to_string(), error_type.to_string(), n));
    }

    /// Pass every call on again (drop the faults not used up yet).
    pub fn clear_faults(&self) {
        self.faults.lock().unwrap().clear();
    }

    /// Answer the next `n` `TransactWriteItems` calls with a throttling
    /// error.
    pub fn throttle_next(&self, n: usize) {
        self.fail_next(TRANSACT_TARGET, "ProvisionedThroughputExceededException", n);
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
