//! Range checks for settings: every duration, size and count a config
//! takes is checked when the combinator is built, so a bad value is an
//! error naming the setting instead of a background task panicking later.

use std::time::Duration;

use crate::error::{Error, Result};

/// Check that `value` lies in `min..=max`; the error names `field` and the
/// allowed range.
///
/// ```
/// use std::time::Duration;
/// use waypost::backend::check_duration;
/// let err = check_duration("flush_interval", Duration::ZERO, Duration::from_millis(1), Duration::from_secs(60))
///     .unwrap_err();
/// assert!(err.to_string().contains("flush_interval"));
/// ```
pub fn check_duration(field: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::invalid(
            field,
            format!(
                "{} is out of range: allowed {} to {}",
                fmt_duration(value),
                fmt_duration(min),
                fmt_duration(max)
            ),
        ));
    }
    Ok(())
}

/// Check that `value` lies in `min..=max`; the error names `field` and the
/// allowed range.
pub fn check_count(field: &str, value: usize, min: usize, max: usize) -> Result<()> {
    if value < min || value > max {
        return Err(Error::invalid(
            field,
            format!("{value} is out of range: allowed {min} to {max}"),
        ));
    }
    Ok(())
}

/// A duration as people write it (`100ms`, `5s`, `1m 30s`).
fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_named_and_inclusive() {
        let min = Duration::from_millis(1);
        let max = Duration::from_secs(3600);
        assert!(check_duration("x", min, min, max).is_ok());
        assert!(check_duration("x", max, min, max).is_ok());
        let e = check_duration("write_batch_interval", Duration::ZERO, min, max).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid write_batch_interval: 0s is out of range: allowed 1ms to 1h"
        );
        let e = check_count("capacity", 0, 1, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid capacity: 0 is out of range: allowed 1 to 10"
        );
        assert_eq!(fmt_duration(Duration::from_secs(90)), "1m 30s");
    }
}
