//! [`Keyspace`]: what one registry shares with its clones and watch
//! streams (the client, settings, key layout and lease bookkeeping):
//! connecting it, and running a request with the request timeout; and
//! [`Nodes`], that bookkeeping. The requests on the endpoint keys are in
//! [`crate::endpoints`], the leases of the nodes in [`crate::leases`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Error as EtcdError, GetOptions};
use tokio::sync::Mutex;
use tracing::info;
use waypost::{Endpoint, EndpointKey, Error, Result};

use crate::config::EtcdConfig;
use crate::error;
use crate::layout::Layout;

/// The client, settings, key layout and lease bookkeeping of one registry
/// (shared by its clones and watch streams).
pub(crate) struct Keyspace {
    pub(crate) client: Client,
    pub(crate) cfg: EtcdConfig,
    pub(crate) layout: Layout,
    pub(crate) nodes: Mutex<Nodes>,
}

/// What this registry wrote for each node, so that it can write it again
/// under a new lease.
#[derive(Default)]
pub(crate) struct Nodes {
    pub(crate) by_node: HashMap<String, NodeState>,
    pub(crate) owner: HashMap<EndpointKey, String>,
}

pub(crate) struct NodeState {
    pub(crate) lease: Option<i64>,
    pub(crate) endpoints: BTreeMap<EndpointKey, Endpoint>,
    /// Last register or heartbeat for this node.
    pub(crate) last_seen: Instant,
    pub(crate) monitored: bool,
}

impl Nodes {
    pub(crate) fn forget(&mut self, key: &EndpointKey) {
        if let Some(node) = self.owner.remove(key) {
            if let Some(st) = self.by_node.get_mut(&node) {
                st.endpoints.remove(key);
            }
        }
    }

    /// Forget `node`'s lease `id` (etcd no longer has it), unless the node
    /// has moved on to another lease already.
    pub(crate) fn lease_gone(&mut self, node: &str, id: i64) {
        if let Some(st) = self.by_node.get_mut(node) {
            if st.lease == Some(id) {
                st.lease = None;
            }
        }
    }

    pub(crate) fn remember(&mut self, ep: Endpoint) {
        let key = ep.key();
        if self.owner.get(&key).is_some_and(|n| *n != ep.node) {
            self.forget(&key);
        }
        if ep.node.is_empty() {
            return;
        }
        self.owner.insert(key.clone(), ep.node.clone());
        let st = self.state(&ep.node);
        st.last_seen = Instant::now();
        st.endpoints.insert(key, ep);
    }

    pub(crate) fn state(&mut self, node: &str) -> &mut NodeState {
        self.by_node
            .entry(node.to_string())
            .or_insert_with(|| NodeState {
                lease: None,
                endpoints: BTreeMap::new(),
                last_seen: Instant::now(),
                monitored: false,
            })
    }
}

impl Keyspace {
    /// Connect to etcd and check that it answers (see
    /// `EtcdRegistry::connect`).
    pub(crate) async fn connect(cfg: EtcdConfig) -> Result<Arc<Self>> {
        if cfg.endpoints.is_empty() {
            return Err(Error::invalid("endpoints", "no etcd endpoint given"));
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        match (&cfg.user, &cfg.password) {
            (Some(user), Some(password)) => opts = opts.with_user(user, password),
            (Some(_), None) => {
                return Err(Error::invalid(
                    "password",
                    "a user is set without a password",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::invalid("user", "a password is set without a user"))
            }
            (None, None) => {}
        }
        if let Some(tls) = &cfg.tls {
            opts = tls_options(opts, tls)?;
        }
        let what = format!("connect to etcd at {}", cfg.endpoints.join(","));
        let limit = cfg.connect_timeout + cfg.request_timeout;
        let client = timed(limit, Client::connect(&cfg.endpoints, Some(opts)))
            .await
            .map_err(|e| error::map(e, &what))?;
        let layout = Layout::new(cfg.normalized_prefix());
        let keyspace = Arc::new(Keyspace {
            client,
            cfg,
            layout,
            nodes: Mutex::new(Nodes::default()),
        });
        // One cheap read: a wrong address or password fails here, not later.
        let root = keyspace.layout.root().to_string();
        let mut kv = keyspace.client.kv_client();
        keyspace
            .timed(kv.get(
                root.clone(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ))
            .await
            .map_err(|e| error::map(e, format!("{what}: read {root}")))?;
        info!(endpoints = ?keyspace.cfg.endpoints, prefix = %keyspace.cfg.normalized_prefix(), "connected to etcd");
        Ok(keyspace)
    }

    /// Run one etcd request with the request timeout; a timeout is
    /// reported as etcd's `DeadlineExceeded`.
    pub(crate) async fn timed<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, EtcdError>>,
    ) -> std::result::Result<T, EtcdError> {
        timed(self.cfg.request_timeout, fut).await
    }
}

/// Run `fut` for at most `limit`; a timeout is reported as etcd's
/// `DeadlineExceeded`.
pub(crate) async fn timed<T>(
    limit: Duration,
    fut: impl Future<Output = std::result::Result<T, EtcdError>>,
) -> std::result::Result<T, EtcdError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(EtcdError::GRpcStatus(tonic::Status::deadline_exceeded(
            format!("etcd did not answer within {limit:?}"),
        ))),
    }
}

#[cfg(feature = "tls")]
fn tls_options(opts: ConnectOptions, tls: &crate::config::TlsConfig) -> Result<ConnectOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| error::tls_file(field, path, e))
    };
    let mut t = TlsOptions::new();
    if let Some(ca) = &tls.ca_cert {
        t = t.ca_certificate(Certificate::from_pem(read("ca_cert", ca)?));
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            t = t.identity(Identity::from_pem(
                read("client_cert", cert)?,
                read("client_key", key)?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::invalid(
                "tls",
                "client_cert and client_key go together",
            ))
        }
    }
    if let Some(domain) = &tls.domain {
        t = t.domain_name(domain.clone());
    }
    Ok(opts.with_tls(t))
}

#[cfg(not(feature = "tls"))]
fn tls_options(_opts: ConnectOptions, _tls: &crate::config::TlsConfig) -> Result<ConnectOptions> {
    Err(Error::invalid(
        "tls",
        "this build of waypost-etcd has no TLS support (enable the crate feature `tls`)",
    ))
}
