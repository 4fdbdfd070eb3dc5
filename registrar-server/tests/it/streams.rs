//! What an agent stream costs the registrar: a stream that stops
//! reading holds a bounded part of its first snapshot, whatever the size of
//! the registry, while healthy streams get every change in order; the
//! snapshot's messages on the wire are unchanged; a connection whose peer
//! stopped answering HTTP/2 PINGs is dropped with its stream. Messages
//! encoded once for every stream and read from the registrar's one feed
//! decode, in a client generated from the proto, exactly as the
//! ones each stream encodes itself; a stream resuming from the current
//! version reads the feed without a snapshot.

use crate::common;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::{start, Server, TestRegistrar};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;
use waypost::testing::{ep, eventually};
use waypost::{memory::MemoryRegistry, Batch, EndpointKey, Op};
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
use waypost_registrar_client::proto::registrar::v1::{
    EndpointEvent, RegisterEndpointRequest, UnregisterEndpointRequest, WatchEndpointsRequest,
};
use waypost_registrar_client::{endpoint_to_proto, Token};
use waypost_registrar_server::{Backend, Registrar, RegistrarConfig, ServeOptions, StreamEncoding};

/// Endpoints in the registry, and per `FULL_SNAPSHOT` message.
const ENDPOINTS: usize = 20_000;
const CHUNK: usize = 100;
/// The HTTP/2 flow-control window the stuck clients advertise (the
/// protocol's default), for their stream and their connection.
pub(super) const WINDOW: u32 = 65_535;
/// What tonic gathers before handing bytes to hyper (the yield threshold
/// of `WatchEndpoints`' codec).
const TONIC_BATCH: u64 = 8 * 1024;

pub(super) async fn registry_of(n: usize) -> Arc<dyn Backend> {
    let mem = MemoryRegistry::new();
    let ops: Vec<Op> = (0..n)
        .map(|i| Op::Register(ep(&format!("svc-{:05}", i / 10), &format!("ep-{i}"), 8080)))
        .collect();
    for batch in ops.chunks(1000) {
        mem.apply(batch.to_vec()).await.unwrap();
    }
    Arc::new(mem)
}

pub(super) fn watch_request(node: &str) -> WatchEndpointsRequest {
    WatchEndpointsRequest {
        cluster_name: "test".into(),
        node_name: node.into(),
        last_version: String::new(),
        held: None,
        held_total: None,
    }
}

pub(super) async fn next(stream: &mut Streaming<EndpointEvent>) -> EndpointEvent {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("no message within 30 s")
        .unwrap()
        .expect("the stream ended")
}

/// Read a whole snapshot: its messages, checked against the proto's
/// contract (chunks of `CHUNK` in key order, one version, only the last
/// flagged).
pub(super) async fn read_snapshot(stream: &mut Streaming<EndpointEvent>) -> Vec<EndpointEvent> {
    let mut msgs = Vec::new();
    loop {
        let m = next(stream).await;
        assert_eq!(m.r#type, EventType::FullSnapshot as i32);
        let last = m.snapshot_last;
        msgs.push(m);
        if last {
            return msgs;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_messages_on_the_wire_are_chunks_in_key_order() {
    let server = start(
        registry_of(250).await,
        RegistrarConfig::new("test").with_snapshot_chunk(CHUNK),
    )
    .await;
    server.registrar.state().wait_until_ready().await;
    let mut grpc = Grpc::connect(server.url()).await.unwrap();
    let mut stream = grpc
        .watch_endpoints(watch_request("reader"))
        .await
        .unwrap()
        .into_inner();
    let msgs = read_snapshot(&mut stream).await;
    let sizes: Vec<usize> = msgs.iter().map(|m| m.snapshot_endpoints.len()).collect();
    assert_eq!(sizes, [100, 100, 50]);
    let flags: Vec<bool> = msgs.iter().map(|m| m.snapshot_last).collect();
    assert_eq!(flags, [false, false, true]);
    assert!(msgs.iter().all(|m| m.version == msgs[0].version));
    // Exactly the registrar's state, in key order: the messages the
    // registrar sent before snapshots were encoded lazily.
    let snap = server.registrar.state().store().snapshot().unwrap();
    let sent: Vec<_> = msgs
        .into_iter()
        .flat_map(|m| m.snapshot_endpoints)
        .collect();
    let expected: Vec<_> = snap.iter().map(endpoint_to_proto).collect();
    assert_eq!(sent, expected);

    // An empty registry is one message, flagged last.
    let empty = start(registry_of(0).await, RegistrarConfig::new("test")).await;
    empty.registrar.state().wait_until_ready().await;
    let mut grpc = Grpc::connect(empty.url()).await.unwrap();
    let mut stream = grpc
        .watch_endpoints(watch_request("reader"))
        .await
        .unwrap()
        .into_inner();
    let msgs = read_snapshot(&mut stream).await;
    assert_eq!(msgs.len(), 1);
    assert!(msgs[0].snapshot_endpoints.is_empty());
}

/// A client that reads one message, then nothing: its HTTP/2 window
/// (`WINDOW`) fills and stays full.
pub(super) async fn stuck_stream(url: &str, node: &str) -> (Channel, Streaming<EndpointEvent>) {
    let channel = Endpoint::from_shared(url.to_string())
        .unwrap()
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .connect()
        .await
        .unwrap();
    let mut stream = Grpc::new(channel.clone())
        .watch_endpoints(watch_request(node))
        .await
        .unwrap()
        .into_inner();
    // The registrar has started encoding this stream's snapshot.
    let first = next(&mut stream).await;
    assert_eq!(first.r#type, EventType::FullSnapshot as i32);
    (channel, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_stop_reading_hold_a_bounded_part_of_the_snapshot() {
    let server = start(
        registry_of(ENDPOINTS).await,
        RegistrarConfig::new("test").with_snapshot_chunk(CHUNK),
    )
    .await;
    server.registrar.state().wait_until_ready().await;

    // A healthy watcher first: its snapshot is the baseline of what a
    // whole snapshot costs to encode.
    let mut grpc = Grpc::connect(server.url()).await.unwrap();
    let mut healthy = grpc
        .watch_endpoints(watch_request("healthy"))
        .await
        .unwrap()
        .into_inner();
    let snapshot = read_snapshot(&mut healthy).await;
    assert_eq!(snapshot.len(), ENDPOINTS / CHUNK);
    let whole: u64 = snapshot.iter().map(|m| m.encoded_len() as u64).sum();
    let largest = snapshot
        .iter()
        .map(|m| m.encoded_len() as u64)
        .max()
        .unwrap();
    let before = server.registrar.watch_stats();
    assert_eq!(before.snapshot_bytes, whole);

    const STUCK: usize = 8;
    let mut stuck = Vec::new();
    for i in 0..STUCK {
        stuck.push(stuck_stream(&server.url(), &format!("stuck-{i}")).await);
    }

    // Changes while they are stuck: the healthy watcher gets each, in
    // order.
    let version = snapshot[0].version.parse::<Token>().unwrap();
    let mut last = version.version;
    const CHANGES: usize = 300;
    for i in 0..CHANGES {
        let e = ep("churn", &format!("c-{i:04}"), 9000);
        grpc.register_endpoint(RegisterEndpointRequest {
            endpoint: Some(endpoint_to_proto(&e)),
            ack: 0,
        })
        .await
        .unwrap();
    }
    for i in 0..CHANGES {
        let m = next(&mut healthy).await;
        assert_eq!(m.r#type, EventType::EndpointAdded as i32, "change {i}");
        let ep = m.endpoint.unwrap();
        assert_eq!(
            EndpointKey::new(ep.service_name, ep.id),
            EndpointKey::new("churn", format!("c-{i:04}")),
            "change {i} out of order"
        );
        let v = m.version.parse::<Token>().unwrap();
        assert_eq!(v.epoch, version.epoch);
        assert!(v.version > last, "change {i}: version went back");
        last = v.version;
    }

    // Per stuck stream, what the registrar encoded of its snapshot: what
    // the client's window took, plus what HTTP/2 queued beyond it and
    // hyper holds (a batch each, every batch at most tonic's 8 KiB plus
    // one chunk), plus the chunk
    // being encoded. Eagerly encoded, it would be the whole snapshot.
    let bound = u64::from(WINDOW) + 2 * (TONIC_BATCH + largest) + largest;
    assert!(bound * 4 < whole, "the registry is too small to tell");
    let stats = server.registrar.watch_stats();
    assert_eq!(stats.streams, STUCK + 1);
    let stuck_bytes = stats.snapshot_bytes - before.snapshot_bytes;
    assert!(
        stuck_bytes <= STUCK as u64 * bound,
        "{STUCK} stuck streams encoded {stuck_bytes} bytes of their snapshots: more than \
         {bound} each (a whole snapshot is {whole})"
    );
    // And the rest waits, unencoded, in the shared snapshot.
    let encoded_endpoints = bound / (whole / ENDPOINTS as u64) + CHUNK as u64;
    assert!(
        stats.pending_endpoints >= STUCK as u64 * (ENDPOINTS as u64 - encoded_endpoints),
        "{stats:?}"
    );
    drop(stuck);
    eventually("the stuck streams to close", || async {
        let s = server.registrar.watch_stats();
        (s.streams == 1 && s.pending_endpoints == 0).then_some(())
    })
    .await;
}

/// A TCP stream that can be frozen: once frozen it neither reads nor
/// writes, like a process that stopped (its kernel still ACKs).
struct Freezable {
    inner: tokio::net::TcpStream,
    frozen: Arc<AtomicBool>,
}

impl AsyncRead for Freezable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Freezable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.frozen.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn start_serving(options: ServeOptions) -> (Arc<Registrar>, String, Server) {
    let server = TestRegistrar::new(registry_of(10).await, RegistrarConfig::new("test"))
        .options(options)
        .start()
        .await
        .unwrap();
    server.registrar.state().wait_until_ready().await;
    (Arc::clone(&server.registrar), server.url(), server)
}

/// A watch over a connection that can be frozen.
async fn freezable_watch(url: &str) -> (Arc<AtomicBool>, Streaming<EndpointEvent>) {
    let frozen = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&frozen);
    let connector = tower::service_fn(move |uri: tonic::transport::Uri| {
        let flag = Arc::clone(&flag);
        async move {
            let addr = format!(
                "{}:{}",
                uri.host().unwrap_or("127.0.0.1"),
                uri.port_u16().unwrap_or(80)
            );
            let inner = tokio::net::TcpStream::connect(addr).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Freezable {
                inner,
                frozen: flag,
            }))
        }
    });
    let channel = Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap();
    let mut stream = Grpc::new(channel)
        .watch_endpoints(watch_request("frozen"))
        .await
        .unwrap()
        .into_inner();
    let snap = read_snapshot(&mut stream).await;
    assert_eq!(snap.len(), 1);
    (frozen, stream)
}

/// With the HTTP/2 keepalive, a connection whose peer stops answering
/// PINGs is closed and its stream freed, within about interval + timeout
/// (checked here with a bounded wait, not a timing threshold). This proves
/// the PING deadline is wired; a peer whose kernel also stopped answering
/// is dropped by the same deadline, since it needs no TCP error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_pings_is_dropped_with_its_stream() {
    let ms = Duration::from_millis;
    let options = ServeOptions::default().with_http2_keepalive(Some(ms(200)), ms(200));
    let (registrar, url, _server) = start_serving(options).await;
    let (frozen, _stream) = freezable_watch(&url).await;
    assert_eq!(registrar.watch_stats().streams, 1);
    frozen.store(true, Ordering::SeqCst);
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        while registrar.watch_stats().streams != 0 {
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the frozen peer's stream is still open after 30 s with a 200 ms keepalive"
    );
}

/// Changes of the encoding tests: 20 adds, 20 updates of them, 20 removes.
const CHANGES: u16 = 20;

/// What three watchers (clients generated from the proto) of a registrar
/// encoding as `encoding` receive: their snapshot, then the changes, with
/// each version made relative to the snapshot's (epochs differ between
/// registrars); and how many messages the registrar encoded for the
/// changes.
async fn three_watchers(encoding: StreamEncoding) -> (Vec<Vec<EndpointEvent>>, u64) {
    let server = start(
        registry_of(250).await,
        RegistrarConfig::new("test")
            .with_snapshot_chunk(CHUNK)
            .with_stream_encoding(encoding),
    )
    .await;
    server.registrar.state().wait_until_ready().await;
    let mut grpc = Grpc::connect(server.url()).await.unwrap();
    let mut streams = Vec::new();
    for i in 0..3 {
        let s = grpc
            .watch_endpoints(watch_request(&format!("watcher-{i}")))
            .await
            .unwrap()
            .into_inner();
        streams.push(s);
    }
    let mut got = Vec::new();
    for s in &mut streams {
        got.push(read_snapshot(s).await);
    }
    let before = server.registrar.watch_stats().messages_encoded;
    for round in 0..2u16 {
        for i in 0..CHANGES {
            let e = ep("fan", &format!("f-{i:02}"), 7000 + round * 100 + i)
                .with_label("round", round.to_string());
            grpc.register_endpoint(RegisterEndpointRequest {
                endpoint: Some(endpoint_to_proto(&e)),
                ack: 0,
            })
            .await
            .unwrap();
        }
    }
    for i in 0..CHANGES {
        grpc.unregister_endpoint(UnregisterEndpointRequest {
            service_name: "fan".into(),
            id: format!("f-{i:02}"),
            ack: 0,
        })
        .await
        .unwrap();
    }
    for (s, msgs) in streams.iter_mut().zip(&mut got) {
        for _ in 0..3 * CHANGES {
            msgs.push(next(s).await);
        }
    }
    let encoded = server.registrar.watch_stats().messages_encoded - before;
    for msgs in &mut got {
        let base = msgs[0].version.parse::<Token>().unwrap().version.0;
        for m in msgs.iter_mut() {
            let v = m.version.parse::<Token>().unwrap().version.0;
            m.version = (v - base).to_string();
        }
    }
    (got, encoded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_decodes_shared_messages_as_the_ones_it_would_encode() {
    let (shared, shared_encoded) = three_watchers(StreamEncoding::Shared).await;
    let (sub, sub_encoded) = three_watchers(StreamEncoding::SharedPerSubscriber).await;
    let (own, own_encoded) = three_watchers(StreamEncoding::PerStream).await;
    // Each change encoded once for the three streams, against once each.
    assert_eq!(shared_encoded, 3 * u64::from(CHANGES));
    assert_eq!(sub_encoded, 3 * u64::from(CHANGES));
    assert_eq!(own_encoded, 3 * 3 * u64::from(CHANGES));
    // The same messages on every stream, from the one feed, from a
    // subscription each, and as the per-stream encoding.
    assert_eq!(shared[0], shared[1]);
    assert_eq!(shared[0], shared[2]);
    assert_eq!(shared, sub);
    assert_eq!(shared, own);
    // And they are the proto's: the snapshot's chunks, then each change
    // in order with its endpoint (a removal carries the one it removed).
    let msgs = &shared[0];
    let sizes: Vec<usize> = msgs[..3]
        .iter()
        .map(|m| m.snapshot_endpoints.len())
        .collect();
    assert_eq!(sizes, [100, 100, 50]);
    let deltas = &msgs[3..];
    assert_eq!(deltas.len(), 3 * usize::from(CHANGES));
    for (n, m) in deltas.iter().enumerate() {
        let (round, i) = (n / usize::from(CHANGES), (n % usize::from(CHANGES)) as u16);
        let ty = [
            EventType::EndpointAdded,
            EventType::EndpointUpdated,
            EventType::EndpointRemoved,
        ][round];
        assert_eq!(m.r#type, ty as i32, "change {n}");
        let port_round = round.min(1) as u16;
        let e = ep("fan", &format!("f-{i:02}"), 7000 + port_round * 100 + i)
            .with_label("round", port_round.to_string());
        assert_eq!(m.endpoint, Some(endpoint_to_proto(&e)), "change {n}");
        assert_eq!(m.service_name, "fan");
        assert!(m.snapshot_endpoints.is_empty() && !m.snapshot_last && m.refusal.is_none());
    }
    let versions: Vec<u64> = msgs.iter().map(|m| m.version.parse().unwrap()).collect();
    assert!(
        versions[3..].windows(2).all(|w| w[0] < w[1]),
        "{versions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_chunk_is_encoded_once_for_the_streams_sending_it() {
    let server = start(
        registry_of(ENDPOINTS).await,
        RegistrarConfig::new("test").with_snapshot_chunk(CHUNK),
    )
    .await;
    server.registrar.state().wait_until_ready().await;
    let chunks = (ENDPOINTS / CHUNK) as u64;
    // A stream that stops reading keeps the snapshot's chunks shared.
    let stuck = stuck_stream(&server.url(), "stuck").await;
    let mut grpc = Grpc::connect(server.url()).await.unwrap();
    let mut first = grpc
        .watch_endpoints(watch_request("first"))
        .await
        .unwrap()
        .into_inner();
    let first_snapshot = read_snapshot(&mut first).await;
    assert_eq!(first_snapshot.len() as u64, chunks);
    assert_eq!(server.registrar.watch_stats().messages_encoded, chunks);
    let mut second = grpc
        .watch_endpoints(watch_request("second"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read_snapshot(&mut second).await, first_snapshot);
    // Every chunk came from the memo.
    assert_eq!(server.registrar.watch_stats().messages_encoded, chunks);

    // Once no stream sends that snapshot, the memo is gone: a new stream
    // encodes its chunks again.
    drop((stuck, first, second));
    eventually("the streams to close", || async {
        (server.registrar.watch_stats().streams == 0).then_some(())
    })
    .await;
    let mut third = grpc
        .watch_endpoints(watch_request("third"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read_snapshot(&mut third).await, first_snapshot);
    assert_eq!(server.registrar.watch_stats().messages_encoded, 2 * chunks);
}

/// A stream resuming from the current version reads the registrar's feed
/// (no snapshot, then every change, encoded once with the other streams);
/// one resuming from an older version still gets exactly what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resuming_from_the_current_version_reads_the_feed() {
    let server = start(registry_of(10).await, RegistrarConfig::new("test")).await;
    server.registrar.state().wait_until_ready().await;
    let mut grpc = Grpc::connect(server.url()).await.unwrap();
    let register = |port: u16| RegisterEndpointRequest {
        endpoint: Some(endpoint_to_proto(&ep("feed", "f", port))),
        ack: 0,
    };
    let mut first = grpc
        .watch_endpoints(watch_request("first"))
        .await
        .unwrap()
        .into_inner();
    let current = read_snapshot(&mut first).await.pop().unwrap().version;
    grpc.register_endpoint(register(1)).await.unwrap();
    let older = next(&mut first).await.version;
    grpc.register_endpoint(register(2)).await.unwrap();
    let now = next(&mut first).await.version;

    let resume = |node: &str, last: &str| WatchEndpointsRequest {
        last_version: last.to_string(),
        ..watch_request(node)
    };
    let mut up_to_date = grpc
        .watch_endpoints(resume("up-to-date", &now))
        .await
        .unwrap()
        .into_inner();
    let mut behind = grpc
        .watch_endpoints(resume("behind", &older))
        .await
        .unwrap()
        .into_inner();
    // The one behind gets what it missed, the change to port 2.
    let missed = next(&mut behind).await;
    assert_eq!(missed.version, now);
    assert_eq!(missed.endpoint.unwrap().port, 2);
    assert_ne!(current, now);

    let before = server.registrar.watch_stats().messages_encoded;
    grpc.register_endpoint(register(3)).await.unwrap();
    for s in [&mut first, &mut up_to_date, &mut behind] {
        let m = next(s).await;
        assert_eq!(m.r#type, EventType::EndpointUpdated as i32);
        assert_eq!(m.endpoint.unwrap().port, 3);
    }
    // Encoded once for the first stream and the resumed one (both on the
    // feed), once more for the stream that replayed the history.
    assert_eq!(server.registrar.watch_stats().messages_encoded - before, 2);
}
