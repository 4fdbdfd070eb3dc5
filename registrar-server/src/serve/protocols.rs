//! [`Protocols`]: the read-only listeners beside the gRPC port (the
//! HTTP/JSON API and the DNS responder), started once the registrar
//! exists and stopped with it.

use std::sync::Arc;

use registry_api::Result;

use super::ServeOptions;
use crate::Registrar;

/// The field protocols' listeners (each behind its cargo feature); `None`
/// (the default) leaves a protocol off. They are plaintext and read-only,
/// and bypass the gRPC port's authorization: a non-loopback address is
/// refused unless [`ServeOptions::insecure`].
#[non_exhaustive]
#[derive(Debug, Default)]
pub struct Protocols {
    /// The HTTP/JSON API's listener (`--http-api-addr`).
    #[cfg(feature = "http-api")]
    pub http_api: Option<tokio::net::TcpListener>,
    /// The DNS responder's sockets and settings (`--dns-addr`).
    #[cfg(feature = "dns")]
    pub dns: Option<(crate::dns::DnsListeners, crate::dns::DnsConfig)>,
}

impl Protocols {
    /// No protocol beside gRPC.
    pub fn none() -> Self {
        Self::default()
    }

    /// Refuse a non-loopback address unless `options.insecure`.
    pub(super) fn check(&self, options: &ServeOptions) -> Result<()> {
        #[cfg(feature = "http-api")]
        if let Some(l) = &self.http_api {
            options.check_read_only(l.local_addr(), "http_api_addr", "the HTTP API")?;
        }
        #[cfg(feature = "dns")]
        if let Some((l, _)) = &self.dns {
            options.check_read_only(l.local_addr(), "dns_addr", "DNS")?;
        }
        let _ = options;
        Ok(())
    }

    /// Serve each protocol given from `registrar`'s state; they stop when
    /// the registrar closes.
    pub(super) fn start(self, registrar: &Arc<Registrar>) -> Running {
        #[cfg_attr(not(any(feature = "http-api", feature = "dns")), allow(unused_mut))]
        let mut tasks = Vec::new();
        #[cfg(feature = "http-api")]
        if let Some(listener) = self.http_api {
            let registrar = Arc::clone(registrar);
            tasks.push(tokio::spawn(async move {
                if let Err(e) = crate::api_http::serve(registrar, listener).await {
                    tracing::warn!(error = %e, "the HTTP API failed");
                }
            }));
        }
        #[cfg(feature = "dns")]
        if let Some((listeners, config)) = self.dns {
            tasks.push(tokio::spawn(crate::dns::serve_dns(
                Arc::clone(registrar),
                listeners,
                config,
            )));
        }
        let _ = registrar;
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
