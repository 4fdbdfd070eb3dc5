//! [`VersionClock`]: versions for a source that has none of its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::Version;

/// A version counter for a source without versions of its own (a poller,
/// a cache numbering its own events, a stream reader): it starts at the
/// current time in microseconds, so versions keep growing across restarts
/// of the process, and a watch resumed with a version from an earlier run
/// is older than anything it holds and gets a fresh snapshot.
///
/// ```
/// use waypost::backend::VersionClock;
/// let clock = VersionClock::new();
/// let a = clock.next();
/// assert!(clock.next() > a);
/// assert!(a.0 > 1_600_000_000_000_000); // microseconds since 1970
/// ```
#[derive(Debug)]
pub struct VersionClock(AtomicU64);

impl Default for VersionClock {
    fn default() -> Self {
        Self::new()
    }
}

impl VersionClock {
    /// A clock starting at the current time in microseconds.
    pub fn new() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
            .unwrap_or(1);
        Self(AtomicU64::new(now))
    }

    /// The next version (greater than every one handed out before).
    pub fn next(&self) -> Version {
        Version(self.0.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// The last version handed out (or the start).
    pub fn current(&self) -> Version {
        Version(self.0.load(Ordering::Acquire))
    }
}
