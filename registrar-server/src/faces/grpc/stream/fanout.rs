//! One feed of the registrar's state for all agent streams.
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
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use waypost::backend::Observer;
use waypost::cached::Store;
use waypost::{Endpoint, Error, Event, Snapshot, Version};

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

/// The largest agent buffer the feed serves: its channel is allocated
/// whole (a slot per item, rounded up to a power of two), where a stream's
/// own queue grows only as it falls behind. With a larger
/// `agent_buffer` every stream has a subscription of its own.
pub(crate) const FEED_MAX: usize = 65_536;

/// The registrar's one observer of its state (see the module docs).
pub(crate) struct Fanout {
    /// `None` when the agent buffer is above [`FEED_MAX`].
    tx: Option<broadcast::Sender<Arc<Item>>>,
}

impl Fanout {
    /// A feed holding `capacity` items for each stream.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            tx: (capacity <= FEED_MAX).then(|| broadcast::channel(capacity.max(1)).0),
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
        let tx = self.tx.as_ref()?;
        store.with_state(|snap| {
            let snap = snap?;
            let first = match from {
                None => Some(Snapshot::clone(snap)),
                Some(v) if v == snap.version() => None,
                Some(_) => return None,
            };
            let feed = Feed {
                rx: BroadcastStream::new(tx.subscribe()),
                after: snap.version(),
            };
            Some((first, feed))
        })
    }

    /// The channel, when some stream reads it (a stream subscribing later
    /// starts from a snapshot that holds what is sent before).
    fn read(&self) -> Option<&broadcast::Sender<Arc<Item>>> {
        self.tx.as_ref().filter(|tx| tx.receiver_count() > 0)
    }
}

impl Observer for Fanout {
    fn event(&self, event: &Event, before: &Snapshot) {
        let Some(tx) = self.read() else { return };
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
        // A receiver gone meanwhile is no loss: it was a stream that ended.
        let _ = tx.send(Arc::new(item));
    }

    fn failed(&self, error: &Error) {
        if let Some(tx) = self.read() {
            let _ = tx.send(Arc::new(Item::Failed(error.clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use waypost::cached::CachedRegistry;
    use waypost::memory::MemoryRegistry;
    use waypost::Version;

    use super::{Fanout, FEED_MAX};

    #[tokio::test]
    async fn a_feed_serves_the_current_version_up_to_its_largest_buffer() {
        let cache = CachedRegistry::new(MemoryRegistry::new());
        cache.wait_until_ready().await;
        let store = cache.store();
        let current = store.version();
        let feed = Fanout::new(FEED_MAX);
        assert!(matches!(feed.subscribe(store, None), Some((Some(_), _))));
        assert!(matches!(
            feed.subscribe(store, Some(current)),
            Some((None, _))
        ));
        // An older (or unknown) version replays the history on its own.
        assert!(feed
            .subscribe(store, Some(Version(current.0 + 1)))
            .is_none());
        // Above the largest buffer every stream subscribes on its own.
        assert!(Fanout::new(FEED_MAX + 1).subscribe(store, None).is_none());
    }
}
