//! [`Membership`]: foca's SWIM and what this crate adds around it.
//!
//! foca decides who is a member, detects failures and carries our
//! broadcasts; this module configures it, merges the registry entries it
//! delivers ([`EntryBroadcasts`]), keeps the transmission count at
//! `2·ceil(log2 N) + 1` as the cluster changes, remembers the seeds and the
//! nodes declared down, and turns foca's notifications into what the
//! machine has to do about them ([`Notice`]).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};

use bytes::Bytes;
use foca::{AccumulatingRuntime, BroadcastHandler, Foca, Invalidates, OwnedNotification, Timer};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use waypost::EndpointKey;

use super::store::StoreHandle;
use crate::config::GossipConfig;
use crate::crdt::NodeId;
use crate::layout;
use crate::wire::{DecodeError, GossipId, WireCodec};

/// How many times each broadcast is sent in a cluster of `n` nodes:
/// `2·ceil(log2(n)) + 1`. With `ceil(log2(n)) + 1` a node missed a
/// broadcast (and waited for anti-entropy) in about one run in ten at
/// 64 nodes on loopback; SWIM's `λ·log N` with λ = 2 makes that rare.
pub fn dissemination_count(n: usize) -> u32 {
    let n = n.max(1);
    2 * (usize::BITS - (n - 1).leading_zeros()) + 1
}

/// foca's broadcast handler: decodes an entry, merges it, and asks foca to
/// keep disseminating it only when it was news. Entries from another node
/// (foca names a sender) go through the clock bound
/// ([`Store::merge_remote`](super::store::Store::merge_remote)); this
/// node's own writes (no sender) do not.
struct EntryBroadcasts {
    store: StoreHandle,
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

impl BroadcastHandler<GossipId> for EntryBroadcasts {
    type Key = BroadcastKey;
    type Error = DecodeError;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&GossipId>,
    ) -> Result<Option<BroadcastKey>, DecodeError> {
        let entry = layout::decode_entry(data)?;
        let key = entry.key.clone();
        let mut store = self.store.lock();
        let news = match sender {
            Some(_) => store.merge_remote(entry, false),
            None => store.merge(entry, false),
        };
        Ok(news.then_some(BroadcastKey(key)))
    }
}

/// foca's configuration for `config`, with SWIM bodies of at most
/// `swim_max` bytes.
fn swim_config(config: &GossipConfig, swim_max: usize) -> foca::Config {
    let mut swim = foca::Config::simple();
    swim.probe_period = config.probe_period;
    swim.probe_rtt = config.probe_rtt;
    swim.suspect_to_down_after = config.suspect_to_down_after;
    swim.max_packet_size = NonZeroUsize::new(swim_max).unwrap_or(NonZeroUsize::MIN);
    swim.max_transmissions = NonZeroU8::MIN;
    swim.notify_down_members = true;
    swim.periodic_gossip = Some(foca::PeriodicParams {
        frequency: config.gossip_interval,
        num_members: NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN),
    });
    swim.periodic_announce = Some(foca::PeriodicParams {
        frequency: config.probe_period * 10,
        num_members: NonZeroUsize::MIN,
    });
    swim.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: config.suspect_to_down_after * 3,
        num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
    });
    swim
}

/// What a foca notification means for the machine.
#[derive(Debug)]
pub(super) enum Notice {
    /// The membership changed; nothing else to do.
    Changed,
    /// The first member after a time alone came up: catch up from it.
    Connected(SocketAddr),
    /// Another node was declared down and no identity of it is still up:
    /// its entries die.
    NodeDown(NodeId),
    /// This node was declared down by the cluster and rejoined under a
    /// renewed identity.
    Rejoined,
    /// Not a membership change.
    Other,
}

impl Notice {
    /// Whether the membership changed (the transmission count may have).
    pub(super) fn changed_membership(&self) -> bool {
        !matches!(self, Notice::Other)
    }
}

/// foca with its configuration and runtime, the seeds, and the nodes
/// declared down.
pub(super) struct Membership {
    foca: Foca<GossipId, WireCodec, SmallRng, EntryBroadcasts>,
    swim_config: foca::Config,
    runtime: AccumulatingRuntime<GossipId>,
    seeds: Vec<SocketAddr>,
    down: BTreeSet<NodeId>,
    /// Whether this node had a live member after the last notification.
    connected: bool,
    /// The address of every active member, with its name, kept from
    /// foca's notifications (a lookup per datagram must not walk the
    /// member list).
    addrs: HashMap<SocketAddr, NodeId>,
    /// The view's count and digest for the membership sync, computed when
    /// asked for after a change.
    digest: Option<(u32, u64)>,
}

/// The digest of one identity: FNV-1a of its encoding-independent parts,
/// then a 64-bit finalizer so that XOR-ing digests mixes well.
fn id_digest(id: &GossipId) -> u64 {
    let mut h = crate::crdt::Fnv::new();
    match id.addr.ip() {
        std::net::IpAddr::V4(ip) => h.write(&ip.octets()),
        std::net::IpAddr::V6(ip) => h.write(&ip.octets()),
    }
    h.write(&id.addr.port().to_be_bytes());
    h.write(id.node.as_str().as_bytes());
    h.write(&id.bump.to_be_bytes());
    let mut x = h.finish();
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

impl Membership {
    /// SWIM for `identity`, randomised from `seed`; received entries merge
    /// into `store`.
    pub(super) fn new(
        identity: GossipId,
        config: &GossipConfig,
        swim_max: usize,
        seed: u64,
        store: StoreHandle,
    ) -> Self {
        let swim_config = swim_config(config, swim_max);
        let foca = Foca::with_custom_broadcast(
            identity,
            swim_config.clone(),
            SmallRng::seed_from_u64(seed),
            WireCodec,
            EntryBroadcasts { store },
        );
        Self {
            foca,
            swim_config,
            runtime: AccumulatingRuntime::new(),
            seeds: Vec::new(),
            down: BTreeSet::new(),
            connected: false,
            addrs: HashMap::new(),
            digest: None,
        }
    }

    // ------------------------------------------------------------- reads

    /// This node's current identity.
    pub(super) fn identity(&self) -> &GossipId {
        self.foca.identity()
    }

    /// Number of active members other than this node.
    pub(super) fn num_members(&self) -> usize {
        self.foca.num_members()
    }

    /// Active members other than this node.
    pub(super) fn members(&self) -> Vec<GossipId> {
        self.foca.iter_members().map(|m| m.id().clone()).collect()
    }

    /// Whether `node` is an active member other than this node.
    pub(super) fn has_member(&self, node: &NodeId) -> bool {
        self.foca.iter_members().any(|m| m.id().node == *node)
    }

    /// The name of the active member at `addr`, if any.
    pub(super) fn node_at(&self, addr: &SocketAddr) -> Option<&NodeId> {
        self.addrs.get(addr)
    }

    /// Forget `id`'s address unless another active identity still has it.
    fn forget_addr(&mut self, id: &GossipId) {
        if self.addrs.get(&id.addr) != Some(&id.node) {
            return;
        }
        let successor = self
            .foca
            .iter_members()
            .map(|m| m.id())
            .find(|m| m.addr == id.addr)
            .map(|m| m.node.clone());
        match successor {
            Some(node) => self.addrs.insert(id.addr, node),
            None => self.addrs.remove(&id.addr),
        };
    }

    /// Nodes declared down (and not seen again).
    pub(super) fn down(&self) -> &BTreeSet<NodeId> {
        &self.down
    }

    /// This node's view for the membership sync: how many active members
    /// it knows, itself included, and the XOR of their digests (so two
    /// nodes that agree have the same pair). Recomputed after a change.
    pub(super) fn view_digest(&mut self) -> (u32, u64) {
        if let Some(d) = self.digest {
            return d;
        }
        let mut digest = id_digest(self.foca.identity());
        let mut count = 1u32;
        for m in self.foca.iter_members() {
            digest ^= id_digest(m.id());
            count = count.saturating_add(1);
        }
        self.digest = Some((count, digest));
        (count, digest)
    }

    /// This node and its active members with an address above `after`, by
    /// ascending address, as many as `take` accepts (it is given each
    /// identity in turn and says whether to go on): a page of a view is
    /// copied, not the whole view.
    pub(super) fn view_after(
        &self,
        after: Option<SocketAddr>,
        mut take: impl FnMut(&GossipId) -> bool,
    ) -> Vec<GossipId> {
        let me = self.foca.identity();
        let mut view: Vec<&GossipId> = std::iter::once(me)
            .chain(self.foca.iter_members().map(|m| m.id()))
            .filter(|id| after.is_none_or(|a| id.addr > a))
            .collect();
        view.sort_unstable_by_key(|id| id.addr);
        view.into_iter()
            .take_while(|id| take(id))
            .cloned()
            .collect()
    }

    /// A random active member's address, picked with `rng` (from foca's
    /// list, whose order is reproducible from the seed).
    pub(super) fn random_member(&self, rng: &mut SmallRng) -> Option<SocketAddr> {
        let n = self.foca.num_members();
        if n == 0 {
            return None;
        }
        let i = rng.random_range(0..n);
        self.foca.iter_members().nth(i).map(|m| m.id().addr)
    }

    /// Learn `ids` as alive members (from another node's view), without
    /// gossiping them further: they are that node's knowledge, not news.
    /// Identities foca knows better (down, or a later rejoin) stay as
    /// they are. Names already active at their address are skipped here
    /// (foca looks a member up by walking its list; a sync list is mostly
    /// known members), so a renewed identity comes through SWIM instead.
    pub(super) fn learn(&mut self, ids: Vec<GossipId>) -> Result<(), foca::Error> {
        let me = self.foca.identity().clone();
        let updates: Vec<_> = ids
            .into_iter()
            .filter(|id| *id != me && self.addrs.get(&id.addr) != Some(&id.node))
            .map(foca::Member::alive)
            .collect();
        if updates.is_empty() {
            return Ok(());
        }
        self.foca
            .apply_many(updates.into_iter(), false, &mut self.runtime)
    }

    // ------------------------------------------------------------ inputs

    /// Remember `seed` to announce to again while it is not a member.
    pub(super) fn remember_seed(&mut self, seed: SocketAddr) {
        if !self.seeds.contains(&seed) && seed != self.foca.identity().addr {
            self.seeds.push(seed);
        }
    }

    /// Ask the node at `addr` to let us in.
    pub(super) fn announce(&mut self, addr: SocketAddr) -> Result<(), foca::Error> {
        let dst = GossipId {
            addr,
            node: NodeId::default(),
            bump: 0,
        };
        self.foca.announce(dst, &mut self.runtime)
    }

    /// Where to announce: every seed that is not a live member; when this
    /// node has no live member, also up to three members seen before,
    /// picked with `rng`.
    pub(super) fn rejoin_targets(&self, rng: &mut SmallRng) -> Vec<SocketAddr> {
        let mut targets: Vec<SocketAddr> = self
            .seeds
            .iter()
            .filter(|s| !self.is_member_addr(s))
            .copied()
            .collect();
        if self.foca.num_members() > 0 {
            return targets;
        }
        let me = self.foca.identity().addr;
        let mut known: Vec<SocketAddr> = self
            .foca
            .iter_membership_state()
            .map(|m| m.id().addr)
            .filter(|a| *a != me && !targets.contains(a))
            .collect();
        for _ in 0..known.len().min(3) {
            let i = rng.random_range(0..known.len());
            targets.push(known.swap_remove(i));
        }
        targets
    }

    /// Hand foca a SWIM body.
    pub(super) fn handle_data(&mut self, body: &[u8]) -> Result<(), foca::Error> {
        self.foca.handle_data(body, &mut self.runtime)
    }

    /// How many registry entries foca still has to send.
    pub(super) fn broadcast_backlog(&self) -> usize {
        self.foca.custom_broadcast_backlog()
    }

    /// Send what foca has to disseminate to a few random members now,
    /// rather than at the next periodic gossip.
    pub(super) fn gossip_now(&mut self) -> Result<(), foca::Error> {
        self.foca.gossip(&mut self.runtime)
    }

    /// Whether `addr` is an active member's address.
    pub(super) fn is_member_addr(&self, addr: &SocketAddr) -> bool {
        self.addrs.contains_key(addr)
    }

    /// Hand foca one of its timers.
    pub(super) fn handle_timer(&mut self, timer: Timer<GossipId>) -> Result<(), foca::Error> {
        self.foca.handle_timer(timer, &mut self.runtime)
    }

    /// Queue an encoded entry for dissemination. foca's answer (whether
    /// the item was news to its handler) is not needed: the machine merges
    /// its own writes through the same handler.
    pub(super) fn add_broadcast(&mut self, item: &[u8]) -> Result<(), foca::Error> {
        self.foca.add_broadcast(item).map(|_| ())
    }

    /// Leave the cluster: members are told.
    pub(super) fn leave(&mut self) -> Result<(), foca::Error> {
        self.foca.leave_cluster(&mut self.runtime)
    }

    /// Set how many times foca sends each broadcast for the current
    /// cluster size, `2·ceil(log2 N) + 1`; returns that number.
    pub(super) fn retune(&mut self) -> u32 {
        let target = dissemination_count(self.foca.num_members() + 1);
        let tx = NonZeroU8::new(u8::try_from(target).unwrap_or(u8::MAX)).unwrap_or(NonZeroU8::MIN);
        if self.swim_config.max_transmissions != tx {
            self.swim_config.max_transmissions = tx;
            if let Err(e) = self.foca.set_config(self.swim_config.clone()) {
                tracing::warn!(error = %e, "could not retune foca");
            }
        }
        target
    }

    // ----------------------------------------------------------- outputs

    /// The next notification foca produced, interpreted.
    pub(super) fn next_notice(&mut self) -> Option<Notice> {
        let note = self.runtime.to_notify()?;
        Some(self.interpret(note))
    }

    /// The next timer foca asked for, with its delay.
    pub(super) fn next_timer(&mut self) -> Option<(std::time::Duration, Timer<GossipId>)> {
        self.runtime.to_schedule()
    }

    /// The next SWIM body foca wants sent, with its destination.
    pub(super) fn next_send(&mut self) -> Option<(SocketAddr, Bytes)> {
        self.runtime.to_send().map(|(to, data)| (to.addr, data))
    }

    /// Whether foca has output not taken yet.
    pub(super) fn has_backlog(&self) -> bool {
        self.runtime.backlog() != 0
    }

    fn interpret(&mut self, note: OwnedNotification<GossipId>) -> Notice {
        self.digest = None;
        match note {
            OwnedNotification::MemberUp(id) => {
                tracing::debug!(member = ?id, "member up");
                self.addrs.insert(id.addr, id.node.clone());
                self.down.remove(&id.node);
                if !self.connected {
                    // We just (re)connected: catch up from this member now.
                    self.connected = true;
                    return Notice::Connected(id.addr);
                }
                Notice::Changed
            }
            OwnedNotification::MemberDown(id) => {
                tracing::debug!(member = ?id, "member down");
                self.forget_addr(&id);
                self.connected = self.foca.num_members() > 0;
                let still_up = self.has_member(&id.node);
                if !still_up && id.node != self.foca.identity().node {
                    self.down.insert(id.node.clone());
                    return Notice::NodeDown(id.node);
                }
                Notice::Changed
            }
            OwnedNotification::Rename(old, new) => {
                tracing::debug!(?old, ?new, "member renamed");
                self.forget_addr(&old);
                if self.foca.iter_members().any(|m| *m.id() == new) {
                    self.addrs.insert(new.addr, new.node.clone());
                }
                self.down.remove(&new.node);
                Notice::Changed
            }
            OwnedNotification::Rejoin(id) => {
                tracing::info!(identity = ?id, "declared down by the cluster; rejoined and re-asserting owned entries");
                Notice::Rejoined
            }
            other => {
                tracing::debug!(notification = ?other, "swim");
                Notice::Other
            }
        }
    }
}
