//! DNS over UDP: one socket per core on the same address (`SO_REUSEPORT`,
//! so the kernel spreads clients across them), each read by a thread of
//! its own that answers every datagram in place: one receive and one send
//! per query, no task, no allocation, the answer written into a buffer
//! the thread keeps.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use super::answer::{respond, Transport};
use super::index::Indexer;

/// The largest request read; longer datagrams are cut to it.
const RECEIVE_BUFFER: usize = 4096;
/// How long a thread waits for a datagram before looking whether it
/// should stop (where closing the socket's reading side does not wake
/// it).
const WAKE_EVERY: Duration = Duration::from_secs(1);

/// How many sockets (and threads) to answer on: one per core.
pub(super) fn socket_count() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// A UDP socket bound to `addr`, which others may share where the system
/// allows (`SO_REUSEPORT`); whether it does.
fn socket(addr: SocketAddr) -> io::Result<(UdpSocket, bool)> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    #[cfg(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    ))]
    let shared = s.set_reuse_port(true).is_ok();
    #[cfg(not(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    )))]
    let shared = false;
    s.bind(&addr.into())?;
    Ok((s.into(), shared))
}

/// `count` sockets bound to `addr` (with port 0, the same free port for
/// all; one where sockets cannot share an address), and the address.
pub(super) fn bind(addr: SocketAddr, count: usize) -> io::Result<(Vec<UdpSocket>, SocketAddr)> {
    let (first, shared) = socket(addr)?;
    let bound = first.local_addr()?;
    let mut all = vec![first];
    if shared {
        for _ in 1..count {
            all.push(socket(bound)?.0);
        }
    }
    Ok((all, bound))
}

/// The threads answering on the UDP sockets; dropping it stops them.
pub(super) struct Workers {
    sockets: Vec<Arc<UdpSocket>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// Answer on each of `sockets` from `indexer` with `threads` threads in
    /// all (at least one per socket; several share one socket where the
    /// system gave only one).
    pub(super) fn start(
        sockets: Vec<UdpSocket>,
        threads: usize,
        indexer: Arc<Indexer>,
    ) -> io::Result<Self> {
        // Made first, so that a failure below stops the threads started.
        let mut workers = Self {
            sockets: sockets.into_iter().map(Arc::new).collect(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        let Some(first) = workers.sockets.first() else {
            return Err(io::Error::other("no UDP socket to answer on"));
        };
        for s in &workers.sockets {
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(WAKE_EVERY))?;
        }
        let addr = first.local_addr().ok();
        let count = workers.sockets.len();
        for i in 0..threads.max(count) {
            let socket = Arc::clone(&workers.sockets[i % count]);
            let (indexer, stop) = (Arc::clone(&indexer), Arc::clone(&workers.stop));
            let thread = std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || serve(&socket, &indexer, &stop))?;
            workers.threads.push(thread);
        }
        tracing::debug!(?addr, sockets = count, "DNS: answering over UDP");
        Ok(workers)
    }
}

impl Workers {
    /// Tell every thread to stop, without waiting for them.
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in &self.sockets {
            // Wakes a thread waiting on the socket (Linux); elsewhere it
            // sees `stop` within WAKE_EVERY. An unconnected socket reports
            // "not connected" but is shut all the same.
            let _ = SockRef::from(&**s).shutdown(std::net::Shutdown::Read);
        }
    }

    /// Stop every thread and wait until they have.
    #[cfg(test)]
    fn stop_and_wait(mut self) {
        self.stop();
        for t in std::mem::take(&mut self.threads) {
            t.join().expect("a UDP thread panicked");
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Answer the datagrams on `socket` until `stop`.
fn serve(socket: &UdpSocket, indexer: &Indexer, stop: &AtomicBool) {
    let mut buf = vec![0u8; RECEIVE_BUFFER];
    let mut out = Vec::with_capacity(RECEIVE_BUFFER);
    let mut key = Vec::with_capacity(256);
    loop {
        let received = socket.recv_from(&mut buf);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (n, peer) = match received {
            Ok(x) => x,
            Err(e) => {
                if !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) {
                    tracing::debug!(error = %e, "DNS: receiving over UDP failed");
                }
                continue;
            }
        };
        let view = indexer.view();
        let index = view.as_deref().map(|i| &**i);
        if respond(
            indexer.zone(),
            index,
            &buf[..n],
            Transport::Udp,
            &mut key,
            &mut out,
        ) {
            if let Err(e) = socket.send_to(&out, peer) {
                tracing::debug!(%peer, error = %e, "DNS: sending over UDP failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::faces::dns::wire::{query, rtype};
    use crate::faces::dns::zone::Zone;
    use hickory_proto::rr::Name;
    use waypost::cached::CachedRegistry;
    use waypost::memory::MemoryRegistry;

    #[tokio::test]
    async fn every_socket_answers_and_stopping_frees_the_port() {
        let cache = CachedRegistry::new(MemoryRegistry::new());
        cache.wait_until_ready().await;
        let zone = Zone::new(&Name::from_ascii("registry.").unwrap(), 5);
        let indexer = Arc::new(Indexer::new(Arc::new(zone), cache.store().clone()));
        let (sockets, addr) = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        assert_eq!(sockets.len(), 2, "two sockets share the port");
        let workers = Workers::start(sockets, 3, indexer).unwrap();
        assert_eq!(workers.threads.len(), 3);
        // Clients on several ports land on both sockets; each is answered.
        for _ in 0..8 {
            let client = UdpSocket::bind("127.0.0.1:0").unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            client
                .send_to(&query("x.registry.", rtype::A, None), addr)
                .unwrap();
            let mut buf = [0u8; 512];
            let (n, _) = client.recv_from(&mut buf).unwrap();
            assert!(n > 12);
            assert_eq!(buf[3] & 0x0F, 3, "NXDOMAIN");
        }
        workers.stop_and_wait();
        // Every socket closed: the port can be bound without sharing.
        UdpSocket::bind(addr).unwrap();
    }
}
