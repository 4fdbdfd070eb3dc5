//! [`Polling`]: a [`Watch`](crate::Watch) for any registry by polling `snapshot()` and
//! diffing.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::backend::{check_count, check_duration, diff, Hub, VersionClock};
use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::model::Version;
use crate::snapshot::Event;
use crate::traits::{Batch, EventStream, Heartbeat, Registry};

/// Settings of [`Polling`].
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct PollingConfig {
    /// Time between two `snapshot()` calls. Default 5 s (the registrar's
    /// `--sync-interval`).
    pub interval: Duration,
    /// Deltas kept so a watch can resume. Default 4096.
    pub history: usize,
    /// Events buffered per watcher before it is cut off. Default 1024.
    pub buffer: usize,
    /// Prefix of the metric names: `<prefix>_sync_duration_seconds` (each
    /// poll), `<prefix>_sync_errors_total` (failed polls). Default
    /// `registry`.
    pub metrics_prefix: String,
}

impl Default for PollingConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            history: 4096,
            buffer: Hub::DEFAULT_BUFFER,
            metrics_prefix: "registry".to_string(),
        }
    }
}

impl PollingConfig {
    /// Set `interval`.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
    /// Set `history`.
    pub fn with_history(mut self, history: usize) -> Self {
        self.history = history;
        self
    }
    /// Set `buffer`.
    pub fn with_buffer(mut self, buffer: usize) -> Self {
        self.buffer = buffer;
        self
    }
    /// Set `metrics_prefix`.
    pub fn with_metrics_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.metrics_prefix = prefix.into();
        self
    }

    /// Check every setting: `interval` 1 ms to 1 h, `history` and
    /// `buffer` 1 to 10 000 000.
    pub fn validate(&self) -> Result<()> {
        check_duration(
            "interval",
            self.interval,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        )?;
        check_count("history", self.history, 1, 10_000_000)?;
        check_count("buffer", self.buffer, 1, 10_000_000)?;
        crate::backend::check_name("metrics_prefix", &self.metrics_prefix, true)
    }
}

/// Turns any [`Registry`] into a [`Watch`](crate::Watch) by polling `snapshot()` every
/// `interval` and sending the [`diff`] of consecutive snapshots.
///
/// Each delta gets its own version from a counter that starts at the
/// current time in microseconds, so versions grow across restarts of the
/// process and a watch resumed with a version from an earlier run gets a
/// fresh snapshot. A failed poll keeps the last state (reads of the watch go
/// on from it), counts `<prefix>_sync_errors_total`, reports the failure on the
/// watchers' streams, and tries again next
/// interval. Changes that come and go between two polls are not seen; the
/// capabilities say `native_watch: false`.
///
/// Polling starts with the first `watch()` call, which must be made inside a
/// Tokio runtime, and stops when the `Polling` is dropped. Reads and writes
/// go straight to the inner registry.
pub struct Polling<R> {
    inner: Arc<R>,
    hub: Arc<Hub>,
    config: PollingConfig,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl<R: Registry> Polling<R> {
    /// Poll `inner` with the default settings.
    pub fn new(inner: R) -> Self {
        Self::build(inner, PollingConfig::default())
    }

    /// Poll `inner` with `config`, checked first
    /// ([`PollingConfig::validate`]).
    pub fn with_config(inner: R, config: PollingConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self::build(inner, config))
    }

    fn build(inner: R, config: PollingConfig) -> Self {
        Self {
            inner: Arc::new(inner),
            hub: Arc::new(Hub::pending(config.buffer, config.history)),
            config,
            task: std::sync::Mutex::new(None),
        }
    }

    /// The inner registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    fn start(&self) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_none() {
            let inner = Arc::clone(&self.inner);
            let hub = Arc::downgrade(&self.hub);
            *task = Some(tokio::spawn(poll_loop(
                inner,
                hub,
                self.config.interval,
                self.config.metrics_prefix.clone(),
            )));
        }
    }

    /// Whether the polling task runs, or has not been started yet (false
    /// once it ended, which only a panic makes happen while the `Polling`
    /// lives).
    pub fn is_running(&self) -> bool {
        self.task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|t| !t.is_finished())
    }
}

async fn poll_loop<R: Registry>(inner: Arc<R>, hub: Weak<Hub>, interval: Duration, prefix: String) {
    let clock = VersionClock::new();
    let (duration, errors) = (
        format!("{prefix}_sync_duration_seconds"),
        format!("{prefix}_sync_errors_total"),
    );
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A failure was reported to the watchers: the next good poll is sent
    // whole, as the watch contract says.
    let mut failed = false;
    loop {
        ticker.tick().await;
        let Some(hub) = hub.upgrade() else { return };
        let started = tokio::time::Instant::now();
        match inner.snapshot().await {
            Ok(fresh) => {
                metrics::histogram!(duration.clone()).record(started.elapsed().as_secs_f64());
                if !hub.is_ready() || failed {
                    hub.publish([Event::Snapshot(fresh.at_version(clock.next()))]);
                    failed = false;
                    continue;
                }
                let events: Vec<Event> = diff(&hub.current(), &fresh)
                    .into_iter()
                    .map(|ev| ev.with_version(clock.next()))
                    .collect();
                if !events.is_empty() {
                    tracing::debug!(registry = %inner, changes = events.len(), "poll found changes");
                    hub.publish(events);
                }
            }
            Err(e) => {
                metrics::counter!(errors.clone()).increment(1);
                tracing::warn!(registry = %inner, error = %e, "poll failed; keeping the last state");
                if hub.is_ready() {
                    hub.report_error(e);
                    failed = true;
                }
            }
        }
    }
}

impl<R: Registry> fmt::Display for Polling<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Polling({})", self.inner)
    }
}

impl<R: Registry> fmt::Debug for Polling<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Polling")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("hub", &self.hub)
            .finish()
    }
}

crate::forward! {
    impl[R: Registry] Registry for Polling<R> {
        forward to inner: register, deregister, list, list_shared, snapshot, probe;
        fn capabilities(&self) -> Capabilities {
            self.inner
                .capabilities()
                .with_native_watch(false)
                .with_resumable_watch(true)
        }
    }
}

crate::forward! {
    impl[R: Registry] Watch for Polling<R> {
        forward to inner: ;
        fn watch(&self, from: Option<Version>) -> EventStream {
            self.start();
            self.hub.subscribe(from)
        }
    }
}

crate::forward! {
    impl[R: Batch] Batch for Polling<R> {
        forward to inner: apply, max_batch;
    }
}

crate::forward! {
    impl[R: Registry + Heartbeat] Heartbeat for Polling<R> {
        forward to inner: heartbeat;
    }
}
