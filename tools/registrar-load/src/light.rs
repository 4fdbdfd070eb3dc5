//! Light agents (`--light-agents` in the fan-out phase, the baseline of
//! the restart and failover phases and, with `--light-agents`, their
//! agents that resume by content, and always against the HTTP/2 floor,
//! `floor.rs`). Each agent is a
//! bare HTTP/2 connection (the `h2` crate) carrying one `WatchEndpoints`
//! call, driven by one task that reads the stream's DATA frames, cuts them
//! into gRPC messages and decodes each `EndpointEvent` with prost. There is
//! no `RegistrarClient` cache, no event conversion and no second task per
//! connection, so the agents' process costs less per event (figures in
//! docs/benchmarks-history.md, "Where a delivery's CPU goes") and limits a
//! run less: what is measured is more the registrar's. What the registrar
//! sends them is what it sends any agent.

use std::net::SocketAddr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::net::TcpStream;
use tonic::codegen::http;
use waypost_registrar_client::proto::registrar::v1::{
    endpoint_event::EventType, EndpointEvent, HeldServices, HeldTotal, WatchEndpointsRequest,
};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The gRPC path of the agent stream.
const WATCH: &str = "/aether.registrar.v1.Registrar/WatchEndpoints";
/// A gRPC message's prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// `message` as one uncompressed gRPC message: its prefix, then its
/// encoding.
pub(crate) fn grpc_message(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // A BytesMut grows as needed: encoding into it cannot fail.
    let _ = message.encode(&mut buf);
    buf.freeze()
}

/// One agent's watch on a connection of its own.
pub(crate) struct LightAgent {
    conn: h2::client::Connection<TcpStream, Bytes>,
    body: h2::RecvStream,
    buf: BytesMut,
    // Kept open: dropping them would end the connection or the call.
    _send: h2::client::SendRequest<Bytes>,
    _request: h2::SendStream<Bytes>,
}

/// `f` to its end while the connection `conn` is driven (its frames read
/// and written); an error if the connection ends first.
async fn driven<F: std::future::Future>(
    conn: &mut h2::client::Connection<TcpStream, Bytes>,
    f: F,
) -> Res<F::Output> {
    tokio::select! {
        biased;
        out = f => Ok(out),
        end = conn => Err(format!("the connection ended: {end:?}").into()),
    }
}

/// What an agent says it holds when it resumes by content: its summary
/// and the summary's total, as `RegistrarClient` sends them.
pub(crate) type Held = (HeldServices, HeldTotal);

impl LightAgent {
    /// Open a watch at the registrar at `url` (`http://host:port`) as node
    /// `node` and read its snapshot.
    pub(crate) async fn open(url: &str, node: &str) -> Res<Self> {
        Self::open_with(url, node, None, |_| ()).await
    }

    /// [`open`](Self::open), saying it holds `held` (then the snapshot is
    /// partial: only the services that differ), and handing each snapshot
    /// message to `each`.
    pub(crate) async fn open_with(
        url: &str,
        node: &str,
        held: Option<&Held>,
        mut each: impl FnMut(&EndpointEvent),
    ) -> Res<Self> {
        let addr: SocketAddr = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("not an http:// URL: {url:.60}"))?
            .parse()?;
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, mut conn) = h2::client::handshake(tcp).await?;
        let mut send = driven(&mut conn, send.ready()).await??;
        let request = http::Request::post(format!("http://{addr}{WATCH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let (response, mut request_body) = send.send_request(request, false)?;
        let request = grpc_message(&WatchEndpointsRequest {
            cluster_name: "load".into(),
            node_name: node.into(),
            last_version: String::new(),
            held: held.map(|(services, _)| services.clone()),
            held_total: held.map(|(_, total)| *total),
        });
        request_body.send_data(request, true)?;
        let response = driven(&mut conn, response).await??;
        if response.status() != http::StatusCode::OK {
            return Err(format!("WatchEndpoints answered HTTP {}", response.status()).into());
        }
        if let Some(status) = response.headers().get("grpc-status") {
            return Err(format!("WatchEndpoints ended at once: grpc-status {status:?}").into());
        }
        let mut agent = LightAgent {
            conn,
            body: response.into_body(),
            buf: BytesMut::new(),
            _send: send,
            _request: request_body,
        };
        loop {
            let event = agent.next_event().await?;
            if event.r#type() != EventType::FullSnapshot {
                return Err(
                    format!("the first event was {:?}, not a snapshot", event.r#type()).into(),
                );
            }
            each(&event);
            if event.snapshot_last {
                return Ok(agent);
            }
        }
    }

    /// The next event on the stream; an error once it or the connection
    /// ends.
    pub(crate) async fn next_event(&mut self) -> Res<EndpointEvent> {
        loop {
            if self.buf.len() >= PREFIX {
                if self.buf[0] != 0 {
                    return Err("a compressed message, which this agent did not ask for".into());
                }
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
                let whole = PREFIX + len as usize;
                if self.buf.len() >= whole {
                    let mut message = self.buf.split_to(whole);
                    message.advance(PREFIX);
                    return Ok(EndpointEvent::decode(message.freeze())?);
                }
            }
            let chunk = tokio::select! {
                biased;
                chunk = self.body.data() => chunk,
                end = &mut self.conn => return Err(format!("the connection ended: {end:?}").into()),
            };
            let chunk = chunk.ok_or("the stream ended")??;
            let _ = self.body.flow_control().release_capacity(chunk.len());
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// The labels `sent` and `seq` of the next added or updated endpoint
    /// (what the fan-out's writer puts on each change); `None` once the
    /// stream ends.
    pub(crate) async fn next_change(&mut self) -> Option<(u64, u64)> {
        loop {
            let event = self.next_event().await.ok()?;
            if !matches!(
                event.r#type(),
                EventType::EndpointAdded | EventType::EndpointUpdated
            ) {
                continue;
            }
            let Some(endpoint) = event.endpoint else {
                continue;
            };
            let label = |k: &str| endpoint.labels.get(k).and_then(|s| s.parse().ok());
            if let (Some(sent), Some(seq)) = (label("sent"), label("seq")) {
                return Some((sent, seq));
            }
        }
    }
}
