//! Loopback UDP, side by side: `GossipRegistry` (default timings) and the
//! `chitchat` crate (gossip interval 200 ms, the same as ours), all nodes
//! of one system in this process on 127.0.0.1, one system at a time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use waypost::{Endpoint, EndpointKey, Registry};
use waypost_gossip::{GossipConfig, GossipRegistry};

/// Bytes handed to the socket by chitchat, counted through its transport.
struct Counting {
    bytes: Arc<AtomicU64>,
}

struct CountingSocket {
    inner: Box<dyn chitchat::transport::Socket>,
    bytes: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl chitchat::transport::Transport for Counting {
    async fn open(&self, addr: SocketAddr) -> anyhow::Result<Box<dyn chitchat::transport::Socket>> {
        let inner = chitchat::transport::UdpTransport.open(addr).await?;
        Ok(Box::new(CountingSocket {
            inner,
            bytes: self.bytes.clone(),
        }))
    }
}

#[async_trait::async_trait]
impl chitchat::transport::Socket for CountingSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: chitchat::ChitchatEnvelope,
    ) -> anyhow::Result<chitchat::transport::SendOutcome> {
        let out = self.inner.send(to, envelope).await?;
        self.bytes
            .fetch_add(out.num_bytes_sent as u64, AtomicOrdering::Relaxed);
        Ok(out)
    }

    async fn recv(&mut self) -> anyhow::Result<chitchat::transport::RecvOutcome> {
        self.inner.recv().await
    }
}

const POLL: Duration = Duration::from_millis(2);
const UDP_LIMIT: Duration = Duration::from_secs(60);
/// After forming, before the idle window.
const SETTLE: Duration = Duration::from_secs(1);
/// The window idle traffic is measured over.
const IDLE: Duration = Duration::from_secs(2);

/// One run of one system at one N.
#[derive(Clone, Copy)]
pub struct Run {
    /// From the first node's start until every node lists every other.
    pub formed: Duration,
    /// From the write until every node holds it.
    pub converge: Duration,
    /// Bytes sent per node while the write spread.
    pub bytes_per_node: f64,
    /// Idle bytes per second per node, after forming.
    pub idle_per_node_s: f64,
}

/// waypost-gossip's tokio driver, default timings, on 127.0.0.1; every
/// node joins through the first.
pub async fn gossip_udp(n: usize) -> Run {
    let started = Instant::now();
    let first = GossipRegistry::start(GossipConfig::new().with_node_name("g0000"))
        .await
        .unwrap();
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for i in 1..n {
        let config = GossipConfig::new()
            .with_node_name(format!("g{i:04}"))
            .with_seeds([seed]);
        nodes.push(GossipRegistry::start(config).await.unwrap());
    }
    while !nodes.iter().all(|g| g.members().len() == n - 1) {
        assert!(
            started.elapsed() < UDP_LIMIT,
            "gossip N = {n}: no full membership"
        );
        tokio::time::sleep(POLL).await;
    }
    let formed = started.elapsed();
    let bytes = |nodes: &[GossipRegistry]| nodes.iter().map(|g| g.stats().bytes_out).sum::<u64>();
    tokio::time::sleep(SETTLE).await;
    let before = bytes(&nodes);
    tokio::time::sleep(IDLE).await;
    let idle = (bytes(&nodes) - before) as f64 / IDLE.as_secs_f64() / n as f64;
    let before = bytes(&nodes);
    let t0 = Instant::now();
    nodes[n / 2]
        .register(Endpoint::new("payments", "pod-a", "10.1.0.7", 8080))
        .await
        .unwrap();
    let key = EndpointKey::new("payments", "pod-a");
    while !nodes
        .iter()
        .all(|g| g.with_machine(|m| m.endpoint(&key).is_some()))
    {
        assert!(t0.elapsed() < UDP_LIMIT, "gossip N = {n}: did not converge");
        tokio::time::sleep(POLL).await;
    }
    let converge = t0.elapsed();
    let sent = bytes(&nodes) - before;
    drop(nodes);
    Run {
        formed,
        converge,
        bytes_per_node: sent as f64 / n as f64,
        idle_per_node_s: idle,
    }
}

/// chitchat with the same gossip interval (200 ms) on 127.0.0.1; every
/// node seeded with the first.
pub async fn chitchat_udp(n: usize) -> Run {
    let started = Instant::now();
    let bytes = Arc::new(AtomicU64::new(0));
    let transport = Counting {
        bytes: bytes.clone(),
    };
    let mut handles = Vec::new();
    let mut ids = Vec::new();
    let mut seed = None;
    for i in 0..n {
        let listen = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let id = chitchat::ChitchatId::new(format!("c{i:04}"), 0, listen);
        let config = chitchat::ChitchatConfig {
            chitchat_id: id.clone(),
            cluster_id: "bench".to_string(),
            gossip_interval: Duration::from_millis(200),
            listen_addr: listen,
            seed_nodes: seed.iter().map(|s: &SocketAddr| s.to_string()).collect(),
            failure_detector_config: chitchat::FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V1,
        };
        handles.push(
            chitchat::spawn_chitchat(config, Vec::new(), &transport)
                .await
                .unwrap(),
        );
        seed.get_or_insert(listen);
        ids.push(id);
    }
    loop {
        let mut complete = true;
        for h in &handles {
            if h.with_chitchat(|c| c.node_states().len()).await < n {
                complete = false;
                break;
            }
        }
        if complete {
            break;
        }
        assert!(
            started.elapsed() < UDP_LIMIT,
            "chitchat N = {n}: no full membership"
        );
        tokio::time::sleep(POLL).await;
    }
    let formed = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let before = bytes.load(AtomicOrdering::Relaxed);
    tokio::time::sleep(IDLE).await;
    let idle =
        (bytes.load(AtomicOrdering::Relaxed) - before) as f64 / IDLE.as_secs_f64() / n as f64;
    let writer = ids[n / 2].clone();
    let before = bytes.load(AtomicOrdering::Relaxed);
    let t0 = Instant::now();
    handles[n / 2]
        .with_chitchat(|c| c.self_node_state().set("payments/pod-a", "10.1.0.7:8080"))
        .await;
    loop {
        let mut all = true;
        for h in &handles {
            let seen = h
                .with_chitchat(|c| {
                    c.node_state(&writer)
                        .is_some_and(|s| s.get("payments/pod-a").is_some())
                })
                .await;
            if !seen {
                all = false;
                break;
            }
        }
        if all {
            break;
        }
        assert!(
            t0.elapsed() < UDP_LIMIT,
            "chitchat N = {n}: did not converge"
        );
        tokio::time::sleep(POLL).await;
    }
    let converge = t0.elapsed();
    let sent = bytes.load(AtomicOrdering::Relaxed) - before;
    for h in handles {
        h.shutdown().await.unwrap();
    }
    Run {
        formed,
        converge,
        bytes_per_node: sent as f64 / n as f64,
        idle_per_node_s: idle,
    }
}

/// Median and worst of `f` over `runs`.
fn med_worst(runs: &[Run], f: impl Fn(&Run) -> f64) -> (f64, f64) {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[v.len() - 1])
}

/// `runs` runs of each system at each of `sizes`, alternating, then the
/// table: median and worst of each figure.
pub fn compare(sizes: &[usize], runs: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!();
    println!(
        "loopback UDP, gossip interval 200 ms for both, every node seeded with the first; {runs} runs each, median / worst"
    );
    println!(
        "{:>4} {:>16} {:>17} {:>17} {:>17} {:>19}",
        "N", "system", "formed (s)", "one key (ms)", "bytes/node", "idle B/s per node"
    );
    for &n in sizes {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..runs {
            ours.push(rt.block_on(gossip_udp(n)));
            theirs.push(rt.block_on(chitchat_udp(n)));
        }
        for (name, r) in [("waypost-gossip", &ours), ("chitchat", &theirs)] {
            let f = med_worst(r, |x| x.formed.as_secs_f64());
            let c = med_worst(r, |x| x.converge.as_secs_f64() * 1e3);
            let b = med_worst(r, |x| x.bytes_per_node);
            let i = med_worst(r, |x| x.idle_per_node_s);
            println!(
                "{:>4} {:>16} {:>8.2} / {:>6.2} {:>8.0} / {:>6.0} {:>8.0} / {:>6.0} {:>9.0} / {:>7.0}",
                n, name, f.0, f.1, c.0, c.1, b.0, b.1, i.0, i.1
            );
        }
        let ratio = |f: &dyn Fn(&Run) -> f64| {
            let a = med_worst(&ours, f);
            let b = med_worst(&theirs, f);
            (a.0 / b.0.max(1e-9), a.1 / b.1.max(1e-9))
        };
        let formed = ratio(&|x| x.formed.as_secs_f64());
        let conv = ratio(&|x| x.converge.as_secs_f64());
        let bytes = ratio(&|x| x.bytes_per_node);
        let idle = ratio(&|x| x.idle_per_node_s);
        println!(
            "RATIO N={n} gossip/chitchat formed median={:.2} worst={:.2} one-key median={:.2} worst={:.2} bytes median={:.2} idle median={:.2} worst={:.2}",
            formed.0, formed.1, conv.0, conv.1, bytes.0, idle.0, idle.1
        );
    }
}
