//! Taking connections on a port: accepted from the moment the server
//! starts, tuned (`TCP_NODELAY`, keepalive), TLS handshakes run
//! concurrently, and held (at most [`HELD`]) until the server takes them.
//! A fleet reconnecting at once to a registrar that is still opening its
//! backend so waits in this process (its calls answered once the backend is
//! open) instead of overflowing the kernel's accept queue, which drops or
//! resets what overflows it. Beyond [`HELD`] waiting connections nothing
//! more is accepted, and the kernel's queue takes the rest, as before.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::ServeOptions;

/// Connections accepted but not yet taken by the server, at most.
pub(super) const HELD: usize = 1024;

pub(super) type TlsConn = tokio_rustls::server::TlsStream<TcpStream>;

/// The connections of the gRPC port, as its server takes them.
pub(super) enum Incoming {
    Plain(mpsc::Receiver<TcpStream>),
    Tls(mpsc::Receiver<TlsConn>),
}

/// Start accepting on `listener` (through TLS when `acceptor` is given);
/// stops when the returned receiver is dropped.
pub(super) fn start(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    options: ServeOptions,
) -> Incoming {
    match acceptor {
        None => {
            let (tx, rx) = mpsc::channel(HELD);
            tokio::spawn(accept_plain(listener, tx, options));
            Incoming::Plain(rx)
        }
        Some(acceptor) => {
            let (tx, rx) = mpsc::channel(HELD);
            tokio::spawn(accept_tls(listener, acceptor, tx, options));
            Incoming::Tls(rx)
        }
    }
}

/// The next connection on `listener`, tuned as `options` say; `None` once
/// `tx` is closed.
async fn next<T>(
    listener: &TcpListener,
    tx: &mpsc::Sender<T>,
    options: &ServeOptions,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = tx.closed() => return None,
        };
        match accepted {
            Ok((tcp, peer)) => {
                // Without TCP_NODELAY small responses wait for delayed
                // ACKs (tens of milliseconds per call).
                let _ = tcp.set_nodelay(true);
                if let Some(idle) = options.tcp_keepalive {
                    let keepalive = socket2::TcpKeepalive::new().with_time(idle);
                    if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive) {
                        tracing::warn!(%peer, error = %e, "cannot set TCP keepalive");
                    }
                }
                return Some((tcp, peer));
            }
            Err(e) => {
                // Out of file descriptors and the like: do not spin.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Accept plaintext connections into `tx`, only while it has room (the
/// kernel's queue holds the rest).
async fn accept_plain(listener: TcpListener, tx: mpsc::Sender<TcpStream>, options: ServeOptions) {
    loop {
        let Ok(room) = tx.reserve().await else { return };
        let Some((tcp, _)) = next(&listener, &tx, &options).await else {
            return;
        };
        room.send(tcp);
    }
}

/// Accept TCP connections and hand those that complete the TLS handshake
/// to `tx`; handshakes run concurrently, each bounded by the options'
/// handshake timeout. Ends when `tx` is closed.
pub(super) async fn accept_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: mpsc::Sender<TlsConn>,
    options: ServeOptions,
) {
    let timeout = options.handshake_timeout;
    while let Some((tcp, peer)) = next(&listener, &tx, &options).await {
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send(tls).await;
                }
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    tracing::warn!(%peer, ?timeout, "TLS handshake timed out");
                }
            }
        });
    }
}
