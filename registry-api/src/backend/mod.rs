//! Plumbing for those who write a backend or a combinator: the fan-out
//! [`Hub`], [`diff`], a [`VersionClock`], a watch that resumes by itself
//! ([`resume_with_backoff`]), the standard [`backoff`], and the checks every
//! backend runs before it writes ([`validate_endpoint`], [`check_batch`],
//! …). Users of the toolkit need none of it.

mod cause;
mod clock;
mod diff;
mod history;
mod hub;
mod resume;
mod shared_liveness;
mod silence;
mod url;

pub use crate::error::{prefix, quote, QUOTE_BYTES};
pub use crate::settings::{check_count, check_duration};
pub use crate::traits::PROBE_SERVICE;
pub use crate::validate::{
    check_batch, check_name, forbidden_in_name, validate_endpoint, validate_ops,
};
pub use cause::{
    aws_root_cause, root_cause, root_cause_or_hint, NO_AWS_CREDENTIALS, ROOT_CAUSE_CHARS,
};
pub use clock::VersionClock;
pub use diff::diff;
pub use hub::{Hub, Observer};
pub use resume::resume_with_backoff;
pub use shared_liveness::{now_ms, sweep_loop, NodeRecord, NodeTable, SharedLiveness};
pub use silence::{Observed, Silence};
pub use url::BackendUrl;

use std::time::Duration;

/// A delay drawn uniformly from zero to `ceiling` ("full jitter"): for
/// retries of writers that contend for one item, so that writers which
/// collided once do not collide again in step.
///
/// ```
/// use std::time::Duration;
/// let d = waypost::backend::full_jitter(Duration::from_millis(50));
/// assert!(d <= Duration::from_millis(50));
/// ```
pub fn full_jitter(ceiling: Duration) -> Duration {
    ceiling.mul_f64(rand::random::<f64>())
}

/// `every`, moved by up to `share` of itself either way at random: for
/// periodic work of many processes that should not fall into step.
///
/// ```
/// use std::time::Duration;
/// let d = waypost::backend::spread(Duration::from_secs(10), 0.2);
/// assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
/// ```
pub fn spread(every: Duration, share: f64) -> Duration {
    let share = share.clamp(0.0, 1.0);
    every.mul_f64(1.0 - share + 2.0 * share * rand::random::<f64>())
}

/// Exponential backoff from `min` to `max`, factor 2, with jitter, without
/// end: the delays every retry loop of the toolkit uses.
///
/// ```
/// use std::time::Duration;
/// let mut delays = waypost::backend::backoff(Duration::from_millis(100), Duration::from_secs(5));
/// let first = delays.next().unwrap();
/// assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(200));
/// ```
pub fn backoff(min: Duration, max: Duration) -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max.max(min))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}
