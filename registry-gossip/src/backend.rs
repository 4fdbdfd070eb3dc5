//! [`GossipRegistry`]: the tokio UDP driver around [`Machine`], and the
//! registry traits on top of its local replica.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use registry_api::{
    backend::{validate_ops, Hub},
    Batch, Capabilities, Endpoint, EndpointKey, Event, EventStream, Heartbeat, Op, Registry,
    Result, Snapshot, Version, Watch,
};
use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::GossipConfig;
use crate::crdt::{Change, NodeId};
use crate::error;
use crate::machine::{Machine, Stats};

/// A registry node gossiping over UDP.
///
/// Every node holds the full replica: reads are local, writes apply locally
/// at once and spread by SWIM broadcasts (each `ceil(log2 N) + 1` times) and
/// periodic anti-entropy. The cluster is eventually consistent: another
/// node sees a write after it was gossiped to it. Entries of a node SWIM
/// declares down are tombstoned on every survivor.
///
/// Dropping the registry stops its tasks without telling anyone (as a
/// crash would); [`GossipRegistry::leave`] leaves gracefully first.
pub struct GossipRegistry {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

struct Inner {
    state: Mutex<DriverState>,
    hub: Arc<Hub>,
    socket: Arc<UdpSocket>,
    addr: SocketAddr,
    node: NodeId,
    epoch: Instant,
    wake: Arc<Notify>,
    max_batch: usize,
    send_errors: AtomicU64,
}

struct DriverState {
    machine: Machine,
    version: Version,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, DriverState> {
        // The machine is only mutated inside `step`, which completes
        // before the lock is released.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Run one machine step, then publish its changes and send its
    /// datagrams, all under the lock so events keep the machine's order.
    fn step<T>(&self, f: impl FnOnce(&mut Machine, Duration) -> T) -> T {
        let now = self.now();
        let mut st = self.lock();
        let before = st.machine.next_deadline();
        let out = f(&mut st.machine, now);
        let after = st.machine.next_deadline();
        let changes = st.machine.take_changes();
        if !changes.is_empty() {
            let events = to_events(&mut st.version, changes);
            self.hub.publish(events);
        }
        for (to, packet) in st.machine.take_outbox() {
            if let Err(e) = self.socket.try_send_to(&packet, to) {
                // UDP is lossy anyway; SWIM and anti-entropy retry.
                self.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(%to, error = %e, "send failed");
            }
        }
        drop(st);
        // Wake the timer task only when the next deadline moved earlier
        // (waking it on every step would make it spin).
        let earlier = match (before, after) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(b), Some(a)) => a < b,
        };
        if earlier {
            self.wake.notify_one();
        }
        out
    }
}

fn to_events(version: &mut Version, changes: Vec<Change>) -> Vec<Event> {
    changes
        .into_iter()
        .filter_map(|c| {
            let next = version.next();
            let ev = match (c.before, c.after) {
                (None, Some(endpoint)) => Event::Added {
                    version: next,
                    endpoint,
                },
                (Some(_), Some(endpoint)) => Event::Updated {
                    version: next,
                    endpoint,
                },
                (Some(_), None) => Event::Removed {
                    version: next,
                    key: c.key,
                },
                (None, None) => return None,
            };
            *version = next;
            Some(ev)
        })
        .collect()
}

impl GossipRegistry {
    /// Bind the UDP socket, start the node and announce it to every seed.
    /// Returns once the socket is bound; joining goes on in the background
    /// (see [`GossipRegistry::members`]).
    pub async fn start(config: GossipConfig) -> Result<GossipRegistry> {
        let socket = UdpSocket::bind(config.bind)
            .await
            .map_err(|e| error::socket(config.bind, e))?;
        let addr = socket
            .local_addr()
            .map_err(|e| error::socket(config.bind, e))?;
        let node = NodeId::new(
            config
                .node_name
                .clone()
                .unwrap_or_else(|| format!("gossip-{addr}")),
        );
        let seed = config.rng_seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ u64::from(addr.port()).rotate_left(48)
        });
        let machine = Machine::new(&config, addr, node.clone(), seed, Duration::ZERO)?;
        let inner = Arc::new(Inner {
            state: Mutex::new(DriverState {
                machine,
                version: Version::ZERO,
            }),
            hub: Arc::new(Hub::new(config.watch_buffer, config.watch_history)),
            socket: Arc::new(socket),
            addr,
            node,
            epoch: Instant::now(),
            wake: Arc::new(Notify::new()),
            max_batch: config.max_batch.max(1),
            send_errors: AtomicU64::new(0),
        });
        tracing::info!(%addr, node = %inner.node, seeds = ?config.seeds, "gossip node started");
        for seed in &config.seeds {
            inner.step(|m, now| m.join(*seed, now));
        }
        let tasks = vec![
            tokio::spawn(recv_loop(Arc::downgrade(&inner), inner.socket.clone())),
            tokio::spawn(timer_loop(Arc::downgrade(&inner), inner.wake.clone())),
        ];
        Ok(GossipRegistry { inner, tasks })
    }

    /// The bound UDP address (other nodes use it as a seed).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// This node's name.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.node
    }

    /// Addresses of the other live members.
    pub fn members(&self) -> Vec<SocketAddr> {
        let st = self.inner.lock();
        st.machine.members().into_iter().map(|m| m.addr).collect()
    }

    /// Protocol counters (datagrams, authentication failures, GC, …).
    pub fn stats(&self) -> Stats {
        self.inner.lock().machine.stats()
    }

    /// Datagrams the socket refused to send.
    pub fn send_errors(&self) -> u64 {
        self.inner.send_errors.load(Ordering::Relaxed)
    }

    /// Announce this node to `seed` (joining after start).
    pub fn join(&self, seed: SocketAddr) {
        self.inner.step(|m, now| m.join(seed, now));
    }

    pub(crate) fn hub(&self) -> Arc<Hub> {
        self.inner.hub.clone()
    }

    /// Run `f` on the state machine (for tests and diagnostics).
    pub fn with_machine<T>(&self, f: impl FnOnce(&Machine) -> T) -> T {
        f(&self.inner.lock().machine)
    }

    /// Leave the cluster gracefully, then stop: the other members declare
    /// this node down at once and tombstone its entries.
    pub async fn leave(mut self) {
        self.inner.step(|m, now| m.leave(now));
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

async fn recv_loop(inner: Weak<Inner>, socket: Arc<UdpSocket>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(v) => v,
            Err(e) => {
                // E.g. an ICMP port-unreachable reported on the next read.
                tracing::trace!(error = %e, "recv failed");
                tokio::task::yield_now().await;
                continue;
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        let data = &buf[..n];
        inner.step(|m, now| m.handle_datagram(from, data, now));
    }
}

async fn timer_loop(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let deadline = {
            let Some(inner) = inner.upgrade() else { return };
            let next = inner.lock().machine.next_deadline();
            next.map(|d| inner.epoch + d)
        };
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {}
            _ = wake.notified() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        inner.step(|m, now| m.tick(now));
    }
}

impl fmt::Display for GossipRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gossip({})", self.inner.addr)
    }
}

impl fmt::Debug for GossipRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("GossipRegistry")
            .field("addr", &self.inner.addr)
            .field("node", &self.inner.node)
            .field("machine", &st.machine)
            .field("version", &st.version)
            .finish()
    }
}

#[async_trait]
impl Registry for GossipRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        self.inner.step(|m, now| m.register(endpoint, now))
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.inner.step(|m, now| m.deregister(key, now));
        Ok(())
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        Ok(self.inner.hub.current().list(service))
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot::clone(&self.inner.hub.current()))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(true)
            .with_resumable_watch(true)
            // Applied locally under one lock, but other nodes receive the
            // ops as separate broadcasts: not atomic across the cluster.
            .with_atomic_writes(false)
            .with_max_batch(self.inner.max_batch)
            .with_native_liveness(true)
    }
}

impl Watch for GossipRegistry {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.inner.hub.subscribe(from)
    }
}

#[async_trait]
impl Batch for GossipRegistry {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        if ops.len() > self.inner.max_batch {
            return Err(error::batch_too_large(ops.len(), self.inner.max_batch));
        }
        self.inner.step(|m, now| m.apply(ops, now))
    }
}

#[async_trait]
impl Heartbeat for GossipRegistry {
    /// SWIM is the liveness signal: this succeeds for this node and for
    /// every live member, and for a node that owns an endpoint here (the
    /// `node` of an endpoint; its endpoints live as long as the member that
    /// wrote them). Any other node is `NotFound` (the rule of
    /// `registry_api::Heartbeat`): it should register again.
    async fn heartbeat(&self, node: &str) -> Result<()> {
        let member = self
            .inner
            .lock()
            .machine
            .is_member(&NodeId::new(node.to_string()));
        let known = member || self.inner.hub.current().iter().any(|e| e.node == node);
        if known {
            Ok(())
        } else {
            Err(error::unknown_node(node))
        }
    }
}

/// GossipRegistry implements all four traits: [`registry_api::stack::stack`] wraps it as its capabilities call
/// for.
impl registry_api::stack::IntoStack for GossipRegistry {
    fn into_stack(
        self,
        cfg: &registry_api::stack::StackConfig,
    ) -> registry_api::Result<std::sync::Arc<dyn registry_api::stack::Stack>> {
        registry_api::stack::full(self, cfg)
    }
}
