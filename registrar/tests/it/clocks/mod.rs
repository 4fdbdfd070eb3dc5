//! Liveness and Consul TTL checks when the wall clocks of `registrar
//! serve` processes disagree or jump: one replica's clock is moved with
//! libfaketime (a fixed offset, or a step of ten minutes while it runs),
//! and silence is still judged by how long a node has really been silent.
//!
//! - [`shared`]: two replicas over DynamoDB, and over Cloud Map (both on
//!   moto), the second replica's clock ahead, behind, stepped back and
//!   stepped forward. No live node is ever shown unhealthy or missing on
//!   either, each silent node is marked on both in time, and
//!   self-preservation never holds.
//! - [`sqlite`]: one replica on a SQLite file, stepped forward and back:
//!   no live node is marked, a silent node is marked in time and removed
//!   `--remove-after` after its silence began, not at the step.
//! - [`consul`]: a Consul TTL check reported to two replicas in turn, one
//!   of them ahead: passing while reported, critical on both within the
//!   TTL (and the runner's tick, a sync, some slack) of the last report.
//!
//! Every bound is computed from the flags below and stated in the failure
//! message; views are read every [`SAMPLE_EVERY`] throughout.
//!
//! ```sh
//! cargo test -p waypost-registrar --all-features --test it clocks -- --nocapture
//! ```

#[cfg(feature = "sqlite")]
mod consul;
#[cfg(any(feature = "dynamodb", feature = "cloudmap"))]
mod shared;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use waypost::announce::{announce, AnnounceConfig, Announcement};
use waypost::{Endpoint, Health, Registry};
use waypost_registrar_client::{Ack, ClientConfig, RpcClient};

use crate::common::{self, Spawned};

/// `--suspect-after`: a node silent this long is marked unhealthy.
pub const SUSPECT: Duration = Duration::from_secs(6);
/// `--liveness-sweep-interval`.
pub const SWEEP: Duration = Duration::from_secs(1);
/// `--sync-interval`: how often a replica reads the backend's changes
/// into its view.
pub const SYNC: Duration = Duration::from_millis(500);
/// Room for process scheduling on a loaded two-core machine (moto, the
/// replicas and the agents share it).
pub const SLACK: Duration = Duration::from_secs(4);
/// How often the live agents heartbeat (a third of [`SUSPECT`] or less).
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How often the test reads every replica's view.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// Ten minutes: the size of a step of a replica's clock.
pub const STEP_SECS: i64 = 600;

/// The service every endpoint of these tests belongs to.
pub const SERVICE: &str = "clocks";
pub const CLUSTER: &str = "clocks";
/// The longest a replica may take to start, or a first registration.
const START_LIMIT: Duration = Duration::from_secs(60);

/// `serve`'s liveness flags: [`SUSPECT`], [`SWEEP`], [`SYNC`] and
/// `remove_after`.
pub fn liveness_flags(remove_after: Duration) -> Vec<String> {
    vec![
        format!("--suspect-after={}ms", SUSPECT.as_millis()),
        format!("--remove-after={}ms", remove_after.as_millis()),
        format!("--liveness-sweep-interval={}ms", SWEEP.as_millis()),
        format!("--sync-interval={}ms", SYNC.as_millis()),
        format!("--cluster-name={CLUSTER}"),
    ]
}

/// Seconds, for messages: `6.0 s`, `10.5 s`, `0.25 s`.
pub fn secs(d: Duration) -> String {
    let two = format!("{:.2}", d.as_secs_f64());
    match two.strip_suffix('0') {
        Some(one) => format!("{one} s"),
        None => format!("{two} s"),
    }
}

/// `at` in seconds after `start` (negative before it), for messages.
pub fn since(start: Instant, at: Instant) -> String {
    match at.checked_duration_since(start) {
        Some(d) => format!("{:.1} s", d.as_secs_f64()),
        None => format!("-{:.1} s", (start - at).as_secs_f64()),
    }
}

/// One `registrar serve` process with its HTTP API, named for messages;
/// killed on drop.
pub struct Replica {
    pub name: &'static str,
    pub http: SocketAddr,
    served: Spawned,
}

impl Replica {
    /// Start `registrar serve` with `args` and the environment `env`, and
    /// wait (bounded) until it is ready: its backend is open.
    pub async fn start(name: &'static str, args: &[String], env: &[(&str, &str)]) -> Replica {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let served = common::spawn_serve_env(&args, env).await;
        let http = served.field("http-api=").parse().unwrap();
        let r = Replica { name, http, served };
        let ready = async {
            while r.served.readyz().await.0 != 200 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        if tokio::time::timeout(START_LIMIT, ready).await.is_err() {
            panic!(
                "replica {name} was not ready within {START_LIMIT:?}:\n{}",
                r.served.stderr()
            );
        }
        r
    }

    /// A client of this replica for `node`, acknowledged once durable.
    pub fn client(&self, node: &str) -> Arc<RpcClient> {
        let cfg = ClientConfig::new(self.served.url(), CLUSTER, node)
            .with_ack(Ack::Durable)
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
        Arc::new(RpcClient::connect(cfg).unwrap())
    }

    /// The endpoints of [`SERVICE`] in this replica's view (its HTTP API);
    /// `None` when it does not answer with them.
    pub async fn view(&self) -> Option<Vec<Endpoint>> {
        let path = format!("/v1/services/{SERVICE}");
        let body = common::http::try_get_at(self.http, &path).await?;
        serde_json::from_value(body).ok()
    }

    /// `registry_liveness_self_preservation` on its `/metrics`, if set.
    pub async fn self_preservation(&self) -> Option<f64> {
        let (_, text) = common::http_get(&self.served.health, "/metrics").await;
        common::parse(&text).value("registry_liveness_self_preservation")
    }

    /// The last lines of its log, for a failure message.
    pub fn log_tail(&self) -> String {
        let log = self.served.stderr();
        let lines: Vec<&str> = log.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// The endpoint of node `node` (one per node), `id` in [`SERVICE`].
pub fn endpoint(id: &str, node: &str, port: u16) -> Endpoint {
    Endpoint::new(SERVICE, id, "127.0.0.1", port)
        .with_node(node)
        .with_cluster(CLUSTER)
}

/// Live agents: `n` nodes of one endpoint each, registered through
/// `replica` and heartbeating through it every [`HEARTBEAT`] (registering
/// again if it forgets them), ids `{prefix}0`…; returned once every one is
/// registered.
pub async fn live_agents(
    replica: &Replica,
    prefix: &str,
    n: u16,
) -> (Vec<Endpoint>, Vec<Announcement>) {
    let cfg = AnnounceConfig::default()
        .with_heartbeat_every(HEARTBEAT)
        .with_retry(Duration::from_millis(100), Duration::from_secs(1));
    let mut endpoints = Vec::new();
    let mut announced = Vec::new();
    for i in 0..n {
        let node = format!("node-{prefix}{i}");
        let e = endpoint(&format!("{prefix}{i}"), &node, 1000 + i);
        let a = announce(replica.client(&node), vec![e.clone()], cfg.clone()).unwrap();
        endpoints.push(e);
        announced.push(a);
    }
    for a in &announced {
        tokio::time::timeout(START_LIMIT, a.registered())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "an agent of replica {} did not register within {START_LIMIT:?}:\n{}",
                    replica.name,
                    replica.log_tail()
                )
            });
    }
    (endpoints, announced)
}

/// A node that registers one endpoint and then says nothing.
pub struct Silent {
    pub endpoint: Endpoint,
    /// When its registration was sent, and when it was acknowledged
    /// (durable: its node's record and endpoint were written in between).
    pub sent: Instant,
    pub acked: Instant,
}

impl Silent {
    /// Register `id` (node `node-{id}`) through `replica`, durably.
    pub async fn register(replica: &Replica, id: &str) -> Silent {
        let node = format!("node-{id}");
        let endpoint = endpoint(id, &node, 999);
        let sent = Instant::now();
        replica
            .client(&node)
            .register(endpoint.clone())
            .await
            .unwrap_or_else(|e| panic!("registering {id} through {}: {e}", replica.name));
        Silent {
            endpoint,
            sent,
            acked: Instant::now(),
        }
    }

    /// The latest a replica may show it unhealthy: [`SUSPECT`] after its
    /// last write, a sweep that may just have missed it and the next one
    /// ([`SWEEP`] each), `reach` for the mark to reach the other replica's
    /// view, [`SLACK`].
    pub fn mark_deadline(&self, reach: Duration) -> Instant {
        self.acked + SUSPECT + 2 * SWEEP + reach + SLACK
    }

    /// The earliest a replica may show it unhealthy: [`SUSPECT`] after its
    /// registration was sent, less one [`SWEEP`] (a sweep may take its
    /// time before reading what the registration wrote).
    pub fn mark_earliest(&self) -> Instant {
        self.sent + SUSPECT - SWEEP
    }
}

/// What reading the replicas' views found, over the whole test.
pub struct Sampler {
    start: Instant,
    live: Vec<String>,
    silent: Vec<String>,
    /// Whether `registry_liveness_self_preservation` is read too.
    self_preservation: bool,
    /// Each kind of wrong reading: when first and last read, how often.
    violations: BTreeMap<String, (Instant, Instant, usize)>,
    /// Per (replica, silent id): when first seen, first seen unhealthy,
    /// first seen gone after being seen.
    seen: BTreeSet<(usize, String)>,
    marked: BTreeMap<(usize, String), Instant>,
    gone: BTreeMap<(usize, String), Instant>,
    samples: Vec<usize>,
}

impl Sampler {
    pub fn new(live: &[Endpoint], replicas: usize, self_preservation: bool) -> Sampler {
        Sampler {
            start: Instant::now(),
            live: live.iter().map(|e| e.id.clone()).collect(),
            silent: Vec::new(),
            self_preservation,
            violations: BTreeMap::new(),
            seen: BTreeSet::new(),
            marked: BTreeMap::new(),
            gone: BTreeMap::new(),
            samples: vec![0; replicas],
        }
    }

    /// Follow the silent node `id` too.
    pub fn follow(&mut self, id: &str) {
        self.silent.push(id.to_string());
    }

    /// `at`, in seconds since the sampler started.
    pub fn at(&self, at: Instant) -> String {
        since(self.start, at)
    }

    /// Note a wrong reading.
    fn violation(&mut self, what: String) {
        let now = Instant::now();
        let v = self.violations.entry(what).or_insert((now, now, 0));
        v.1 = now;
        v.2 += 1;
    }

    /// Read every replica's view (and gauge) once.
    pub async fn sample(&mut self, replicas: &[&Replica]) {
        for (i, r) in replicas.iter().enumerate() {
            let Some(view) = r.view().await else {
                continue;
            };
            let now = Instant::now();
            self.samples[i] += 1;
            let find = |id: &str| view.iter().find(|e| e.id == id);
            for id in self.live.clone() {
                match find(&id) {
                    None => self.violation(format!("replica {} lists no live {id}", r.name)),
                    Some(e) if e.health != Health::Healthy => {
                        self.violation(format!(
                            "replica {} shows live {id} {}",
                            r.name,
                            e.health.as_str()
                        ));
                    }
                    Some(_) => {}
                }
            }
            for id in &self.silent {
                let k = (i, id.clone());
                match find(id) {
                    Some(e) => {
                        self.seen.insert(k.clone());
                        if e.health == Health::Unhealthy {
                            self.marked.entry(k).or_insert(now);
                        }
                    }
                    None if self.seen.contains(&k) => {
                        self.gone.entry(k).or_insert(now);
                    }
                    None => {}
                }
            }
            if self.self_preservation && r.self_preservation().await == Some(1.0) {
                self.violation(format!(
                    "replica {} holds its sweeps (registry_liveness_self_preservation 1)",
                    r.name
                ));
            }
        }
    }

    /// Whether replica `i` shows `id` unhealthy (seen so at least once).
    pub fn is_marked(&self, i: usize, id: &str) -> bool {
        self.marked.contains_key(&(i, id.to_string()))
    }

    /// When replica `i` first no longer listed `id`, after listing it.
    pub fn gone_at(&self, i: usize, id: &str) -> Option<Instant> {
        self.gone.get(&(i, id.to_string())).copied()
    }

    /// What is wrong with when each replica marked `silent`: never, later
    /// than its deadline, or earlier than its silence allows.
    /// `reach`: how long a change may take to reach a replica's view.
    pub fn check_marked(
        &self,
        replicas: &[&Replica],
        silent: &Silent,
        reach: Duration,
        problems: &mut Vec<String>,
    ) {
        let id = &silent.endpoint.id;
        let (earliest, deadline) = (silent.mark_earliest(), silent.mark_deadline(reach));
        let bound = format!(
            "registered at {} (acknowledged at {}), to be marked unhealthy between {} \
             (suspect_after {} after it was sent, less a sweep interval of {}) and {} \
             (suspect_after + 2 × sweep {} + {} to reach a view + slack {} after it was \
             acknowledged)",
            self.at(silent.sent),
            self.at(silent.acked),
            self.at(earliest),
            secs(SUSPECT),
            secs(SWEEP),
            self.at(deadline),
            secs(SWEEP),
            secs(reach),
            secs(SLACK)
        );
        for (i, r) in replicas.iter().enumerate() {
            let k = (i, id.clone());
            match self.marked.get(&k) {
                None => problems.push(format!(
                    "replica {} never showed silent {id} unhealthy ({}); {bound}",
                    r.name,
                    match self.gone.get(&k) {
                        Some(at) => format!("it was gone at {}", self.at(*at)),
                        None => "it stayed healthy".into(),
                    }
                )),
                Some(at) if *at > deadline || *at < earliest => problems.push(format!(
                    "replica {} first showed silent {id} unhealthy at {}; {bound}",
                    r.name,
                    self.at(*at)
                )),
                Some(_) => {}
            }
        }
    }

    /// When each replica first showed `silent` unhealthy, for the log:
    /// seconds after its registration was acknowledged.
    pub fn marks(&self, replicas: &[&Replica], silent: &Silent) -> String {
        let id = &silent.endpoint.id;
        let shown: Vec<String> = replicas
            .iter()
            .enumerate()
            .map(|(i, r)| match self.marked.get(&(i, id.clone())) {
                Some(at) => format!("{} +{}", r.name, since(silent.acked, *at)),
                None => format!("{} never", r.name),
            })
            .collect();
        format!("{id} marked on {}", shown.join(", "))
    }

    /// The violations seen (live nodes, self-preservation) and whether
    /// every replica was read often enough for them to mean something.
    pub fn check_views(&self, replicas: &[&Replica], problems: &mut Vec<String>) {
        for (what, (first, last, n)) in &self.violations {
            problems.push(format!(
                "{what}: {n} reading(s), from {} to {}",
                self.at(*first),
                self.at(*last)
            ));
        }
        for (i, r) in replicas.iter().enumerate() {
            if self.samples[i] < 10 {
                problems.push(format!(
                    "replica {}'s view was read only {} times",
                    r.name, self.samples[i]
                ));
            }
        }
    }
}

/// `Err` listing `problems` (of `what`) with the replicas' last log
/// lines, unless there are none.
pub fn report(what: &str, problems: &[String], replicas: &[&Replica]) -> Result<(), String> {
    if problems.is_empty() {
        return Ok(());
    }
    let logs: Vec<String> = replicas
        .iter()
        .map(|r| format!("--- replica {} log (last lines):\n{}", r.name, r.log_tail()))
        .collect();
    Err(format!(
        "{what}: {} problem(s):\n- {}\n{}",
        problems.len(),
        problems.join("\n- "),
        logs.join("\n")
    ))
}
