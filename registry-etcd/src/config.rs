//! [`EtcdConfig`]: where etcd is, how to talk to it, and how the registry
//! lays out its keys.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Default key prefix: keys are `/registry/services/<service>/<id>`.
/// Earlier releases defaulted to `/aether`: a deployment that relied on it
/// passes that prefix ([`EtcdConfig::with_prefix`]) to keep its keys.
pub const DEFAULT_PREFIX: &str = "/registry";
/// Default time-to-live of a node's lease: 30 s.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Default largest number of operations in one `Txn` (etcd's default
/// `--max-txn-ops`).
pub const DEFAULT_MAX_BATCH: usize = 128;
/// Default largest size of the values written by one `Txn`, in bytes,
/// kept under etcd's default `--max-request-bytes` (1.5 MiB).
pub const DEFAULT_MAX_TXN_BYTES: usize = 1024 * 1024;
/// Default number of keys read per page by `snapshot()` and `list()`.
pub const DEFAULT_PAGE_SIZE: usize = 1000;

/// How to reach etcd and how to use it.
///
/// Every field has a default ([`EtcdConfig::default`] talks to
/// `http://127.0.0.1:2379` with the prefix `/registry`); set fields with the
/// `with_*` methods. `Debug` never shows the password.
///
/// ```
/// use std::time::Duration;
/// use waypost_etcd::EtcdConfig;
/// let cfg = EtcdConfig::new(["http://127.0.0.1:2379"])
///     .with_prefix("/prod")
///     .with_lease_ttl(Duration::from_secs(10))
///     .with_user("registry", "s3cret");
/// assert!(!format!("{cfg:?}").contains("s3cret"));
/// ```
#[non_exhaustive]
#[derive(Clone)]
pub struct EtcdConfig {
    /// etcd client URLs (`http://host:port`, or `https://` with [`TlsConfig`]).
    /// Default: `["http://127.0.0.1:2379"]`.
    pub endpoints: Vec<String>,
    /// Key prefix; keys are `<prefix>/services/<service>/<id>`. A trailing
    /// `/` is ignored. Default: [`DEFAULT_PREFIX`].
    pub prefix: String,
    /// Time-to-live of each node's lease: a node's endpoints are deleted
    /// by etcd this long after its last heartbeat. Whole seconds, at least
    /// 1 s. Default: [`DEFAULT_LEASE_TTL`].
    pub lease_ttl: Duration,
    /// Most ops one `apply` takes (and so in one `Txn`); a bigger batch is
    /// refused with `InvalidInput` naming `ops`. Must not exceed the
    /// server's `--max-txn-ops`. Default: [`DEFAULT_MAX_BATCH`].
    pub max_batch: usize,
    /// Largest total size of keys and values in one `Txn`; a batch over it
    /// is split. Default: [`DEFAULT_MAX_TXN_BYTES`].
    pub max_txn_bytes: usize,
    /// Keys read per page when listing. Default: [`DEFAULT_PAGE_SIZE`].
    pub page_size: usize,
    /// How long to wait for a connection. Default: 5 s.
    pub connect_timeout: Duration,
    /// How long to wait for the answer to one request. Default: 10 s.
    pub request_timeout: Duration,
    /// How often a watch asks etcd for a progress notification, so that it
    /// knows how far it is even when nothing changes. Default: 10 s.
    pub progress_interval: Duration,
    /// User name for etcd authentication. Default: none.
    pub user: Option<String>,
    /// Password for [`EtcdConfig::user`]. Default: none. Never shown by `Debug`.
    pub password: Option<String>,
    /// TLS settings; `None` (the default) connects in plain text.
    pub tls: Option<TlsConfig>,
}

/// TLS settings: PEM files for the CA, and optionally a client identity.
///
/// Needs the crate feature `tls`; without it, connecting with TLS fails
/// with `InvalidInput`.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM file of the CA that signed etcd's certificate.
    pub ca_cert: Option<PathBuf>,
    /// PEM file of the client certificate (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// PEM file of the client's private key (with `client_cert`).
    pub client_key: Option<PathBuf>,
    /// Server name to verify, if not the host of the endpoint URL.
    pub domain: Option<String>,
}

impl TlsConfig {
    /// TLS verifying the server against the CA in `ca_cert` (a PEM file).
    pub fn new(ca_cert: impl Into<PathBuf>) -> Self {
        Self {
            ca_cert: Some(ca_cert.into()),
            ..Self::default()
        }
    }

    /// Authenticate with a client certificate and key (PEM files).
    pub fn with_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some(cert.into());
        self.client_key = Some(key.into());
        self
    }

    /// Verify the server under this name.
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            prefix: DEFAULT_PREFIX.to_string(),
            lease_ttl: DEFAULT_LEASE_TTL,
            max_batch: DEFAULT_MAX_BATCH,
            max_txn_bytes: DEFAULT_MAX_TXN_BYTES,
            page_size: DEFAULT_PAGE_SIZE,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            progress_interval: Duration::from_secs(10),
            user: None,
            password: None,
            tls: None,
        }
    }
}

impl EtcdConfig {
    /// The defaults, talking to `endpoints`.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Set the key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Set the lease time-to-live (rounded up to whole seconds, at least 1 s).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Set the largest number of operations in one `Txn` (at least 1).
    pub fn with_max_batch(mut self, max: usize) -> Self {
        self.max_batch = max.max(1);
        self
    }

    /// Set the largest size of one `Txn` in bytes.
    pub fn with_max_txn_bytes(mut self, max: usize) -> Self {
        self.max_txn_bytes = max.max(1);
        self
    }

    /// Set the number of keys read per page (at least 1).
    pub fn with_page_size(mut self, size: usize) -> Self {
        self.page_size = size.max(1);
        self
    }

    /// Set the connect timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Set the per-request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Set how often an idle watch asks for a progress notification.
    pub fn with_progress_interval(mut self, interval: Duration) -> Self {
        self.progress_interval = interval;
        self
    }

    /// Authenticate as `user` with `password`.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Connect with TLS.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The prefix without a trailing `/`.
    pub(crate) fn normalized_prefix(&self) -> &str {
        self.prefix.trim_end_matches('/')
    }

    /// The lease TTL in whole seconds, at least 1.
    pub(crate) fn lease_ttl_secs(&self) -> i64 {
        let secs = self.lease_ttl.as_secs() + u64::from(self.lease_ttl.subsec_nanos() > 0);
        i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("max_batch", &self.max_batch)
            .field("max_txn_bytes", &self.max_txn_bytes)
            .field("page_size", &self.page_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("progress_interval", &self.progress_interval)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let cfg = EtcdConfig::default().with_user("alice", "hunter2-secret");
        let dbg = format!("{cfg:?}");
        assert!(!dbg.contains("hunter2-secret"), "{dbg}");
        assert!(dbg.contains("alice") && dbg.contains("<hidden>"), "{dbg}");
        let dbg = format!("{:#?}", cfg);
        assert!(!dbg.contains("hunter2-secret"), "{dbg}");
    }

    #[test]
    fn ttl_rounds_up_and_prefix_is_normalized() {
        let cfg = EtcdConfig::default()
            .with_lease_ttl(Duration::from_millis(1500))
            .with_prefix("/x/");
        assert_eq!(cfg.lease_ttl_secs(), 2);
        assert_eq!(cfg.normalized_prefix(), "/x");
        let cfg = cfg.with_lease_ttl(Duration::ZERO);
        assert_eq!(cfg.lease_ttl_secs(), 1);
    }
}
