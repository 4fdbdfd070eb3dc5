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

use crate::Backend;

/// A backend with a native watch, recording the registrar's sync metrics
/// the way [`registry_api::Polling`] does for polled ones:
///
/// - `registrar_sync_duration_seconds`: each (re)subscription to the
///   backend's watch is a sync; its duration is the time from subscribing
///   to the first event (the full snapshot, or the first change when
///   resuming).
/// - `registrar_sync_errors_total`: each error the backend's watch yields.
///
/// Everything else is passed through.
pub struct SyncMetered {
    inner: Arc<dyn Backend>,
}

impl SyncMetered {
    /// Meter `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self { inner }
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
    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
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
        let started = std::time::Instant::now();
        let mut first = true;
        self.inner
            .watch(from)
            .inspect(move |item: &Result<Event>| match item {
                Ok(_) if first => {
                    first = false;
                    metrics::histogram!("registrar_sync_duration_seconds")
                        .record(started.elapsed().as_secs_f64());
                }
                Ok(_) => {}
                Err(e) => {
                    metrics::counter!("registrar_sync_errors_total").increment(1);
                    tracing::warn!(error = %e, "the backend's watch failed");
                }
            })
            .boxed()
    }
}

/// Describe the nine metrics of the registrar document (help text and
/// unit) to the installed recorder. Call once after installing it.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
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
        "agent_registrar_cache_age_seconds",
        Unit::Seconds,
        "Time since last cache update on agent"
    );
    describe_counter!(
        "agent_registrar_stream_reconnects_total",
        Unit::Count,
        "Watch stream reconnection attempts"
    );
}
