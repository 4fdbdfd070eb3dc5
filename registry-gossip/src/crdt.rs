//! The replicated state: one last-writer-wins register per endpoint key.
//!
//! Pure data, no I/O: [`Entry`], its total order ([`Entry::lww_cmp`]), and
//! [`Replica`], a map of registers merged pointwise.
//!
//! # The merge rule
//!
//! A register holds the entry with the greatest
//! `(timestamp, generation, writer)`; when two entries agree on all three
//! (which only happens for a death tombstone and the live entry it kills, or
//! for corrupt input), a tombstone beats a live value, and after that the
//! encoded value decides. A total order makes merge a join: commutative,
//! associative and idempotent, so any delivery order of the same entries
//! gives the same state (property-tested in `tests/crdt_laws.rs`).
//!
//! # The clock
//!
//! Timestamps come from a Lamport clock kept near the wall clock: every
//! node's clock moves to the largest timestamp it has seen ([`Replica::merge`]
//! does it on receive), and a local write takes `max(clock, now) + 1`, `now`
//! being the wall clock in microseconds since the UNIX epoch
//! ([`Replica::tick_at`]). A write made after a node has seen another write
//! therefore always wins over it, whatever the nodes' wall clocks say,
//! which is what makes a re-registration after an unregister win
//! everywhere; and a restarted node, whose clock starts at 0, still stamps
//! its writes after its earlier run's. Because timestamps follow the wall
//! clock, a bound on them means something: the machine refuses entries
//! stamped further ahead of its own clock than `max_clock_skew`, so one bad
//! timestamp (`u64::MAX`, say) cannot pin every clock at its maximum.
//! Concurrent writes (neither node had seen the other's) are ordered by
//! timestamp and then by the tie-breaks above, identically on every node.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use waypost::{Endpoint, EndpointKey};

/// The name of a gossip node: the writer of entries and the unit of
/// liveness. Compared as a string for the LWW tie-break.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeId(pub String);

impl NodeId {
    /// A node id from a name.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// When and by whom an entry was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// Lamport timestamp.
    pub ts: u64,
    /// Per-key counter, one more than the entry the write replaced.
    pub gen: u64,
    /// The node that wrote the entry. For a death tombstone: the dead node.
    pub writer: NodeId,
}

impl Stamp {
    fn cmp_parts(&self, other: &Stamp) -> Ordering {
        self.ts
            .cmp(&other.ts)
            .then(self.gen.cmp(&other.gen))
            .then_with(|| self.writer.cmp(&other.writer))
    }
}

/// One register: the latest write to a key, live or a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The endpoint key this register holds.
    pub key: EndpointKey,
    /// When and by whom.
    pub stamp: Stamp,
    /// The endpoint, or `None` for a tombstone.
    pub value: Option<Endpoint>,
    /// A tombstone written on behalf of a dead writer (SWIM declared
    /// `stamp.writer` down). Its stamp is the stamp of the entry it kills,
    /// so every survivor writes the same tombstone, and the owner, when it
    /// turns out to be alive, refutes it with a newer write.
    pub died: bool,
}

impl Entry {
    /// A live entry.
    pub fn live(endpoint: Endpoint, stamp: Stamp) -> Self {
        Self {
            key: endpoint.key(),
            stamp,
            value: Some(endpoint),
            died: false,
        }
    }

    /// A tombstone for `key`.
    pub fn tombstone(key: EndpointKey, stamp: Stamp) -> Self {
        Self {
            key,
            stamp,
            value: None,
            died: false,
        }
    }

    /// Whether this is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }

    /// The tombstone SWIM death turns this entry into: same stamp, no value.
    pub fn killed(&self) -> Entry {
        Entry {
            key: self.key.clone(),
            stamp: self.stamp.clone(),
            value: None,
            died: true,
        }
    }

    /// The total LWW order: `Greater` means `self` wins over `other`.
    pub fn lww_cmp(&self, other: &Entry) -> Ordering {
        self.stamp
            .cmp_parts(&other.stamp)
            .then(self.is_tombstone().cmp(&other.is_tombstone()))
            .then(self.died.cmp(&other.died))
            .then_with(|| cmp_values(self.value.as_ref(), other.value.as_ref()))
            .then_with(|| self.key.cmp(&other.key))
    }

    /// A 64-bit fingerprint of the stamp and kind, for anti-entropy
    /// digests: two replicas whose fingerprints for a key differ exchange
    /// the entry.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(&self.stamp.ts.to_le_bytes());
        h.write(&self.stamp.gen.to_le_bytes());
        h.write(self.stamp.writer.as_str().as_bytes());
        h.write(&[u8::from(self.is_tombstone()), u8::from(self.died)]);
        h.finish()
    }
}

fn cmp_values(a: Option<&Endpoint>, b: Option<&Endpoint>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => {
            let fields = |e: &Endpoint| {
                (
                    e.address.clone(),
                    e.port,
                    e.protocol.as_str(),
                    e.cluster.clone(),
                    e.node.clone(),
                    e.health.as_str(),
                    e.labels.clone(),
                )
            };
            fields(a).cmp(&fields(b))
        }
        (a, b) => a.is_some().cmp(&b.is_some()),
    }
}

/// 64-bit FNV-1a: stable across builds and platforms, unlike the std hasher.
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// A time as microseconds, the unit of timestamps and of datagram
/// counters; saturates at `u64::MAX`.
pub fn micros(t: std::time::Duration) -> u64 {
    u64::try_from(t.as_micros()).unwrap_or(u64::MAX)
}

/// The position of a key in anti-entropy's hash space.
pub fn key_hash(key: &EndpointKey) -> u64 {
    let mut h = Fnv::new();
    h.write(key.service.as_bytes());
    h.write(&[0]);
    h.write(key.id.as_bytes());
    h.finish()
}

/// A visible change of the replica: the endpoint under a key before and
/// after a merge (`None` = absent or tombstoned).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The key that changed.
    pub key: EndpointKey,
    /// The visible value before.
    pub before: Option<Endpoint>,
    /// The visible value after.
    pub after: Option<Endpoint>,
}

/// A Lamport clock: the largest timestamp a node has seen or written.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct LamportClock(u64);

impl LamportClock {
    /// Receive: move to at least `ts`.
    fn observe(&mut self, ts: u64) {
        self.0 = self.0.max(ts);
    }

    /// A local write: advance by one and return the new timestamp.
    fn tick(&mut self) -> u64 {
        self.0 = self.0.saturating_add(1);
        self.0
    }
}

impl fmt::Debug for LamportClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A map of LWW registers, one per key, tombstones included.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replica {
    entries: BTreeMap<EndpointKey, Entry>,
    clock: LamportClock,
}

impl Replica {
    /// An empty replica with its clock at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Merge one entry: it replaces the register when it wins the LWW
    /// order. Moves the clock to at least its timestamp (Lamport receive).
    /// Returns the visible change, if any, and whether the register was
    /// replaced (a replaced register with no visible change is possible,
    /// e.g. a tombstone over a tombstone).
    pub fn merge(&mut self, entry: Entry) -> (bool, Option<Change>) {
        self.clock.observe(entry.stamp.ts);
        let before = match self.entries.get(&entry.key) {
            Some(cur) if entry.lww_cmp(cur) != Ordering::Greater => return (false, None),
            Some(cur) => cur.value.clone(),
            None => None,
        };
        let after = entry.value.clone();
        let key = entry.key.clone();
        self.entries.insert(key.clone(), entry);
        let change = (before != after).then_some(Change { key, before, after });
        (true, change)
    }

    /// Merge every entry of `other` into this replica.
    pub fn merge_all(&mut self, other: &Replica) {
        for e in other.entries.values() {
            self.merge(e.clone());
        }
    }

    /// The register of `key`, tombstone included.
    pub fn get(&self, key: &EndpointKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The live endpoint under `key`.
    pub fn endpoint(&self, key: &EndpointKey) -> Option<&Endpoint> {
        self.entries.get(key).and_then(|e| e.value.as_ref())
    }

    /// Every register, tombstones included, ordered by key.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.entries.values()
    }

    /// Every live endpoint, ordered by key.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> + '_ {
        self.entries.values().filter_map(|e| e.value.as_ref())
    }

    /// Number of registers, tombstones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no registers at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The Lamport clock: the largest timestamp seen or written.
    pub fn clock(&self) -> u64 {
        self.clock.0
    }

    /// Advance the clock for a local write and return the new timestamp.
    pub fn tick(&mut self) -> u64 {
        self.clock.tick()
    }

    /// Advance the clock for a local write made at wall-clock time `now`
    /// (in microseconds) and return the new timestamp:
    /// `max(clock, now) + 1`.
    pub fn tick_at(&mut self, now: u64) -> u64 {
        self.clock.observe(now);
        self.clock.tick()
    }

    /// Forget a register entirely (tombstone garbage collection).
    pub(crate) fn forget(&mut self, key: &EndpointKey) -> Option<Entry> {
        self.entries.remove(key)
    }

    /// The generation a new write to `key` gets.
    pub fn next_gen(&self, key: &EndpointKey) -> u64 {
        self.entries
            .get(key)
            .map_or(1, |e| e.stamp.gen.saturating_add(1))
    }
}
