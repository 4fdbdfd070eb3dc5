//! [`Ownership`]: the entries this node asserts, and the writes that keep
//! the replica honest about who is alive.
//!
//! A node owns what it registered. It stamps its writes from the replica's
//! clock (Lamport, kept near the wall clock); it re-asserts everything it owns after the cluster
//! wrongly declared it down; it refutes death tombstones of its own
//! entries; it retracts entries written under its name that it does not
//! own (left by an earlier run); and it turns the live entries of a node
//! declared down into death tombstones. Every function here only computes
//! the entries to write; the machine publishes them.

use std::collections::{BTreeMap, BTreeSet};

use waypost::{Endpoint, EndpointKey, Op};

use super::stats::Stats;
use super::store::Store;
use crate::crdt::{Entry, NodeId, Stamp};

/// The keys this node registered and still asserts, with their value.
#[derive(Debug)]
pub(super) struct Ownership {
    node: NodeId,
    owned: BTreeMap<EndpointKey, Endpoint>,
}

impl Ownership {
    /// Nothing owned yet by `node`.
    pub(super) fn new(node: NodeId) -> Self {
        Self {
            node,
            owned: BTreeMap::new(),
        }
    }

    /// This node's name, the writer of its entries.
    pub(super) fn node(&self) -> &NodeId {
        &self.node
    }

    /// The keys this node owns.
    pub(super) fn keys(&self) -> Vec<EndpointKey> {
        self.owned.keys().cloned().collect()
    }

    /// A stamp for a write by this node that replaces a register of
    /// generation `gen - 1`, with a fresh timestamp: after everything this
    /// node has seen, and not before its clock.
    fn stamp(&self, store: &mut Store, gen: u64) -> Stamp {
        let now = store.now_us();
        let ts = store.replica.tick_at(now);
        Stamp {
            ts,
            gen,
            writer: self.node.clone(),
        }
    }

    /// The entry a local write of `op` produces, if any: a register takes
    /// ownership of the key, a deregister gives it up and tombstones the
    /// key unless it is already gone here.
    pub(super) fn write(&mut self, store: &mut Store, op: Op) -> Option<Entry> {
        match op {
            Op::Register(ep) => {
                let key = ep.key();
                let gen = store.replica.next_gen(&key);
                let stamp = self.stamp(store, gen);
                self.owned.insert(key, ep.clone());
                Some(Entry::live(ep, stamp))
            }
            Op::Deregister(key) => {
                self.owned.remove(&key);
                store.replica.endpoint(&key)?;
                let gen = store.replica.next_gen(&key);
                let stamp = self.stamp(store, gen);
                Some(Entry::tombstone(key, stamp))
            }
        }
    }

    /// Every owned entry again, with fresh stamps (after this node was
    /// declared down and rejoined).
    pub(super) fn reassert_all(&self, store: &mut Store) -> Vec<Entry> {
        self.owned
            .values()
            .map(|ep| {
                let gen = store.replica.next_gen(&ep.key());
                Entry::live(ep.clone(), self.stamp(store, gen))
            })
            .collect()
    }

    /// The death tombstones of `node`'s live entries (it was declared
    /// down): same stamps, so every survivor writes the same ones.
    pub(super) fn death_tombstones(store: &Store, node: &NodeId) -> Vec<Entry> {
        store
            .replica
            .entries()
            .filter(|e| !e.is_tombstone() && e.stamp.writer == *node)
            .map(Entry::killed)
            .collect()
    }

    /// Look at every register replaced since last time: a live entry of a
    /// node in `down` is killed; a death tombstone of one of our own
    /// entries is refuted; an owned key someone else wrote is no longer
    /// ours; a live entry under our name that we do not own is retracted.
    /// Returns the entries to write.
    pub(super) fn reconcile(
        &mut self,
        store: &mut Store,
        down: &BTreeSet<NodeId>,
        stats: &mut Stats,
    ) -> Vec<Entry> {
        let mut writes = Vec::new();
        for key in store.take_touched() {
            let Some(cur) = store.replica.get(&key).cloned() else {
                continue;
            };
            if !cur.is_tombstone()
                && cur.stamp.writer != self.node
                && down.contains(&cur.stamp.writer)
            {
                writes.push(cur.killed());
                continue;
            }
            let Some(mine) = self.owned.get(&key).cloned() else {
                if !cur.is_tombstone() && cur.stamp.writer == self.node {
                    // Written under our name by an earlier run of this
                    // node (a restart faster than failure detection):
                    // nobody asserts it any more, so retract it.
                    let stamp = self.stamp(store, cur.stamp.gen.saturating_add(1));
                    stats.retracted += 1;
                    writes.push(Entry::tombstone(key, stamp));
                }
                continue;
            };
            if cur.stamp.writer == self.node && cur.died {
                let stamp = self.stamp(store, cur.stamp.gen.saturating_add(1));
                stats.reasserted += 1;
                writes.push(Entry::live(mine, stamp));
            } else if cur.stamp.writer != self.node || cur.is_tombstone() {
                self.owned.remove(&key);
            }
        }
        writes
    }
}

#[cfg(test)]
mod tests {
    //! The stamping of local writes, with the clock injected: after
    //! everything the node has seen, and not before its clock.

    use std::time::Duration;

    use waypost::{Endpoint, EndpointKey, Op};

    use super::{Ownership, Store};
    use crate::crdt::{micros, Entry, NodeId, Stamp};
    use crate::machine::store::StoreHandle;

    /// A real UNIX time, so timestamps have their real size.
    const T0: Duration = Duration::from_secs(1_764_000_000);
    const SKEW: Duration = Duration::from_secs(60);
    const TTL: Duration = Duration::from_secs(3600);

    fn ep(addr: &str) -> Endpoint {
        Endpoint::new("names", "leader", addr, 80)
    }

    fn key() -> EndpointKey {
        EndpointKey::new("names", "leader")
    }

    /// Write `op` as node `me` at `now` (this node's clock).
    fn write(me: &mut Ownership, store: &mut Store, now: Duration, op: Op) -> Entry {
        store.set_now(now);
        me.write(store, op).expect("the write produced an entry")
    }

    /// An entry written by `writer` on a clock reading `at`.
    fn remote(writer: &str, at: Duration, gen: u64, value: Option<Endpoint>) -> Entry {
        let stamp = Stamp {
            ts: micros(at) + 1,
            gen,
            writer: NodeId::new(writer),
        };
        match value {
            Some(v) => Entry::live(v, stamp),
            None => Entry::tombstone(key(), stamp),
        }
    }

    #[test]
    fn a_write_is_stamped_just_after_the_clock() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        let e = write(&mut me, &mut store, T0, Op::Register(ep("b-1")));
        assert_eq!(e.stamp.ts, micros(T0) + 1);
        assert_eq!((e.stamp.gen, e.stamp.writer.as_str()), (1, "b"));
        assert_eq!(me.keys(), vec![key()]);
    }

    #[test]
    fn writes_within_one_microsecond_are_stamped_in_order() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        let mut last = 0;
        for (n, addr) in ["b-1", "b-2", "b-3"].into_iter().enumerate() {
            let e = write(&mut me, &mut store, T0, Op::Register(ep(addr)));
            assert!(
                e.stamp.ts > last,
                "write {n} stamped {} after {last}",
                e.stamp.ts
            );
            assert_eq!(e.stamp.gen, n as u64 + 1);
            store.merge(e.clone(), false);
            last = e.stamp.ts;
        }
        let gone = write(&mut me, &mut store, T0, Op::Deregister(key()));
        assert!(gone.is_tombstone());
        assert!(gone.stamp.ts > last);
    }

    #[test]
    fn stamps_never_go_back_when_the_clock_does() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        let later = T0 + Duration::from_secs(5);
        let first = write(&mut me, &mut store, later, Op::Register(ep("b-1")));
        store.merge(first.clone(), false);
        let second = write(&mut me, &mut store, T0, Op::Register(ep("b-2")));
        assert_eq!(second.stamp.ts, first.stamp.ts + 1);
        assert_eq!(second.lww_cmp(&first), std::cmp::Ordering::Greater);
    }

    #[test]
    fn a_write_after_a_tombstone_from_a_clock_ahead_beats_it() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        // Node a, its clock 60 s ahead, registered then deregistered.
        let ahead = T0 + SKEW;
        let a_live = remote("a", ahead, 1, Some(ep("a-1")));
        let a_gone = remote("a", ahead + Duration::from_millis(1), 2, None);
        // Received a few milliseconds after they were written.
        store.set_now(T0 + Duration::from_millis(2));
        assert!(store.merge_remote(a_live, false));
        assert!(store.merge_remote(a_gone.clone(), false));
        assert_eq!(store.refused, 0);
        assert!(store.replica.endpoint(&key()).is_none());

        let now = T0 + Duration::from_millis(3);
        let mine = write(&mut me, &mut store, now, Op::Register(ep("b-1")));
        assert_eq!(mine.stamp.ts, a_gone.stamp.ts + 1);
        assert_eq!(mine.stamp.gen, 3);
        assert_eq!(mine.lww_cmp(&a_gone), std::cmp::Ordering::Greater);
        assert!(store.merge(mine.clone(), false));
        // The tombstone arriving again changes nothing.
        assert!(!store.merge_remote(a_gone, false));
        assert_eq!(store.replica.endpoint(&key()), mine.value.as_ref());
    }

    #[test]
    fn a_write_after_an_entry_from_a_clock_ahead_beats_it() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        let a_live = remote("a", T0 + SKEW, 1, Some(ep("a-1")));
        store.set_now(T0 + Duration::from_millis(2));
        assert!(store.merge_remote(a_live.clone(), false));
        let mine = write(&mut me, &mut store, T0, Op::Register(ep("b-1")));
        assert_eq!(mine.stamp.ts, a_live.stamp.ts + 1);
        assert_eq!(mine.stamp.gen, 2);
        assert!(store.merge(mine, false));
        assert_eq!(store.replica.endpoint(&key()), Some(&ep("b-1")));
    }

    #[test]
    fn stamps_follow_the_clock_again_once_it_passes_what_was_seen() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        store.set_now(T0 + Duration::from_millis(2));
        assert!(store.merge_remote(remote("a", T0 + SKEW, 1, Some(ep("a-1"))), false));
        let later = T0 + SKEW * 2;
        let mine = write(&mut me, &mut store, later, Op::Register(ep("b-1")));
        assert_eq!(mine.stamp.ts, micros(later) + 1);
    }

    #[test]
    fn a_refused_entry_leaves_the_stamps_on_the_local_clock() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        let too_far = remote("a", T0 + SKEW, 1, Some(ep("a-1")));
        // Arrives at once: one microsecond beyond the skew.
        assert!(!store.merge_remote(too_far, false));
        assert_eq!(store.refused, 1);
        let mine = write(&mut me, &mut store, T0, Op::Register(ep("b-1")));
        assert_eq!(mine.stamp.ts, micros(T0) + 1);
        assert_eq!(mine.stamp.gen, 1);
    }

    #[test]
    fn reasserted_entries_are_stamped_after_their_death_tombstones() {
        let handle = StoreHandle::new(T0, SKEW, TTL);
        let mut store = handle.lock();
        let mut me = Ownership::new(NodeId::new("b"));
        let mine = write(&mut me, &mut store, T0, Op::Register(ep("b-1")));
        store.merge(mine.clone(), false);
        // A member whose clock runs ahead declared b down, then b's clock
        // saw that member's later writes.
        store.set_now(T0 + Duration::from_millis(2));
        assert!(store.merge_remote(mine.killed(), false));
        let seen = remote("c", T0 + SKEW, 1, Some(Endpoint::new("other", "x", "c", 1)));
        assert!(store.merge_remote(seen.clone(), false));
        let again = me.reassert_all(&mut store);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].stamp.ts, seen.stamp.ts + 1);
        assert_eq!(again[0].stamp.gen, mine.stamp.gen + 1);
        assert_eq!(
            again[0].lww_cmp(&mine.killed()),
            std::cmp::Ordering::Greater
        );
    }
}
