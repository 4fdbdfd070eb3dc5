//! [`GossipRegistry`]: a gossip node as a registry. The node itself (the
//! socket, the state machine, the hub) is [`crate::driver::Driver`]; this
//! module holds the public handle and the registry traits, which read the
//! local replica and step the machine.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use waypost::{
    backend::{validate_ops, Hub},
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Heartbeat, Op, Registry, Result,
    Snapshot, Version, Watch,
};

use crate::config::GossipConfig;
use crate::crdt::NodeId;
use crate::driver::Driver;
use crate::error;
use crate::machine::{Machine, Stats};

/// A registry node gossiping over UDP.
///
/// Every node holds the full replica: reads are local, writes apply locally
/// at once and spread by SWIM broadcasts (each `2·ceil(log2 N) + 1` times) and
/// periodic anti-entropy. The cluster is eventually consistent: another
/// node sees a write after it was gossiped to it. Entries of a node SWIM
/// declares down are tombstoned on every survivor.
///
/// Dropping the registry stops its tasks without telling anyone (as a
/// crash would); [`GossipRegistry::leave`] leaves gracefully first.
pub struct GossipRegistry {
    driver: Arc<Driver>,
    tasks: Vec<JoinHandle<()>>,
}

impl GossipRegistry {
    /// Bind the UDP socket, start the node and announce it to every seed.
    /// Returns once the socket is bound; joining goes on in the background
    /// (see [`GossipRegistry::members`]).
    pub async fn start(config: GossipConfig) -> Result<GossipRegistry> {
        let (driver, tasks) = Driver::start(config).await?;
        Ok(GossipRegistry { driver, tasks })
    }

    /// The bound UDP address (other nodes use it as a seed).
    pub fn local_addr(&self) -> SocketAddr {
        self.driver.addr
    }

    /// This node's name.
    pub fn node_id(&self) -> &NodeId {
        &self.driver.node
    }

    /// Addresses of the other live members.
    pub fn members(&self) -> Vec<SocketAddr> {
        let st = self.driver.lock();
        st.machine.members().into_iter().map(|m| m.addr).collect()
    }

    /// Protocol counters (datagrams, authentication failures, GC, …).
    pub fn stats(&self) -> Stats {
        self.driver.lock().machine.stats()
    }

    /// Datagrams the socket refused to send.
    pub fn send_errors(&self) -> u64 {
        self.driver.send_errors()
    }

    /// Announce this node to `seed` (joining after start).
    pub fn join(&self, seed: SocketAddr) {
        self.driver.step(|m, now| m.join(seed, now));
    }

    pub(crate) fn hub(&self) -> Arc<Hub> {
        self.driver.hub.clone()
    }

    /// Run `f` on the state machine (for tests and diagnostics).
    pub fn with_machine<T>(&self, f: impl FnOnce(&Machine) -> T) -> T {
        f(&self.driver.lock().machine)
    }

    /// Leave the cluster gracefully, then stop: the other members declare
    /// this node down at once and tombstone its entries.
    pub async fn leave(mut self) {
        self.driver.step(|m, now| m.leave(now));
        // Give the goodbye datagrams a moment to leave the socket.
        tokio::task::yield_now().await;
        self.stop_tasks();
    }

    fn stop_tasks(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for GossipRegistry {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

impl fmt::Display for GossipRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gossip({})", self.driver.addr)
    }
}

impl fmt::Debug for GossipRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.driver.lock();
        f.debug_struct("GossipRegistry")
            .field("addr", &self.driver.addr)
            .field("node", &self.driver.node)
            .field("machine", &st.machine)
            .field("version", &st.version)
            .finish()
    }
}

#[async_trait]
impl Registry for GossipRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        self.driver.step(|m, now| m.register(endpoint, now))
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.driver.step(|m, now| m.deregister(key, now));
        Ok(())
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        Ok(self.driver.hub.current().list(service))
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot::clone(&self.driver.hub.current()))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            // Applied locally under one lock, but other nodes receive the
            // ops as separate broadcasts: not atomic across the cluster.
            .with_atomic_writes(false)
            .with_max_batch(self.driver.max_batch)
            .with_native_liveness(true)
    }
}

impl Watch for GossipRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.driver.hub.subscribe(from)
    }
}

#[async_trait]
impl Batch for GossipRegistry {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        if ops.len() > self.driver.max_batch {
            return Err(error::batch_too_large(ops.len(), self.driver.max_batch));
        }
        self.driver.step(|m, now| m.apply(ops, now))
    }
}

#[async_trait]
impl Heartbeat for GossipRegistry {
    /// SWIM is the liveness signal: this succeeds for this node and for
    /// every live member, and for a node that owns an endpoint here (the
    /// `node` of an endpoint; its endpoints live as long as the member that
    /// wrote them). Any other node is `NotFound` (the rule of
    /// `waypost::Heartbeat`): it should register again.
    async fn heartbeat(&self, node: &str) -> Result<()> {
        let member = self
            .driver
            .lock()
            .machine
            .is_member(&NodeId::new(node.to_string()));
        let known = member || self.driver.hub.current().iter().any(|e| e.node == node);
        if known {
            Ok(())
        } else {
            Err(error::unknown_node(node))
        }
    }
}

/// GossipRegistry implements all four traits: [`waypost::stack::stack`]
/// wraps it as its capabilities call for.
impl waypost::stack::IntoStack for GossipRegistry {
    fn into_stack(
        self,
        cfg: &waypost::stack::StackConfig,
    ) -> waypost::Result<std::sync::Arc<dyn waypost::stack::Stack>> {
        waypost::stack::by_capabilities(self, cfg)
    }
}
