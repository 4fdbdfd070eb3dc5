//! The connection flags, each on the side it belongs to: the client
//! commands' `--address` and TLS files ([`ClientArgs`]), `serve`'s TLS
//! files ([`ServerTlsArgs`]), and the client flags also accepted before
//! the command name ([`EarlyClientArgs`], hidden).

use std::path::PathBuf;

use waypost_registrar_server::TlsFiles;

/// The registrar's address when none is given.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9443";

/// How a client command reaches the registrar.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "Connection")]
pub struct ClientArgs {
    /// The registrar: `HOST:PORT` or a URL [default: 127.0.0.1:9443].
    /// Without a scheme, `http://` is used, or `https://` when --tls-ca
    /// is given.
    #[arg(long, env = "REGISTRAR_ADDRESS")]
    pub address: Option<String>,
    /// The CA bundle (PEM) that signed the registrar's certificate: connect
    /// with TLS.
    #[arg(long, env = "REGISTRAR_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This operator's certificate chain (PEM), for a registrar that
    /// requires client certificates (mTLS); its SPIFFE ID decides what it
    /// may write. Needs --tls-ca and --tls-key.
    #[arg(long, env = "REGISTRAR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "REGISTRAR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ClientArgs {
    /// These flags, each one not given here taken from `early` (the same
    /// flags before the command name).
    pub fn or(&self, early: &EarlyClientArgs) -> ClientArgs {
        ClientArgs {
            address: early.address.clone().or_else(|| self.address.clone()),
            tls_ca: early.tls_ca.clone().or_else(|| self.tls_ca.clone()),
            tls_cert: early.tls_cert.clone().or_else(|| self.tls_cert.clone()),
            tls_key: early.tls_key.clone().or_else(|| self.tls_key.clone()),
        }
    }

    /// Whether any TLS flag was given.
    pub fn tls(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_key.is_some()
    }

    /// `--address` as a URL: `http://` prepended when it has no scheme
    /// (`https://` when a TLS flag is given).
    pub fn url(&self) -> String {
        with_scheme(
            self.address.as_deref().unwrap_or(DEFAULT_ADDRESS),
            self.tls(),
        )
    }

    /// The TLS files: a CA bundle, and a certificate and key when given.
    pub fn files(&self) -> Result<Option<TlsFiles>, String> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles::new(ca, cert, key))),
            (Some(ca), None, None) => Ok(Some(TlsFiles::ca_only(ca))),
            _ => Err("--tls-cert and --tls-key need --tls-ca (the registrar's CA)".to_string()),
        }
    }
}

/// The client flags before the command name (`registrar --address X ls`):
/// hidden, and refused for `serve`. Given
/// here they win over the command's own (and their environment
/// variables).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EarlyClientArgs {
    /// See the client commands' --address.
    #[arg(long, hide = true)]
    pub address: Option<String>,
    /// See the client commands' --tls-ca.
    #[arg(long, hide = true)]
    pub tls_ca: Option<PathBuf>,
    /// See the client commands' --tls-cert.
    #[arg(long, hide = true)]
    pub tls_cert: Option<PathBuf>,
    /// See the client commands' --tls-key.
    #[arg(long, hide = true)]
    pub tls_key: Option<PathBuf>,
}

impl EarlyClientArgs {
    /// The first flag given, for the message refusing it with `serve`.
    pub fn first_given(&self) -> Option<&'static str> {
        if self.address.is_some() {
            Some("--address")
        } else if self.tls_ca.is_some() {
            Some("--tls-ca")
        } else if self.tls_cert.is_some() {
            Some("--tls-cert")
        } else if self.tls_key.is_some() {
            Some("--tls-key")
        } else {
            None
        }
    }
}

/// `serve`'s TLS: all three files or none (plaintext).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "TLS (all three or none; re-read when they change)")]
pub struct ServerTlsArgs {
    /// The CA bundle (PEM) that signed the agents' and operators' client
    /// certificates: with it, every client must present one (mTLS).
    #[arg(long, env = "REGISTRAR_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// The registrar's certificate chain (PEM), presented to clients.
    #[arg(long, env = "REGISTRAR_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "REGISTRAR_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

impl ServerTlsArgs {
    /// All three files or none.
    pub fn files(&self) -> Result<Option<TlsFiles>, String> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles::new(ca, cert, key))),
            _ => Err("serve needs all of --tls-ca, --tls-cert and --tls-key, or none".to_string()),
        }
    }
}

/// `address` with a scheme: unchanged when it has one.
pub fn with_scheme(address: &str, tls: bool) -> String {
    if address.contains("://") {
        address.to_string()
    } else if tls {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}
