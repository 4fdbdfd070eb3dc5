//! The fan-out phase's floors: what the same fan-out costs a minimal tokio
//! server with no registry. It accepts `--agents` loopback connections and,
//! for each change (`--rate` per second for `--seconds`), wakes one task
//! per connection (as the registrar wakes one stream per agent) that sends
//! the change's message, encoded once for all. The agents (a child
//! process, on CPU 1 with `--pin`) read them. The server's CPU time per
//! delivered message is what the registrar's is compared with.
//!
//! - `--encoding floor` ([`Floor::Tcp`]): no gRPC, no HTTP/2; a 128-byte
//!   message written to the socket. One socket write per delivery, and
//!   the wake-up before it.
//! - `--encoding floor-h2` ([`Floor::Http2`]): the agent's `WatchEndpoints`
//!   call answered with the `h2` crate alone, one task per connection
//!   driving both the connection and its one stream; each change is an
//!   `EndpointEvent` as the registrar sends it, read by light agents
//!   (`light.rs`). What HTTP/2 and gRPC's framing cost without hyper's
//!   task per stream, tonic's encoder or the registrar.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::broadcast;
use tonic::codegen::http;
use waypost_registrar_client::proto::registrar::v1::{endpoint_event::EventType, EndpointEvent};
use waypost_registrar_client::proto::registry::v1::ServiceEndpoint;

use crate::light::{grpc_message, LightAgent};
use crate::procs::{
    cpu_seconds, join_within, spawn_self, CpuMark, Deliveries, Figures, REGISTRAR_CPU,
};
use crate::{now_micros, Args};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The size of one message: about an `EndpointEvent` delta with its gRPC
/// and HTTP/2 framing.
const MESSAGE: usize = 128;

/// Which floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Floor {
    /// Bare TCP: a 128-byte message per change.
    Tcp,
    /// `WatchEndpoints` over the `h2` crate alone.
    Http2,
}

impl Floor {
    /// Change `seq`, written at `sent` (µs since the epoch), as this
    /// floor sends it.
    fn message(self, seq: u64, sent: u64) -> Bytes {
        match self {
            Floor::Tcp => {
                let mut msg = BytesMut::zeroed(MESSAGE);
                msg[..8].copy_from_slice(&seq.to_le_bytes());
                msg[8..16].copy_from_slice(&sent.to_le_bytes());
                msg.freeze()
            }
            Floor::Http2 => grpc_message(&EndpointEvent {
                r#type: EventType::EndpointUpdated as i32,
                service_name: "load".into(),
                endpoint: Some(ServiceEndpoint {
                    service_name: "load".into(),
                    id: format!("ep-{}", seq % 500),
                    address: "127.0.0.1".into(),
                    port: 8080,
                    labels: [("sent", sent), ("seq", seq)]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_string()))
                        .collect(),
                    ..ServiceEndpoint::default()
                }),
                version: format!("1.{seq}"),
                ..EndpointEvent::default()
            }),
        }
    }
}

/// One agent's connection to the bare TCP floor: each message written.
async fn tcp_connection(mut sock: TcpStream, mut rx: broadcast::Receiver<Bytes>) {
    while let Ok(msg) = rx.recv().await {
        if sock.write_all(&msg).await.is_err() {
            return;
        }
    }
}

/// One agent's connection to the HTTP/2 floor: its `WatchEndpoints` call
/// answered with an empty snapshot, then each message as a DATA frame on
/// that stream, by one task that also drives the connection.
async fn h2_connection(sock: TcpStream, mut rx: broadcast::Receiver<Bytes>) -> Res<()> {
    let mut conn = h2::server::handshake(sock).await?;
    let (_request, mut respond) = conn.accept().await.ok_or("the agent sent no request")??;
    let response = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())?;
    let mut stream = respond.send_response(response, false)?;
    stream.send_data(
        grpc_message(&EndpointEvent {
            r#type: EventType::FullSnapshot as i32,
            snapshot_last: true,
            ..EndpointEvent::default()
        }),
        false,
    )?;
    loop {
        tokio::select! {
            biased;
            msg = rx.recv() => match msg {
                Ok(msg) => stream.send_data(msg, false)?,
                Err(_) => return Ok(()),
            },
            // Reads the agent's frames and writes what was queued.
            next = conn.accept() => if next.is_none() {
                return Ok(());
            },
        }
    }
}

/// The server's side of `floor` (this process, on CPU 0 with `--pin`).
pub(crate) async fn serve(args: &Args, floor: Floor) -> Res<Figures> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = match floor {
        Floor::Tcp => listener.local_addr()?.to_string(),
        Floor::Http2 => format!("http://{}", listener.local_addr()?),
    };
    let agents_cpu = args.pin.then_some(REGISTRAR_CPU + 1);
    let mut child = spawn_self(args, &["--floor-client", &addr], agents_cpu)?;
    let (tx, _) = broadcast::channel::<Bytes>(65_536);
    let mut tasks = Vec::with_capacity(args.agents);
    for _ in 0..args.agents {
        let (sock, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
            .await
            .map_err(|_| "the agents did not connect within 60 s")??;
        sock.set_nodelay(true)?;
        let rx = tx.subscribe();
        tasks.push(match floor {
            Floor::Tcp => tokio::spawn(tcp_connection(sock, rx)),
            Floor::Http2 => tokio::spawn(async move {
                if let Err(e) = h2_connection(sock, rx).await {
                    println!("floor: an agent's HTTP/2 connection failed: {e}");
                }
            }),
        });
    }
    let stdout = child.stdout.take().ok_or("the agents' stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let writes = args.rate * args.seconds;
    let asked = args.rate.clamp(1, u64::from(u32::MAX));
    let period = Duration::from_millis(10).max(Duration::from_secs(1) / asked as u32);
    let per_tick = ((asked as f64 * period.as_secs_f64()).round() as u64).max(1);
    let mut tick = tokio::time::interval(period);
    let (cpu_start, start) = (CpuMark::now(), Instant::now());
    let mut seq = 0;
    while seq < writes {
        tick.tick().await;
        for _ in 0..per_tick.min(writes - seq) {
            let _ = tx.send(floor.message(seq, now_micros()));
            seq += 1;
        }
    }
    let mut figures = Figures::default();
    // The floor's writer does not wait for its writes: the rate is what
    // reached every agent, over the time until the last one did.
    let mut delivery_time = start.elapsed();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Some(line) = tokio::time::timeout_at(deadline, lines.next_line())
        .await
        .map_err(|_| "the agents did not report within 60 s")??
    {
        if line == "delivered" {
            delivery_time = start.elapsed();
            (figures.server_cpu_per_s, figures.server_kernel_per_s) =
                cpu_start.per_second(delivery_time);
        } else if let Some(r) = line.strip_prefix("result ") {
            let v: Vec<f64> = r.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [p50, p99, cpu] = v.as_slice() {
                figures.every_p50_ms = *p50;
                figures.every_p99_ms = *p99;
                figures.agents_cpu_per_s = *cpu;
            }
        } else {
            println!("{line}");
        }
    }
    figures.changes_per_s = writes as f64 / delivery_time.as_secs_f64();
    drop(tx);
    for t in tasks {
        let _ = t.await;
    }
    child.wait().await?;
    Ok(figures)
}

/// One agent of a floor: a bare TCP connection or a light HTTP/2 one.
enum Reader {
    Tcp(TcpStream),
    Http2(Box<LightAgent>),
}

impl Reader {
    /// A connection to the floor at `addr` (`http://…` for the HTTP/2
    /// floor) as agent `i`.
    async fn open(addr: &str, i: usize) -> Res<Self> {
        if addr.starts_with("http://") {
            let agent = LightAgent::open(addr, &format!("agent-{i}"))
                .await
                .map_err(|e| format!("agent {i}: {e}"))?;
            return Ok(Reader::Http2(Box::new(agent)));
        }
        Ok(Reader::Tcp(TcpStream::connect(addr).await?))
    }

    /// The next change's number and when it was sent; `None` once the
    /// connection ends.
    async fn next(&mut self) -> Option<(usize, u64)> {
        match self {
            Reader::Tcp(sock) => {
                let mut msg = [0u8; MESSAGE];
                sock.read_exact(&mut msg).await.ok()?;
                let word = |at: usize| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&msg[at..at + 8]);
                    u64::from_le_bytes(b)
                };
                Some((word(0) as usize, word(8)))
            }
            Reader::Http2(agent) => {
                let (sent, seq) = agent.next_change().await?;
                Some((seq as usize, sent))
            }
        }
    }
}

/// The agents' side: `agents` connections to `addr`, each reading every
/// message; prints `delivered` once every message reached every agent
/// (or 30 s after the last was due), then `result <every p50 ms> <every
/// p99 ms> <CPU s/s>`.
pub(crate) async fn client(addr: &str, args: &Args) -> Res<()> {
    let writes = (args.rate * args.seconds) as usize;
    let deliveries = Arc::new(Deliveries::new(writes));
    // The writer is the server, in another process: each message says
    // when it was sent.
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..writes).map(|_| AtomicU64::new(0)).collect());
    let mut readers = Vec::with_capacity(args.agents);
    for i in 0..args.agents {
        let mut reader = Reader::open(addr, i).await?;
        let (deliveries, sent_at) = (Arc::clone(&deliveries), Arc::clone(&sent_at));
        readers.push(tokio::spawn(async move {
            for _ in 0..writes {
                let Some((seq, sent)) = reader.next().await else {
                    return;
                };
                deliveries.record(seq, now_micros());
                if let Some(t) = sent_at.get(seq) {
                    t.store(sent, Ordering::Relaxed);
                }
            }
        }));
    }
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    if !join_within(readers, Duration::from_secs(args.seconds + 30)).await {
        println!("floor: some agents did not receive every message in time");
    }
    let cpu_per_s = (cpu_seconds() - cpu_start) / start.elapsed().as_secs_f64();
    println!("delivered");
    let (every, complete) =
        deliveries.every(args.agents, |seq| sent_at[seq].load(Ordering::Relaxed))?;
    println!("floor: {complete} of {writes} changes reached all agents");
    let ms = |q: f64| every.value_at_quantile(q) as f64 / 1000.0;
    println!("result {} {} {cpu_per_s}", ms(0.5), ms(0.99));
    Ok(())
}
