//! Leases: what this registry wrote for each node, and the etcd lease its
//! keys hang on. A node's keys are written under its lease; when the lease
//! is gone (revoked, or expired while etcd was unreachable) although the
//! node is alive, a new one is granted and the keys are written again.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use etcd_client::{PutOptions, Txn, TxnOp};
use tokio::sync::MutexGuard;
use tracing::{debug, info, warn};
use waypost::{Endpoint, Error, Result};

use crate::error;
use crate::keyspace::{Keyspace, Nodes};
use crate::layout;

/// The lease currently attached to `node`'s endpoints, if any.
pub(crate) async fn lease_of(keyspace: &Keyspace, node: &str) -> Option<i64> {
    keyspace
        .nodes
        .lock()
        .await
        .by_node
        .get(node)
        .and_then(|s| s.lease)
}

/// The lease of `node`, granted (and the node's endpoints written again
/// under it) when it has none.
pub(crate) async fn ensure_lease(keyspace: &Arc<Keyspace>, node: &str) -> Result<i64> {
    let mut nodes = keyspace.nodes.lock().await;
    if let Some(id) = nodes.by_node.get(node).and_then(|s| s.lease) {
        return Ok(id);
    }
    regrant(keyspace, &mut nodes, node).await
}

/// Grant a new lease for `node` and write every endpoint we hold for it
/// under that lease.
async fn regrant(
    keyspace: &Arc<Keyspace>,
    nodes: &mut MutexGuard<'_, Nodes>,
    node: &str,
) -> Result<i64> {
    let ttl = keyspace.cfg.lease_ttl_secs();
    let mut lease = keyspace.client.lease_client();
    let grant = keyspace
        .timed(lease.grant(ttl, None))
        .await
        .map_err(|e| error::map(e, format!("grant a lease for node {node}")))?;
    let id = grant.id();
    let st = nodes.state(node);
    st.lease = Some(id);
    let endpoints: Vec<Endpoint> = st.endpoints.values().cloned().collect();
    let spawn_monitor = !st.monitored;
    st.monitored = true;
    if spawn_monitor {
        tokio::spawn(monitor(Arc::downgrade(keyspace), node.to_string()));
    }
    info!(
        node,
        lease = format!("{id:x}"),
        ttl,
        endpoints = endpoints.len(),
        "granted lease"
    );
    for chunk in endpoints.chunks(keyspace.cfg.max_batch.max(1)) {
        let mut ops = Vec::with_capacity(chunk.len());
        for ep in chunk {
            let value = layout::encode(ep)?;
            ops.push(TxnOp::put(
                keyspace.layout.key(&ep.key()),
                value,
                Some(PutOptions::new().with_lease(id)),
            ));
        }
        let mut kv = keyspace.client.kv_client();
        keyspace
            .timed(kv.txn(Txn::new().and_then(ops)))
            .await
            .map_err(|e| {
                error::map(
                    e,
                    format!("write the endpoints of node {node} under lease {id:x}"),
                )
            })?;
    }
    Ok(id)
}

/// One keep-alive for `node`'s lease, granting a new lease when it is
/// gone while the node was alive.
///
/// `NotFound` (the rule of `waypost::Heartbeat`: the node should
/// register again) for a node that owns no endpoint through this
/// registry, and for one whose lease expired because it was silent for
/// longer than the TTL: etcd removed its endpoints, as liveness does.
pub(crate) async fn keep_alive(keyspace: &Arc<Keyspace>, node: &str) -> Result<()> {
    let unknown = |why: &str| {
        Error::not_found(format!(
            "node {node:?}: {why}; register its endpoints again"
        ))
    };
    let mut nodes = keyspace.nodes.lock().await;
    let Some(st) = nodes
        .by_node
        .get_mut(node)
        .filter(|st| !st.endpoints.is_empty())
    else {
        debug!(node, "heartbeat from a node without endpoints here");
        return Err(unknown("no endpoint of this node is registered here"));
    };
    let silent = st.last_seen.elapsed();
    st.last_seen = Instant::now();
    match st.lease {
        Some(id) => {
            let mut lease = keyspace.client.lease_client();
            match keyspace.timed(lease.keep_alive(id)).await {
                Ok(_) => Ok(()),
                Err(e) if error::is_lease_not_found(&e) && silent > keyspace.cfg.lease_ttl => {
                    // Silent past the TTL: etcd expired the lease and
                    // deleted the endpoints. Forget them rather than
                    // write them again behind the node's back.
                    info!(
                        node,
                        lease = format!("{id:x}"),
                        silent_ms = silent.as_millis() as u64,
                        "lease expired after the node went silent"
                    );
                    if let Some(st) = nodes.by_node.remove(node) {
                        for key in st.endpoints.keys() {
                            nodes.owner.remove(key);
                        }
                    }
                    Err(unknown(
                        "its lease expired after it went silent for longer than the TTL",
                    ))
                }
                Err(e) if error::is_lease_not_found(&e) => {
                    warn!(
                        node,
                        lease = format!("{id:x}"),
                        "lease lost; granting a new one"
                    );
                    regrant(keyspace, &mut nodes, node).await.map(drop)
                }
                Err(e) => Err(error::map(
                    e,
                    format!("keep-alive of lease {id:x} of node {node}"),
                )),
            }
        }
        None => regrant(keyspace, &mut nodes, node).await.map(drop),
    }
}

/// Watch over one node's lease while the node is alive: when the lease
/// disappears (revoked, or expired while etcd was unreachable) although the
/// node heartbeats, grant a new one and write its endpoints again. Ends
/// when the registry is dropped.
fn monitor(keyspace: Weak<Keyspace>, node: String) -> futures::future::BoxFuture<'static, ()> {
    // Boxed with an explicit type: `regrant` spawns this, and this calls
    // `regrant`, a cycle the compiler cannot prove `Send` through otherwise.
    Box::pin(async move {
        loop {
            let (every, alive_for) = match keyspace.upgrade() {
                Some(i) => {
                    let ttl = i.cfg.lease_ttl.max(Duration::from_secs(1));
                    ((ttl / 3).max(Duration::from_millis(200)), ttl * 3 / 4)
                }
                None => return,
            };
            tokio::time::sleep(every).await;
            let Some(keyspace) = keyspace.upgrade() else {
                return;
            };
            let mut nodes = keyspace.nodes.lock().await;
            let Some(st) = nodes.by_node.get(&node) else {
                continue;
            };
            if st.endpoints.is_empty() || st.last_seen.elapsed() > alive_for {
                // Nothing to protect, or the node went silent: let it expire.
                continue;
            }
            let lost = match st.lease {
                None => true,
                Some(id) => {
                    let mut lease = keyspace.client.lease_client();
                    match keyspace.timed(lease.time_to_live(id, None)).await {
                        Ok(r) => r.ttl() <= 0,
                        Err(e) => {
                            debug!(node, error = %e, "cannot check the lease");
                            false
                        }
                    }
                }
            };
            if lost {
                warn!(node, "lease of a live node is gone; granting a new one");
                if let Err(e) = regrant(&keyspace, &mut nodes, &node).await {
                    warn!(node, error = %e, "could not restore the node's endpoints; will retry");
                    if let Some(st) = nodes.by_node.get_mut(&node) {
                        st.lease = None;
                    }
                }
            }
        }
    })
}
