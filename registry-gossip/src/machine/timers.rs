//! [`Timers`]: the machine's pending timers, ordered by deadline and then
//! by the order they were set, so equal deadlines fire deterministically.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

use foca::Timer;

use crate::wire::GossipId;

/// What a timer does when it fires.
#[derive(Debug)]
pub(super) enum TimerKind {
    /// One of foca's SWIM timers.
    Swim(Timer<GossipId>),
    /// Start an anti-entropy exchange with a random member.
    AntiEntropy,
    /// Collect expired tombstones.
    Gc,
    /// Announce to seeds again if they are not members.
    Rejoin,
    /// Offer a random member this node's view digest (membership sync).
    MemberSync,
}

#[derive(Debug)]
struct Scheduled {
    at: Duration,
    seq: u64,
    kind: TimerKind,
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

/// A min-heap of timers.
#[derive(Debug, Default)]
pub(super) struct Timers {
    heap: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
}

impl Timers {
    /// Fire `kind` at `at`.
    pub(super) fn schedule(&mut self, at: Duration, kind: TimerKind) {
        self.seq += 1;
        self.heap.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            kind,
        }));
    }

    /// The earliest timer due at `now`, removed.
    pub(super) fn pop_due(&mut self, now: Duration) -> Option<TimerKind> {
        if self.heap.peek().is_some_and(|t| t.0.at <= now) {
            self.heap.pop().map(|Reverse(t)| t.kind)
        } else {
            None
        }
    }

    /// The earliest deadline.
    pub(super) fn next_deadline(&self) -> Option<Duration> {
        self.heap.peek().map(|t| t.0.at)
    }
}
