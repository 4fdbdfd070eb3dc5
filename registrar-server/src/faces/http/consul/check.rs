//! Consul checks as the registrar keeps them: one label per check on the
//! endpoint it belongs to, `consul.check/<CheckID>`, whose value is the
//! check's definition and its last status in JSON. The definition travels
//! with the endpoint through the backend, so every replica (a restarted
//! one too) knows every check.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use waypost::{Endpoint, Health};

use super::damping::Damping;

/// The prefix of a check's label key; the rest is its `CheckID`.
pub(crate) const LABEL_PREFIX: &str = "consul.check/";

/// The longest `Output` kept with a check, in characters.
pub(crate) const MAX_OUTPUT_CHARS: usize = 256;

pub(crate) use super::status::Status;

/// How a check learns its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum Probe {
    /// The service reports it (`/v1/agent/check/pass|warn|fail|update`);
    /// critical when no report was recorded for `ttl_ms`, as each replica
    /// measures it on its own monotonic clock.
    Ttl { ttl_ms: u64 },
    /// An HTTP request every `interval_ms`: 2xx passing, 429 warning,
    /// anything else (or no answer within `timeout_ms`) critical.
    Http {
        url: String,
        method: String,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        header: BTreeMap<String, Vec<String>>,
        interval_ms: u64,
        timeout_ms: u64,
    },
    /// A TCP connection to `target` (`host:port`): passing when it opens.
    Tcp {
        target: String,
        interval_ms: u64,
        timeout_ms: u64,
    },
    /// `grpc.health.v1.Health/Check` at `target` (`host:port`, optionally
    /// `/service`): passing when it answers `SERVING`.
    Grpc {
        target: String,
        interval_ms: u64,
        timeout_ms: u64,
    },
}

impl Probe {
    /// Consul's `Type` of the check.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Probe::Ttl { .. } => "ttl",
            Probe::Http { .. } => "http",
            Probe::Tcp { .. } => "tcp",
            Probe::Grpc { .. } => "grpc",
        }
    }

    /// How often the registrar runs it (`None` for a TTL check, which the
    /// service reports).
    pub(crate) fn interval(&self) -> Option<Duration> {
        match self {
            Probe::Ttl { .. } => None,
            Probe::Http { interval_ms, .. }
            | Probe::Tcp { interval_ms, .. }
            | Probe::Grpc { interval_ms, .. } => Some(Duration::from_millis(*interval_ms)),
        }
    }
}

/// One check of an endpoint: its definition and its last status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Check {
    /// Consul's `Name`.
    pub(crate) name: String,
    #[serde(flatten)]
    pub(crate) probe: Probe,
    /// `DeregisterCriticalServiceAfter`: the endpoint is removed once the
    /// check has been critical this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deregister_after_ms: Option<u64>,
    pub(crate) status: Status,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) output: String,
    /// When `status` began (milliseconds since the Unix epoch, on the
    /// clock of the replica that wrote it). Shown to people and read by
    /// registrars of earlier releases; no decision is taken on it.
    pub(crate) since_ms: u64,
    /// A TTL check's wall-clock deadline (milliseconds since the Unix
    /// epoch, on the clock of the replica that recorded the last report):
    /// shown to people, and what registrars of earlier releases sharing
    /// the backend judge. This release decides nothing on it: each
    /// replica times a TTL check on its own monotonic clock
    /// ([`super::observed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_ms: Option<u64>,
    /// How many reports of a TTL check were recorded (written): it changes
    /// at each one, which is how every replica learns of a report. Only
    /// ever compared for equality; 0 in a label written without it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) reports: u64,
    /// `SuccessBeforePassing`, `FailuresBeforeWarning`,
    /// `FailuresBeforeCritical` and the counts toward a change (checks the
    /// registrar runs only; absent when there is no damping).
    #[serde(flatten)]
    pub(crate) damping: Damping,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Check {
    /// The wall-clock TTL deadline of a check reported (or registered) at
    /// `now` (`expires_ms`): `now + TTL` for a TTL check, `None` for the
    /// others.
    pub(crate) fn deadline_from(&self, now: u64) -> Option<u64> {
        match self.probe {
            Probe::Ttl { ttl_ms } => Some(now.saturating_add(ttl_ms)),
            _ => None,
        }
    }
}

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The label key of check `id`.
pub(crate) fn label_key(id: &str) -> String {
    format!("{LABEL_PREFIX}{id}")
}

/// Whether a label key is a check's.
pub(crate) fn is_check_label(key: &str) -> bool {
    key.starts_with(LABEL_PREFIX)
}

/// The ids of `e`'s checks.
pub(crate) fn check_ids(e: &Endpoint) -> impl Iterator<Item = &str> + '_ {
    e.labels.keys().filter_map(|k| k.strip_prefix(LABEL_PREFIX))
}

/// `e`'s checks by id; a label that does not parse (written by someone
/// else) is left out.
pub(crate) fn checks(e: &Endpoint) -> impl Iterator<Item = (&str, Check)> + '_ {
    e.labels.iter().filter_map(|(k, v)| {
        let id = k.strip_prefix(LABEL_PREFIX)?;
        serde_json::from_str(v).ok().map(|c| (id, c))
    })
}

/// The check `id` of `e`, if it has one that parses.
pub(crate) fn check(e: &Endpoint, id: &str) -> Option<Check> {
    serde_json::from_str(e.labels.get(&label_key(id))?).ok()
}

/// The endpoint's health given its checks: unhealthy when one is critical.
pub(crate) fn health_of<'a>(statuses: impl IntoIterator<Item = &'a Check>) -> Health {
    if statuses.into_iter().any(|c| c.status == Status::Critical) {
        Health::Unhealthy
    } else {
        Health::Healthy
    }
}

/// Store `check` as `id` in `e`, and set `e`'s health from all its checks
/// (a draining endpoint stays draining: a passing check does not bring it
/// back).
pub(crate) fn put(e: &mut Endpoint, id: &str, check: &Check) {
    // Serializing plain strings, numbers and maps of strings cannot fail.
    let value = serde_json::to_string(check).unwrap_or_default();
    e.labels.insert(label_key(id), value);
    if e.health == Health::Draining {
        return;
    }
    let all: Vec<Check> = checks(e).map(|(_, c)| c).collect();
    e.health = health_of(&all);
}

/// `e` without its check `id` (its health set from the checks left), or
/// `None` when it has no such check.
pub(crate) fn without(e: &Endpoint, id: &str) -> Option<Endpoint> {
    let mut updated = e.clone();
    updated.labels.remove(&label_key(id))?;
    let all: Vec<Check> = checks(&updated).map(|(_, c)| c).collect();
    updated.health = health_of(&all);
    Some(updated)
}

/// `e` with check `id` set to `status` (and `output`), or `None` when the
/// check is not there or already has that status: only a change of state
/// is written.
pub(crate) fn with_status(
    e: &Endpoint,
    id: &str,
    status: Status,
    output: &str,
) -> Option<Endpoint> {
    let mut c = check(e, id)?;
    if c.status == status {
        return None;
    }
    c.status = status;
    c.output = waypost::backend::prefix(output, MAX_OUTPUT_CHARS).into_owned();
    c.since_ms = now_ms();
    let mut updated = e.clone();
    put(&mut updated, id, &c);
    Some(updated)
}

/// `e` after a run of its check `id` gave `result` (with `output`),
/// damped as the check says ([`Damping`]): the status changes when the
/// counts reach their thresholds, and the counts are stored meanwhile.
/// `None` when nothing stored changes (or the check is not there).
pub(crate) fn with_result(
    e: &Endpoint,
    id: &str,
    result: Status,
    output: &str,
    now_ms: u64,
) -> Option<Endpoint> {
    let before = check(e, id)?;
    let mut c = before.clone();
    let status = c.damping.apply(c.status, result);
    if status != c.status {
        c.status = status;
        c.output = waypost::backend::prefix(output, MAX_OUTPUT_CHARS).into_owned();
        c.since_ms = now_ms;
    }
    if c == before {
        return None;
    }
    let mut updated = e.clone();
    put(&mut updated, id, &c);
    Some(updated)
}

/// `e` after a recorded report of its TTL check `id` at wall time
/// `now_ms`, or `None` when `e` has no TTL check `id`. The report counts
/// in `reports` (so every replica sees a change), the wall-clock deadline
/// moves to `now_ms + TTL`, and a change of state sets the status, its
/// output and `since_ms`. Whether a report is recorded at all is the
/// observing replica's call ([`super::observed::Observations::report`]).
pub(crate) fn with_report(
    e: &Endpoint,
    id: &str,
    status: Status,
    output: &str,
    now_ms: u64,
) -> Option<Endpoint> {
    let mut c = check(e, id)?;
    let Probe::Ttl { .. } = c.probe else {
        return None;
    };
    if c.status != status {
        c.status = status;
        c.output = waypost::backend::prefix(output, MAX_OUTPUT_CHARS).into_owned();
        c.since_ms = now_ms;
    }
    c.reports = c.reports.wrapping_add(1);
    c.expires_ms = c.deadline_from(now_ms);
    let mut updated = e.clone();
    put(&mut updated, id, &c);
    Some(updated)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ttl(status: Status) -> Check {
        Check {
            name: "t".into(),
            probe: Probe::Ttl { ttl_ms: 10_000 },
            deregister_after_ms: None,
            status,
            output: String::new(),
            since_ms: 1,
            expires_ms: None,
            reports: 0,
            damping: Damping::default(),
        }
    }

    #[test]
    fn a_recorded_report_counts_moves_the_wall_deadline_and_keeps_since_unless_the_state_changes() {
        let mut e = Endpoint::new("web", "a", "10.0.0.1", 80);
        put(&mut e, "t", &ttl(Status::Critical));
        // A change of state: status, output, since and the deadline.
        let e = with_report(&e, "t", Status::Passing, "up", 1_000).unwrap();
        let c = check(&e, "t").unwrap();
        assert_eq!(
            (
                c.status,
                c.output.as_str(),
                c.since_ms,
                c.expires_ms,
                c.reports
            ),
            (Status::Passing, "up", 1_000, Some(11_000), 1)
        );
        assert_eq!(e.health, Health::Healthy);
        // The same state again: counted, deadline moved, since kept (and
        // an output without a change of state is not kept).
        let again = with_report(&e, "t", Status::Passing, "other", 6_500).unwrap();
        let c = check(&again, "t").unwrap();
        assert_eq!(
            (c.output.as_str(), c.since_ms, c.expires_ms, c.reports),
            ("up", 1_000, Some(16_500), 2)
        );
        // No such check: nothing.
        assert!(with_report(&again, "nope", Status::Passing, "", 7_000).is_none());
    }

    #[test]
    fn a_label_without_a_report_count_reads_as_zero_and_zero_is_not_written() {
        let old = r#"{"name":"t","type":"ttl","ttl_ms":10000,"status":"passing","since_ms":1,"expires_ms":11}"#;
        let mut e = Endpoint::new("web", "a", "10.0.0.1", 80);
        e.labels.insert(label_key("t"), old.to_string());
        let c = check(&e, "t").unwrap();
        assert_eq!((c.reports, c.expires_ms), (0, Some(11)));
        put(&mut e, "t", &c);
        assert!(!e.labels[&label_key("t")].contains("reports"));
        let reported = with_report(&e, "t", Status::Passing, "", 20).unwrap();
        assert!(reported.labels[&label_key("t")].contains(r#""reports":1"#));
    }

    #[test]
    fn a_check_round_trips_through_its_label() {
        let mut e = Endpoint::new("web", "a", "10.0.0.1", 80);
        let http = Check {
            name: "h".into(),
            probe: Probe::Http {
                url: "http://127.0.0.1:1/health".into(),
                method: "GET".into(),
                header: BTreeMap::new(),
                interval_ms: 1000,
                timeout_ms: 500,
            },
            deregister_after_ms: Some(60_000),
            status: Status::Passing,
            output: String::new(),
            since_ms: 7,
            expires_ms: None,
            reports: 3,
            damping: Damping::default(),
        };
        put(&mut e, "service:a", &http);
        assert_eq!(check(&e, "service:a"), Some(http));
        let label = &e.labels["consul.check/service:a"];
        assert!(label.contains(r#""type":"http""#), "{label}");
        assert_eq!(e.health, Health::Healthy);
    }

    #[test]
    fn one_critical_check_makes_the_endpoint_unhealthy() {
        let mut e = Endpoint::new("web", "a", "10.0.0.1", 80);
        put(&mut e, "one", &ttl(Status::Warning));
        assert_eq!(e.health, Health::Healthy);
        put(&mut e, "two", &ttl(Status::Critical));
        assert_eq!(e.health, Health::Unhealthy);
        let back = with_status(&e, "two", Status::Passing, "ok").unwrap();
        assert_eq!(back.health, Health::Healthy);
        assert!(with_status(&back, "two", Status::Passing, "again").is_none());
        assert!(with_status(&back, "nope", Status::Critical, "").is_none());
        assert_eq!(check_ids(&back).collect::<Vec<_>>(), vec!["one", "two"]);
    }

    #[test]
    fn a_result_is_damped_and_its_counts_are_stored_with_the_check() {
        let mut e = Endpoint::new("web", "a", "10.0.0.1", 80);
        let mut c = ttl(Status::Passing);
        c.probe = Probe::Tcp {
            target: "127.0.0.1:1".into(),
            interval_ms: 1000,
            timeout_ms: 1000,
        };
        c.damping = Damping::new(0, None, 3).unwrap();
        put(&mut e, "tcp", &c);
        // A result that changes nothing writes nothing.
        assert!(with_result(&e, "tcp", Status::Passing, "ok", 5).is_none());
        // Two failures are counted, in the label; the third turns it critical.
        let one = with_result(&e, "tcp", Status::Critical, "refused", 5).unwrap();
        assert!(one.labels[&label_key("tcp")].contains(r#""failures":1"#));
        assert_eq!(check(&one, "tcp").unwrap().status, Status::Passing);
        let two = with_result(&one, "tcp", Status::Critical, "refused", 6).unwrap();
        let three = with_result(&two, "tcp", Status::Critical, "refused", 7).unwrap();
        let c = check(&three, "tcp").unwrap();
        assert_eq!(
            (c.status, c.output.as_str(), c.since_ms, c.damping.failures),
            (Status::Critical, "refused", 7, 0)
        );
        assert_eq!(three.health, Health::Unhealthy);
        // A pass between failures starts the count again.
        let back = with_result(&one, "tcp", Status::Passing, "ok", 8).unwrap();
        assert_eq!(check(&back, "tcp").unwrap().damping.failures, 0);
        assert!(without(&three, "tcp").is_some_and(|e| e.health == Health::Healthy));
        assert!(without(&three, "nope").is_none());
    }
}
