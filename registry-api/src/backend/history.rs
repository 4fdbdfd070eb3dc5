//! A bounded change history that lets a watch resume from a version.

use std::collections::VecDeque;

use crate::model::Version;
use crate::snapshot::{Event, Snapshot};

/// The last `cap` deltas, and the version from which they are complete.
#[derive(Debug)]
pub(crate) struct History {
    events: VecDeque<Event>,
    cap: usize,
    /// Every delta with a version above `floor` is held.
    floor: Version,
}

impl History {
    pub(crate) fn new(cap: usize, floor: Version) -> Self {
        Self {
            events: VecDeque::new(),
            cap: cap.max(1),
            floor,
        }
    }

    /// Record a delta; the oldest one is forgotten when full.
    pub(crate) fn push(&mut self, event: Event) {
        if self.events.len() == self.cap {
            if let Some(old) = self.events.pop_front() {
                self.floor = old.version();
            }
        }
        self.events.push_back(event);
    }

    /// Forget everything: the history starts again after `floor`.
    pub(crate) fn reset(&mut self, floor: Version) {
        self.events.clear();
        self.floor = floor;
    }

    /// What a watch from `from` must send first, given the current state:
    /// nothing when it is up to date, the missed deltas when they are all
    /// held, otherwise a snapshot of `current`.
    pub(crate) fn since(&self, from: Option<Version>, current: &Snapshot) -> Vec<Event> {
        match from {
            Some(v) if v == current.version() => Vec::new(),
            Some(v) if v >= self.floor && v < current.version() => self
                .events
                .iter()
                .filter(|e| e.version() > v)
                .cloned()
                .collect(),
            _ => vec![Event::Snapshot(current.clone())],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::EndpointKey;

    fn removed(v: u64) -> Event {
        Event::Removed {
            version: Version(v),
            key: EndpointKey::new("s", v.to_string()),
        }
    }

    #[test]
    fn resumes_while_held_then_snapshots() {
        let mut h = History::new(3, Version(0));
        for v in [2, 5, 9, 12] {
            h.push(removed(v));
        }
        let cur = Snapshot::empty(Version(12));
        // 2 fell out: floor is 2, so resuming from 2 or later works.
        let got: Vec<_> = h
            .since(Some(Version(2)), &cur)
            .iter()
            .map(Event::version)
            .collect();
        assert_eq!(got, vec![Version(5), Version(9), Version(12)]);
        assert!(matches!(
            h.since(Some(Version(1)), &cur)[..],
            [Event::Snapshot(_)]
        ));
        assert!(h.since(Some(Version(12)), &cur).is_empty());
        assert!(matches!(
            h.since(Some(Version(13)), &cur)[..],
            [Event::Snapshot(_)]
        ));
        assert!(matches!(h.since(None, &cur)[..], [Event::Snapshot(_)]));
    }
}
