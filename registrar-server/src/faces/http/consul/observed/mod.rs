//! What this replica has seen of each check, timed on its own monotonic
//! clock. Replicas share a check's state through the backend, but never
//! compare their clocks: each one remembers the [`Mark`] it last saw of a
//! check and the [`Instant`] at which it saw that mark change. A TTL check
//! lapses when its mark has not changed for its TTL of this replica's
//! time; a report is recorded when it changes the state, or when the last
//! change seen here is half a TTL old (sooner when reports reach this
//! replica rarely: [`Observed::report_writes`]);
//! `DeregisterCriticalServiceAfter` counts from when this replica saw the
//! check turn critical. Wall-clock fields of the stored state are compared
//! only for equality, as signs that something was recorded, never as
//! times.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use waypost::{Endpoint, EndpointKey};

use super::check::{self, Check, Probe, Status};

/// What changes in a check's stored state at each recorded report and at
/// each change of its state: the report count, the status, and the
/// wall-clock fields, which a registrar of an earlier release moves at
/// each report it records (it does not keep the count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    reports: u64,
    status: Status,
    since_ms: u64,
    expires_ms: Option<u64>,
}

impl Mark {
    /// The mark of `c`'s stored state.
    pub(crate) fn of(c: &Check) -> Self {
        Self {
            reports: c.reports,
            status: c.status,
            since_ms: c.since_ms,
            expires_ms: c.expires_ms,
        }
    }
}

/// What this replica remembers of one check.
#[derive(Debug, Clone, Copy)]
struct Entry {
    mark: Mark,
    /// When the mark was first seen as it is.
    changed: Instant,
    /// Whether the mark was seen to change since the check was first seen.
    seen_change: bool,
    /// When the check was seen turn critical (or first seen critical).
    critical_since: Option<Instant>,
    /// When this replica last took a report of the check.
    last_report: Option<Instant>,
    /// The last time the check was observed (what forgetting goes by).
    observed: Instant,
}

/// What this replica knows of one check, as one observation left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    /// This observation was the replica's first sight of the check.
    pub(crate) first: bool,
    /// When the replica saw the check's mark change last (or first saw it).
    pub(crate) changed: Instant,
    /// Whether the replica has seen the mark change since its first sight
    /// (before that, it does not know how old the last change is).
    pub(crate) seen_change: bool,
    /// When the replica saw the check turn critical (or first saw it
    /// critical); `None` while it is not critical.
    pub(crate) critical_since: Option<Instant>,
    /// When the replica took its previous report of the check, if it took
    /// one (set by [`Observations::report`] only).
    pub(crate) last_report: Option<Instant>,
}

impl Observed {
    /// Whether TTL check `c` (as observed) turns critical at `now`: it is
    /// not critical yet, and its mark has not changed for its TTL.
    pub(crate) fn ttl_lapsed(&self, c: &Check, now: Instant) -> bool {
        let Probe::Ttl { ttl_ms } = c.probe else {
            return false;
        };
        c.status != Status::Critical
            && now.saturating_duration_since(self.changed) >= Duration::from_millis(ttl_ms)
    }

    /// Whether `c`'s endpoint is due for removal at `now`: the check has a
    /// `DeregisterCriticalServiceAfter` and has been seen critical that
    /// long.
    pub(crate) fn deregister_due(&self, c: &Check, now: Instant) -> bool {
        match (c.deregister_after_ms, self.critical_since) {
            (Some(after), Some(since)) => {
                c.status == Status::Critical
                    && now.saturating_duration_since(since) >= Duration::from_millis(after)
            }
            _ => false,
        }
    }

    /// Whether a report of `status` for TTL check `c` (as observed) is to
    /// be written at `now`:
    /// - it changes the state;
    /// - or this replica has not seen the check change since it first saw
    ///   it, or never took a report of it: it cannot tell how old the last
    ///   change is, nor when its next report will come;
    /// - or the last change seen here is at least half a TTL old: so a
    ///   service reporting every few seconds costs about two writes per
    ///   TTL, whichever replica it reports to;
    /// - or the last change seen here is so old that, were this replica's
    ///   next report as far off as its previous one, the TTL would lapse
    ///   first. Replicas see each other's writes only after the backend's
    ///   sync, so the last change looks younger here than it is; when
    ///   reports alternate between replicas, each records the reports it
    ///   takes as soon as skipping one could let the check lapse.
    pub(crate) fn report_writes(&self, c: &Check, status: Status, now: Instant) -> bool {
        let Probe::Ttl { ttl_ms } = c.probe else {
            return false;
        };
        let Some(previous) = self.last_report else {
            return true;
        };
        let ttl = Duration::from_millis(ttl_ms);
        let age = now.saturating_duration_since(self.changed);
        let gap = now.saturating_duration_since(previous);
        c.status != status || !self.seen_change || age >= ttl / 2 || age + gap >= ttl
    }
}

/// Each check this replica observes, by endpoint and check id, with what
/// it saw of it: shared by the check runner (which observes every check
/// of the registrar's cluster at each tick, and forgets the others) and
/// the report routes.
#[derive(Debug, Default)]
pub(crate) struct Observations {
    inner: Mutex<HashMap<EndpointKey, HashMap<String, Entry>>>,
}

impl Observations {
    fn lock(&self) -> MutexGuard<'_, HashMap<EndpointKey, HashMap<String, Entry>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Observe check `id` of endpoint `key` as the state holds it (`c`) at
    /// `now` on this replica's clock: a mark not seen before is a change.
    pub(crate) fn observe(&self, key: &EndpointKey, id: &str, c: &Check, now: Instant) -> Observed {
        self.observe_at(key, id, c, now, false)
    }

    /// [`Self::observe`]; with `report`, also note that a report was taken
    /// at `now` (the answer holds the previous one).
    fn observe_at(
        &self,
        key: &EndpointKey,
        id: &str,
        c: &Check,
        now: Instant,
        report: bool,
    ) -> Observed {
        let mark = Mark::of(c);
        let critical = c.status == Status::Critical;
        let mut inner = self.lock();
        let Some(entry) = inner.get_mut(key).and_then(|checks| checks.get_mut(id)) else {
            let entry = Entry {
                mark,
                changed: now,
                seen_change: false,
                critical_since: critical.then_some(now),
                last_report: report.then_some(now),
                observed: now,
            };
            inner
                .entry(key.clone())
                .or_default()
                .insert(id.to_string(), entry);
            return Observed {
                first: true,
                changed: now,
                seen_change: false,
                critical_since: entry.critical_since,
                last_report: None,
            };
        };
        // Observers on several tasks may pass instants slightly out of
        // order: what is remembered never goes back.
        entry.observed = entry.observed.max(now);
        if entry.mark != mark {
            entry.mark = mark;
            entry.changed = entry.changed.max(now);
            entry.seen_change = true;
        }
        match (critical, entry.critical_since) {
            (true, None) => entry.critical_since = Some(now),
            (false, Some(_)) => entry.critical_since = None,
            _ => {}
        }
        let last_report = entry.last_report;
        if report {
            entry.last_report = Some(last_report.map_or(now, |r| r.max(now)));
        }
        Observed {
            first: false,
            changed: entry.changed,
            seen_change: entry.seen_change,
            critical_since: entry.critical_since,
            last_report,
        }
    }

    /// A report of TTL check `id` of `e` taken at `now` on this replica's
    /// clock (`now_ms` on its wall clock): `e` with the report recorded
    /// when it is to be written ([`Observed::report_writes`]), `None` when
    /// not (or when `e` has no TTL check `id`).
    pub(crate) fn report(
        &self,
        e: &Endpoint,
        id: &str,
        status: Status,
        output: &str,
        now: Instant,
        now_ms: u64,
    ) -> Option<Endpoint> {
        let c = check::check(e, id)?;
        let seen = self.observe_at(&e.key(), id, &c, now, true);
        if !seen.report_writes(&c, status, now) {
            return None;
        }
        check::with_report(e, id, status, output, now_ms)
    }

    /// Forget the checks not observed since `before` (the runner passes
    /// the instant of its tick, after observing every check that is still
    /// there): what is remembered stays as large as the state.
    pub(crate) fn forget_unseen(&self, before: Instant) {
        let mut inner = self.lock();
        inner.retain(|_, checks| {
            checks.retain(|_, e| e.observed >= before);
            !checks.is_empty()
        });
    }

    /// How many checks are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests;
