//! Every metric of the registrar, by name ([`names`]), described once
//! ([`describe_metrics`]) and present from the start ([`zero`]); `serve`
//! calls both, so a library user of it exports what the binary does.
//!
//! The combinators of `waypost` the registrar stacks record theirs
//! under [`names::PREFIX`] (`registrar_write_batch_size`, …): they are
//! named here too, so that the whole list is in one place.

/// The names, as the dashboard and the alerts in `deploy/` know them.
pub(crate) mod names {
    /// The prefix given to the combinators (`Coalescing`, `CachedRegistry`,
    /// `Polling`), which name their metrics after it.
    pub(crate) const PREFIX: &str = "registrar";
    pub(crate) const BACKEND_UP: &str = "registrar_backend_up";
    pub(crate) const BACKEND_DOWN_SECONDS: &str = "registrar_backend_down_seconds";
    pub(crate) const READY: &str = "registrar_ready";
    pub(crate) const WRITE_ERRORS_TOTAL: &str = "registrar_write_errors_total";
    pub(crate) const CONNECTED_AGENTS: &str = "registrar_connected_agents";
    pub(crate) const ENDPOINT_COUNT: &str = "registrar_endpoint_count";
    pub(crate) const SYNC_DURATION_SECONDS: &str = "registrar_sync_duration_seconds";
    pub(crate) const SYNC_ERRORS_TOTAL: &str = "registrar_sync_errors_total";
    pub(crate) const WRITE_BATCH_SIZE: &str = "registrar_write_batch_size";
    pub(crate) const WRITE_QUEUE_DEPTH: &str = "registrar_write_queue_depth";
    pub(crate) const EVENT_BROADCAST_TOTAL: &str = "registrar_event_broadcast_total";
    pub(crate) const SNAPSHOT_PENDING_ENDPOINTS: &str = "registrar_snapshot_pending_endpoints";
    pub(crate) const STREAM_MESSAGES_ENCODED_TOTAL: &str =
        "registrar_stream_messages_encoded_total";
    pub(crate) const SNAPSHOT_BYTES_TOTAL: &str = "registrar_snapshot_bytes_total";
    pub(crate) const CACHE_AGE_SECONDS: &str = "registrar_cache_age_seconds";
    pub(crate) const STREAM_RECONNECTS_TOTAL: &str = "registrar_stream_reconnects_total";
    pub(crate) const XDS_STREAMS: &str = "registrar_xds_streams";
    pub(crate) const XDS_PUSHES_TOTAL: &str = "registrar_xds_pushes_total";
    pub(crate) const XDS_RESOURCES_SENT_TOTAL: &str = "registrar_xds_resources_sent_total";
    pub(crate) const XDS_NACKS_TOTAL: &str = "registrar_xds_nacks_total";
    pub(crate) const HTTP_REQUESTS_TOTAL: &str = "registrar_http_requests_total";
    pub(crate) const HTTP_REQUEST_DURATION_SECONDS: &str =
        "registrar_http_request_duration_seconds";
    pub(crate) const HTTP_BLOCKING_QUERIES: &str = "registrar_http_blocking_queries";
    pub(crate) const HTTP_SSE_STREAMS: &str = "registrar_http_sse_streams";
}

use metrics::Unit;
use names::*;

/// What a metric is recorded as.
#[derive(Clone, Copy)]
enum Kind {
    Gauge,
    Counter,
    Histogram,
}

/// Every metric of the registrar, with its kind, unit and help text (a
/// table, laid out by hand).
#[rustfmt::skip]
const DESCRIPTIONS: &[(&str, Kind, Unit, &str)] = &[
    (BACKEND_UP, Kind::Gauge, Unit::Count,
        "1 while the backend answers, 0 while it is unreachable"),
    (BACKEND_DOWN_SECONDS, Kind::Gauge, Unit::Seconds,
        "How long the backend has been unreachable (0 while it answers)"),
    (READY, Kind::Gauge, Unit::Count,
        "1 while /readyz answers 200"),
    (CONNECTED_AGENTS, Kind::Gauge, Unit::Count,
        "Number of agents with active watch streams"),
    (ENDPOINT_COUNT, Kind::Gauge, Unit::Count,
        "Total endpoints in snapshot, by cluster"),
    (WRITE_QUEUE_DEPTH, Kind::Gauge, Unit::Count,
        "Pending writes in buffer"),
    (SNAPSHOT_PENDING_ENDPOINTS, Kind::Gauge, Unit::Count,
        "Endpoints of first snapshots that open watch streams have not sent yet (taken chunk by chunk as each agent reads)"),
    (CACHE_AGE_SECONDS, Kind::Gauge, Unit::Seconds,
        "How stale the registrar's cache of the backend may be (0 while its watch delivers)"),
    (XDS_STREAMS, Kind::Gauge, Unit::Count,
        "Open xDS (ADS) streams, by variant (sotw, delta)"),
    (HTTP_BLOCKING_QUERIES, Kind::Gauge, Unit::Count,
        "HTTP API blocking queries (?index=) waiting, by route"),
    (HTTP_SSE_STREAMS, Kind::Gauge, Unit::Count,
        "Open Server-Sent Events streams (the HTTP API's /v1/watch, the dashboard's feed), by route"),
    (WRITE_ERRORS_TOTAL, Kind::Counter, Unit::Count,
        "Failed backend write calls, by error kind"),
    (SYNC_ERRORS_TOTAL, Kind::Counter, Unit::Count,
        "Failed sync attempts"),
    (EVENT_BROADCAST_TOTAL, Kind::Counter, Unit::Count,
        "Events pushed to agents, by type"),
    (STREAM_MESSAGES_ENCODED_TOTAL, Kind::Counter, Unit::Count,
        "Watch stream messages encoded to protobuf (once for every stream that sends them)"),
    (SNAPSHOT_BYTES_TOTAL, Kind::Counter, Unit::Bytes,
        "Encoded size of the FULL_SNAPSHOT messages sent to agents"),
    (STREAM_RECONNECTS_TOTAL, Kind::Counter, Unit::Count,
        "Failures or ends of the registrar's watch of the backend"),
    (XDS_PUSHES_TOTAL, Kind::Counter, Unit::Count,
        "xDS responses pushed, by type URL"),
    (XDS_RESOURCES_SENT_TOTAL, Kind::Counter, Unit::Count,
        "xDS resources sent in responses, by type URL"),
    (XDS_NACKS_TOTAL, Kind::Counter, Unit::Count,
        "xDS responses rejected by clients (NACK), by type URL"),
    (HTTP_REQUESTS_TOTAL, Kind::Counter, Unit::Count,
        "HTTP API requests answered, by route, method and status"),
    (SYNC_DURATION_SECONDS, Kind::Histogram, Unit::Seconds,
        "External registry sync latency"),
    (WRITE_BATCH_SIZE, Kind::Histogram, Unit::Count,
        "Operations per write batch"),
    (HTTP_REQUEST_DURATION_SECONDS, Kind::Histogram, Unit::Seconds,
        "HTTP API time to the answer's headers, by route, method and blocking (a blocking query's includes its wait)"),
];

/// Describe the registrar's metrics (help text and unit) to the installed
/// recorder; [`serve`](crate::serve) calls it. (The agents' two metrics,
/// `agent_registrar_cache_age_seconds` and
/// `agent_registrar_stream_reconnects_total`, are exported by the agents.)
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(name, kind, unit, help) in DESCRIPTIONS {
        match kind {
            Kind::Gauge => describe_gauge!(name, unit, help),
            Kind::Counter => describe_counter!(name, unit, help),
            Kind::Histogram => describe_histogram!(name, unit, help),
        }
    }
}

/// Make the metrics that are not labelled present from the start, at
/// their idle values, rather than after their first event; `serve` calls
/// it before the backend is open.
pub(crate) fn zero() {
    for gauge in [CONNECTED_AGENTS, SNAPSHOT_PENDING_ENDPOINTS] {
        metrics::gauge!(gauge).increment(0.0);
    }
    for counter in [
        SNAPSHOT_BYTES_TOTAL,
        STREAM_MESSAGES_ENCODED_TOTAL,
        SYNC_ERRORS_TOTAL,
        STREAM_RECONNECTS_TOTAL,
    ] {
        metrics::counter!(counter).increment(0);
    }
    for (gauge, idle) in [
        (WRITE_QUEUE_DEPTH, 0.0),
        (CACHE_AGE_SECONDS, 0.0),
        (BACKEND_UP, 1.0),
        (BACKEND_DOWN_SECONDS, 0.0),
        (READY, 0.0),
    ] {
        metrics::gauge!(gauge).set(idle);
    }
}

/// One open request or stream in the gauge `name{route}` while it lives.
pub(crate) struct Open {
    gauge: metrics::Gauge,
}

impl Open {
    /// Count one more open in `name{route}`.
    pub(crate) fn new(name: &'static str, route: &str) -> Self {
        let gauge = metrics::gauge!(name, "route" => route.to_string());
        gauge.increment(1.0);
        Self { gauge }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Histogram buckets (the exporter renders histograms without buckets as
/// summaries).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// The HTTP API's: from a fraction of a millisecond to a blocking query's
/// longest wait (10 minutes).
const HTTP_SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 600.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// Install a Prometheus recorder for this process, with the registrar's
/// histogram buckets; hand its handle to [`Opening`](crate::Opening)'s
/// `metrics` to serve `/metrics` on the health port.
pub fn install_prometheus_recorder(
) -> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError>
{
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(SYNC_DURATION_SECONDS.into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(WRITE_BATCH_SIZE.into()), BATCH_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(HTTP_REQUEST_DURATION_SECONDS.into()),
            HTTP_SECONDS_BUCKETS,
        )?
        .install_recorder()
}
