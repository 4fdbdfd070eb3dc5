//! Flap damping of the checks the registrar runs, as Consul defines it:
//! `SuccessBeforePassing` consecutive successful results before a check
//! turns passing (or warning), `FailuresBeforeWarning` and
//! `FailuresBeforeCritical` consecutive failed results before it turns
//! warning, then critical. The counts are stored with the check's state
//! (its `consul.check/<id>` label), so whichever replica runs the check
//! next continues them.
//!
//! A result is a success when it is passing or warning (as Consul's agent
//! counts them), a failure when it is critical. A result that matches the
//! stored status counts toward nothing: the counts move only while a
//! change is pending, so a steady check costs no writes.

use serde::{Deserialize, Serialize};

use super::status::Status;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A check's damping thresholds and its pending counts (all 0: no
/// damping, every result applies at once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Damping {
    /// `SuccessBeforePassing` (0 and 1 both mean the first success).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) success_before_passing: u32,
    /// `FailuresBeforeWarning` (as registered, or `FailuresBeforeCritical`
    /// when it was not given).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) failures_before_warning: u32,
    /// `FailuresBeforeCritical` (0 and 1 both mean the first failure).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) failures_before_critical: u32,
    /// Consecutive successes counted toward a change of status.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) successes: u32,
    /// Consecutive failures counted toward a change of status.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) failures: u32,
}

impl Damping {
    /// Thresholds as registered; `failures_before_warning` defaults to
    /// `failures_before_critical`. `None` when warning would come after
    /// critical (Consul refuses that too).
    pub(crate) fn new(
        success_before_passing: u32,
        failures_before_warning: Option<u32>,
        failures_before_critical: u32,
    ) -> Option<Self> {
        let warning = failures_before_warning.unwrap_or(failures_before_critical);
        if warning > failures_before_critical {
            return None;
        }
        Some(Self {
            success_before_passing,
            failures_before_warning: warning,
            failures_before_critical,
            successes: 0,
            failures: 0,
        })
    }

    /// The same thresholds with no pending counts.
    pub(crate) fn thresholds(&self) -> Self {
        Self {
            successes: 0,
            failures: 0,
            ..*self
        }
    }

    /// One run of a check whose stored status is `current` gave `result`:
    /// the counts move, and the status to store is returned.
    pub(crate) fn apply(&mut self, current: Status, result: Status) -> Status {
        if result == Status::Critical {
            self.successes = 0;
            if current == Status::Critical {
                self.failures = 0;
                return current;
            }
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.failures_before_critical.max(1) {
                self.failures = 0;
                Status::Critical
            } else if self.failures >= self.failures_before_warning.max(1) {
                Status::Warning
            } else {
                current
            }
        } else {
            self.failures = 0;
            if current == result {
                self.successes = 0;
                return current;
            }
            self.successes = self.successes.saturating_add(1);
            if self.successes >= self.success_before_passing.max(1) {
                self.successes = 0;
                result
            } else {
                current
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::{Critical, Passing, Warning};

    /// The statuses stored after each result, from `start`.
    fn run(mut d: Damping, start: Status, results: &[Status]) -> Vec<Status> {
        let mut current = start;
        results
            .iter()
            .map(|r| {
                current = d.apply(current, *r);
                current
            })
            .collect()
    }

    fn damping(success: u32, warning: Option<u32>, critical: u32) -> Damping {
        Damping::new(success, warning, critical).expect("valid thresholds")
    }

    #[test]
    fn without_damping_every_result_applies_at_once() {
        let d = Damping::default();
        assert_eq!(
            run(d, Passing, &[Critical, Passing, Warning, Critical]),
            [Critical, Passing, Warning, Critical]
        );
    }

    #[test]
    fn one_failure_between_passes_is_not_critical_three_in_a_row_are() {
        let d = damping(0, None, 3);
        assert_eq!(
            run(
                d,
                Passing,
                &[Critical, Passing, Critical, Critical, Passing]
            ),
            [Passing; 5]
        );
        assert_eq!(
            run(d, Passing, &[Critical, Critical, Critical]),
            [Passing, Passing, Critical]
        );
    }

    #[test]
    fn failures_before_warning_defaults_to_failures_before_critical() {
        assert_eq!(damping(0, None, 3).failures_before_warning, 3);
        let d = damping(0, Some(1), 3);
        assert_eq!(
            run(d, Passing, &[Critical, Critical, Critical]),
            [Warning, Warning, Critical]
        );
        assert!(Damping::new(0, Some(4), 3).is_none());
    }

    #[test]
    fn success_before_passing_needs_that_many_successes_in_a_row() {
        let d = damping(2, None, 0);
        assert_eq!(
            run(d, Critical, &[Passing, Critical, Passing, Passing]),
            [Critical, Critical, Critical, Passing]
        );
        // A warning result counts as a success, and applies as a warning.
        assert_eq!(run(d, Critical, &[Warning, Warning]), [Critical, Warning]);
    }

    #[test]
    fn the_counts_move_only_while_a_change_is_pending() {
        let mut d = damping(3, None, 3);
        assert_eq!(d.apply(Passing, Passing), Passing);
        assert_eq!((d.successes, d.failures), (0, 0));
        assert_eq!(d.apply(Passing, Critical), Passing);
        assert_eq!((d.successes, d.failures), (0, 1));
        // The count is what another replica continues from.
        let mut other = d;
        assert_eq!(other.apply(Passing, Critical), Passing);
        assert_eq!(other.apply(Passing, Critical), Critical);
        assert_eq!((other.successes, other.failures), (0, 0));
        assert_eq!(d.thresholds().failures, 0);
    }
}
