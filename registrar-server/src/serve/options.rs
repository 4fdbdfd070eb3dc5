//! [`ServeOptions`]: how the gRPC port is secured and kept, checked
//! before anything listens.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use waypost::{backend::check_duration, Error, Result};

use crate::auth;
use crate::auth::AuthzConfig;
use waypost_registrar_client::TlsFiles;

/// How [`serve_with`](super::serve_with) secures the gRPC port.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// mTLS: the server's certificate and key, and the CA bundle agents'
    /// certificates must chain to; all re-read when the files change.
    /// `None`: plaintext, allowed only on a loopback address unless
    /// `insecure`.
    pub tls: Option<TlsFiles>,
    /// Authorization by SPIFFE ID (needs `tls`). `None` with `tls` is
    /// refused unless `any_certificate`.
    pub authz: Option<AuthzConfig>,
    /// Serve plaintext gRPC on a non-loopback address (anyone who can
    /// reach the port may write any endpoint).
    pub insecure: bool,
    /// With `tls` and no `authz`: let any certificate of the CA write any
    /// endpoint.
    pub any_certificate: bool,
    /// The largest request message decoded; default
    /// [`DEFAULT_MAX_REQUEST_BYTES`](crate::DEFAULT_MAX_REQUEST_BYTES).
    pub max_request_bytes: usize,
    /// Longest TLS handshake. Default 10 s.
    pub handshake_timeout: Duration,
    /// How often an HTTP/2 PING is sent on each connection, idle or not.
    /// `None`: never. Default 30 s.
    pub http2_keepalive_interval: Option<Duration>,
    /// A connection whose peer has not answered a PING within this long is
    /// closed, with its streams. Default 10 s. So a client that vanished
    /// (powered off, partitioned, stopped) is dropped within interval +
    /// timeout, instead of whenever TCP gives up (many minutes).
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive on accepted connections: idle time before the first
    /// probe (the kernel's interval and count follow). `None`: off.
    /// Default 60 s.
    pub tcp_keepalive: Option<Duration>,
    /// Serve the live dashboard at `/ui` on the health port (off by
    /// default: the health port is plaintext and unauthenticated, so the
    /// dashboard shows every endpoint to anyone who can reach it).
    pub ui: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            authz: None,
            insecure: false,
            any_certificate: false,
            max_request_bytes: crate::engine::config::DEFAULT_MAX_REQUEST_BYTES,
            handshake_timeout: Duration::from_secs(10),
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(10),
            tcp_keepalive: Some(Duration::from_secs(60)),
            ui: false,
        }
    }
}

impl ServeOptions {
    /// Plaintext, no authorization (on a loopback address only).
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// mTLS with `files`.
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Authorize by SPIFFE ID.
    pub fn with_authz(mut self, authz: AuthzConfig) -> Self {
        self.authz = Some(authz);
        self
    }

    /// Allow plaintext gRPC on a non-loopback address.
    pub fn allow_insecure(mut self) -> Self {
        self.insecure = true;
        self
    }

    /// With mTLS and no authorization, let any certificate of the CA
    /// write any endpoint.
    pub fn allow_any_certificate(mut self) -> Self {
        self.any_certificate = true;
        self
    }

    /// Decode request messages of at most `bytes`.
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Set the HTTP/2 keepalive: a PING every `interval` (`None`: never),
    /// the connection closed when one is not answered within `timeout`.
    pub fn with_http2_keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.http2_keepalive_interval = interval;
        self.http2_keepalive_timeout = timeout;
        self
    }

    /// Serve the live dashboard at `/ui` on the health port (see
    /// [`ServeOptions::ui`]).
    pub fn with_ui(mut self, on: bool) -> Self {
        self.ui = on;
        self
    }

    /// Set the TCP keepalive idle time (`None`: off).
    pub fn with_tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.tcp_keepalive = idle;
        self
    }

    /// Check the options as [`serve_with`](super::serve_with) will: the certificate files
    /// load, the authorization settings (and policy file) are valid and
    /// have TLS, mTLS has authorization or allows any certificate, the
    /// keepalive durations are in range (HTTP/2 interval and timeout 10 ms
    /// to 1 h, TCP keepalive 1 s to 1 h).
    ///
    /// A certificate file that does not exist yet is not an error here
    /// (everything else is checked): [`Opening::serve`](super::Opening::serve)
    /// waits for it, not ready, as a sidecar such as SPIRE's helper writes
    /// the files after the registrar starts; [`serve_with`](super::serve_with)
    /// fails at once. Files that exist must load.
    pub fn check(&self) -> Result<()> {
        let cluster = waypost::Endpoint::DEFAULT_CLUSTER;
        if self.missing_tls_files().is_empty() {
            security(self, cluster).map(drop)
        } else {
            settings(self, cluster).map(drop)
        }
    }

    /// The TLS files (CA bundle, certificate, private key) that do not
    /// exist, each with what it is: empty without TLS or when all exist.
    pub fn missing_tls_files(&self) -> Vec<(&'static str, &std::path::Path)> {
        let Some(files) = &self.tls else {
            return Vec::new();
        };
        let mut all = vec![("CA bundle", files.ca.as_path())];
        if let Some((cert, key)) = &files.identity {
            all.push(("certificate", cert.as_path()));
            all.push(("private key", key.as_path()));
        }
        all.retain(|(_, path)| !path.exists());
        all
    }

    /// Refuse plaintext on `listener` unless it is a loopback address or
    /// `insecure` was given.
    pub(super) fn check_listener(&self, listener: &TcpListener) -> Result<()> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::unavailable(format!("the gRPC listener: {e}")).with_source(e))?;
        if self.tls.is_none() && !self.insecure && !addr.ip().is_loopback() {
            return Err(Error::invalid(
                "grpc_addr",
                format!(
                    "plaintext gRPC on {addr}, which is not a loopback address: anyone who \
                     can reach it could write any endpoint. Give TLS certificates \
                     (--tls-ca, --tls-cert, --tls-key), listen on 127.0.0.1 or [::1], or \
                     accept the risk with --insecure"
                ),
            ));
        }
        Ok(())
    }

    /// Refuse a plaintext listener of a field protocol (the HTTP API,
    /// DNS, xDS without TLS) at `addr` on a non-loopback address unless
    /// `insecure` was given: it `exposes` (shows every endpoint, lets
    /// anyone write) to anyone who can reach it, whatever the gRPC port's
    /// authorization says.
    #[cfg_attr(
        not(any(feature = "http-api", feature = "dns", feature = "xds")),
        allow(dead_code)
    )]
    pub(super) fn check_plaintext(
        &self,
        addr: std::io::Result<std::net::SocketAddr>,
        field: &'static str,
        what: &str,
        exposes: &str,
    ) -> Result<()> {
        let addr = addr
            .map_err(|e| Error::unavailable(format!("the {what} listener: {e}")).with_source(e))?;
        if !self.insecure && !addr.ip().is_loopback() {
            return Err(Error::invalid(
                field,
                format!(
                    "{what} on {addr}, which is not a loopback address: it is plaintext and \
                     {exposes} to anyone who can reach it, without the gRPC \
                     port's authorization. Listen on 127.0.0.1 or [::1], or accept it \
                     with --insecure"
                ),
            ));
        }
        Ok(())
    }

    fn check_keepalive(&self) -> Result<()> {
        let hour = Duration::from_secs(3600);
        let ms10 = Duration::from_millis(10);
        if let Some(d) = self.http2_keepalive_interval {
            check_duration("http2_keepalive_interval", d, ms10, hour)?;
        }
        check_duration(
            "http2_keepalive_timeout",
            self.http2_keepalive_timeout,
            ms10,
            hour,
        )?;
        if let Some(d) = self.tcp_keepalive {
            check_duration("tcp_keepalive", d, Duration::from_secs(1), hour)?;
        }
        Ok(())
    }
}

/// How the gRPC port is secured: checked [`ServeOptions`].
pub(super) struct Secured {
    pub(super) security: auth::Security,
    pub(super) acceptor: Option<tokio_rustls::TlsAcceptor>,
    /// The same certificates for HTTP/1.1 (the HTTP API's ALPN).
    #[cfg_attr(not(feature = "http-api"), allow(dead_code))]
    pub(super) http_acceptor: Option<tokio_rustls::TlsAcceptor>,
    pub(super) options: ServeOptions,
}

/// Check the options, load the certificate files and log what the gRPC
/// port will do; `cluster` is what `{cluster}` stands for in the
/// authorization policy.
pub(super) fn security(options: &ServeOptions, cluster: &str) -> Result<Secured> {
    let authz = settings(options, cluster)?;
    let (tls, http_tls) = match &options.tls {
        Some(files) => {
            let cfg = waypost_registrar_client::tls::server_config(files)?;
            let mut http = cfg.clone();
            http.alpn_protocols = vec![b"http/1.1".to_vec()];
            (
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(cfg))),
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(http))),
            )
        }
        None => (None, None),
    };
    let security = auth::Security {
        tls: tls.is_some(),
        authz,
    };
    Ok(Secured {
        security,
        acceptor: tls,
        http_acceptor: http_tls,
        options: options.clone(),
    })
}

/// Everything [`security`] checks but the certificate files themselves:
/// the keepalive durations, the authorization settings and policy file,
/// and that TLS and authorization go together; logs what the gRPC port
/// will do.
pub(super) fn settings(options: &ServeOptions, cluster: &str) -> Result<Option<auth::Authz>> {
    options.check_keepalive()?;
    let authz = options
        .authz
        .as_ref()
        .map(|a| auth::Authz::new(a, cluster))
        .transpose()?;
    match (&options.tls, &options.authz) {
        (None, None) => tracing::warn!(
            "no certificates configured: serving plaintext gRPC without authentication"
        ),
        (None, Some(_)) => {
            return Err(Error::invalid(
                "authz",
                "authorization by SPIFFE ID needs TLS certificates",
            ))
        }
        (Some(_), None) if !options.any_certificate => {
            return Err(Error::invalid(
                "authz",
                "mTLS without authorization would let any certificate of the CA write any \
                 endpoint: give a trust domain (--trust-domain, and optionally \
                 --authz-policy), or allow it explicitly (--allow-any-certificate)",
            ))
        }
        (Some(files), None) => tracing::warn!(
            ca = %files.ca.display(),
            "mTLS without a trust domain: any certificate of the CA may write any endpoint"
        ),
        (Some(files), Some(a)) => tracing::info!(
            ca = %files.ca.display(),
            trust_domain = %a.trust_domain,
            policy = ?a.policy_file,
            "mTLS with authorization by SPIFFE ID"
        ),
    }
    Ok(authz)
}
