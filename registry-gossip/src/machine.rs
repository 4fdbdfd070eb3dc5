//! The protocol as a pure, synchronous state machine: foca's SWIM, the LWW
//! replica riding on its custom broadcasts, anti-entropy and tombstone GC.
//!
//! No sockets, no clock, no global randomness: time comes in as a
//! `Duration` since an epoch the caller picks, randomness from a seed, and
//! datagrams go in through [`Machine::handle_datagram`] and out through
//! [`Machine::take_outbox`]. The UDP driver ([`crate::GossipRegistry`]) and
//! the simulation in the tests drive the same code.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use foca::{AccumulatingRuntime, BroadcastHandler, Foca, Invalidates, OwnedNotification, Timer};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use registry_api::{Endpoint, EndpointKey, Op};

use crate::config::GossipConfig;
use crate::crdt::{key_hash, Change, Entry, NodeId, Replica, Stamp};
use crate::error;
use crate::wire::{self, AeMessage, GossipId, Kind, WireCodec, FRAME_HEAD, TAG_LEN};

/// Counters of what the machine did, for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams handed to [`Machine::handle_datagram`].
    pub datagrams_in: u64,
    /// Datagrams produced.
    pub datagrams_out: u64,
    /// Bytes produced.
    pub bytes_out: u64,
    /// Datagrams dropped because their authentication tag was missing or
    /// wrong.
    pub auth_failures: u64,
    /// Datagrams (or broadcast items) dropped because they did not decode.
    pub malformed: u64,
    /// Errors foca reported while handling input (stale or unexpected
    /// messages; no state is lost).
    pub swim_errors: u64,
    /// Anti-entropy digests sent.
    pub digests_sent: u64,
    /// Entries received through anti-entropy that changed the replica.
    pub entries_repaired: u64,
    /// Tombstones garbage-collected.
    pub tombstones_collected: u64,
    /// Death tombstones this node wrote for dead members' entries.
    pub death_tombstones: u64,
    /// Entries re-asserted after this node was (wrongly) declared dead.
    pub reasserted: u64,
    /// Live entries found under this node's name that it does not own (left
    /// by an earlier run of the node) and retracted with a tombstone.
    pub retracted: u64,
}

/// Per-register bookkeeping for tombstone GC.
#[derive(Debug, Clone)]
struct Meta {
    merged_at: Duration,
    sent: u32,
    target: u32,
}

/// The replica plus what this node owns; shared with foca's broadcast
/// handler, which merges entries as they arrive.
#[derive(Debug)]
struct Store {
    replica: Replica,
    meta: HashMap<EndpointKey, Meta>,
    /// Keys this node registered and still asserts, with their value.
    owned: BTreeMap<EndpointKey, Endpoint>,
    /// Keys whose register was replaced since the last reconcile.
    touched: Vec<EndpointKey>,
    changes: Vec<Change>,
    now: Duration,
    target: u32,
}

impl Store {
    fn merge(&mut self, entry: Entry, disseminated: bool) -> bool {
        let key = entry.key.clone();
        let (replaced, change) = self.replica.merge(entry);
        if replaced {
            let target = self.target;
            self.meta.insert(
                key.clone(),
                Meta {
                    merged_at: self.now,
                    sent: if disseminated { target } else { 0 },
                    target,
                },
            );
            self.touched.push(key);
        }
        if let Some(c) = change {
            self.changes.push(c);
        }
        replaced
    }
}

fn lock(store: &Mutex<Store>) -> MutexGuard<'_, Store> {
    // Every store mutation completes before the lock is released.
    store.lock().unwrap_or_else(|p| p.into_inner())
}

/// foca's broadcast handler: decodes an entry, merges it, and asks foca to
/// keep disseminating it only when it was news.
struct Handler {
    store: Arc<Mutex<Store>>,
}

/// The key foca dedupes broadcasts by: a newer entry for the same endpoint
/// key replaces an older one still in the backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BroadcastKey(EndpointKey);

impl Invalidates for BroadcastKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl BroadcastHandler<GossipId> for Handler {
    type Key = BroadcastKey;
    type Error = wire::DecodeError;

    fn receive_item(
        &mut self,
        data: &[u8],
        _sender: Option<&GossipId>,
    ) -> Result<Option<BroadcastKey>, wire::DecodeError> {
        let entry = wire::decode_entry(data)?;
        let key = entry.key.clone();
        Ok(lock(&self.store)
            .merge(entry, false)
            .then_some(BroadcastKey(key)))
    }
}

#[derive(Debug)]
enum Tick {
    Swim(Timer<GossipId>),
    AntiEntropy,
    Gc,
    Rejoin,
}

#[derive(Debug)]
struct Scheduled {
    at: Duration,
    seq: u64,
    tick: Tick,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// How many times each broadcast is sent in a cluster of `n` nodes:
/// `ceil(log2(n)) + 1`.
pub fn dissemination_count(n: usize) -> u32 {
    let n = n.max(1);
    (usize::BITS - (n - 1).leading_zeros()) + 1
}

/// Settings the machine keeps from [`GossipConfig`].
#[derive(Debug, Clone)]
struct Settings {
    key: Option<Vec<u8>>,
    max_packet: usize,
    ae_interval: Duration,
    ae_budget: usize,
    ttl: Duration,
    gc_every: Duration,
    rejoin_every: Duration,
    /// Largest encoded entry sent as a SWIM broadcast; bigger ones travel
    /// by anti-entropy only.
    max_broadcast: usize,
}

/// One gossip node's protocol state. See the module docs.
pub struct Machine {
    foca: Foca<GossipId, WireCodec, SmallRng, Handler>,
    swim_config: foca::Config,
    rt: AccumulatingRuntime<GossipId>,
    store: Arc<Mutex<Store>>,
    node: NodeId,
    rng: SmallRng,
    timers: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    now: Duration,
    outbox: Vec<(SocketAddr, Vec<u8>)>,
    down: BTreeSet<NodeId>,
    seeds: Vec<SocketAddr>,
    /// Whether this node had a live member after the last notification.
    connected: bool,
    ae_cursor: u64,
    settings: Settings,
    stats: Stats,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("identity", self.foca.identity())
            .field("members", &self.foca.num_members())
            .field("registers", &lock(&self.store).replica.len())
            .finish()
    }
}

impl Machine {
    /// A node listening at `addr` named `node`, at time `now`. Fails with
    /// `InvalidInput` when the configuration cannot work.
    pub fn new(
        config: &GossipConfig,
        addr: SocketAddr,
        node: NodeId,
        seed: u64,
        now: Duration,
    ) -> registry_api::Result<Self> {
        registry_api::backend::check_name("node_name", node.as_str(), true)?;
        if config.probe_rtt.is_zero() || config.probe_rtt >= config.probe_period {
            return Err(error::config(
                "probe_rtt",
                "must be above zero and below probe_period",
            ));
        }
        if config.suspect_to_down_after.is_zero() || config.gossip_interval.is_zero() {
            return Err(error::config(
                "suspect_to_down_after",
                "suspicion time and gossip interval must be above zero",
            ));
        }
        if config.anti_entropy_interval.is_zero() {
            return Err(error::config("anti_entropy_interval", "must be above zero"));
        }
        let overhead = FRAME_HEAD
            + if config.auth_key.is_some() {
                TAG_LEN
            } else {
                0
            };
        let swim_max = config.max_packet_size.saturating_sub(overhead);
        if swim_max < 512 || config.max_packet_size > 65_000 {
            return Err(error::config(
                "max_packet_size",
                format!("{} bytes; must be 512 to 65000", config.max_packet_size),
            ));
        }
        let identity = GossipId {
            addr,
            node: node.clone(),
            bump: 0,
        };
        let id_len = 1 + 16 + 2 + 1 + node.as_str().len() + 2;
        let max_broadcast = swim_max.saturating_sub(3 * id_len + 64).max(64);
        let mut swim_config = foca::Config::simple();
        swim_config.probe_period = config.probe_period;
        swim_config.probe_rtt = config.probe_rtt;
        swim_config.suspect_to_down_after = config.suspect_to_down_after;
        swim_config.max_packet_size = NonZeroUsize::new(swim_max).unwrap_or(NonZeroUsize::MIN);
        swim_config.max_transmissions = NonZeroU8::MIN;
        swim_config.notify_down_members = true;
        swim_config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: config.gossip_interval,
            num_members: NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN),
        });
        swim_config.periodic_announce = Some(foca::PeriodicParams {
            frequency: config.probe_period * 10,
            num_members: NonZeroUsize::MIN,
        });
        swim_config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: config.suspect_to_down_after * 3,
            num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
        });
        let store = Arc::new(Mutex::new(Store {
            replica: Replica::new(),
            meta: HashMap::new(),
            owned: BTreeMap::new(),
            touched: Vec::new(),
            changes: Vec::new(),
            now,
            target: 1,
        }));
        let foca = Foca::with_custom_broadcast(
            identity,
            swim_config.clone(),
            SmallRng::seed_from_u64(seed),
            WireCodec,
            Handler {
                store: store.clone(),
            },
        );
        let ttl = config.tombstone_ttl;
        let mut m = Self {
            foca,
            swim_config,
            rt: AccumulatingRuntime::new(),
            store,
            node,
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            timers: BinaryHeap::new(),
            seq: 0,
            now,
            outbox: Vec::new(),
            down: BTreeSet::new(),
            seeds: Vec::new(),
            connected: false,
            ae_cursor: 0,
            settings: Settings {
                key: config.auth_key.clone(),
                max_packet: config.max_packet_size,
                ae_interval: config.anti_entropy_interval,
                ae_budget: config.anti_entropy_budget.max(config.max_packet_size),
                ttl,
                gc_every: (ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
                rejoin_every: config.probe_period * 3,
                max_broadcast,
            },
            stats: Stats::default(),
        };
        let first_ae = m.jitter(m.settings.ae_interval);
        m.schedule(first_ae, Tick::AntiEntropy);
        m.schedule(m.settings.gc_every, Tick::Gc);
        m.schedule(m.settings.rejoin_every, Tick::Rejoin);
        Ok(m)
    }

    // ------------------------------------------------------------ inputs

    /// Ask the node at `seed` to let us in. The seed is remembered: while
    /// this node has no live member it keeps announcing itself to its seeds
    /// (and to members it saw go down), so a lost announce or a partition
    /// that isolated it is retried.
    pub fn join(&mut self, seed: SocketAddr, now: Duration) {
        self.set_now(now);
        if !self.seeds.contains(&seed) && seed != self.foca.identity().addr {
            self.seeds.push(seed);
        }
        self.announce(seed);
        self.pump();
    }

    fn announce(&mut self, addr: SocketAddr) {
        let dst = GossipId {
            addr,
            node: NodeId::default(),
            bump: 0,
        };
        if let Err(e) = self.foca.announce(dst, &mut self.rt) {
            tracing::debug!(%addr, error = %e, "announce failed");
            self.stats.swim_errors += 1;
        }
    }

    /// Announce to every seed that is not a live member; when alone, also
    /// to a few members seen before.
    fn rejoin_if_alone(&mut self) {
        let live: BTreeSet<SocketAddr> = self.foca.iter_members().map(|m| m.id().addr).collect();
        let mut targets: Vec<SocketAddr> = self
            .seeds
            .iter()
            .filter(|s| !live.contains(s))
            .copied()
            .collect();
        if !live.is_empty() {
            for addr in targets {
                self.announce(addr);
            }
            return;
        }
        let me = self.foca.identity().addr;
        let mut known: Vec<SocketAddr> = self
            .foca
            .iter_membership_state()
            .map(|m| m.id().addr)
            .filter(|a| *a != me && !targets.contains(a))
            .collect();
        for _ in 0..known.len().min(3) {
            let i = self.rng.random_range(0..known.len());
            targets.push(known.swap_remove(i));
        }
        for addr in targets {
            self.announce(addr);
        }
    }

    /// Handle one datagram from `from`. Bad datagrams are dropped and
    /// counted ([`Stats`]), never an error.
    pub fn handle_datagram(&mut self, from: SocketAddr, data: &[u8], now: Duration) {
        self.set_now(now);
        self.stats.datagrams_in += 1;
        let (kind, body) = match wire::open(data, self.settings.key.as_deref()) {
            Ok(v) => v,
            Err(wire::FrameError::BadTag) => {
                self.stats.auth_failures += 1;
                tracing::debug!(%from, "dropped a datagram that failed authentication");
                return;
            }
            Err(e) => {
                self.stats.malformed += 1;
                tracing::debug!(%from, error = %e, "dropped a malformed datagram");
                return;
            }
        };
        match kind {
            Kind::Swim => {
                // foca reads what it needs; a bad entry stops it at that
                // item. Check the whole body first so nothing half-applies.
                if let Err(e) = wire::decode_body(kind, body) {
                    self.stats.malformed += 1;
                    tracing::debug!(%from, error = %e, "dropped a malformed SWIM datagram");
                    return;
                }
                if let Err(e) = self.foca.handle_data(body, &mut self.rt) {
                    self.stats.swim_errors += 1;
                    tracing::trace!(%from, error = %e, "foca refused a datagram");
                }
            }
            _ => match AeMessage::decode(kind, body) {
                Ok(msg) => self.handle_ae(from, msg),
                Err(e) => {
                    self.stats.malformed += 1;
                    tracing::debug!(%from, error = %e, "dropped a malformed anti-entropy datagram");
                    return;
                }
            },
        }
        self.pump();
    }

    /// Fire every timer due at `now`.
    pub fn tick(&mut self, now: Duration) {
        self.set_now(now);
        while self.timers.peek().is_some_and(|t| t.0.at <= now) {
            let Some(Reverse(t)) = self.timers.pop() else {
                break;
            };
            match t.tick {
                Tick::Swim(timer) => {
                    if let Err(e) = self.foca.handle_timer(timer, &mut self.rt) {
                        self.stats.swim_errors += 1;
                        tracing::trace!(error = %e, "foca timer");
                    }
                }
                Tick::AntiEntropy => {
                    self.anti_entropy_round();
                    let next = self.jitter(self.settings.ae_interval);
                    self.schedule(next, Tick::AntiEntropy);
                }
                Tick::Gc => {
                    self.gc();
                    self.schedule(self.settings.gc_every, Tick::Gc);
                }
                Tick::Rejoin => {
                    self.rejoin_if_alone();
                    let next = self.jitter(self.settings.rejoin_every);
                    self.schedule(next, Tick::Rejoin);
                }
            }
            self.pump();
        }
    }

    /// When [`Machine::tick`] next has something to do.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.timers.peek().map(|t| t.0.at)
    }

    /// Register (upsert) `endpoint` as owned by this node.
    pub fn register(&mut self, endpoint: Endpoint, now: Duration) -> registry_api::Result<()> {
        endpoint.validate()?;
        self.set_now(now);
        self.write(Op::Register(endpoint));
        self.pump();
        Ok(())
    }

    /// Deregister `key` (a tombstone); nothing happens when it is unknown
    /// or already gone here.
    pub fn deregister(&mut self, key: &EndpointKey, now: Duration) {
        self.set_now(now);
        self.write(Op::Deregister(key.clone()));
        self.pump();
    }

    /// Apply `ops` in order, all locally at once (the cluster sees them as
    /// separate writes).
    pub fn apply(&mut self, ops: Vec<Op>, now: Duration) -> registry_api::Result<()> {
        registry_api::backend::validate_ops(&ops)?;
        self.set_now(now);
        for op in ops {
            self.write(op);
        }
        self.pump();
        Ok(())
    }

    /// Re-assert every entry this node owns with a fresh timestamp (what a
    /// node does after it was declared down and rejoined).
    pub fn reassert(&mut self, now: Duration) {
        self.set_now(now);
        self.reassert_all();
        self.pump();
    }

    /// Leave the cluster: members are told, and declare us down.
    pub fn leave(&mut self, now: Duration) {
        self.set_now(now);
        if let Err(e) = self.foca.leave_cluster(&mut self.rt) {
            tracing::debug!(error = %e, "leave_cluster");
        }
        self.pump();
    }

    // ----------------------------------------------------------- outputs

    /// Datagrams to send, with their destination.
    pub fn take_outbox(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        std::mem::take(&mut self.outbox)
    }

    /// Visible changes of the replica since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut lock(&self.store).changes)
    }

    // ------------------------------------------------------------- reads

    /// This node's current SWIM identity.
    pub fn identity(&self) -> &GossipId {
        self.foca.identity()
    }

    /// This node's name.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// A copy of the replica, tombstones included.
    pub fn replica(&self) -> Replica {
        lock(&self.store).replica.clone()
    }

    /// Every live endpoint.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        lock(&self.store).replica.endpoints().cloned().collect()
    }

    /// The live endpoint under `key`.
    pub fn endpoint(&self, key: &EndpointKey) -> Option<Endpoint> {
        lock(&self.store).replica.endpoint(key).cloned()
    }

    /// The register of `key`, tombstone included.
    pub fn entry(&self, key: &EndpointKey) -> Option<Entry> {
        lock(&self.store).replica.get(key).cloned()
    }

    /// The keys this node owns (registered and still asserts).
    pub fn owned(&self) -> Vec<EndpointKey> {
        lock(&self.store).owned.keys().cloned().collect()
    }

    /// Active members other than this node.
    pub fn members(&self) -> Vec<GossipId> {
        self.foca.iter_members().map(|m| m.id().clone()).collect()
    }

    /// Whether `node` is currently an active member (or this node).
    pub fn is_member(&self, node: &NodeId) -> bool {
        *node == self.node || self.foca.iter_members().any(|m| m.id().node == *node)
    }

    /// Nodes SWIM declared down (and not seen again).
    pub fn down_nodes(&self) -> Vec<NodeId> {
        self.down.iter().cloned().collect()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// How many times a broadcast is currently sent.
    pub fn dissemination_target(&self) -> u32 {
        lock(&self.store).target
    }

    // ---------------------------------------------------------- internals

    fn set_now(&mut self, now: Duration) {
        self.now = self.now.max(now);
        lock(&self.store).now = self.now;
    }

    fn schedule(&mut self, after: Duration, tick: Tick) {
        self.seq += 1;
        self.timers.push(Reverse(Scheduled {
            at: self.now + after,
            seq: self.seq,
            tick,
        }));
    }

    /// `d` plus or minus 10%, so nodes started together spread out.
    fn jitter(&mut self, d: Duration) -> Duration {
        d.mul_f64(self.rng.random_range(0.9..1.1))
    }

    fn write(&mut self, op: Op) {
        let entry = {
            let mut st = lock(&self.store);
            match op {
                Op::Register(ep) => {
                    let key = ep.key();
                    let gen = st.replica.next_gen(&key);
                    let ts = st.replica.tick();
                    st.owned.insert(key, ep.clone());
                    Entry::live(
                        ep,
                        Stamp {
                            ts,
                            gen,
                            writer: self.node.clone(),
                        },
                    )
                }
                Op::Deregister(key) => {
                    st.owned.remove(&key);
                    if st.replica.endpoint(&key).is_none() {
                        return;
                    }
                    let gen = st.replica.next_gen(&key);
                    let ts = st.replica.tick();
                    Entry::tombstone(
                        key,
                        Stamp {
                            ts,
                            gen,
                            writer: self.node.clone(),
                        },
                    )
                }
            }
        };
        self.publish(entry);
    }

    /// Merge `entry` here and queue it for dissemination.
    fn publish(&mut self, entry: Entry) {
        let bytes = match wire::encode_entry(&entry) {
            Ok(b) if b.len() <= self.settings.max_broadcast => b,
            _ => {
                // Too big for a SWIM packet: anti-entropy carries it.
                lock(&self.store).merge(entry, true);
                return;
            }
        };
        if let Err(e) = self.foca.add_broadcast(&bytes) {
            tracing::warn!(error = %e, "could not queue a broadcast; anti-entropy will carry it");
            lock(&self.store).merge(entry, true);
        }
    }

    fn reassert_all(&mut self) {
        let entries: Vec<Entry> = {
            let mut st = lock(&self.store);
            let owned: Vec<Endpoint> = st.owned.values().cloned().collect();
            owned
                .into_iter()
                .map(|ep| {
                    let gen = st.replica.next_gen(&ep.key());
                    let ts = st.replica.tick();
                    Entry::live(
                        ep,
                        Stamp {
                            ts,
                            gen,
                            writer: self.node.clone(),
                        },
                    )
                })
                .collect()
        };
        self.stats.reasserted += entries.len() as u64;
        for e in entries {
            self.publish(e);
        }
    }

    /// Handle everything foca produced, then the consequences of merges
    /// (death tombstones, refutations), until nothing is left.
    fn pump(&mut self) {
        loop {
            let mut membership_changed = false;
            while let Some(note) = self.rt.to_notify() {
                membership_changed |= self.on_notification(note);
            }
            if membership_changed {
                self.retune();
            }
            while let Some((after, timer)) = self.rt.to_schedule() {
                self.schedule(after, Tick::Swim(timer));
            }
            while let Some((to, data)) = self.rt.to_send() {
                self.count_sent(&data);
                self.emit(to.addr, Kind::Swim, &data);
            }
            if !self.reconcile() && self.rt.backlog() == 0 {
                break;
            }
        }
    }

    fn emit(&mut self, to: SocketAddr, kind: Kind, body: &[u8]) {
        let packet = wire::seal(kind, body, self.settings.key.as_deref());
        self.stats.datagrams_out += 1;
        self.stats.bytes_out += packet.len() as u64;
        self.outbox.push((to, packet));
    }

    /// Count how many times each entry went out, for GC.
    fn count_sent(&mut self, body: &[u8]) {
        let Ok(items) = wire::swim_broadcasts(body) else {
            return;
        };
        let mut st = lock(&self.store);
        for item in items {
            let Ok(e) = wire::decode_entry(item) else {
                continue;
            };
            let current = st.replica.get(&e.key).is_some_and(|c| *c == e);
            if current {
                if let Some(m) = st.meta.get_mut(&e.key) {
                    m.sent = m.sent.saturating_add(1);
                }
            }
        }
    }

    fn on_notification(&mut self, note: OwnedNotification<GossipId>) -> bool {
        match note {
            OwnedNotification::MemberUp(id) => {
                tracing::debug!(member = ?id, "member up");
                self.down.remove(&id.node);
                if !self.connected {
                    // We just (re)connected: catch up from this member now.
                    self.connected = true;
                    self.send_digest(id.addr, 0);
                }
                true
            }
            OwnedNotification::MemberDown(id) => {
                tracing::debug!(member = ?id, "member down");
                self.connected = self.foca.num_members() > 0;
                let still_up = self.foca.iter_members().any(|m| m.id().node == id.node);
                if !still_up && id.node != self.node {
                    self.down.insert(id.node.clone());
                    self.kill_node(&id.node);
                }
                true
            }
            OwnedNotification::Rename(old, new) => {
                tracing::debug!(?old, ?new, "member renamed");
                self.down.remove(&new.node);
                true
            }
            OwnedNotification::Rejoin(id) => {
                tracing::info!(identity = ?id, "declared down by the cluster; rejoined and re-asserting owned entries");
                self.reassert_all();
                true
            }
            other => {
                tracing::debug!(notification = ?other, "swim");
                false
            }
        }
    }

    /// Cluster size changed: each broadcast goes out ceil(log2 N)+1 times.
    fn retune(&mut self) {
        let target = dissemination_count(self.foca.num_members() + 1);
        lock(&self.store).target = target;
        let tx = NonZeroU8::new(u8::try_from(target).unwrap_or(u8::MAX)).unwrap_or(NonZeroU8::MIN);
        if self.swim_config.max_transmissions != tx {
            self.swim_config.max_transmissions = tx;
            if let Err(e) = self.foca.set_config(self.swim_config.clone()) {
                tracing::warn!(error = %e, "could not retune foca");
            }
        }
    }

    /// SWIM declared `node` down: tombstone its live entries here.
    fn kill_node(&mut self, node: &NodeId) {
        let doomed: Vec<Entry> = lock(&self.store)
            .replica
            .entries()
            .filter(|e| !e.is_tombstone() && e.stamp.writer == *node)
            .map(Entry::killed)
            .collect();
        if !doomed.is_empty() {
            tracing::info!(%node, entries = doomed.len(), "node declared down; tombstoning its entries");
        }
        self.stats.death_tombstones += doomed.len() as u64;
        for e in doomed {
            self.publish(e);
        }
    }

    /// Look at every register replaced since last time: a live entry of a
    /// dead node is killed; a death tombstone of one of our own entries is
    /// refuted; an owned key someone else wrote is no longer ours; a live
    /// entry under our name that we do not own is retracted. Returns
    /// whether it wrote anything.
    fn reconcile(&mut self) -> bool {
        let mut writes = Vec::new();
        {
            let mut st = lock(&self.store);
            let touched = std::mem::take(&mut st.touched);
            for key in touched {
                let Some(cur) = st.replica.get(&key).cloned() else {
                    continue;
                };
                if !cur.is_tombstone()
                    && cur.stamp.writer != self.node
                    && self.down.contains(&cur.stamp.writer)
                {
                    writes.push(cur.killed());
                    continue;
                }
                let Some(mine) = st.owned.get(&key).cloned() else {
                    if !cur.is_tombstone() && cur.stamp.writer == self.node {
                        // Written under our name by an earlier run of this
                        // node (a restart faster than failure detection):
                        // nobody asserts it any more, so retract it.
                        let gen = cur.stamp.gen.saturating_add(1);
                        let ts = st.replica.tick();
                        self.stats.retracted += 1;
                        writes.push(Entry::tombstone(
                            key,
                            Stamp {
                                ts,
                                gen,
                                writer: self.node.clone(),
                            },
                        ));
                    }
                    continue;
                };
                if cur.stamp.writer == self.node && cur.died {
                    let gen = cur.stamp.gen.saturating_add(1);
                    let ts = st.replica.tick();
                    self.stats.reasserted += 1;
                    writes.push(Entry::live(
                        mine,
                        Stamp {
                            ts,
                            gen,
                            writer: self.node.clone(),
                        },
                    ));
                } else if cur.stamp.writer != self.node || cur.is_tombstone() {
                    st.owned.remove(&key);
                }
            }
        }
        let wrote = !writes.is_empty();
        for e in writes {
            if e.died {
                self.stats.death_tombstones += 1;
            }
            self.publish(e);
        }
        wrote
    }

    fn gc(&mut self) {
        let alone = self.foca.num_members() == 0;
        let mut st = lock(&self.store);
        let now = st.now;
        let ttl = self.settings.ttl;
        let expired: Vec<EndpointKey> = st
            .replica
            .entries()
            .filter(|e| e.is_tombstone())
            .filter(|e| {
                st.meta.get(&e.key).is_none_or(|m| {
                    (alone || m.sent >= m.target) && now.saturating_sub(m.merged_at) >= ttl
                })
            })
            .map(|e| e.key.clone())
            .collect();
        for key in &expired {
            st.replica.forget(key);
            st.meta.remove(key);
        }
        self.stats.tombstones_collected += expired.len() as u64;
    }

    // ------------------------------------------------------ anti-entropy

    fn anti_entropy_round(&mut self) {
        let members = self.members();
        if members.is_empty() {
            return;
        }
        let peer = members[self.rng.random_range(0..members.len())].addr;
        let cursor = self.ae_cursor;
        self.send_digest(peer, cursor);
    }

    /// `(key hash, fingerprint, key)` of every register, ordered by hash.
    fn digests(&self) -> Vec<(u64, u64, EndpointKey)> {
        let st = lock(&self.store);
        let mut v: Vec<(u64, u64, EndpointKey)> = st
            .replica
            .entries()
            .map(|e| (key_hash(&e.key), e.fingerprint(), e.key.clone()))
            .collect();
        v.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
        v
    }

    fn overhead(&self) -> usize {
        FRAME_HEAD
            + if self.settings.key.is_some() {
                TAG_LEN
            } else {
                0
            }
    }

    fn send_digest(&mut self, to: SocketAddr, lo: u64) {
        let room = (self.settings.max_packet - self.overhead() - 18) / 16;
        let all = self.digests();
        let items: Vec<(u64, u64)> = all
            .iter()
            .filter(|d| d.0 >= lo)
            .take(room)
            .map(|d| (d.0, d.1))
            .collect();
        let truncated = all.iter().filter(|d| d.0 >= lo).count() > items.len();
        let hi = match (truncated, items.last()) {
            (true, Some(last)) => last.0,
            _ => u64::MAX,
        };
        self.stats.digests_sent += 1;
        self.send_ae(to, &AeMessage::Digest { lo, hi, items });
    }

    fn send_ae(&mut self, to: SocketAddr, msg: &AeMessage) {
        match msg.encode() {
            Ok(body) => self.emit(to, msg.kind(), &body),
            Err(e) => tracing::warn!(error = %e, "could not encode an anti-entropy message"),
        }
    }

    /// Push `entries` to `to` in datagrams of at most the packet size (one
    /// oversized entry goes alone), within the budget. Returns how many
    /// were sent.
    fn push(&mut self, to: SocketAddr, entries: Vec<Entry>) -> usize {
        let limit = self.settings.max_packet - self.overhead() - 2;
        let mut budget = self.settings.ae_budget;
        let mut batch: Vec<Entry> = Vec::new();
        let mut batch_len = 0;
        let mut sent = 0;
        for e in entries {
            let Ok(bytes) = wire::encode_entry(&e) else {
                sent += 1;
                continue;
            };
            if bytes.len() > budget {
                break;
            }
            if batch_len + bytes.len() > limit && !batch.is_empty() {
                let full = std::mem::take(&mut batch);
                self.send_ae(to, &AeMessage::Push { entries: full });
                batch_len = 0;
            }
            budget -= bytes.len();
            batch_len += bytes.len();
            batch.push(e);
            sent += 1;
        }
        if !batch.is_empty() {
            self.send_ae(to, &AeMessage::Push { entries: batch });
        }
        sent
    }

    fn handle_ae(&mut self, from: SocketAddr, msg: AeMessage) {
        match msg {
            AeMessage::Digest { lo, hi, items } => {
                let theirs: HashMap<u64, u64> = items.iter().copied().collect();
                let all = self.digests();
                let mine: Vec<&(u64, u64, EndpointKey)> =
                    all.iter().filter(|d| d.0 >= lo && d.0 <= hi).collect();
                let my_fp: HashMap<u64, u64> = mine.iter().map(|d| (d.0, d.1)).collect();
                let push_keys: Vec<(u64, EndpointKey)> = mine
                    .iter()
                    .filter(|d| theirs.get(&d.0) != Some(&d.1))
                    .map(|d| (d.0, d.2.clone()))
                    .collect();
                let want: Vec<u64> = items
                    .iter()
                    .filter(|(h, f)| my_fp.get(h) != Some(f))
                    .map(|(h, _)| *h)
                    .collect();
                let entries: Vec<Entry> = {
                    let st = lock(&self.store);
                    push_keys
                        .iter()
                        .filter_map(|(_, k)| st.replica.get(k).cloned())
                        .collect()
                };
                let n = entries.len();
                let sent = self.push(from, entries);
                let next = if sent < n {
                    push_keys.get(sent).map_or(0, |p| p.0)
                } else {
                    hi.checked_add(1).unwrap_or(0)
                };
                let differed = n > 0 || !want.is_empty();
                self.send_ae(
                    from,
                    &AeMessage::Want {
                        hashes: want,
                        next,
                        differed,
                    },
                );
            }
            AeMessage::Want {
                hashes,
                next,
                differed,
            } => {
                let wanted: BTreeSet<u64> = hashes.into_iter().collect();
                let entries: Vec<Entry> = {
                    let st = lock(&self.store);
                    st.replica
                        .entries()
                        .filter(|e| wanted.contains(&key_hash(&e.key)))
                        .cloned()
                        .collect()
                };
                self.push(from, entries);
                self.ae_cursor = next;
                if differed && next != 0 {
                    // Keep going through the hash space while the replicas
                    // differ: a late joiner catches up in one pass.
                    self.send_digest(from, next);
                }
            }
            AeMessage::Push { entries } => {
                let mut st = lock(&self.store);
                for e in entries {
                    if st.merge(e, true) {
                        self.stats.entries_repaired += 1;
                    }
                }
            }
        }
    }
}
