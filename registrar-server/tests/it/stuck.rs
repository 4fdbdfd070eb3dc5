//! A stream that stops reading holds at most about one HTTP/2 window of
//! its snapshot beyond the window its client took, whatever the size of
//! the registry: with the default settings a `FULL_SNAPSHOT` message is at
//! most `DEFAULT_SNAPSHOT_CHUNK_BYTES`, and the registrar's counters of
//! what it handed to the stuck streams stay under the bound at 10,000 and
//! at 40,000 endpoints (with messages of 1,000 endpoints, about 48 KiB
//! each here, a stuck stream was handed some 126 KiB beyond its window).

use prost::Message;
use waypost::testing::{ep, eventually};
use waypost_registrar_client::endpoint_to_proto;
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use waypost_registrar_client::proto::registrar::v1::RegisterEndpointRequest;
use waypost_registrar_server::{RegistrarConfig, WatchStats, DEFAULT_SNAPSHOT_CHUNK_BYTES};

use crate::common::start;
use crate::streams::{next, read_snapshot, registry_of, stuck_stream, watch_request, WINDOW};

/// The most a stuck stream may have been handed beyond its client's
/// window: one more window (64 KiB).
const BEYOND_WINDOW: u64 = 64 * 1024;

/// Stuck streams opened per registry.
const STUCK: u64 = 4;

/// Bytes of `FULL_SNAPSHOT` messages handed to streams as they go on the
/// wire (each message with gRPC's 5-byte prefix).
fn wire_bytes(stats: WatchStats) -> u64 {
    stats.snapshot_bytes + 5 * stats.snapshot_chunks
}

/// On a registry of `size` endpoints with the default settings: the
/// largest snapshot message a reader gets, and the snapshot bytes handed
/// to each of `STUCK` streams that read their first message and then
/// nothing.
async fn stuck_streams_on(size: usize) -> (u64, u64) {
    let server = start(registry_of(size).await, RegistrarConfig::new("test")).await;
    server.registrar.state().wait_until_ready().await;
    let stats = || server.registrar.watch_stats();

    // A reader that reads: every message within the byte bound, so more
    // messages than 1,000 endpoints each would make.
    let mut grpc = Grpc::connect(server.url()).await.unwrap();
    let mut healthy = grpc
        .watch_endpoints(watch_request("healthy"))
        .await
        .unwrap()
        .into_inner();
    let snapshot = read_snapshot(&mut healthy).await;
    let endpoints: usize = snapshot.iter().map(|m| m.snapshot_endpoints.len()).sum();
    assert_eq!(endpoints, size);
    let largest = snapshot
        .iter()
        .map(|m| m.encoded_len() as u64)
        .max()
        .unwrap();
    assert!(largest <= DEFAULT_SNAPSHOT_CHUNK_BYTES as u64, "{largest}");
    assert!(snapshot.len() > size / 1000, "{} messages", snapshot.len());
    let whole: u64 = snapshot.iter().map(|m| m.encoded_len() as u64 + 5).sum();
    assert!(
        whole > 2 * (u64::from(WINDOW) + BEYOND_WINDOW),
        "the registry is too small to tell"
    );

    // The stuck streams, one at a time: each is handed at least its
    // window (what HTTP/2 sends before the window is full), and whatever
    // hyper and HTTP/2 take beyond it is taken in the same go.
    let before = wire_bytes(stats());
    let mut stuck = Vec::new();
    for i in 0..STUCK {
        let at = wire_bytes(stats());
        stuck.push(stuck_stream(&server.url(), &format!("stuck-{i}")).await);
        eventually("the stuck stream's window to fill", || async {
            (wire_bytes(stats()) - at >= u64::from(WINDOW)).then_some(())
        })
        .await;
    }
    // The registrar goes on serving the reader meanwhile.
    let e = ep("churn", "c-0", 9000);
    grpc.register_endpoint(RegisterEndpointRequest {
        endpoint: Some(endpoint_to_proto(&e)),
        ack: 0,
    })
    .await
    .unwrap();
    let m = next(&mut healthy).await;
    assert_eq!(m.r#type, EventType::EndpointAdded as i32);
    let s = stats();
    assert_eq!(s.streams as u64, STUCK + 1);
    assert!(s.pending_endpoints > 0, "{s:?}");
    let per_stream = (wire_bytes(s) - before) / STUCK;
    drop(stuck);
    (largest, per_stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_stream_holds_at_most_a_window_beyond_its_window_at_any_registry_size() {
    for size in [10_000, 40_000] {
        let (largest, per_stream) = stuck_streams_on(size).await;
        assert!(per_stream >= u64::from(WINDOW), "{per_stream}");
        let beyond = per_stream - u64::from(WINDOW);
        assert!(
            beyond <= BEYOND_WINDOW,
            "at {size} endpoints a stuck stream was handed {per_stream} bytes of its \
             snapshot, {beyond} beyond its {WINDOW}-byte window (largest message {largest})"
        );
    }
}
