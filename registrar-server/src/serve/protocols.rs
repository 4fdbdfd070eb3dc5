//! [`Protocols`]: the listeners beside the gRPC port (the HTTP/JSON API,
//! the DNS responder and the xDS server), started once the registrar
//! exists and stopped with it.

use std::sync::Arc;

use waypost::Result;

use super::options::Secured;
use super::ServeOptions;
use crate::engine::registrar::Registrar;

/// The field protocols' listeners (each behind its cargo feature); `None`
/// (the default) leaves a protocol off. The HTTP API and the xDS server
/// are secured as the gRPC port is: mTLS and authorization when it has
/// TLS; otherwise plaintext, on a loopback address unless
/// [`ServeOptions::insecure`]. DNS is plaintext and read-only, and
/// bypasses the gRPC port's authorization: a non-loopback address is
/// refused unless `insecure`.
#[non_exhaustive]
#[derive(Debug, Default)]
pub struct Protocols {
    /// The HTTP/JSON API's listener (`--http-api-addr`).
    #[cfg(feature = "http-api")]
    pub http_api: Option<tokio::net::TcpListener>,
    /// The DNS responder's sockets and settings (`--dns-addr`).
    #[cfg(feature = "dns")]
    pub dns: Option<(
        crate::faces::dns::DnsListeners,
        crate::faces::dns::DnsConfig,
    )>,
    /// The xDS server's listener (`--xds-addr`).
    #[cfg(feature = "xds")]
    pub xds: Option<tokio::net::TcpListener>,
}

impl Protocols {
    /// No protocol beside gRPC.
    pub fn none() -> Self {
        Self::default()
    }

    /// Refuse a non-loopback address unless `options.insecure`.
    pub(super) fn check(&self, options: &ServeOptions) -> Result<()> {
        #[cfg(any(feature = "dns", feature = "xds"))]
        const SHOWS: &str = "shows every endpoint";
        #[cfg(feature = "http-api")]
        if let Some(l) = &self.http_api {
            if options.tls.is_none() {
                options.check_plaintext(
                    l.local_addr(),
                    "http_api_addr",
                    "the HTTP API",
                    "shows every endpoint and lets anyone write any endpoint",
                )?;
            }
        }
        #[cfg(feature = "dns")]
        if let Some((l, _)) = &self.dns {
            options.check_plaintext(l.local_addr(), "dns_addr", "DNS", SHOWS)?;
        }
        #[cfg(feature = "xds")]
        if let Some(l) = &self.xds {
            if options.tls.is_none() {
                options.check_plaintext(l.local_addr(), "xds_addr", "xDS", SHOWS)?;
            }
        }
        let _ = options;
        Ok(())
    }

    /// Serve each protocol given from `registrar`'s state; they stop when
    /// the registrar closes.
    pub(super) fn start(self, registrar: &Arc<Registrar>, secured: &Secured) -> Running {
        #[cfg_attr(
            not(any(feature = "http-api", feature = "dns", feature = "xds")),
            allow(unused_mut)
        )]
        let mut tasks = Vec::new();
        #[cfg(feature = "http-api")]
        if let Some(listener) = self.http_api {
            use crate::faces::http::{peer::TlsListener, HttpListener};
            let listener = match (&secured.http_acceptor, listener.local_addr()) {
                (Some(acceptor), Ok(local)) => {
                    let (tx, rx) = tokio::sync::mpsc::channel(64);
                    tasks.push(tokio::spawn(super::accept::accept_tls(
                        listener,
                        acceptor.clone(),
                        tx,
                        secured.options.clone(),
                    )));
                    HttpListener::Tls(TlsListener::new(rx, local))
                }
                _ => HttpListener::Plain(listener),
            };
            let registrar = Arc::clone(registrar);
            let security = Arc::new(secured.security.clone());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = crate::faces::http::serve(registrar, listener, security).await {
                    tracing::warn!(error = %e, "the HTTP API failed");
                }
            }));
        }
        #[cfg(feature = "dns")]
        if let Some((listeners, config)) = self.dns {
            tasks.push(tokio::spawn(crate::faces::dns::serve_dns(
                Arc::clone(registrar),
                listeners,
                config,
            )));
        }
        #[cfg(feature = "xds")]
        if let Some(listener) = self.xds {
            tasks.push(tokio::spawn(serve_xds(
                Arc::clone(registrar),
                listener,
                secured.security.clone(),
                secured.acceptor.clone(),
                secured.options.clone(),
            )));
        }
        let _ = (registrar, secured);
        Running { tasks }
    }
}

/// The running protocols' tasks.
#[derive(Default)]
pub(super) struct Running {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// End them (they end by themselves once the registrar closes; a
    /// blocked HTTP request is cut here).
    pub(super) async fn stop(self) {
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Serve the aggregated discovery service on `listener` until the
/// registrar closes: over mTLS with `acceptor` (callers authenticated and
/// authorized as on the gRPC port), plaintext without.
#[cfg(feature = "xds")]
async fn serve_xds(
    registrar: Arc<Registrar>,
    listener: tokio::net::TcpListener,
    security: crate::auth::Security,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    options: ServeOptions,
) {
    use futures::StreamExt;
    use tonic::service::interceptor::InterceptedService;

    let security = Arc::new(security);
    let service = crate::faces::xds::XdsService::new(Arc::clone(&registrar))
        .with_security(Arc::clone(&security))
        .into_server();
    let router = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(options.http2_keepalive_interval)
        .http2_keepalive_timeout(Some(options.http2_keepalive_timeout))
        .add_service(InterceptedService::new(
            service,
            crate::auth::Authenticate(security),
        ));
    let closing = registrar.closing();
    let result = match acceptor {
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(options.tcp_keepalive);
            router.serve_with_incoming_shutdown(incoming, closing).await
        }
        Some(acceptor) => {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            tokio::spawn(super::accept::accept_tls(listener, acceptor, tx, options));
            let incoming =
                tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
            router.serve_with_incoming_shutdown(incoming, closing).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "the xDS server failed");
    }
}
