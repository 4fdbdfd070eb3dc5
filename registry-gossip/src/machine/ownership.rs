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

use registry_api::{Endpoint, EndpointKey, Op};

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
