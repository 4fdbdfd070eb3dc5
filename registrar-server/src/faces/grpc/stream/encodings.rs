//! What the agent streams share: every event, and every snapshot chunk of
//! one version, encoded to protobuf once and handed to each stream as the
//! same [`Bytes`].
//!
//! - **Deltas**: the encodings of the last [`DELTA_WINDOW`] events, in
//!   version order. The first stream to send an event encodes it (under
//!   the window's lock, so exactly once); the others find it by version
//!   (a binary search), then by kind and key, which the hub never repeats
//!   within one version. A stream further behind than the window encodes
//!   its own copy.
//! - **Snapshots**: the chunks of the newest snapshot a stream is sending,
//!   each encoded when the first stream asks for it. The registrar keeps
//!   one such memo, and only while a stream uses it; streams hold it
//!   weakly. A stream whose snapshot is older than the memo (or whose memo
//!   was replaced mid-way) encodes its own chunks from where it is. So the
//!   shared part is at most one encoded snapshot, and what one stream holds
//!   stays what the module docs of [`super`] say.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use waypost::{EndpointKey, Event, Snapshot, Version};

/// Events whose encodings are kept for streams that send them later.
pub(crate) const DELTA_WINDOW: usize = 4096;

/// Events of one version compared before a stream gives up and encodes its
/// own (a bound on the search, for a version with very many events).
const SAME_VERSION_SCAN: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The encodings the registrar's streams share (see the module docs).
#[derive(Default)]
pub(crate) struct Encodings {
    deltas: Mutex<VecDeque<Delta>>,
    snapshot: Mutex<Option<Arc<SnapshotMemo>>>,
}

struct Delta {
    version: Version,
    kind: &'static str,
    key: EndpointKey,
    bytes: Bytes,
}

/// What identifies a delta: its version, its kind and its key (the hub
/// publishes at most one event per key and version, as its own
/// `removed(version, key)` relies on).
fn identity(event: &Event) -> (&'static str, &str, &str) {
    match event {
        Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
            (event.type_name(), &endpoint.service, &endpoint.id)
        }
        Event::Removed { key, .. } => (event.type_name(), &key.service, &key.id),
        Event::Snapshot(_) => (event.type_name(), "", ""),
    }
}

impl Delta {
    fn is(&self, version: Version, (kind, service, id): (&'static str, &str, &str)) -> bool {
        self.version == version
            && self.kind == kind
            && self.key.id == id
            && self.key.service == service
    }
}

impl Encodings {
    /// The encoding of `event`: the one another stream made, or `encode()`'s
    /// (kept for the others). The flag says whether `encode` ran.
    pub(crate) fn delta(&self, event: &Event, encode: impl FnOnce() -> Bytes) -> (Bytes, bool) {
        let version = event.version();
        let id = identity(event);
        let mut window = lock(&self.deltas);
        let start = window.partition_point(|d| d.version < version);
        let mut at = start;
        while let Some(d) = window.get(at) {
            if d.version != version {
                break;
            }
            if d.is(version, id) {
                return (d.bytes.clone(), false);
            }
            at += 1;
            if at - start >= SAME_VERSION_SCAN {
                drop(window);
                return (encode(), true);
            }
        }
        let bytes = encode();
        // Older than everything kept, in a full window: not worth keeping.
        if !(at == 0 && window.len() >= DELTA_WINDOW) {
            let (kind, service, id) = id;
            window.insert(
                at,
                Delta {
                    version,
                    kind,
                    key: EndpointKey::new(service, id),
                    bytes: bytes.clone(),
                },
            );
            if window.len() > DELTA_WINDOW {
                window.pop_front();
            }
        }
        (bytes, true)
    }

    /// The memo of `snap`'s chunks for a stream about to send it: the
    /// registrar's current one if it is of the same snapshot, a new one if
    /// `snap` is at least as new, `None` (the stream encodes its own) if
    /// it is older.
    pub(crate) fn snapshot_memo(self: &Arc<Self>, snap: &Snapshot) -> Option<MemoUse> {
        let mut slot = lock(&self.snapshot);
        let memo = match slot.as_ref() {
            Some(m) if m.snap.version() == snap.version() && m.snap.same_endpoints(snap) => {
                Arc::clone(m)
            }
            Some(m) if m.snap.version() > snap.version() => return None,
            _ => {
                let m = Arc::new(SnapshotMemo {
                    snap: snap.clone(),
                    chunks: Mutex::new(Vec::new()),
                    users: AtomicUsize::new(0),
                });
                *slot = Some(Arc::clone(&m));
                m
            }
        };
        memo.users.fetch_add(1, Ordering::SeqCst);
        Some(MemoUse {
            shared: Arc::downgrade(self),
            memo: Arc::downgrade(&memo),
        })
    }

    /// A stream stopped using `memo`: the last one out frees it (unless a
    /// stream took it up again meanwhile, which happens under the lock).
    fn release(&self, memo: &Arc<SnapshotMemo>) {
        let mut slot = lock(&self.snapshot);
        if memo.users.fetch_sub(1, Ordering::SeqCst) == 1 {
            if let Some(current) = slot.as_ref() {
                if Arc::ptr_eq(current, memo) {
                    *slot = None;
                }
            }
        }
    }
}

/// The chunks of one snapshot encoded so far, in order.
pub(crate) struct SnapshotMemo {
    snap: Snapshot,
    chunks: Mutex<Vec<Chunk>>,
    users: AtomicUsize,
}

impl SnapshotMemo {
    /// A memo of `snap`'s chunks that its owner keeps, outside the
    /// registrar's one slot: the partial snapshot answered to agents that
    /// hold the same ([`super::request::Partials`]).
    pub(crate) fn detached(snap: Snapshot) -> Arc<Self> {
        Arc::new(Self {
            snap,
            chunks: Mutex::new(Vec::new()),
            users: AtomicUsize::new(0),
        })
    }

    /// The snapshot whose chunks these are.
    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// A stream's use of this detached memo (held weakly, as every use:
    /// once its owner drops it, streams encode their own).
    pub(crate) fn use_detached(self: &Arc<Self>) -> MemoUse {
        MemoUse {
            shared: Weak::new(),
            memo: Arc::downgrade(self),
        }
    }
}

/// One encoded `FULL_SNAPSHOT` message of a memo.
#[derive(Clone)]
pub(crate) struct Chunk {
    pub(crate) bytes: Bytes,
    /// The last key it holds (`None` for an empty snapshot's one message).
    pub(crate) last: Option<EndpointKey>,
    /// The endpoints it holds.
    pub(crate) count: usize,
}

/// A stream's use of a snapshot memo (weak: a stream never keeps a memo
/// the registrar dropped).
pub(crate) struct MemoUse {
    shared: Weak<Encodings>,
    memo: Weak<SnapshotMemo>,
}

impl MemoUse {
    /// Chunk `index` of the snapshot: shared if a stream encoded it
    /// already, else `encode()` (the caller, having sent chunks `0..index`,
    /// is where that chunk starts) kept for the others; the flag says
    /// whether `encode` ran. `None` when the memo is gone or does not reach
    /// `index` (the stream encodes its own from where it is).
    pub(crate) fn chunk(
        &self,
        index: usize,
        encode: impl FnOnce() -> Chunk,
    ) -> Option<(Chunk, bool)> {
        let memo = self.memo.upgrade()?;
        let mut chunks = lock(&memo.chunks);
        if let Some(c) = chunks.get(index) {
            return Some((c.clone(), false));
        }
        if index != chunks.len() {
            return None;
        }
        let chunk = encode();
        chunks.push(chunk.clone());
        Some((chunk, true))
    }
}

impl Drop for MemoUse {
    fn drop(&mut self) {
        if let (Some(shared), Some(memo)) = (self.shared.upgrade(), self.memo.upgrade()) {
            shared.release(&memo);
        }
    }
}
