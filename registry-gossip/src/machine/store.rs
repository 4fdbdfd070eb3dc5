//! [`Store`]: the LWW replica with what tombstone collection needs to know
//! about each register, the registers replaced since the machine last
//! looked, and the visible changes not yet taken.
//!
//! The store is shared ([`StoreHandle`]) between the machine and foca's
//! broadcast handler, which merges entries as they arrive in the middle of
//! foca's own processing.
//!
//! A deregistration's tombstone older than the tombstone TTL (and the
//! skew) that arrives for a key the store holds nothing of is dropped: it
//! was collected here (or would be at once), and taking it again would
//! keep it for another TTL and bounce it between nodes that collect at
//! different times. One for a key still held live is merged: it deletes
//! that entry. (A death tombstone carries the stamp of the entry it kills,
//! so its timestamp tells nothing of its age: it is always merged.)
//!
//! The store also bounds the clock: an entry stamped further ahead of this
//! node's clock than the allowed skew (or at `u64::MAX`) is refused before
//! the replica sees it, so it neither replaces a register nor drags the
//! replica's clock forward.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use waypost::EndpointKey;

use super::stats;
use crate::crdt::{micros, Change, Entry, Replica};

/// Per-register bookkeeping for tombstone collection: when the register
/// was last replaced, and how many of its sends are done.
#[derive(Debug, Clone)]
struct Dissemination {
    merged_at: Duration,
    sent: u32,
    target: u32,
}

/// The replica and its bookkeeping.
#[derive(Debug)]
pub(super) struct Store {
    /// The registers.
    pub(super) replica: Replica,
    dissemination: HashMap<EndpointKey, Dissemination>,
    /// Keys whose register was replaced since the last reconcile.
    touched: Vec<EndpointKey>,
    changes: Vec<Change>,
    now: Duration,
    /// How many times a broadcast is sent in the current cluster.
    pub(super) target: u32,
    /// How far ahead of `now` an entry's timestamp may be.
    max_skew: Duration,
    /// How long a tombstone is kept once disseminated.
    ttl: Duration,
    /// Entries refused for a timestamp too far ahead.
    pub(super) refused: u64,
    /// Expired tombstones received for keys not held, dropped.
    pub(super) expired_dropped: u64,
}

impl Store {
    fn new(now: Duration, max_skew: Duration, ttl: Duration) -> Self {
        Self {
            replica: Replica::new(),
            dissemination: HashMap::new(),
            touched: Vec::new(),
            changes: Vec::new(),
            now,
            target: 1,
            max_skew,
            ttl,
            refused: 0,
            expired_dropped: 0,
        }
    }

    /// This node's clock in microseconds.
    pub(super) fn now_us(&self) -> u64 {
        micros(self.now)
    }

    /// The largest timestamp an entry may carry now: this node's clock in
    /// microseconds plus the allowed skew.
    pub(super) fn max_ts(&self) -> u64 {
        micros(self.now + self.max_skew).min(u64::MAX - 1)
    }

    /// Merge an entry received from another node, unless it is stamped
    /// after [`Store::max_ts`]: then it is refused (counted, not merged,
    /// the clock unmoved), or it is an expired tombstone of a key not held
    /// (dropped, counted; see the module docs). Otherwise as
    /// [`Store::merge`].
    pub(super) fn merge_remote(&mut self, entry: Entry, disseminated: bool) -> bool {
        if self.expired_unheld(&entry) {
            self.expired_dropped += 1;
            tracing::debug!(key = %entry.key, ts = entry.stamp.ts, "dropped an expired tombstone of a key not held");
            return false;
        }
        let limit = self.max_ts();
        if entry.stamp.ts > limit {
            self.refused += 1;
            metrics::counter!(stats::REFUSED_METRIC).increment(1);
            let (key, writer, ts) = (&entry.key, &entry.stamp.writer, entry.stamp.ts);
            if stats::warn_now(self.refused) {
                tracing::warn!(%key, %writer, ts, limit, "refused an entry stamped too far ahead of this node's clock");
            } else {
                tracing::debug!(%key, %writer, ts, limit, "refused an entry stamped too far ahead of this node's clock");
            }
            return false;
        }
        self.merge(entry, disseminated)
    }

    /// Whether `entry` is a deregistration's tombstone older than the TTL
    /// plus the skew (by its timestamp against this node's clock) for a
    /// key not held here.
    fn expired_unheld(&self, entry: &Entry) -> bool {
        entry.is_tombstone()
            && !entry.died
            && self.replica.get(&entry.key).is_none()
            && self.now_us().saturating_sub(entry.stamp.ts) > micros(self.ttl + self.max_skew)
    }

    /// Merge `entry` (a local write, or a remote one already checked);
    /// `disseminated` when nobody needs it from this node any more (it
    /// came by anti-entropy, or will travel only that way). Returns whether
    /// it replaced the register.
    pub(super) fn merge(&mut self, entry: Entry, disseminated: bool) -> bool {
        let key = entry.key.clone();
        let (replaced, change) = self.replica.merge(entry);
        if replaced {
            let target = self.target;
            self.dissemination.insert(
                key.clone(),
                Dissemination {
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

    /// Move the store's notion of now (merges stamp it on their register).
    pub(super) fn set_now(&mut self, now: Duration) {
        self.now = now;
    }

    /// The keys whose register was replaced since the last call.
    pub(super) fn take_touched(&mut self) -> Vec<EndpointKey> {
        std::mem::take(&mut self.touched)
    }

    /// The visible changes since the last call, in order.
    pub(super) fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// `entry` went out once more in a SWIM datagram: count it if it is
    /// still the register's current value.
    pub(super) fn note_sent(&mut self, entry: &Entry) {
        let current = self.replica.get(&entry.key).is_some_and(|c| c == entry);
        if current {
            if let Some(m) = self.dissemination.get_mut(&entry.key) {
                m.sent = m.sent.saturating_add(1);
            }
        }
    }

    /// Forget every tombstone that was sent its target number of times (or
    /// needs no sending because this node is `alone`) and is older than
    /// the TTL. Returns how many were forgotten.
    pub(super) fn collect_tombstones(&mut self, alone: bool) -> usize {
        let (now, ttl) = (self.now, self.ttl);
        let expired: Vec<EndpointKey> = self
            .replica
            .entries()
            .filter(|e| e.is_tombstone())
            .filter(|e| {
                self.dissemination.get(&e.key).is_none_or(|m| {
                    (alone || m.sent >= m.target) && now.saturating_sub(m.merged_at) >= ttl
                })
            })
            .map(|e| e.key.clone())
            .collect();
        for key in &expired {
            self.replica.forget(key);
            self.dissemination.remove(key);
        }
        expired.len()
    }
}

/// The store shared by the machine and foca's broadcast handler.
#[derive(Debug, Clone)]
pub(super) struct StoreHandle(Arc<Mutex<Store>>);

impl StoreHandle {
    /// An empty store at time `now`, refusing entries stamped more than
    /// `max_skew` after it, keeping tombstones for `ttl` once disseminated.
    pub(super) fn new(now: Duration, max_skew: Duration, ttl: Duration) -> Self {
        Self(Arc::new(Mutex::new(Store::new(now, max_skew, ttl))))
    }

    /// Lock the store.
    pub(super) fn lock(&self) -> MutexGuard<'_, Store> {
        // Every store mutation completes before the lock is released.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
