//! Measurements, not checks (`cargo bench -p waypost-registrar --bench
//! xds`), quoted in BENCHMARKS.md: the time from a registration to its
//! push reaching 100 state-of-the-world ADS clients subscribed to the
//! service's load assignment, against the same change reaching 100
//! `WatchEndpoints` streams of another registrar in the same process
//! (changes alternate between the two); and the time from a registration to
//! the change being visible through each protocol the registrar speaks
//! (gRPC watch, xDS, the HTTP API's blocking query, DNS).

#![allow(clippy::unwrap_used)]

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::xds::{endpoints, node, EDS};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use hdrhistogram::Histogram;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use waypost::{liveness::Liveness, memory::MemoryRegistry};
use waypost_registrar_client::endpoint_to_proto;
use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use waypost_registrar_client::proto::registrar::v1::{
    RegisterEndpointRequest, WatchEndpointsRequest,
};
use waypost_registrar_server::{Backend, Opening, RegistrarConfig};

const CLIENTS: usize = 100;
const CHANGES: u32 = 1_000;
/// The whole run stops after this long, whatever it measured.
const BUDGET: Duration = Duration::from_secs(240);
/// The first port of the measured endpoint; change `i` moves it to
/// `BASE_PORT + i`.
const BASE_PORT: u32 = 20_000;

/// Which stream saw the port (its index among its kind), and when.
type Seen = (usize, u32, Instant);

/// One ADS client on its own connection, subscribed to the load
/// assignment of `bench`, reporting each port it sees and, if `ack`,
/// acknowledging each response (as every real client does; its node only
/// in the first request, as gRPC's). Without, it measures the server's
/// push alone.
async fn ads_client(xds: String, i: usize, ack: bool, seen: mpsc::UnboundedSender<Seen>) {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let ask = |version: String, nonce: String| DiscoveryRequest {
        node: if nonce.is_empty() {
            node(&format!("bench-{i}"))
        } else {
            None
        },
        type_url: EDS.to_string(),
        resource_names: vec!["bench".into()],
        version_info: version,
        response_nonce: nonce,
        ..Default::default()
    };
    tx.send(ask(String::new(), String::new())).await.unwrap();
    let mut stream = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    while let Ok(Some(resp)) = stream.message().await {
        let at = Instant::now();
        for r in &resp.resources {
            for (_, port) in endpoints(&r.value) {
                let _ = seen.send((i, port, at));
            }
        }
        if ack && tx.send(ask(resp.version_info, resp.nonce)).await.is_err() {
            return;
        }
    }
}

/// The baseline: one `WatchEndpoints` stream (its index `i`), reporting
/// the port of each added or updated `bench` endpoint.
async fn watcher(url: String, i: usize, seen: mpsc::UnboundedSender<Seen>) {
    let mut grpc = Grpc::connect(url).await.unwrap();
    let mut stream = grpc
        .watch_endpoints(WatchEndpointsRequest {
            cluster_name: "bench".into(),
            node_name: format!("watcher-{i}"),
            last_version: String::new(),
            held: None,
            held_total: None,
        })
        .await
        .unwrap()
        .into_inner();
    while let Ok(Some(ev)) = stream.message().await {
        let at = Instant::now();
        let eps = ev.endpoint.into_iter().chain(ev.snapshot_endpoints);
        for e in eps.filter(|e| e.service_name == "bench") {
            let _ = seen.send((i, e.port, at));
        }
    }
}

/// Serve `server` over `MemoryRegistry` on loopback gRPC and health ports;
/// the gRPC URL and a client that has registered the measured endpoint at
/// [`BASE_PORT`].
async fn serve(server: Opening) -> (String, Grpc<tonic::transport::Channel>) {
    let grpc_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc_l.local_addr().unwrap());
    tokio::spawn(server.serve(
        || async { Ok(Arc::new(Liveness::new(MemoryRegistry::new())) as Arc<dyn Backend>) },
        grpc_l,
        health,
        futures::future::pending(),
    ));
    let mut writer = loop {
        match Grpc::connect(url.clone()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    writer.register_endpoint(register(BASE_PORT)).await.unwrap();
    (url, writer)
}

/// The measured endpoint moved to `port`.
fn register(port: u32) -> RegisterEndpointRequest {
    RegisterEndpointRequest {
        endpoint: Some(endpoint_to_proto(&waypost::Endpoint::new(
            "bench",
            "e1",
            "10.9.0.1",
            u16::try_from(port).unwrap(),
        ))),
        ..Default::default()
    }
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// One registrar and its [`CLIENTS`] streams, each reporting what it saw.
struct Fleet {
    writer: Grpc<tonic::transport::Channel>,
    seen: mpsc::UnboundedReceiver<Seen>,
    /// Per stream, from the registration to the stream's decode.
    one: Histogram<u64>,
    /// From the registration to the last stream's decode.
    all: Histogram<u64>,
}

impl Fleet {
    /// Wait until every stream holds `port`.
    async fn holds(&mut self, port: u32) {
        let mut ready = std::collections::BTreeSet::new();
        while ready.len() < CLIENTS {
            let (who, p, _) = tokio::time::timeout(BUDGET, self.seen.recv())
                .await
                .unwrap()
                .unwrap();
            if p == port {
                ready.insert(who);
            }
        }
    }

    /// Move the endpoint to `port` and record when each stream saw it.
    async fn change(&mut self, port: u32) {
        let t0 = Instant::now();
        self.writer.register_endpoint(register(port)).await.unwrap();
        let mut got = std::collections::BTreeSet::new();
        let mut last = t0;
        while got.len() < CLIENTS {
            let Ok(Some((who, p, at))) = tokio::time::timeout(BUDGET, self.seen.recv()).await
            else {
                panic!("port {port}: {} of {CLIENTS} saw it", got.len());
            };
            if p != port || !got.insert(who) {
                continue;
            }
            let us = u64::try_from(at.duration_since(t0).as_micros()).unwrap_or(u64::MAX);
            self.one.record(us.max(1)).unwrap();
            last = last.max(at);
        }
        let us = u64::try_from(last.duration_since(t0).as_micros()).unwrap_or(u64::MAX);
        self.all.record(us.max(1)).unwrap();
    }
}

async fn measure_eds_push_latency_to_100_clients() {
    let started = Instant::now();
    // The baseline: a registrar and 100 `WatchEndpoints` streams.
    let (url, writer) = serve(Opening::new(RegistrarConfig::new("bench"))).await;
    let (seen_tx, seen) = mpsc::unbounded_channel::<Seen>();
    for i in 0..CLIENTS {
        tokio::spawn(watcher(url.clone(), i, seen_tx.clone()));
    }
    let hist = || Histogram::<u64>::new(3).unwrap();
    let mut watch = Fleet {
        writer,
        seen,
        one: hist(),
        all: hist(),
    };
    // Two more registrars, each with 100 ADS clients: acknowledging
    // every response, and not.
    let ads_fleet = |ack: bool| async move {
        let xds_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let xds = xds_l.local_addr().unwrap().to_string();
        let mut server = Opening::new(RegistrarConfig::new("bench"));
        server.protocols.xds = Some(xds_l);
        let (_, writer) = serve(server).await;
        let (seen_tx, seen) = mpsc::unbounded_channel::<Seen>();
        for i in 0..CLIENTS {
            tokio::spawn(ads_client(xds.clone(), i, ack, seen_tx.clone()));
        }
        let mut fleet = Fleet {
            writer,
            seen,
            one: hist(),
            all: hist(),
        };
        fleet.holds(BASE_PORT).await;
        fleet
    };
    watch.holds(BASE_PORT).await;
    let mut ads = ads_fleet(true).await;
    let mut push = ads_fleet(false).await;

    let mut done = 0;
    for i in 1..=CHANGES {
        if started.elapsed() > BUDGET {
            break;
        }
        // Rotate which goes first, so none always follows another.
        let mut fleets = [&mut watch, &mut ads, &mut push];
        fleets.rotate_left(i as usize % 3);
        for fleet in fleets {
            fleet.change(BASE_PORT + i).await;
        }
        done = i;
    }
    println!(
        "{done} changes to each of three registrars in one process, {CLIENTS} streams each: \
         WatchEndpoints; ADS (SotW, EDS) acknowledging each response; ADS not \
         acknowledging; in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let row = |what: &str, h: &Histogram<u64>, base: &Histogram<u64>| {
        let (p50, p99) = (ms(h, 0.5), ms(h, 0.99));
        println!(
            "{what:<44} p50 {p50:.2} ms, p99 {p99:.2} ms ({:.2}x / {:.2}x)",
            p50 / ms(base, 0.5),
            p99 / ms(base, 0.99)
        );
    };
    row(
        "gRPC WatchEndpoints (baseline), each stream:",
        &watch.one,
        &watch.one,
    );
    row(
        "xDS EDS push, each client (acknowledging):",
        &ads.one,
        &watch.one,
    );
    row(
        "xDS EDS push, each client (no ACKs):",
        &push.one,
        &watch.one,
    );
    row("gRPC WatchEndpoints, all streams:", &watch.all, &watch.all);
    row(
        "xDS EDS push, all clients (acknowledging):",
        &ads.all,
        &watch.all,
    );
    row(
        "xDS EDS push, all clients (no ACKs):",
        &push.all,
        &watch.all,
    );
    assert!(done > 0, "no change measured within {BUDGET:?}");
}

/// Which protocol saw a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Proto {
    Watch,
    Xds,
    Http,
    Dns,
}

/// The HTTP API's blocking query, over and over: each answer's ports, and
/// the next question asks for anything after the answer's index.
async fn http_poller(addr: String, seen: mpsc::UnboundedSender<(Proto, u32, Instant)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut index = 0u64;
    loop {
        let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await else {
            return;
        };
        let req = format!(
            "GET /v1/health/service/bench?index={index}&wait=30s HTTP/1.1\r\nHost: {addr}\r\n\
             Connection: close\r\n\r\n"
        );
        if s.write_all(req.as_bytes()).await.is_err() {
            return;
        }
        let mut buf = String::new();
        if s.read_to_string(&mut buf).await.is_err() {
            return;
        }
        let at = Instant::now();
        let Some((head, body)) = buf.split_once("\r\n\r\n") else {
            return;
        };
        index = head
            .lines()
            .find_map(|l| {
                l.strip_prefix("X-Consul-Index: ")
                    .or(l.strip_prefix("x-consul-index: "))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(index);
        let entries: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        for e in entries.as_array().into_iter().flatten() {
            if let Some(port) = e["Service"]["Port"].as_u64() {
                let _ = seen.send((Proto::Http, u32::try_from(port).unwrap_or(0), at));
            }
        }
    }
}

/// DNS has no push: SRV questions over UDP, one after the other, each
/// answer's ports reported.
async fn dns_poller(
    addr: std::net::SocketAddr,
    seen: mpsc::UnboundedSender<(Proto, u32, Instant)>,
) {
    use hickory_resolver::proto::op::{Message, Query};
    use hickory_resolver::proto::rr::{Name, RData, RecordType};
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let name = Name::from_ascii("bench.service.registry.").unwrap();
    let mut buf = vec![0u8; 4096];
    loop {
        let mut q = Message::query();
        q.add_query(Query::query(name.clone(), RecordType::SRV));
        if sock.send_to(&q.to_vec().unwrap(), addr).await.is_err() {
            return;
        }
        let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_secs(1), sock.recv_from(&mut buf)).await
        else {
            continue;
        };
        let at = Instant::now();
        let Ok(resp) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        for r in &resp.answers {
            if let RData::SRV(s) = &r.data {
                if seen.send((Proto::Dns, u32::from(s.port), at)).is_err() {
                    return;
                }
            }
        }
    }
}

const ALL: [Proto; 4] = [Proto::Watch, Proto::Xds, Proto::Http, Proto::Dns];

/// Wait until every protocol has shown `port`: the microseconds from `t0`
/// to each first sight.
async fn wait_all(
    seen: &mut mpsc::UnboundedReceiver<(Proto, u32, Instant)>,
    port: u32,
    t0: Instant,
) -> Vec<(Proto, u64)> {
    let mut hist = Vec::new();
    let mut got = std::collections::BTreeSet::new();
    while got.len() < ALL.len() {
        let Ok(Some((proto, p, at))) = tokio::time::timeout(BUDGET, seen.recv()).await else {
            panic!("port {port}: only {got:?} saw it");
        };
        if p == port && got.insert(proto) {
            let us = at.saturating_duration_since(t0).as_micros();
            hist.push((proto, u64::try_from(us).unwrap_or(u64::MAX)));
        }
    }
    hist
}

async fn measure_change_visibility_per_protocol() {
    let started = Instant::now();
    let xds_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dns_l = waypost_registrar_server::DnsListeners::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let xds = xds_l.local_addr().unwrap().to_string();
    let http = http_l.local_addr().unwrap().to_string();
    let dns = dns_l.local_addr().unwrap();
    let mut server = Opening::new(RegistrarConfig::new("bench"));
    server.protocols.xds = Some(xds_l);
    server.protocols.http_api = Some(http_l);
    let dns_cfg = waypost_registrar_server::DnsConfig::new("registry.", Duration::ZERO).unwrap();
    server.protocols.dns = Some((dns_l, dns_cfg));
    let (url, mut writer) = serve(server).await;

    let (seen_tx, mut seen) = mpsc::unbounded_channel::<(Proto, u32, Instant)>();
    // The xDS client and the watch report through channels of their own.
    for proto in [Proto::Xds, Proto::Watch] {
        let (inner_tx, mut inner) = mpsc::unbounded_channel::<Seen>();
        match proto {
            Proto::Xds => tokio::spawn(ads_client(xds.clone(), 0, true, inner_tx)),
            _ => tokio::spawn(watcher(url.clone(), 0, inner_tx)),
        };
        let seen_tx = seen_tx.clone();
        tokio::spawn(async move {
            while let Some((_, port, at)) = inner.recv().await {
                if seen_tx.send((proto, port, at)).is_err() {
                    return;
                }
            }
        });
    }
    tokio::spawn(http_poller(http, seen_tx.clone()));
    tokio::spawn(dns_poller(dns, seen_tx));
    wait_all(&mut seen, BASE_PORT, Instant::now()).await;

    let mut hists: std::collections::BTreeMap<Proto, Histogram<u64>> = ALL
        .iter()
        .map(|p| (*p, Histogram::<u64>::new(3).unwrap()))
        .collect();
    let mut done = 0;
    for i in 1..=CHANGES {
        if started.elapsed() > BUDGET {
            break;
        }
        let port = BASE_PORT + i;
        let t0 = Instant::now();
        writer.register_endpoint(register(port)).await.unwrap();
        for (proto, us) in wait_all(&mut seen, port, t0).await {
            hists.get_mut(&proto).unwrap().record(us.max(1)).unwrap();
        }
        done = i;
    }
    println!(
        "{done} changes, one observer per protocol, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let base = ms(&hists[&Proto::Watch], 0.5);
    let base99 = ms(&hists[&Proto::Watch], 0.99);
    for (proto, h) in &hists {
        println!(
            "{proto:?}: p50 {:.2} ms, p99 {:.2} ms ({:.2}x / {:.2}x the gRPC watch)",
            ms(h, 0.5),
            ms(h, 0.99),
            ms(h, 0.5) / base,
            ms(h, 0.99) / base99
        );
    }
    assert!(done > 0, "no change measured within {BUDGET:?}");
}

/// Whether to run the measurement `name`: every one without a filter on
/// the command line (`cargo bench … -- <filter>`), else those it names.
fn wanted(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if wanted("measure_eds_push_latency_to_100_clients") {
        measure_eds_push_latency_to_100_clients().await;
    }
    if wanted("measure_change_visibility_per_protocol") {
        measure_change_visibility_per_protocol().await;
    }
}
