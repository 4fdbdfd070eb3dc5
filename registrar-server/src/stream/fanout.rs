//! One feed of the registrar's state for all agent streams (issue 21).
//!
//! With a subscription to the state each, every event was copied into
//! every stream's channel (the endpoint, its labels and all), and every
//! stream looked its encoding up in a shared window under a lock. Instead
//! the registrar observes its state once ([`Observer`]): each event goes,
//! once, into one [`broadcast`] channel that every stream reads, and the
//! first stream to send it encodes it to protobuf for all (the same
//! [`Bytes`]). A stream that falls behind by more than the channel holds
//! (the agent buffer, rounded up to a power of two) is cut off with
//! `RESOURCE_EXHAUSTED`, as with a subscription of its own.
//!
//! A stream starts exactly where the state is when it subscribes: its
//! first snapshot and its receiver are taken while no event is published
//! ([`Store::with_state`]), so it misses nothing and skips what its
//! snapshot holds. A stream resuming from an older version than the
//! current one takes a subscription of its own, which replays the history.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use registry_api::backend::Observer;
use registry_api::cached::Store;
use registry_api::{Endpoint, Error, Event, Snapshot, Version};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

/// What the feed carries. Each item is allocated once (in an `Arc`) for
/// all streams, so the size of the largest variant costs nothing per
/// stream.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Item {
    /// A change.
    Delta(Delta),
    /// The state was read again: streams send it whole.
    Snapshot(Snapshot),
    /// The state's source failed: streams end with this error, as they do
    /// with a subscription of their own.
    Failed(Error),
}

/// One change, encoded by the first stream that sends it.
pub(crate) struct Delta {
    pub(crate) event: Event,
    /// For a removal: the endpoint it took away.
    pub(crate) gone: Option<Endpoint>,
    encoded: OnceLock<Bytes>,
}

impl Delta {
    /// The encoding: another stream's, or `encode()`'s (kept for the
    /// others); the flag says whether `encode` ran.
    pub(crate) fn bytes(&self, encode: impl FnOnce() -> Bytes) -> (Bytes, bool) {
        let mut ran = false;
        let bytes = self.encoded.get_or_init(|| {
            ran = true;
            encode()
        });
        (bytes.clone(), ran)
    }
}

/// A stream's end of the feed.
pub(crate) struct Feed {
    pub(crate) rx: BroadcastStream<Arc<Item>>,
    /// Changes up to this version are in what the stream sent already.
    pub(crate) after: Version,
}

/// The registrar's one observer of its state (see the module docs).
pub(crate) struct Fanout {
    tx: broadcast::Sender<Arc<Item>>,
}

impl Fanout {
    /// A feed holding `capacity` items for each stream.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            tx: broadcast::channel(capacity.max(1)).0,
        }
    }

    /// A feed for a stream starting from `from` over `store`, with the
    /// snapshot it sends first (`None` when it resumes from the current
    /// version). `None` before the state's first snapshot, and when `from`
    /// is not the current version: the stream then subscribes on its own.
    pub(crate) fn subscribe(
        &self,
        store: &Store,
        from: Option<Version>,
    ) -> Option<(Option<Snapshot>, Feed)> {
        store.with_state(|snap| {
            let snap = snap?;
            let first = match from {
                None => Some(Snapshot::clone(snap)),
                Some(v) if v == snap.version() => None,
                Some(_) => return None,
            };
            let feed = Feed {
                rx: BroadcastStream::new(self.tx.subscribe()),
                after: snap.version(),
            };
            Some((first, feed))
        })
    }

    fn send(&self, item: Item) {
        // No receiver: nothing to do (a stream subscribing later starts
        // from a snapshot that holds this).
        let _ = self.tx.send(Arc::new(item));
    }
}

impl Observer for Fanout {
    fn event(&self, event: &Event, before: &Snapshot) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let item = match event {
            Event::Snapshot(snap) => Item::Snapshot(snap.clone()),
            Event::Removed { key, .. } => Item::Delta(Delta {
                event: event.clone(),
                gone: before.get(key).cloned(),
                encoded: OnceLock::new(),
            }),
            Event::Added { .. } | Event::Updated { .. } => Item::Delta(Delta {
                event: event.clone(),
                gone: None,
                encoded: OnceLock::new(),
            }),
        };
        self.send(item);
    }

    fn failed(&self, error: &Error) {
        if self.tx.receiver_count() > 0 {
            self.send(Item::Failed(error.clone()));
        }
    }
}
