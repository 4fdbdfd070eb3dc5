//! What the agents' watch streams hold: counters the gRPC face keeps and
//! the rest of the registrar reads ([`WatchStats`]), mirrored to the
//! metrics.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metrics::names;

/// Counters of the registrar's watch streams ([`Registrar::watch_stats`](crate::Registrar::watch_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WatchStats {
    /// Open `WatchEndpoints` streams.
    pub streams: usize,
    /// `FULL_SNAPSHOT` messages handed to streams since the start.
    pub snapshot_chunks: u64,
    /// Their encoded size in bytes.
    pub snapshot_bytes: u64,
    /// Endpoints of first snapshots that open streams have not sent yet.
    pub pending_endpoints: u64,
    /// Messages (snapshot chunks and deltas) the registrar encoded to
    /// protobuf since the start. With shared encoding a message sent to
    /// many streams counts once.
    pub messages_encoded: u64,
}

/// The live counters behind [`WatchStats`], mirrored to the metrics.
#[derive(Debug, Default)]
pub(crate) struct StreamCounters {
    pub(crate) streams: AtomicUsize,
    pub(crate) chunks: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) pending: AtomicU64,
    pub(crate) encoded: AtomicU64,
}

impl StreamCounters {
    pub(crate) fn stats(&self) -> WatchStats {
        WatchStats {
            streams: self.streams.load(Ordering::Relaxed),
            snapshot_chunks: self.chunks.load(Ordering::Relaxed),
            snapshot_bytes: self.bytes.load(Ordering::Relaxed),
            pending_endpoints: self.pending.load(Ordering::Relaxed),
            messages_encoded: self.encoded.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn encoded(&self, n: u64) {
        self.encoded.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(names::STREAM_MESSAGES_ENCODED_TOTAL).increment(n);
    }

    fn add_pending(&self, n: u64) {
        self.pending.fetch_add(n, Ordering::Relaxed);
        metrics::gauge!(names::SNAPSHOT_PENDING_ENDPOINTS).increment(n as f64);
    }

    fn sub_pending(&self, n: u64) {
        self.pending.fetch_sub(n, Ordering::Relaxed);
        metrics::gauge!(names::SNAPSHOT_PENDING_ENDPOINTS).decrement(n as f64);
    }
}

/// Counts an open stream (and the endpoints its unsent snapshot holds)
/// while alive.
pub(crate) struct StreamGuard {
    pub(crate) counters: Arc<StreamCounters>,
    pending: u64,
}

impl StreamGuard {
    pub(crate) fn new(counters: Arc<StreamCounters>) -> Self {
        counters.streams.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(names::CONNECTED_AGENTS).increment(1.0);
        Self {
            counters,
            pending: 0,
        }
    }

    pub(crate) fn set_pending(&mut self, n: u64) {
        if n > self.pending {
            self.counters.add_pending(n - self.pending);
        } else if n < self.pending {
            self.counters.sub_pending(self.pending - n);
        }
        self.pending = n;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.set_pending(0);
        self.counters.streams.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(names::CONNECTED_AGENTS).decrement(1.0);
    }
}
