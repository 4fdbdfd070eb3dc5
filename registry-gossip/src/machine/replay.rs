//! [`Replays`]: which keyed datagrams are fresh.
//!
//! Every keyed datagram carries, under its tag, its sender's name and a
//! counter that the sender raises for every datagram it seals: the wall
//! clock in microseconds since the UNIX epoch, plus one when two datagrams
//! would share a microsecond (so a restarted sender goes on from where its
//! clock is, above its earlier run's counters).
//!
//! A datagram is admitted when its counter is
//!
//! - within `max_clock_skew` of this node's clock, either way (further
//!   ahead: [`Rejected::Ahead`]; further behind: [`Rejected::Behind`], which
//!   also bounds how old a datagram a forgotten window lets through), and
//! - new in its sender's window: above the lowest of the last [`WINDOW`]
//!   counters accepted from that sender ([`Rejected::TooOld`]) and not one
//!   of them ([`Rejected::Replay`]).
//!
//! The window keeps the [`WINDOW`] largest counters accepted (sorted; an
//! in-order counter costs a comparison and a push), not a bitmap over the
//! last counter values: counters are microseconds, with gaps, so a bitmap
//! of 64 values would cover 64 µs and drop any reordering longer than
//! that. Kept this way, a datagram overtaken by up to [`WINDOW`] - 1 later
//! ones is still admitted. The table holds at most `max_senders` windows; a new sender past
//! that evicts the one heard from least recently (only key holders can add
//! senders, since the sender's name is under the tag).

use std::collections::{HashMap, VecDeque};

/// Counters kept per sender: how much reordering is tolerated.
pub(crate) const WINDOW: usize = 64;

/// Default bound on the senders tracked.
pub(super) const MAX_SENDERS: usize = 4096;

/// Why a keyed datagram was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The counter was accepted before.
    #[error("counter {counter} already seen (replay)")]
    Replay {
        /// The datagram's counter.
        counter: u64,
    },
    /// The counter is below every counter kept for the sender, so whether
    /// it was seen cannot be told.
    #[error("counter {counter} older than the window (lowest kept {lowest})")]
    TooOld {
        /// The datagram's counter.
        counter: u64,
        /// The lowest counter kept in the sender's window.
        lowest: u64,
    },
    /// The counter is further ahead of this node's clock than the skew
    /// allows.
    #[error("counter {counter} is {ahead_us} us ahead of this node's clock")]
    Ahead {
        /// The datagram's counter.
        counter: u64,
        /// How far ahead, in microseconds.
        ahead_us: u64,
    },
    /// The counter is further behind this node's clock than the skew
    /// allows (a stale or replayed datagram).
    #[error("counter {counter} is {behind_us} us behind this node's clock")]
    Behind {
        /// The datagram's counter.
        counter: u64,
        /// How far behind, in microseconds.
        behind_us: u64,
    },
}

/// The [`WINDOW`] largest counters accepted from one sender, ascending.
/// In-order counters (the common case) touch only the ends.
#[derive(Debug, Clone)]
struct Window {
    kept: VecDeque<u64>,
    /// This node's clock when the sender was last admitted (for eviction).
    last_us: u64,
}

impl Window {
    fn new(counter: u64, now_us: u64) -> Self {
        let mut kept = VecDeque::with_capacity(WINDOW);
        kept.push_back(counter);
        Self {
            kept,
            last_us: now_us,
        }
    }

    /// Admit `counter` once: keep it, dropping the lowest kept when full.
    fn accept(&mut self, counter: u64) -> Result<(), Rejected> {
        let full = self.kept.len() >= WINDOW;
        match (self.kept.front().copied(), self.kept.back().copied()) {
            (_, Some(highest)) if counter > highest => {
                if full {
                    self.kept.pop_front();
                }
                self.kept.push_back(counter);
                return Ok(());
            }
            (Some(lowest), _) if full && counter < lowest => {
                return Err(Rejected::TooOld { counter, lowest });
            }
            _ => {}
        }
        match self.kept.binary_search(&counter) {
            Ok(_) => Err(Rejected::Replay { counter }),
            Err(mut at) => {
                if full {
                    // counter > lowest here, so `at` is at least 1.
                    self.kept.pop_front();
                    at = at.saturating_sub(1);
                }
                self.kept.insert(at, counter);
                Ok(())
            }
        }
    }
}

/// The replay windows of the senders heard from, and the skew bound.
#[derive(Debug)]
pub(super) struct Replays {
    windows: HashMap<String, Window>,
    max_senders: usize,
    skew_us: u64,
    /// Windows evicted to make room for a new sender.
    pub(super) evicted: u64,
}

impl Replays {
    /// No sender yet; counters may be `skew_us` away from the local clock;
    /// at most `max_senders` windows (at least one).
    pub(super) fn new(skew_us: u64, max_senders: usize) -> Self {
        Self {
            windows: HashMap::new(),
            max_senders: max_senders.max(1),
            skew_us,
            evicted: 0,
        }
    }

    /// Number of senders tracked.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.windows.len()
    }

    /// Admit the datagram `counter` of `sender` at local time `now_us`, or
    /// say why not. An admitted counter is remembered: the same one is a
    /// [`Rejected::Replay`] next time.
    pub(super) fn admit(
        &mut self,
        sender: &str,
        counter: u64,
        now_us: u64,
    ) -> Result<(), Rejected> {
        if counter > now_us.saturating_add(self.skew_us) {
            return Err(Rejected::Ahead {
                counter,
                ahead_us: counter - now_us,
            });
        }
        if counter.saturating_add(self.skew_us) < now_us {
            return Err(Rejected::Behind {
                counter,
                behind_us: now_us - counter,
            });
        }
        if let Some(w) = self.windows.get_mut(sender) {
            w.accept(counter)?;
            w.last_us = w.last_us.max(now_us);
            return Ok(());
        }
        if self.windows.len() >= self.max_senders {
            let stalest = self
                .windows
                .iter()
                .min_by_key(|(_, w)| w.last_us)
                .map(|(name, _)| name.clone());
            if let Some(name) = stalest {
                self.windows.remove(&name);
                self.evicted += 1;
            }
        }
        self.windows
            .insert(sender.to_owned(), Window::new(counter, now_us));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000;
    const SKEW: u64 = 2_000_000;

    fn replays() -> Replays {
        Replays::new(SKEW, MAX_SENDERS)
    }

    #[test]
    fn in_order_counters_are_admitted_once() {
        let mut r = replays();
        for c in NOW..NOW + 200 {
            assert_eq!(r.admit("a", c, NOW), Ok(()));
        }
        assert_eq!(
            r.admit("a", NOW + 199, NOW),
            Err(Rejected::Replay { counter: NOW + 199 })
        );
        // Another sender's counters are its own.
        assert_eq!(r.admit("b", NOW + 199, NOW), Ok(()));
    }

    #[test]
    fn reordering_within_the_window_is_admitted() {
        let mut r = replays();
        // Sparse counters (microseconds apart, as on the wire), delivered
        // in reverse within a window's worth.
        let sent: Vec<u64> = (0..WINDOW as u64).map(|i| NOW + i * 1_000).collect();
        for c in sent.iter().rev() {
            assert_eq!(r.admit("a", *c, NOW), Ok(()), "counter {c}");
        }
        for c in &sent {
            assert_eq!(r.admit("a", *c, NOW), Err(Rejected::Replay { counter: *c }));
        }
    }

    #[test]
    fn duplicates_are_replays() {
        let mut r = replays();
        assert_eq!(r.admit("a", NOW + 5, NOW), Ok(()));
        assert_eq!(r.admit("a", NOW + 3, NOW), Ok(()));
        assert_eq!(
            r.admit("a", NOW + 3, NOW),
            Err(Rejected::Replay { counter: NOW + 3 })
        );
        assert_eq!(
            r.admit("a", NOW + 5, NOW),
            Err(Rejected::Replay { counter: NOW + 5 })
        );
        assert_eq!(r.admit("a", NOW + 4, NOW), Ok(()));
    }

    #[test]
    fn counters_older_than_the_window_are_refused() {
        let mut r = replays();
        assert_eq!(r.admit("a", NOW, NOW), Ok(()));
        for i in 1..=WINDOW as u64 {
            assert_eq!(r.admit("a", NOW + 10 * i, NOW), Ok(()));
        }
        // NOW fell out of the window (the 64 kept are NOW+10..NOW+640):
        // it and anything below the lowest kept is refused, even unseen.
        assert_eq!(
            r.admit("a", NOW, NOW),
            Err(Rejected::TooOld {
                counter: NOW,
                lowest: NOW + 10
            })
        );
        assert_eq!(
            r.admit("a", NOW + 5, NOW),
            Err(Rejected::TooOld {
                counter: NOW + 5,
                lowest: NOW + 10
            })
        );
        // A gap inside the window is still fine, once.
        assert_eq!(r.admit("a", NOW + 15, NOW), Ok(()));
        assert!(r.admit("a", NOW + 15, NOW).is_err());
    }

    #[test]
    fn counters_far_ahead_or_behind_the_clock_are_refused() {
        let mut r = replays();
        assert_eq!(
            r.admit("a", NOW + SKEW + 1, NOW),
            Err(Rejected::Ahead {
                counter: NOW + SKEW + 1,
                ahead_us: SKEW + 1
            })
        );
        assert_eq!(
            r.admit("a", u64::MAX, NOW),
            Err(Rejected::Ahead {
                counter: u64::MAX,
                ahead_us: u64::MAX - NOW
            })
        );
        assert_eq!(
            r.admit("a", NOW - SKEW - 1, NOW),
            Err(Rejected::Behind {
                counter: NOW - SKEW - 1,
                behind_us: SKEW + 1
            })
        );
        // Refused counters leave no trace: the sender is not even tracked,
        // so a far-ahead counter cannot lock out its later datagrams.
        assert_eq!(r.len(), 0);
        assert_eq!(r.admit("a", NOW + SKEW, NOW), Ok(()));
        assert_eq!(r.admit("a", NOW - SKEW, NOW), Ok(()));
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_least_recent_sender() {
        let mut r = Replays::new(SKEW, 3);
        assert_eq!(r.admit("a", NOW, NOW), Ok(()));
        assert_eq!(r.admit("b", NOW, NOW + 1), Ok(()));
        assert_eq!(r.admit("c", NOW, NOW + 2), Ok(()));
        assert_eq!(r.admit("a", NOW + 1, NOW + 3), Ok(()));
        // Full: "d" evicts "b", heard from least recently.
        assert_eq!(r.admit("d", NOW, NOW + 4), Ok(()));
        assert_eq!((r.len(), r.evicted), (3, 1));
        assert!(r.admit("a", NOW + 1, NOW + 5).is_err());
        assert!(r.admit("c", NOW, NOW + 5).is_err());
        // "b" was forgotten: within the skew its old counter gets in again,
        // which is what the skew bound on age is for.
        assert_eq!(r.admit("b", NOW, NOW + 6), Ok(()));
        assert_eq!(r.len(), 3);
    }

    proptest::proptest! {
        /// Against a model: a counter is admitted exactly when it was never
        /// admitted and is above the [`WINDOW`]th largest admitted so far.
        #[test]
        fn the_window_matches_its_model(counters in proptest::collection::vec(0u64..300, 1..500)) {
            let mut w = Window::new(NOW + 1_000, NOW);
            let mut admitted = std::collections::BTreeSet::from([NOW + 1_000]);
            for c in counters.into_iter().map(|c| NOW + c * 7) {
                let fresh = !admitted.contains(&c)
                    && (admitted.len() < WINDOW || admitted.iter().rev().nth(WINDOW - 1).is_some_and(|low| c > *low));
                proptest::prop_assert_eq!(w.accept(c).is_ok(), fresh, "counter {}", c);
                if fresh {
                    admitted.insert(c);
                }
                proptest::prop_assert!(w.kept.len() <= WINDOW);
            }
        }
    }
}
