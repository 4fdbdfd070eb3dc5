//! [`AntiEntropy`]: the digest / want / push exchange that repairs what
//! broadcasts missed.
//!
//! Every round a node sends a random member a [`AeMessage::Digest`]: the
//! `(key hash, fingerprint)` of its registers from the cursor on, ordered
//! by hash, as many as fit a datagram. The member pushes back every entry
//! of that range whose fingerprint differs or that the digest lacks, and
//! answers [`AeMessage::Want`] with the hashes it lacks or holds
//! differently, and where the next page starts. The first node pushes
//! what was wanted and, while the pages differ, sends the next digest at
//! once, so a late joiner catches up in one pass. Each side pushes at most
//! the budget's bytes per message it answers.
//!
//! Everything here only computes the messages; the machine frames and
//! sends them.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use rand::rngs::SmallRng;
use rand::RngExt;
use waypost::EndpointKey;

use super::stats::Stats;
use super::store::Store;
use crate::crdt::{key_hash, Entry};
use crate::layout;
use crate::wire::{AeMessage, GossipId};

/// The exchange's settings and its place in the hash space.
#[derive(Debug)]
pub(super) struct AntiEntropy {
    /// Where the next round's digest starts.
    cursor: u64,
    /// Largest datagram, frame included.
    max_packet: usize,
    /// Bytes the frame adds.
    overhead: usize,
    /// Most entry bytes pushed in answer to one message.
    budget: usize,
}

/// `(key hash, fingerprint, key)` of every register, ordered by hash.
fn digests(store: &Store) -> Vec<(u64, u64, EndpointKey)> {
    let mut v: Vec<(u64, u64, EndpointKey)> = store
        .replica
        .entries()
        .map(|e| (key_hash(&e.key), e.fingerprint(), e.key.clone()))
        .collect();
    v.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
    v
}

impl AntiEntropy {
    /// An exchange in datagrams of at most `max_packet` bytes, of which
    /// the frame takes `overhead`, pushing at most `budget` bytes of
    /// entries per answer.
    pub(super) fn new(max_packet: usize, overhead: usize, budget: usize) -> Self {
        Self {
            cursor: 0,
            max_packet,
            overhead,
            budget,
        }
    }

    /// Start a round: a member picked with `rng`, and the digest to send
    /// it. `None` when there is no member.
    pub(super) fn start_round(
        &self,
        store: &Store,
        members: &[GossipId],
        rng: &mut SmallRng,
        stats: &mut Stats,
    ) -> Option<(SocketAddr, AeMessage)> {
        if members.is_empty() {
            return None;
        }
        let peer = members[rng.random_range(0..members.len())].addr;
        Some((peer, self.digest(store, self.cursor, stats)))
    }

    /// The digest page of this node's registers from hash `lo` on.
    pub(super) fn digest(&self, store: &Store, lo: u64, stats: &mut Stats) -> AeMessage {
        let room = (self.max_packet - self.overhead - 18) / 16;
        let all = digests(store);
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
        stats.digests_sent += 1;
        AeMessage::Digest { lo, hi, items }
    }

    /// `entries` as pushes of at most a datagram each (one oversized entry
    /// goes alone), within the budget, appended to `out`. Returns how many
    /// entries were dealt with (sent, or skipped as unencodable).
    fn push(&self, entries: Vec<Entry>, out: &mut Vec<AeMessage>) -> usize {
        let limit = self.max_packet - self.overhead - 2;
        let mut budget = self.budget;
        let mut batch: Vec<Entry> = Vec::new();
        let mut batch_len = 0;
        let mut sent = 0;
        for e in entries {
            let Ok(bytes) = layout::encode_entry(&e) else {
                sent += 1;
                continue;
            };
            if bytes.len() > budget {
                break;
            }
            if batch_len + bytes.len() > limit && !batch.is_empty() {
                let full = std::mem::take(&mut batch);
                out.push(AeMessage::Push { entries: full });
                batch_len = 0;
            }
            budget -= bytes.len();
            batch_len += bytes.len();
            batch.push(e);
            sent += 1;
        }
        if !batch.is_empty() {
            out.push(AeMessage::Push { entries: batch });
        }
        sent
    }

    /// Handle a message from a peer; returns the answers to send it, in
    /// order.
    pub(super) fn handle(
        &mut self,
        store: &mut Store,
        msg: AeMessage,
        stats: &mut Stats,
    ) -> Vec<AeMessage> {
        let mut out = Vec::new();
        match msg {
            AeMessage::Digest { lo, hi, items } => {
                let theirs: HashMap<u64, u64> = items.iter().copied().collect();
                let all = digests(store);
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
                let entries: Vec<Entry> = push_keys
                    .iter()
                    .filter_map(|(_, k)| store.replica.get(k).cloned())
                    .collect();
                let n = entries.len();
                let sent = self.push(entries, &mut out);
                let next = if sent < n {
                    push_keys.get(sent).map_or(0, |p| p.0)
                } else {
                    hi.checked_add(1).unwrap_or(0)
                };
                let differed = n > 0 || !want.is_empty();
                out.push(AeMessage::Want {
                    hashes: want,
                    next,
                    differed,
                });
            }
            AeMessage::Want {
                hashes,
                next,
                differed,
            } => {
                let wanted: BTreeSet<u64> = hashes.into_iter().collect();
                let entries: Vec<Entry> = store
                    .replica
                    .entries()
                    .filter(|e| wanted.contains(&key_hash(&e.key)))
                    .cloned()
                    .collect();
                self.push(entries, &mut out);
                self.cursor = next;
                if differed && next != 0 {
                    // Keep going through the hash space while the replicas
                    // differ: a late joiner catches up in one pass.
                    out.push(self.digest(store, next, stats));
                }
            }
            AeMessage::Push { entries } => {
                for e in entries {
                    if store.merge_remote(e, true) {
                        stats.entries_repaired += 1;
                    }
                }
            }
        }
        out
    }
}
