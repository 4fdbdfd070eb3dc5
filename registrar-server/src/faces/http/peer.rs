//! Who is on the other end of an HTTP API connection, and the middleware
//! that turns that into a [`Caller`] before any handler runs: plaintext
//! connections are anyone's; over mTLS the client certificate is
//! authenticated and authorized exactly as on the gRPC port.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};

use super::ApiError;
use crate::auth::{Caller, Security};

/// A connection that completed the TLS handshake.
pub(crate) type TlsConn = tokio_rustls::server::TlsStream<TcpStream>;

/// The peer of one connection: its address and, over mTLS, the leaf of
/// the certificate chain it presented.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    addr: SocketAddr,
    leaf: Option<CertificateDer<'static>>,
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Peer {
            addr: *stream.remote_addr(),
            leaf: None,
        }
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// The HTTP API's connections over TLS: those the registrar's acceptor
/// (handshakes bounded in time, as on the gRPC port) hands over.
pub(crate) struct TlsListener {
    conns: tokio::sync::mpsc::Receiver<TlsConn>,
    local: SocketAddr,
}

impl TlsListener {
    /// Connections from `conns`, accepted on `local`.
    pub(crate) fn new(conns: tokio::sync::mpsc::Receiver<TlsConn>, local: SocketAddr) -> Self {
        Self { conns, local }
    }

    /// The address it accepts on.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }
}

impl Listener for TlsListener {
    type Io = TlsConn;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some(conn) = self.conns.recv().await else {
                // The acceptor stopped: so does the server, by its
                // shutdown signal; take nothing more.
                return std::future::pending().await;
            };
            let (tcp, session) = conn.get_ref();
            let Ok(addr) = tcp.peer_addr() else { continue };
            let leaf = session
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.clone().into_owned());
            return (conn, Peer { addr, leaf });
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer {
            addr: self.local,
            leaf: None,
        })
    }
}

/// Identify the caller of every request from its connection (refused with
/// 401/403 as the gRPC port would refuse it), check that it may read when
/// the request is a `GET`, and hand it to the handlers as an extension.
pub(crate) async fn authenticate(
    State(security): State<Arc<Security>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    mut req: Request,
    next: Next,
) -> Response {
    let caller = match security.identify_leaf(peer.leaf.as_ref()) {
        Ok(c) => c,
        Err(status) => {
            tracing::debug!(peer = %peer.addr, error = %status.message(), "HTTP API caller refused");
            return ApiError::from(status).into_response();
        }
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        if let Err(status) = caller.may_read() {
            return ApiError::from(status).into_response();
        }
    }
    req.extensions_mut().insert::<Caller>(caller);
    req.extensions_mut()
        .insert(super::consul::PeerIp(peer.addr.ip()));
    next.run(req).await
}
