//! Sync metrics for backends with a native watch, and the descriptions of
//! the registrar's metrics.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use registry_api::{
    Batch, Capabilities, Endpoint, EndpointKey, Event, EventStream, Heartbeat, Op, Registry,
    Result, Snapshot, Version, Watch,
};

use crate::status::Status;
use crate::Backend;

/// The registrar's view of its backend's watch:
///
/// - every `Err` the watch yields is reported to the registrar's
///   [`Status`] (transient: the backend is unreachable; a lost feed or a
///   refusal of the backend as such: re-read and not ready until done), and
///   every `Ok` item tells it the backend answers;
/// - for backends with a native watch it records the sync metrics the way
///   [`registry_api::polling::Polling`] does for polled ones:
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

#[async_trait]
impl Registry for SyncMetered {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        self.inner.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.inner.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.inner.list(service).await
    }
    async fn list_shared(&self, service: &str) -> Result<std::sync::Arc<[Endpoint]>> {
        self.inner.list_shared(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn probe(&self) -> Result<()> {
        self.inner.probe().await
    }
}

#[async_trait]
impl Batch for SyncMetered {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        self.inner.apply(ops).await
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
}

#[async_trait]
impl Heartbeat for SyncMetered {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        self.inner.heartbeat(node).await
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
                        metrics::histogram!("registrar_sync_duration_seconds")
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
                        metrics::counter!("registrar_sync_errors_total").increment(1);
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

/// Describe the registrar's metrics (help text and unit) to the installed
/// recorder. Call once after installing it. (The agents' two metrics,
/// `agent_registrar_cache_age_seconds` and
/// `agent_registrar_stream_reconnects_total`, are exported by the agents.)
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        "registrar_backend_up",
        Unit::Count,
        "1 while the backend answers, 0 while it is unreachable"
    );
    describe_gauge!(
        "registrar_backend_down_seconds",
        Unit::Seconds,
        "How long the backend has been unreachable (0 while it answers)"
    );
    describe_gauge!(
        "registrar_ready",
        Unit::Count,
        "1 while /readyz answers 200"
    );
    describe_counter!(
        "registrar_write_errors_total",
        Unit::Count,
        "Failed backend write calls, by error kind"
    );
    describe_gauge!(
        "registrar_connected_agents",
        Unit::Count,
        "Number of agents with active watch streams"
    );
    describe_gauge!(
        "registrar_endpoint_count",
        Unit::Count,
        "Total endpoints in snapshot, by cluster"
    );
    describe_histogram!(
        "registrar_sync_duration_seconds",
        Unit::Seconds,
        "External registry sync latency"
    );
    describe_counter!(
        "registrar_sync_errors_total",
        Unit::Count,
        "Failed sync attempts"
    );
    describe_histogram!(
        "registrar_write_batch_size",
        Unit::Count,
        "Operations per write batch"
    );
    describe_gauge!(
        "registrar_write_queue_depth",
        Unit::Count,
        "Pending writes in buffer"
    );
    describe_counter!(
        "registrar_event_broadcast_total",
        Unit::Count,
        "Events pushed to agents, by type"
    );
    describe_gauge!(
        "registrar_snapshot_pending_endpoints",
        Unit::Count,
        "Endpoints of first snapshots that open watch streams have not sent yet \
         (taken chunk by chunk as each agent reads)"
    );
    describe_counter!(
        "registrar_stream_messages_encoded_total",
        Unit::Count,
        "Watch stream messages encoded to protobuf (once for every stream that sends them)"
    );
    describe_counter!(
        "registrar_snapshot_bytes_total",
        Unit::Bytes,
        "Encoded size of the FULL_SNAPSHOT messages sent to agents"
    );
    describe_gauge!(
        "registrar_cache_age_seconds",
        Unit::Seconds,
        "How stale the registrar's cache of the backend may be (0 while its watch delivers)"
    );
    describe_counter!(
        "registrar_stream_reconnects_total",
        Unit::Count,
        "Failures or ends of the registrar's watch of the backend"
    );
    #[cfg(feature = "xds")]
    crate::xds::describe_metrics();
}
