//! The soak's fleet: agents on `RegistrarClient` (durable and optimistic,
//! heartbeating their node), plain gRPC writers and HTTP writers, random
//! acknowledgement each write. Each writer writes only its own keys, one
//! write at a time, and a ledger keeps what every write was answered.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;
use waypost::{Endpoint, EndpointKey, Heartbeat, Op, Registry};
use waypost_registrar_client::{Ack, ClientConfig, RegistrarClient, RpcClient};

/// Keys each writer owns.
pub const KEYS_PER_WRITER: usize = 6;
/// The longest one write may take before it counts as unanswered.
const WRITE_LIMIT: Duration = Duration::from_secs(10);

/// What the writes of one key were answered.
#[derive(Debug, Default)]
pub struct KeyLog {
    /// The state the last durable acknowledgement set (`Some(None)`: a
    /// durable deregistration), `None` when nothing was durably acked.
    pub acked: Option<Option<Endpoint>>,
    /// States written since, whose fate is unknown (failed, unanswered or
    /// optimistically acknowledged): the key may end in any of them.
    pub later: Vec<Option<Endpoint>>,
}

/// How many writes were answered how.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub durable: u64,
    pub optimistic: u64,
    pub failed: u64,
}

/// Every key's log.
#[derive(Default)]
pub struct Ledger {
    keys: Mutex<BTreeMap<EndpointKey, KeyLog>>,
    counts: Mutex<Counts>,
}

impl Ledger {
    fn attempt(&self, key: &EndpointKey, state: Option<Endpoint>) {
        let mut keys = self.keys.lock().unwrap();
        keys.entry(key.clone()).or_default().later.push(state);
    }

    fn answered(&self, key: &EndpointKey, state: Option<Endpoint>, ok: bool, durable: bool) {
        let mut counts = self.counts.lock().unwrap();
        match (ok, durable) {
            (true, true) => {
                counts.durable += 1;
                let mut keys = self.keys.lock().unwrap();
                let log = keys.entry(key.clone()).or_default();
                log.acked = Some(state);
                log.later.clear();
            }
            (true, false) => counts.optimistic += 1,
            (false, _) => counts.failed += 1,
        }
    }

    pub fn counts(&self) -> Counts {
        *self.counts.lock().unwrap()
    }

    pub fn take(&self) -> BTreeMap<EndpointKey, KeyLog> {
        std::mem::take(&mut *self.keys.lock().unwrap())
    }
}

/// How a writer writes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A `RegistrarClient` agent of its own node.
    Agent { durable: bool },
    /// `RpcClient::send`, durable or optimistic at random.
    Grpc,
    /// `PUT`/`DELETE /v1/services/…`, durable or optimistic at random.
    Http,
}

/// One writer of the fleet.
pub struct Writer {
    pub name: String,
    /// The agent's client (agents only): what it holds and caches is
    /// checked at the end.
    pub agent: Option<Arc<RegistrarClient>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// The keys `name` writes.
    pub fn keys(name: &str) -> Vec<EndpointKey> {
        (0..KEYS_PER_WRITER)
            .map(|k| EndpointKey::new(format!("svc-{}", k % 3), format!("{name}-{k}")))
            .collect()
    }

    /// Start writer `name` of `kind` against a replica (`grpc_url`
    /// through its proxy, `http` its HTTP API), until `stop`.
    pub fn start(
        name: String,
        kind: Kind,
        grpc_url: String,
        http: std::net::SocketAddr,
        seed: u64,
        ledger: Arc<Ledger>,
        stop: watch::Receiver<bool>,
    ) -> Writer {
        let cfg = |node: &str| {
            ClientConfig::new(grpc_url.clone(), "soak", node)
                .with_timeouts(Duration::from_secs(2), Duration::from_secs(5))
                .with_reconnect(Duration::from_millis(50), Duration::from_secs(1))
                .with_retry_interval(Duration::from_millis(200))
        };
        let agent = match kind {
            Kind::Agent { durable } => {
                let ack = if durable {
                    Ack::Durable
                } else {
                    Ack::Optimistic
                };
                Some(Arc::new(
                    RegistrarClient::connect(cfg(&name).with_ack(ack)).unwrap(),
                ))
            }
            _ => None,
        };
        let rpc = match kind {
            Kind::Grpc => Some(RpcClient::connect(cfg(&name)).unwrap()),
            _ => None,
        };
        let task = {
            let (name, agent) = (name.clone(), agent.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                let keys = Writer::keys(&name);
                let node = match kind {
                    Kind::Agent { .. } => name.clone(),
                    _ => String::new(),
                };
                let http_client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
                let mut beat = tokio::time::interval(Duration::from_secs(1));
                while !*stop.borrow() {
                    let pause = Duration::from_millis(rng.random_range(20..150));
                    tokio::select! {
                        _ = beat.tick(), if agent.is_some() => {
                            if let Some(a) = &agent {
                                let _ = tokio::time::timeout(WRITE_LIMIT, a.heartbeat(&node)).await;
                            }
                            continue;
                        }
                        () = tokio::time::sleep(pause) => {}
                    }
                    let key = &keys[rng.random_range(0..keys.len())];
                    let state = rng.random_bool(0.7).then(|| {
                        Endpoint::new(
                            key.service.clone(),
                            key.id.clone(),
                            "127.0.0.1",
                            rng.random_range(1024..65000),
                        )
                        .with_node(node.clone())
                        .with_cluster("soak")
                    });
                    let durable = match kind {
                        Kind::Agent { durable } => durable,
                        _ => rng.random_bool(0.5),
                    };
                    ledger.attempt(key, state.clone());
                    let op = match &state {
                        Some(e) => Op::Register(e.clone()),
                        None => Op::Deregister(key.clone()),
                    };
                    let ok = tokio::time::timeout(WRITE_LIMIT, async {
                        match (&agent, &rpc) {
                            (Some(a), _) => match &op {
                                Op::Register(e) => a.register(e.clone()).await.is_ok(),
                                Op::Deregister(k) => a.deregister(k).await.is_ok(),
                            },
                            (None, Some(r)) => {
                                let ack = if durable {
                                    Ack::Durable
                                } else {
                                    Ack::Optimistic
                                };
                                r.send(&op, ack).await.is_ok()
                            }
                            (None, None) => http_write(&http_client, http, &op, durable).await,
                        }
                    })
                    .await
                    .unwrap_or(false);
                    ledger.answered(key, state, ok, durable);
                }
            })
        };
        Writer { name, agent, task }
    }

    /// Stop writing (the client, if any, stays for the final checks).
    pub async fn stop(&mut self) {
        let _ = tokio::time::timeout(WRITE_LIMIT * 2, &mut self.task).await;
        self.task.abort();
    }
}

/// One write through the HTTP API; whether it was acknowledged.
async fn http_write(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    http: std::net::SocketAddr,
    op: &Op,
    durable: bool,
) -> bool {
    let ack = if durable { "durable" } else { "optimistic" };
    let key = op.key();
    let uri = format!(
        "http://{http}/v1/services/{}/{}?ack={ack}",
        key.service, key.id
    );
    let req = match op {
        Op::Register(e) => hyper::Request::put(uri)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                serde_json::json!({"address": e.address, "port": e.port, "node": e.node})
                    .to_string(),
            ))),
        Op::Deregister(_) => hyper::Request::delete(uri).body(Full::new(Bytes::new())),
    };
    match client.request(req.unwrap()).await {
        Ok(resp) => resp.status().is_success(),
        Err(_) => false,
    }
}

/// Whether two endpoints are the same registration (health aside: the
/// registrar's liveness may change it).
pub fn same(a: &Endpoint, b: &Endpoint) -> bool {
    let mut b = b.clone();
    b.health = a.health;
    *a == b
}
