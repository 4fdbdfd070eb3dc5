//! The DNS responder (feature `dns`): authoritative for one domain
//! (default `registry.`), answering A/AAAA and SRV queries for
//! `<service>.<domain>`, `<service>.<cluster>.<domain>` and Consul's
//! `<service>.service.<domain>` from the registrar's state, over UDP and
//! TCP. Messages are parsed and written with `hickory-proto`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::Message;
use hickory_proto::rr::Name;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::engine::registrar::Registrar;

mod answer;

use answer::Zone;

/// The default domain.
pub const DEFAULT_DNS_DOMAIN: &str = "registry.";
/// The longest TTL allowed (answers follow the registry within it).
pub const MAX_DNS_TTL: Duration = Duration::from_secs(5);
/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Why the DNS responder cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The domain is not a valid DNS name.
    #[error("--dns-domain {domain:?} is not a domain name: {reason}")]
    BadDomain {
        /// The domain given.
        domain: String,
        /// Why it was refused.
        reason: String,
    },
    /// The TTL is above [`MAX_DNS_TTL`].
    #[error("--dns-ttl {0:?} is out of range: allowed 0s to 5s")]
    BadTtl(Duration),
    /// A socket could not be bound.
    #[error("cannot listen on {addr} ({proto}): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// `UDP` or `TCP`.
        proto: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What the responder answers for.
#[derive(Debug, Clone)]
pub struct DnsConfig {
    zone: Zone,
}

impl DnsConfig {
    /// Answers for `domain` (a trailing dot is added when missing) with
    /// records of `ttl` (0 s to 5 s, whole seconds).
    pub fn new(domain: &str, ttl: Duration) -> Result<Self, DnsError> {
        if ttl > MAX_DNS_TTL {
            return Err(DnsError::BadTtl(ttl));
        }
        let bad = |reason: String| DnsError::BadDomain {
            domain: domain.to_string(),
            reason,
        };
        let mut name = Name::from_ascii(domain).map_err(|e| bad(e.to_string()))?;
        name.set_fqdn(true);
        if name.is_root() {
            return Err(bad("the root cannot be the registry's domain".into()));
        }
        Ok(Self {
            zone: Zone {
                domain: name.to_lowercase(),
                ttl: ttl.as_secs() as u32,
            },
        })
    }

    /// The domain, fully qualified (`registry.`).
    pub fn domain(&self) -> String {
        self.zone.domain.to_ascii()
    }
}

/// The responder's sockets: UDP and TCP on the same address.
#[derive(Debug)]
pub struct DnsListeners {
    /// The UDP socket.
    pub udp: UdpSocket,
    /// The TCP listener.
    pub tcp: TcpListener,
}

impl DnsListeners {
    /// Bind UDP and TCP on `addr`; with port 0, the same free port for
    /// both (a few attempts when the TCP port is taken).
    pub async fn bind(addr: SocketAddr) -> Result<Self, DnsError> {
        let bind_err = |proto, source| DnsError::Bind {
            addr,
            proto,
            source,
        };
        let attempts = if addr.port() == 0 { 10 } else { 1 };
        let mut last = None;
        for _ in 0..attempts {
            let udp = UdpSocket::bind(addr)
                .await
                .map_err(|e| bind_err("UDP", e))?;
            let bound = udp.local_addr().map_err(|e| bind_err("UDP", e))?;
            match TcpListener::bind(bound).await {
                Ok(tcp) => return Ok(Self { udp, tcp }),
                Err(e) => last = Some(e),
            }
        }
        Err(bind_err(
            "TCP",
            last.unwrap_or_else(|| std::io::Error::other("no attempt made")),
        ))
    }

    /// The bound address (the same port for UDP and TCP).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.udp.local_addr()
    }
}

/// Answer DNS queries on `listeners` from `registrar`'s state until the
/// registrar closes.
pub async fn serve_dns(registrar: Arc<Registrar>, listeners: DnsListeners, config: DnsConfig) {
    let zone = Arc::new(config.zone);
    let DnsListeners { udp, tcp } = listeners;
    let closing = registrar.closing();
    tokio::select! {
        () = serve_udp(Arc::clone(&registrar), udp, Arc::clone(&zone)) => {}
        () = serve_tcp(registrar, tcp, zone) => {}
        () = closing => {}
    }
}

/// The encoded answer to `bytes`, at most `limit` bytes (then truncated,
/// TC set) when given; `None` for a message that cannot be parsed.
fn respond(registrar: &Registrar, zone: &Zone, bytes: &[u8], udp: bool) -> Option<Vec<u8>> {
    let request = Message::from_vec(bytes).ok()?;
    let snapshot = registrar.state().store().snapshot();
    let resp = zone.answer(&request, snapshot.as_deref());
    let encoded = resp.to_vec().ok()?;
    if udp && encoded.len() > usize::from(request.max_payload()) {
        return resp.truncate().to_vec().ok();
    }
    Some(encoded)
}

async fn serve_udp(registrar: Arc<Registrar>, socket: UdpSocket, zone: Arc<Zone>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                // ICMP errors of earlier sends surface here on some
                // systems; nothing to do but go on.
                tracing::debug!(error = %e, "DNS: receiving over UDP failed");
                continue;
            }
        };
        if let Some(out) = respond(&registrar, &zone, &buf[..n], true) {
            if let Err(e) = socket.send_to(&out, peer).await {
                tracing::debug!(%peer, error = %e, "DNS: sending over UDP failed");
            }
        }
    }
}

async fn serve_tcp(registrar: Arc<Registrar>, listener: TcpListener, zone: Arc<Zone>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_conn(
                    Arc::clone(&registrar),
                    stream,
                    Arc::clone(&zone),
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "DNS: accepting a TCP connection failed");
                // Out of file descriptors and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Length-prefixed messages (RFC 1035 4.2.2) until the peer closes or
/// stays idle for [`TCP_IDLE`].
async fn serve_conn(registrar: Arc<Registrar>, mut stream: TcpStream, zone: Arc<Zone>) {
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(TCP_IDLE, stream.read_u16()).await else {
            return;
        };
        let mut msg = vec![0u8; usize::from(len)];
        if !matches!(
            tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut msg)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let Some(out) = respond(&registrar, &zone, &msg, false) else {
            return;
        };
        let Ok(out_len) = u16::try_from(out.len()) else {
            return;
        };
        if stream.write_u16(out_len).await.is_err() || stream.write_all(&out).await.is_err() {
            return;
        }
    }
}
