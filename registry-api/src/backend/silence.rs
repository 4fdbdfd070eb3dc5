//! [`Silence`]: how long each node has been silent, timed on the judge's
//! own monotonic clock.
//!
//! A node's liveness record carries a value that changes at every recorded
//! heartbeat (a counter, with the writer's wall time beside it for people
//! to read). A judge (a sweeper) never compares that wall time with its
//! own: it remembers, per node, the value it last saw and the [`Instant`]
//! at which it saw the value change, and a node is silent for as long as
//! the value has not changed on the judge's clock. Kubernetes' node
//! lifecycle controller judges node heartbeats the same way.
//!
//! A node seen for the first time (the judge has just started, or the
//! record is new) gets a full grace period from that moment: its silence
//! starts at zero. Clocks of other processes, and steps of the judge's own
//! wall clock, change nothing.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use waypost::backend::Silence;
//!
//! let start = Instant::now();
//! let mut judge = Silence::new();
//! // First sight: silent for nothing yet, whatever the record's wall time.
//! assert_eq!(judge.observe("n1", 7u64, start).silent_for, Duration::ZERO);
//! // Unchanged 20 s later: silent for 20 s.
//! let later = start + Duration::from_secs(20);
//! assert_eq!(judge.observe("n1", 7, later).silent_for, Duration::from_secs(20));
//! // A new heartbeat value: silence starts again, and the node was heard.
//! let seen = judge.observe("n1", 8, later + Duration::from_secs(1));
//! assert_eq!((seen.silent_for, seen.heard), (Duration::ZERO, true));
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What [`Silence::observe`] found of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// How long the node's value has not changed, on the judge's clock
    /// (zero at first sight).
    pub silent_for: Duration,
    /// Whether the judge has seen the value change (or written it itself)
    /// since it first saw the node: then the silence runs from a heartbeat,
    /// not merely from the judge's first look, and a node marked silent
    /// before may be revived.
    pub heard: bool,
}

#[derive(Debug, Clone)]
struct Seen<V> {
    value: V,
    since: Instant,
    heard: bool,
}

/// Per-node silence on the judge's own monotonic clock; see the module
/// documentation. `V` is whatever a record holds that changes at every
/// recorded heartbeat.
#[derive(Debug, Clone)]
pub struct Silence<V> {
    nodes: HashMap<String, Seen<V>>,
}

impl<V> Default for Silence<V> {
    fn default() -> Self {
        Self {
            nodes: HashMap::new(),
        }
    }
}

impl<V: PartialEq> Silence<V> {
    /// A judge that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A read at `now` found `node`'s record holding `value`: a value
    /// other than the one last seen starts the node's silence again.
    pub fn observe(&mut self, node: &str, value: V, now: Instant) -> Observed {
        match self.nodes.get_mut(node) {
            Some(seen) => {
                if seen.value != value {
                    *seen = Seen {
                        value,
                        since: now,
                        heard: true,
                    };
                }
                Observed {
                    silent_for: now.saturating_duration_since(seen.since),
                    heard: seen.heard,
                }
            }
            None => {
                self.nodes.insert(
                    node.to_string(),
                    Seen {
                        value,
                        since: now,
                        heard: false,
                    },
                );
                Observed {
                    silent_for: Duration::ZERO,
                    heard: false,
                }
            }
        }
    }

    /// This process itself recorded a heartbeat of `node` at `now`, leaving
    /// `value` in its record: its silence starts now, without waiting for
    /// the next read to show the change.
    pub fn wrote(&mut self, node: &str, value: V, now: Instant) {
        self.nodes.insert(
            node.to_string(),
            Seen {
                value,
                since: now,
                heard: true,
            },
        );
    }

    /// Forget `node` (removed, or its record gone).
    pub fn forget(&mut self, node: &str) {
        self.nodes.remove(node);
    }

    /// Keep only the nodes for which `keep` answers true.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.nodes.retain(|node, _| keep(node));
    }

    /// How many nodes the judge remembers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the judge remembers no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// A record as a backend holds it: a heartbeat counter and the wall
    /// time of whichever process wrote it.
    type Beat = (u64, u64);

    #[test]
    fn silence_runs_on_the_judges_clock_whatever_the_writers_wall_clock() {
        let t0 = Instant::now();
        let mut judge: Silence<Beat> = Silence::new();
        // Written by a process whose wall clock is ten minutes ahead, then
        // by one ten minutes behind: only the change of value counts.
        let ahead = 1_800_000_600_000;
        let behind = 1_799_999_400_000;
        assert_eq!(judge.observe("n", (1, ahead), t0).silent_for, S(0));
        assert_eq!(judge.observe("n", (1, ahead), t0 + S(5)).silent_for, S(5));
        let back = judge.observe("n", (2, behind), t0 + S(6));
        assert_eq!((back.silent_for, back.heard), (S(0), true));
        assert_eq!(
            judge.observe("n", (2, behind), t0 + S(36)).silent_for,
            S(30)
        );
    }

    #[test]
    fn first_sight_gives_full_grace_and_is_not_a_heartbeat() {
        let t0 = Instant::now();
        let mut judge: Silence<Beat> = Silence::new();
        // A record last written an hour ago by the wall clock: no matter.
        let seen = judge.observe("old", (40, 1), t0);
        assert_eq!(
            seen,
            Observed {
                silent_for: S(0),
                heard: false
            }
        );
        let seen = judge.observe("old", (40, 1), t0 + S(29));
        assert_eq!(
            seen,
            Observed {
                silent_for: S(29),
                heard: false
            }
        );
    }

    #[test]
    fn the_judges_own_writes_count_at_once() {
        let t0 = Instant::now();
        let mut judge: Silence<Beat> = Silence::new();
        judge.observe("n", (3, 100), t0);
        judge.wrote("n", (4, 200), t0 + S(20));
        // The next read shows what this process wrote: no new change.
        let seen = judge.observe("n", (4, 200), t0 + S(25));
        assert_eq!(
            seen,
            Observed {
                silent_for: S(5),
                heard: true
            }
        );
        // Another process wrote meanwhile: the change is seen at the read.
        let seen = judge.observe("n", (5, 150), t0 + S(26));
        assert_eq!(seen.silent_for, S(0));
    }

    #[test]
    fn forgotten_nodes_start_over() {
        let t0 = Instant::now();
        let mut judge: Silence<u64> = Silence::new();
        judge.observe("a", 1, t0);
        judge.observe("b", 1, t0);
        judge.retain(|n| n == "a");
        assert_eq!(judge.len(), 1);
        assert_eq!(judge.observe("b", 1, t0 + S(60)).silent_for, S(0));
        judge.forget("a");
        judge.forget("b");
        assert!(judge.is_empty());
    }

    #[test]
    fn an_instant_earlier_than_the_last_change_is_no_silence() {
        let t0 = Instant::now() + S(100);
        let mut judge: Silence<u64> = Silence::new();
        judge.wrote("n", 1, t0);
        assert_eq!(judge.observe("n", 1, t0 - S(3)).silent_for, S(0));
    }
}
