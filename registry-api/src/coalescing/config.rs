//! [`CoalescingConfig`] and the names of the metrics [`super::Coalescing`]
//! records.

use std::time::Duration;

use crate::backend::{check_count, check_duration};
use crate::error::Result;

/// Settings of [`Coalescing`](super::Coalescing). The defaults batch as an
/// in-cluster registrar does: every 100 ms or 50 ops.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct CoalescingConfig {
    /// Flush at least this often while ops are queued. Default 100 ms;
    /// 1 ms to 1 h.
    pub flush_interval: Duration,
    /// Flush as soon as this many ops are queued. Default 50; 1 to
    /// 10 000 000 (above `capacity` only the interval flushes).
    pub flush_ops: usize,
    /// Most ops queued or in flight; one more is refused with
    /// [`Error::Overloaded`](crate::Error::Overloaded). Default 10 000;
    /// 1 to 10 000 000.
    pub capacity: usize,
    /// First retry delay after a transient backend error. Default 50 ms;
    /// 1 ms to 1 min.
    pub retry_min: Duration,
    /// Longest retry delay (exponential, factor 2, with jitter). Default
    /// 5 s; `retry_min` to 10 min.
    pub retry_max: Duration,
    /// Attempts after a `Conflict` before the op counts as refused.
    /// Default 3; 0 to 100.
    pub conflict_retries: u32,
    /// Consecutive transient failures of one backend call after which its
    /// chunk is split in two and the halves are tried one after the other,
    /// so a chunk too large to commit in time cannot stall the queue.
    /// Default 3; 1 to 100.
    pub split_after: u32,
    /// Prefix of the metric names: `<prefix>_write_batch_size`,
    /// `<prefix>_write_queue_depth`, `<prefix>_write_errors_total{kind}`.
    /// Default `registry`.
    pub metrics_prefix: String,
}

impl Default for CoalescingConfig {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_millis(100),
            flush_ops: 50,
            capacity: 10_000,
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_secs(5),
            conflict_retries: 3,
            split_after: 3,
            metrics_prefix: "registry".to_string(),
        }
    }
}

impl CoalescingConfig {
    /// Set `flush_interval`.
    pub fn with_flush_interval(mut self, d: Duration) -> Self {
        self.flush_interval = d;
        self
    }
    /// Set `flush_ops`.
    pub fn with_flush_ops(mut self, n: usize) -> Self {
        self.flush_ops = n;
        self
    }
    /// Set `capacity`.
    pub fn with_capacity(mut self, n: usize) -> Self {
        self.capacity = n;
        self
    }
    /// Set the retry delays.
    pub fn with_retry(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min;
        self.retry_max = max;
        self
    }
    /// Set `conflict_retries`.
    pub fn with_conflict_retries(mut self, n: u32) -> Self {
        self.conflict_retries = n;
        self
    }
    /// Set `split_after`.
    pub fn with_split_after(mut self, n: u32) -> Self {
        self.split_after = n;
        self
    }
    /// Set `metrics_prefix`.
    pub fn with_metrics_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.metrics_prefix = prefix.into();
        self
    }

    /// Check every setting against its documented range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use waypost::coalescing::CoalescingConfig;
    /// let bad = CoalescingConfig::default().with_flush_interval(Duration::ZERO);
    /// assert!(bad.validate().unwrap_err().to_string().contains("flush_interval"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let ms = Duration::from_millis;
        check_duration(
            "flush_interval",
            self.flush_interval,
            ms(1),
            Duration::from_secs(3600),
        )?;
        check_count("capacity", self.capacity, 1, 10_000_000)?;
        check_count("flush_ops", self.flush_ops, 1, 10_000_000)?;
        check_duration("retry_min", self.retry_min, ms(1), Duration::from_secs(60))?;
        check_duration(
            "retry_max",
            self.retry_max,
            self.retry_min,
            Duration::from_secs(600),
        )?;
        check_count("conflict_retries", self.conflict_retries as usize, 0, 100)?;
        check_count("split_after", self.split_after as usize, 1, 100)?;
        crate::backend::check_name("metrics_prefix", &self.metrics_prefix, true)
    }
}

/// The metric names of one `Coalescing`, built once from the prefix.
#[derive(Debug, Clone)]
pub(super) struct Names {
    pub(super) batch_size: String,
    pub(super) queue_depth: String,
    pub(super) errors: String,
}

impl Names {
    pub(super) fn new(prefix: &str) -> Self {
        Self {
            batch_size: format!("{prefix}_write_batch_size"),
            queue_depth: format!("{prefix}_write_queue_depth"),
            errors: format!("{prefix}_write_errors_total"),
        }
    }
}
