//! A measurement, not a check (run with `--ignored --nocapture`, in
//! release): the time from a registration to its push reaching 100
//! state-of-the-world ADS clients subscribed to the service's load
//! assignment, against a `WatchEndpoints` stream's delivery of the same
//! change in the same run. BENCHMARKS.md quotes it.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::xds::{endpoints, node, EDS};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use hdrhistogram::Histogram;
use registrar_server::{Backend, Opening, RegistrarConfig};
use registry_api::{liveness::Liveness, memory::MemoryRegistry};
use registry_registrar::endpoint_to_proto;
use registry_registrar::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use registry_registrar::proto::registrar::v1::{RegisterEndpointRequest, WatchEndpointsRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const CLIENTS: usize = 100;
const CHANGES: u32 = 1_000;
/// The whole run stops after this long, whatever it measured.
const BUDGET: Duration = Duration::from_secs(240);
/// The first port of the measured endpoint; change `i` moves it to
/// `BASE_PORT + i`.
const BASE_PORT: u32 = 20_000;

/// Who saw the port: an xDS client (its index) or the watch (`None`).
type Seen = (Option<usize>, u32, Instant);

/// One ADS client on its own connection, subscribed to the load
/// assignment of `bench`, reporting each port it sees and acknowledging
/// each response.
async fn ads_client(xds: String, i: usize, seen: mpsc::UnboundedSender<Seen>) {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let ask = |version: String, nonce: String| DiscoveryRequest {
        node: node(&format!("bench-{i}")),
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
                let _ = seen.send((Some(i), port, at));
            }
        }
        if tx.send(ask(resp.version_info, resp.nonce)).await.is_err() {
            return;
        }
    }
}

/// The baseline: one `WatchEndpoints` stream, reporting the port of each
/// added or updated `bench` endpoint.
async fn watcher(url: String, seen: mpsc::UnboundedSender<Seen>) {
    let mut grpc = Grpc::connect(url).await.unwrap();
    let mut stream = grpc
        .watch_endpoints(WatchEndpointsRequest {
            cluster_name: "bench".into(),
            node_name: "watcher".into(),
            last_version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    while let Ok(Some(ev)) = stream.message().await {
        let at = Instant::now();
        let eps = ev.endpoint.into_iter().chain(ev.snapshot_endpoints);
        for e in eps.filter(|e| e.service_name == "bench") {
            let _ = seen.send((None, e.port, at));
        }
    }
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn measure_eds_push_latency_to_100_clients() {
    let started = Instant::now();
    let grpc_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let xds_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc_l.local_addr().unwrap());
    let xds = xds_l.local_addr().unwrap().to_string();
    let mut server = Opening::new(RegistrarConfig::new("bench"));
    server.protocols.xds = Some(xds_l);
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
    let register = |port: u32| RegisterEndpointRequest {
        endpoint: Some(endpoint_to_proto(&registry_api::Endpoint::new(
            "bench",
            "e1",
            "10.9.0.1",
            u16::try_from(port).unwrap(),
        ))),
        ..Default::default()
    };
    writer.register_endpoint(register(BASE_PORT)).await.unwrap();

    let (seen_tx, mut seen) = mpsc::unbounded_channel::<Seen>();
    for i in 0..CLIENTS {
        tokio::spawn(ads_client(xds.clone(), i, seen_tx.clone()));
    }
    tokio::spawn(watcher(url.clone(), seen_tx.clone()));
    // Every client and the watcher hold the first port.
    let mut ready = std::collections::BTreeSet::new();
    while ready.len() < CLIENTS + 1 {
        let (who, port, _) = tokio::time::timeout(BUDGET, seen.recv())
            .await
            .unwrap()
            .unwrap();
        if port == BASE_PORT {
            ready.insert(who);
        }
    }

    let mut one = Histogram::<u64>::new(3).unwrap();
    let mut all = Histogram::<u64>::new(3).unwrap();
    let mut watch = Histogram::<u64>::new(3).unwrap();
    let mut done = 0;
    for i in 1..=CHANGES {
        if started.elapsed() > BUDGET {
            break;
        }
        let port = BASE_PORT + i;
        let t0 = Instant::now();
        writer.register_endpoint(register(port)).await.unwrap();
        let mut got = std::collections::BTreeSet::new();
        let mut last = t0;
        while got.len() < CLIENTS + 1 {
            let Ok(Some((who, p, at))) = tokio::time::timeout(BUDGET, seen.recv()).await else {
                panic!("change {i}: {} of {} saw it", got.len(), CLIENTS + 1);
            };
            if p != port || !got.insert(who) {
                continue;
            }
            let us = u64::try_from(at.duration_since(t0).as_micros()).unwrap_or(u64::MAX);
            match who {
                None => watch.record(us).unwrap(),
                Some(_) => {
                    one.record(us).unwrap();
                    last = last.max(at);
                }
            }
        }
        all.record(u64::try_from(last.duration_since(t0).as_micros()).unwrap())
            .unwrap();
        done = i;
    }
    println!(
        "{done} changes, {CLIENTS} ADS clients (SotW, EDS) and 1 WatchEndpoints stream, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "gRPC WatchEndpoints (baseline): p50 {:.2} ms, p99 {:.2} ms",
        ms(&watch, 0.5),
        ms(&watch, 0.99)
    );
    println!(
        "xDS EDS push, each client:      p50 {:.2} ms, p99 {:.2} ms ({:.2}x / {:.2}x the baseline)",
        ms(&one, 0.5),
        ms(&one, 0.99),
        ms(&one, 0.5) / ms(&watch, 0.5),
        ms(&one, 0.99) / ms(&watch, 0.99)
    );
    println!(
        "xDS EDS push, all {CLIENTS} clients: p50 {:.2} ms, p99 {:.2} ms",
        ms(&all, 0.5),
        ms(&all, 0.99)
    );
    assert!(done > 0, "no change measured within {BUDGET:?}");
}
