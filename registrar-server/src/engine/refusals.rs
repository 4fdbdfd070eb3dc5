//! The refusals of optimistically acknowledged writes, kept by the version
//! of the event that undid each, so the watch stream can tell agents why.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, RwLockWriteGuard};

use waypost::{Error, Op, Version};

/// How many refusals are kept (older ones are only in the log).
const KEEP: usize = 4096;

/// A write the backend refused after it was acknowledged.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The refused write.
    pub op: Op,
    /// Why.
    pub error: Error,
}

/// Refusals by the version of the undo event.
#[derive(Default)]
pub(crate) struct Refusals {
    recent: RwLock<VecDeque<(Version, Refusal)>>,
    any: AtomicBool,
    /// Held (written) from publishing an undo event until its refusal is
    /// recorded, so that no stream encodes the event without it: with
    /// shared encoding the first stream's encoding goes to every stream.
    undoing: RwLock<()>,
}

impl Refusals {
    /// Hold lookups until the refusal of the undo about to be published is
    /// recorded (drop the guard after [`Refusals::record`]).
    pub(crate) fn undoing(&self) -> RwLockWriteGuard<'_, ()> {
        self.any.store(true, Ordering::Release);
        self.undoing.write().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn record(&self, version: Version, refusal: Refusal) {
        let mut r = self.recent.write().unwrap_or_else(|p| p.into_inner());
        if r.len() == KEEP {
            r.pop_front();
        }
        r.push_back((version, refusal));
        self.any.store(true, Ordering::Release);
    }

    /// The refusal undone by the event at `version`, if any.
    pub(crate) fn get(&self, version: Version) -> Option<Refusal> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let _recorded = self.undoing.read().unwrap_or_else(|p| p.into_inner());
        let r = self.recent.read().unwrap_or_else(|p| p.into_inner());
        // Undo events get increasing versions, so the deque is sorted.
        r.binary_search_by_key(&version, |(v, _)| *v)
            .ok()
            .map(|i| r[i].1.clone())
    }
}
