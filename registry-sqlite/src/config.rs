//! [`SqliteConfig`] and the injectable [`Clock`] used by liveness.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use waypost::{Error, Result};

/// The file opened when no path is given.
pub const DEFAULT_PATH: &str = "registry.db";

/// Where liveness reads the time from: two clocks, as the system has.
///
/// Silence is timed on the monotonic clock ([`Clock::instant`]); the wall
/// clock ([`Clock::now`]) only stamps `last_seen` for people to read, so a
/// step of the wall clock changes no judgement. [`SystemClock`] in
/// production; [`ManualClock`] in tests, so that "silent for 5 minutes"
/// takes no time at all.
pub trait Clock: Debug + Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;

    /// The current reading of the monotonic clock. Default:
    /// [`Instant::now`].
    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// The real time ([`SystemTime::now`], [`Instant::now`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to; clones share the same time.
/// [`ManualClock::advance`] lets time pass (both clocks move);
/// [`ManualClock::set`] steps the wall clock alone, as NTP or an operator
/// does.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use waypost_sqlite::{Clock, ManualClock};
/// let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000));
/// let start = clock.instant();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_030));
/// clock.set(SystemTime::UNIX_EPOCH);
/// assert_eq!(clock.instant() - start, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<(SystemTime, Instant)>>,
}

impl ManualClock {
    /// A clock standing at `start` (and its monotonic clock at the time
    /// it is made).
    pub fn new(start: SystemTime) -> Self {
        Self {
            now: Arc::new(Mutex::new((start, Instant::now()))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (SystemTime, Instant)> {
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Let `by` pass: both clocks move forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.lock();
        now.0 += by;
        now.1 += by;
    }

    /// Step the wall clock to `to` (forward or back); the monotonic clock
    /// does not move.
    pub fn set(&self, to: SystemTime) {
        self.lock().0 = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        self.lock().0
    }

    fn instant(&self) -> Instant {
        self.lock().1
    }
}

/// How to open and run a [`crate::SqliteRegistry`].
///
/// Build it with [`SqliteConfig::new`] (or `Default`, which uses
/// [`DEFAULT_PATH`]) and the `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use waypost_sqlite::SqliteConfig;
/// let cfg = SqliteConfig::new("/var/lib/registry/registry.db")
///     .with_suspect_after(Duration::from_secs(10))
///     .with_remove_after(Duration::from_secs(60))
///     .with_log_len(50_000);
/// assert_eq!(cfg.log_len, 50_000);
/// ```
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// The database file; created (with its `-wal` and `-shm` companions)
    /// if missing. Default: [`DEFAULT_PATH`] (`registry.db` in the current
    /// directory).
    pub path: PathBuf,
    /// How many changes the change log keeps for resuming watches; a watch
    /// resumed from an older version gets a fresh snapshot. At least 1.
    /// Default: 10 000.
    pub log_len: u64,
    /// How often the change log is polled for changes written by other
    /// processes sharing the file (changes made through this handle wake
    /// watchers at once). Polling only runs while a watch is open.
    /// Default: 250 ms.
    pub poll_interval: Duration,
    /// A node silent (no heartbeat) for at least this long is marked
    /// unhealthy, and so are its endpoints. Default: 30 s.
    pub suspect_after: Duration,
    /// A node silent for at least this long is removed, with its endpoints.
    /// Must be at least `suspect_after`. Default: 5 min.
    pub remove_after: Duration,
    /// How often the liveness sweep runs in the background; `None` turns
    /// the background sweep off (call [`crate::SqliteRegistry::sweep`]
    /// yourself). Default: `Some(10 s)`.
    pub sweep_interval: Option<Duration>,
    /// How long a write waits for another process holding the write lock
    /// before failing with a retryable `Unavailable`. Default: 5 s.
    pub busy_timeout: Duration,
    /// Connections for reads, which run in parallel. Writes are
    /// serialized and use one more connection of their own. At least 1.
    /// Default: 4.
    pub max_connections: u32,
    /// Most ops one [`waypost::Batch::apply`] takes; a larger batch is
    /// refused with `InvalidInput` naming `ops` (the batch rule). Every
    /// batch is one transaction. Default: 100 000.
    pub max_batch: usize,
    /// Where liveness reads the time. Default: [`SystemClock`].
    pub clock: Arc<dyn Clock>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self::new(DEFAULT_PATH)
    }
}

impl SqliteConfig {
    /// The defaults, with the database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            log_len: 10_000,
            poll_interval: Duration::from_millis(250),
            suspect_after: Duration::from_secs(30),
            remove_after: Duration::from_secs(300),
            sweep_interval: Some(Duration::from_secs(10)),
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
            max_batch: 100_000,
            clock: Arc::new(SystemClock),
        }
    }

    /// Set `path`.
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = path.into();
        self
    }

    /// Set `log_len` (at least 1).
    pub fn with_log_len(mut self, log_len: u64) -> Self {
        self.log_len = log_len.max(1);
        self
    }

    /// Set `poll_interval`.
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Set `suspect_after`.
    pub fn with_suspect_after(mut self, after: Duration) -> Self {
        self.suspect_after = after;
        self
    }

    /// Set `remove_after`.
    pub fn with_remove_after(mut self, after: Duration) -> Self {
        self.remove_after = after;
        self
    }

    /// Set `sweep_interval` (`None`: no background sweep).
    pub fn with_sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// Set `busy_timeout`.
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Set `max_connections` (at least 1).
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Set `max_batch` (at least 1).
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Set `clock`.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Check the settings that fields alone cannot enforce.
    pub(crate) fn check(&self) -> Result<()> {
        if self.path.as_os_str().is_empty() {
            return Err(Error::invalid("path", "must not be empty"));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::invalid("poll_interval", "must be greater than zero"));
        }
        if self.sweep_interval.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid(
                "sweep_interval",
                "must be greater than zero",
            ));
        }
        if self.remove_after < self.suspect_after {
            return Err(Error::invalid(
                "remove_after",
                format!(
                    "{:?} is shorter than suspect_after ({:?})",
                    self.remove_after, self.suspect_after
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let cfg = SqliteConfig::default();
        assert_eq!(cfg.path, PathBuf::from("registry.db"));
        assert_eq!(cfg.suspect_after, Duration::from_secs(30));
        assert_eq!(cfg.remove_after, Duration::from_secs(300));
        assert!(cfg.check().is_ok());
    }

    #[test]
    fn inconsistent_thresholds_are_refused() {
        let cfg = SqliteConfig::new("x.db")
            .with_suspect_after(Duration::from_secs(60))
            .with_remove_after(Duration::from_secs(10));
        let err = cfg.check().unwrap_err();
        assert!(err.to_string().contains("remove_after"), "{err}");
        assert!(SqliteConfig::new("").check().is_err());
        assert!(SqliteConfig::new("x")
            .with_poll_interval(Duration::ZERO)
            .check()
            .is_err());
    }
}
