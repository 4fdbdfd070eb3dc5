//! [`Keyspace`]: what one registry shares with its clones and watch
//! streams (the client, settings, key layout and lease bookkeeping), and
//! [`Nodes`], that bookkeeping. Its requests are in [`crate::shared`], its
//! leases in [`crate::leases`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{Client, Error as EtcdError};
use tokio::sync::Mutex;
use waypost::{Endpoint, EndpointKey};

use crate::config::EtcdConfig;
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
