//! Sync metrics for backends with a native watch, and the descriptions of
//! the registrar's metrics.

use std::fmt;
use std::sync::Arc;

use futures::StreamExt;
use waypost::{Event, EventStream, Registry, Result, Version, Watch};

use crate::engine::open::Backend;
use crate::engine::status::Status;
use crate::metrics::names;

/// The registrar's view of its backend's watch:
///
/// - every `Err` the watch yields is reported to the registrar's
///   [`Status`] (transient: the backend is unreachable; a lost feed or a
///   refusal of the backend as such: re-read and not ready until done), and
///   every `Ok` item tells it the backend answers;
/// - for backends with a native watch it records the sync metrics the way
///   [`waypost::polling::Polling`] does for polled ones:
///   `registrar_sync_duration_seconds` (each (re)subscription, from
///   subscribing to the first event) and `registrar_sync_errors_total`
///   (each error of the watch).
///
/// Everything else is passed through.
pub struct SyncMetered {
    inner: Arc<dyn Backend>,
    status: Arc<Status>,
}

impl SyncMetered {
    /// Meter `inner`, reporting to `status`.
    pub fn new(inner: Arc<dyn Backend>, status: Arc<Status>) -> Self {
        Self { inner, status }
    }
}

impl fmt::Display for SyncMetered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.inner, f)
    }
}

impl fmt::Debug for SyncMetered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncMetered")
            .field("inner", &self.inner)
            .finish()
    }
}

waypost::forward! {
    impl[] Registry for SyncMetered {
        forward to inner: register, deregister, list, list_shared, snapshot, capabilities, probe;
    }
}

waypost::forward! {
    impl[] Batch for SyncMetered {
        forward to inner: apply, max_batch;
    }
}

waypost::forward! {
    impl[] Heartbeat for SyncMetered {
        forward to inner: heartbeat;
    }
}

impl Watch for SyncMetered {
    fn watch(&self, from: Option<Version>) -> EventStream {
        let native = self.inner.capabilities().native_watch;
        let status = Arc::clone(&self.status);
        let started = std::time::Instant::now();
        let mut first = true;
        let mut failing = false;
        self.inner
            .watch(from)
            .inspect(move |item: &Result<Event>| match item {
                Ok(_) => {
                    if first && native {
                        metrics::histogram!(names::SYNC_DURATION_SECONDS)
                            .record(started.elapsed().as_secs_f64());
                    }
                    first = false;
                    if failing {
                        failing = false;
                        status.backend_up();
                    }
                }
                Err(e) => {
                    if native {
                        metrics::counter!(names::SYNC_ERRORS_TOTAL).increment(1);
                    }
                    tracing::warn!(error = %e, "the backend's watch failed");
                    failing = true;
                    if e.is_retryable() {
                        status.backend_unreachable(e);
                    } else {
                        // A lost feed: the state must be read again.
                        status.backend_failed(e);
                        status.request_resync();
                    }
                }
            })
            .boxed()
    }
}
