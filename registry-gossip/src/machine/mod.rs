//! The protocol as a pure, synchronous state machine: foca's SWIM, the LWW
//! replica riding on its custom broadcasts, anti-entropy and tombstone GC.
//!
//! No sockets, no clock, no global randomness: time comes in as a
//! `Duration` since an epoch the caller picks, randomness from a seed, and
//! datagrams go in through [`Machine::handle_datagram`] and out through
//! [`Machine::take_outbox`]. The UDP driver ([`crate::GossipRegistry`]) and
//! the simulator (the `sim` module, with the `sim` feature) drive the same
//! code.
//!
//! [`Machine`] drives the parts, each in its own module: the replica and
//! its tombstone bookkeeping (`store`), foca and the membership around it
//! (`membership`), the entries this node asserts and the death tombstones
//! of others (`ownership`), the digest exchange (`anti_entropy`), and the
//! timers, the membership sync (`member_sync`). The parts compute; the
//! machine publishes, and queues what they send in its outbox (`send`),
//! which frames it.
//! What comes in is checked in `receive`: the frame, and with a key its
//! freshness (`replay`); answers to addresses that are not confirmed
//! members are capped there too.
//!
//! With a key, `now` must be the same clock on every node, as the
//! replay counters and the entry timestamps are compared with it across
//! nodes: [`crate::GossipRegistry`] passes the time since the UNIX epoch.

mod anti_entropy;
mod member_sync;
mod membership;
mod ownership;
mod receive;
mod replay;
mod send;
mod settings;
mod stats;
mod store;
mod timers;

use std::net::SocketAddr;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use waypost::{Endpoint, EndpointKey, Op};

use self::anti_entropy::AntiEntropy;
use self::member_sync::MemberSync;
use self::membership::{Membership, Notice};
use self::ownership::Ownership;
use self::replay::Replays;
use self::send::{count_broadcasts, Outbox};
use self::settings::Settings;
use self::store::StoreHandle;
use self::timers::{TimerKind, Timers};
use crate::config::GossipConfig;
use crate::crdt::{micros, Change, Entry, NodeId, Replica};
use crate::layout;
use crate::wire::{AeMessage, GossipId, Kind};

pub use self::membership::dissemination_count;
pub use self::stats::{describe_metrics, Stats};

/// One gossip node's protocol state. See the module docs.
pub struct Machine {
    membership: Membership,
    store: StoreHandle,
    ownership: Ownership,
    anti_entropy: AntiEntropy,
    timers: Timers,
    rng: SmallRng,
    now: Duration,
    outbox: Outbox,
    settings: Settings,
    stats: Stats,
    /// Replay windows of the senders of keyed datagrams.
    replays: Replays,
    /// The membership sync's pace and join peer.
    member_sync: MemberSync,
    /// Delay of the next rejoin check while alone: from the gossip
    /// interval, doubling up to `rejoin_every`.
    rejoin_backoff: Duration,
    /// When news was last gossiped at once (see [`Machine::gossip_news`]).
    last_eager: Option<Duration>,
    /// When this node last caught up after news was addressed to an
    /// earlier identity of it (see [`Machine::catch_up_if_stale`]).
    last_catch_up: Option<Duration>,
}

/// Whether something last done at `last` may be done again at `now`, at
/// most once per `gap`; if so, `now` becomes its last time.
fn once_per(last: &mut Option<Duration>, now: Duration, gap: Duration) -> bool {
    if last.is_some_and(|at| now.saturating_sub(at) < gap) {
        return false;
    }
    *last = Some(now);
    true
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("identity", self.membership.identity())
            .field("members", &self.membership.num_members())
            .field("registers", &self.store.lock().replica.len())
            .finish()
    }
}

impl Machine {
    /// A node listening at `addr` named `node`, at time `now`. Fails with
    /// `InvalidInput` when the configuration cannot work. `now`, here and
    /// in every other call, is compared across nodes (entry timestamps,
    /// and with a key the replay counters): every node of a cluster must
    /// use the same clock, e.g. the time since the UNIX epoch.
    pub fn new(
        config: &GossipConfig,
        addr: SocketAddr,
        node: NodeId,
        seed: u64,
        now: Duration,
    ) -> waypost::Result<Self> {
        let settings = Settings::new(config, &node)?;
        let settings_fast = settings.member_sync_fast;
        let identity = GossipId {
            addr,
            node: node.clone(),
            bump: 0,
        };
        let store = StoreHandle::new(now, settings.max_skew, settings.ttl);
        let outbox = Outbox::new(settings.key.clone(), node.clone());
        let membership = Membership::new(identity, config, settings.swim_max, seed, store.clone());
        let anti_entropy =
            AntiEntropy::new(settings.max_packet, settings.overhead(), settings.ae_budget);
        let mut m = Self {
            membership,
            store,
            ownership: Ownership::new(node),
            anti_entropy,
            timers: Timers::default(),
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            now,
            outbox,
            replays: Replays::new(micros(settings.max_skew), replay::MAX_SENDERS),
            settings,
            stats: Stats::default(),
            member_sync: MemberSync::new(now),
            rejoin_backoff: settings_fast,
            last_eager: None,
            last_catch_up: None,
        };
        let first_ae = m.jitter(m.settings.ae_interval);
        m.schedule(first_ae, TimerKind::AntiEntropy);
        m.schedule(m.settings.gc_every, TimerKind::Gc);
        // The first check comes soon: a joiner whose announce was lost
        // retries within a gossip interval.
        m.schedule(m.settings.member_sync_fast, TimerKind::Rejoin);
        // A new node's view is about to change: sync at the fast pace.
        let first_sync = m.jitter(m.settings.member_sync_fast);
        m.schedule(first_sync, TimerKind::MemberSync);
        Ok(m)
    }

    // ------------------------------------------------------------ inputs

    /// Ask the node at `seed` to let us in. The seed is remembered: while
    /// this node has no live member it keeps announcing itself to its seeds
    /// (and to members it saw go down), so a lost announce or a partition
    /// that isolated it is retried: first after a gossip interval, then
    /// after twice as long each time, up to three probe periods.
    pub fn join(&mut self, seed: SocketAddr, now: Duration) {
        self.set_now(now);
        self.membership.remember_seed(seed);
        self.announce(seed);
        self.pump();
    }

    /// Fire every timer due at `now`.
    pub fn tick(&mut self, now: Duration) {
        self.set_now(now);
        while let Some(kind) = self.timers.pop_due(now) {
            match kind {
                TimerKind::Swim(timer) => {
                    if let Err(e) = self.membership.handle_timer(timer) {
                        self.stats.swim_errors += 1;
                        tracing::trace!(error = %e, "foca timer");
                    }
                }
                TimerKind::AntiEntropy => {
                    self.anti_entropy_round();
                    let next = self.jitter(self.settings.ae_interval);
                    self.schedule(next, TimerKind::AntiEntropy);
                }
                TimerKind::Gc => {
                    self.collect_tombstones();
                    self.schedule(self.settings.gc_every, TimerKind::Gc);
                }
                TimerKind::Rejoin => {
                    self.rejoin_if_alone();
                    let next = self.next_rejoin_check();
                    self.schedule(next, TimerKind::Rejoin);
                }
                TimerKind::MemberSync => {
                    self.member_sync.round(
                        &mut self.membership,
                        &mut self.rng,
                        &mut self.outbox,
                        self.now,
                    );
                    let next = self.jitter(self.member_sync.period(&self.settings, self.now));
                    self.schedule(next, TimerKind::MemberSync);
                }
            }
            self.pump();
        }
    }

    /// When [`Machine::tick`] next has something to do.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.timers.next_deadline()
    }

    /// Register (upsert) `endpoint` as owned by this node.
    pub fn register(&mut self, endpoint: Endpoint, now: Duration) -> waypost::Result<()> {
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
    pub fn apply(&mut self, ops: Vec<Op>, now: Duration) -> waypost::Result<()> {
        waypost::backend::validate_ops(&ops)?;
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
        if let Err(e) = self.membership.leave() {
            tracing::debug!(error = %e, "leave_cluster");
        }
        self.pump();
    }

    // ----------------------------------------------------------- outputs

    /// Datagrams to send, with their destination.
    pub fn take_outbox(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        self.outbox.take()
    }

    /// Visible changes of the replica since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.store.lock().take_changes()
    }

    // ------------------------------------------------------------- reads

    /// This node's current SWIM identity.
    pub fn identity(&self) -> &GossipId {
        self.membership.identity()
    }

    /// This node's name.
    pub fn node(&self) -> &NodeId {
        self.ownership.node()
    }

    /// A copy of the replica, tombstones included.
    pub fn replica(&self) -> Replica {
        self.store.lock().replica.clone()
    }

    /// Every live endpoint.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.store.lock().replica.endpoints().cloned().collect()
    }

    /// The live endpoint under `key`.
    pub fn endpoint(&self, key: &EndpointKey) -> Option<Endpoint> {
        self.store.lock().replica.endpoint(key).cloned()
    }

    /// The register of `key`, tombstone included.
    pub fn entry(&self, key: &EndpointKey) -> Option<Entry> {
        self.store.lock().replica.get(key).cloned()
    }

    /// The keys this node owns (registered and still asserts).
    pub fn owned(&self) -> Vec<EndpointKey> {
        self.ownership.keys()
    }

    /// Active members other than this node.
    pub fn members(&self) -> Vec<GossipId> {
        self.membership.members()
    }

    /// How many active members other than this node there are (without
    /// copying them, unlike [`Machine::members`]).
    pub fn num_members(&self) -> usize {
        self.membership.num_members()
    }

    /// Whether `node` is currently an active member (or this node).
    pub fn is_member(&self, node: &NodeId) -> bool {
        node == self.node() || self.membership.has_member(node)
    }

    /// Nodes SWIM declared down (and not seen again).
    pub fn down_nodes(&self) -> Vec<NodeId> {
        self.membership.down().iter().cloned().collect()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let mut stats = self.stats.clone();
        stats.datagrams_out = self.outbox.datagrams;
        stats.bytes_out = self.outbox.bytes;
        let store = self.store.lock();
        stats.entries_refused = store.refused;
        stats.expired_tombstones_dropped = store.expired_dropped;
        drop(store);
        stats
    }

    /// How many times a broadcast is currently sent.
    pub fn dissemination_target(&self) -> u32 {
        self.store.lock().target
    }

    // ---------------------------------------------------------- internals

    fn set_now(&mut self, now: Duration) {
        self.now = self.now.max(now);
        self.store.lock().set_now(self.now);
    }

    fn schedule(&mut self, after: Duration, kind: TimerKind) {
        self.timers.schedule(self.now + after, kind);
    }

    /// `d` plus or minus 10%, so nodes started together spread out.
    fn jitter(&mut self, d: Duration) -> Duration {
        d.mul_f64(self.rng.random_range(0.9..1.1))
    }

    fn announce(&mut self, addr: SocketAddr) {
        if let Err(e) = self.membership.announce(addr) {
            tracing::debug!(%addr, error = %e, "announce failed");
            self.stats.swim_errors += 1;
        }
    }

    /// When to check again whether to announce: while alone, after a
    /// delay that starts at the gossip interval and doubles up to
    /// `rejoin_every`; otherwise after `rejoin_every`.
    fn next_rejoin_check(&mut self) -> Duration {
        let every = self.settings.rejoin_every;
        if self.membership.num_members() > 0 {
            self.rejoin_backoff = self.settings.member_sync_fast;
            return self.jitter(every);
        }
        let next = self.rejoin_backoff.min(every);
        self.rejoin_backoff = (next * 2).min(every);
        self.jitter(next)
    }

    /// Announce to every seed that is not a live member; when alone, also
    /// to a few members seen before.
    fn rejoin_if_alone(&mut self) {
        for addr in self.membership.rejoin_targets(&mut self.rng) {
            self.announce(addr);
        }
    }

    fn write(&mut self, op: Op) {
        let entry = self.ownership.write(&mut self.store.lock(), op);
        if let Some(entry) = entry {
            self.publish(entry);
            self.gossip_news();
        }
    }

    /// New entries are waiting: gossip them now instead of at the next
    /// periodic gossip (each hop would otherwise wait for the next tick of
    /// its sender), at most once per quarter of the gossip interval so a
    /// burst of writes still shares datagrams. The entries are sent no
    /// more times than before, only sooner.
    fn gossip_news(&mut self) {
        if !once_per(
            &mut self.last_eager,
            self.now,
            self.settings.member_sync_fast / 4,
        ) {
            return;
        }
        if let Err(e) = self.membership.gossip_now() {
            tracing::trace!(error = %e, "gossip");
        }
    }

    /// Merge `entry` here and queue it for dissemination.
    fn publish(&mut self, entry: Entry) {
        let bytes = match layout::encode_entry(&entry) {
            Ok(b) if b.len() <= self.settings.max_broadcast => b,
            _ => {
                // Too big for a SWIM packet: anti-entropy carries it.
                self.store.lock().merge(entry, true);
                return;
            }
        };
        if let Err(e) = self.membership.add_broadcast(&bytes) {
            tracing::warn!(error = %e, "could not queue a broadcast; anti-entropy will carry it");
            self.store.lock().merge(entry, true);
        }
    }

    fn reassert_all(&mut self) {
        let entries = self.ownership.reassert_all(&mut self.store.lock());
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
            while let Some(notice) = self.membership.next_notice() {
                membership_changed |= notice.changed_membership();
                match notice {
                    Notice::Connected(addr) => {
                        self.member_sync.joined(
                            addr,
                            &mut self.membership,
                            &mut self.outbox,
                            self.now,
                        );
                        self.send_digest(addr, 0);
                    }
                    Notice::NodeDown(node) => self.kill_node(&node),
                    Notice::Rejoined => {
                        self.reassert_all();
                        // What was sent to this node while it was down, or
                        // to its old identity, never reached the replica.
                        self.catch_up_from_a_member();
                    }
                    Notice::Changed | Notice::Other => {}
                }
            }
            if membership_changed {
                self.member_sync.view_changed(self.now);
                let target = self.membership.retune();
                self.store.lock().target = target;
            }
            while let Some((after, timer)) = self.membership.next_timer() {
                self.schedule(after, TimerKind::Swim(timer));
            }
            while let Some((to, data)) = self.membership.next_send() {
                count_broadcasts(&self.store, &data);
                self.outbox.emit(to, Kind::Swim, &data, self.now);
            }
            if !self.reconcile() && !self.membership.has_backlog() {
                break;
            }
        }
    }

    /// SWIM declared `node` down: tombstone its live entries here.
    fn kill_node(&mut self, node: &NodeId) {
        let doomed = Ownership::death_tombstones(&self.store.lock(), node);
        if !doomed.is_empty() {
            tracing::info!(%node, entries = doomed.len(), "node declared down; tombstoning its entries");
        }
        self.stats.death_tombstones += doomed.len() as u64;
        for e in doomed {
            self.publish(e);
        }
    }

    /// Apply [`Ownership::reconcile`] to the registers replaced since last
    /// time. Returns whether it wrote anything.
    fn reconcile(&mut self) -> bool {
        let writes = self.ownership.reconcile(
            &mut self.store.lock(),
            self.membership.down(),
            &mut self.stats,
        );
        let wrote = !writes.is_empty();
        for e in writes {
            if e.died {
                self.stats.death_tombstones += 1;
            }
            self.publish(e);
        }
        wrote
    }

    fn collect_tombstones(&mut self) {
        let alone = self.membership.num_members() == 0;
        let collected = self.store.lock().collect_tombstones(alone);
        self.stats.tombstones_collected += collected as u64;
    }

    // ------------------------------------------------------ anti-entropy

    fn anti_entropy_round(&mut self) {
        let members = self.membership.members();
        let round = self.anti_entropy.start_round(
            &self.store.lock(),
            &members,
            &mut self.rng,
            &mut self.stats,
        );
        if let Some((peer, digest)) = round {
            self.send_anti_entropy(peer, &digest);
        }
    }

    /// Walk the whole hash space with a random member now (a rejoined
    /// node catching up on what it missed).
    fn catch_up_from_a_member(&mut self) {
        let members = self.membership.members();
        if members.is_empty() {
            return;
        }
        let peer = members[self.rng.random_range(0..members.len())].addr;
        self.send_digest(peer, 0);
    }

    fn send_digest(&mut self, to: SocketAddr, lo: u64) {
        let digest = self
            .anti_entropy
            .digest(&self.store.lock(), lo, &mut self.stats);
        self.send_anti_entropy(to, &digest);
    }

    fn send_anti_entropy(&mut self, to: SocketAddr, msg: &AeMessage) {
        match msg.encode() {
            Ok(body) => self.outbox.emit(to, msg.kind(), &body, self.now),
            Err(e) => tracing::warn!(error = %e, "could not encode an anti-entropy message"),
        }
    }
}
