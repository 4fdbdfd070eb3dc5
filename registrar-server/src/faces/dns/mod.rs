//! The DNS responder (feature `dns`): authoritative for one domain
//! (default `registry.`), answering A/AAAA and SRV queries for
//! `<service>.<domain>`, `<service>.<cluster>.<domain>` and Consul's
//! `<service>.service.<domain>` from the registrar's state, over UDP and
//! TCP.
//!
//! What a query needs is indexed by name once per version of the state,
//! on this face's side ([`index`]), with its records encoded in advance
//! ([`records`]): a query is read in place ([`wire`]), looked up, and
//! answered by copying those records into a buffer ([`answer`]), whatever
//! the registry's size. UDP is answered by one thread per core, each on a
//! socket of its own ([`udp`]); TCP by a task per connection ([`tcp`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::Name;
use tokio::net::TcpListener;

use crate::engine::registrar::Registrar;

mod answer;
mod index;
mod records;
mod tcp;
mod udp;
mod wire;
mod zone;

use index::Indexer;
use zone::Zone;

/// The default domain.
pub const DEFAULT_DNS_DOMAIN: &str = "registry.";
/// The longest TTL allowed (answers follow the registry within it).
pub const MAX_DNS_TTL: Duration = Duration::from_secs(5);

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
            zone: Zone::new(&name, ttl.as_secs() as u32),
        })
    }

    /// The domain, fully qualified (`registry.`).
    pub fn domain(&self) -> String {
        self.zone.domain.to_ascii()
    }
}

/// The responder's sockets: UDP (one per core where the system lets
/// sockets share an address) and TCP, on the same address.
#[derive(Debug)]
pub struct DnsListeners {
    udp: Vec<std::net::UdpSocket>,
    tcp: TcpListener,
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
            let (udp, bound) =
                udp::bind(addr, udp::socket_count()).map_err(|e| bind_err("UDP", e))?;
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
        self.tcp.local_addr()
    }
}

/// Answer DNS queries on `listeners` from `registrar`'s state until the
/// registrar closes.
pub async fn serve_dns(registrar: Arc<Registrar>, listeners: DnsListeners, config: DnsConfig) {
    let store = registrar.state().store().clone();
    let indexer = Arc::new(Indexer::new(Arc::new(config.zone), store));
    let DnsListeners { udp, tcp } = listeners;
    let threads = udp::socket_count();
    // Stops the UDP threads when this returns or is dropped.
    let _udp = match udp::Workers::start(udp, threads, Arc::clone(&indexer)) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "DNS: cannot answer over UDP");
            return;
        }
    };
    let closing = registrar.closing();
    tokio::select! {
        () = Arc::clone(&indexer).follow() => {}
        () = tcp::serve(tcp, indexer) => {}
        () = closing => {}
    }
}
