//! The checks the registrar runs for the endpoints of its cluster: HTTP,
//! TCP and gRPC checks on their interval (at most [`MAX_RUNNING`] at once,
//! each first run spread over its interval), TTL checks whose stored state
//! this replica has not seen change for a TTL of its own monotonic clock
//! (a report recorded through any replica changes it for all of them), and
//! `DeregisterCriticalServiceAfter`, timed from when this replica saw the
//! check turn critical. Each tick observes every check of the cluster
//! ([`Observations`]); a check's new state is written only when it
//! changes, and the result of an HTTP, TCP or gRPC check is damped as
//! the check says ([`super::damping`]), its counts written with it.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use waypost::{EndpointKey, Op};

use super::check::{self, Probe, Status};
use super::observed::{Mark, Observations, Observed};
use super::probe::Prober;
use super::view::ConsulView;
use crate::engine::registrar::Registrar;

/// How often the runner looks for due checks.
pub(crate) const TICK: Duration = Duration::from_millis(250);
/// The most checks running at once.
pub(crate) const MAX_RUNNING: usize = 64;

/// What a task of the runner finished.
enum Done {
    /// A check ran (and its state was written if it changed).
    Ran(String),
    /// An endpoint was deregistered (`true`), or the write failed.
    Removed(EndpointKey, bool),
    /// A TTL check found lapsed was written critical (or the write failed,
    /// or its state changed meanwhile: judged again at the next tick).
    Expired(String),
}

struct Scheduled {
    key: EndpointKey,
    probe: Probe,
    next: Instant,
    running: bool,
}

/// A first run somewhere in the check's first interval, different on each
/// replica and for each check, so that checks and replicas spread out.
fn first_run(now: Instant, id: &str, every: Duration) -> Instant {
    let spread = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
    let offset = std::collections::hash_map::RandomState::new().hash_one(id) % spread;
    now + Duration::from_millis(offset)
}

/// Run the checks of `registrar`'s cluster until it closes, observing
/// them into `observations` (which the report routes share).
pub(crate) async fn run(
    registrar: Arc<Registrar>,
    view: Arc<ConsulView>,
    observations: Arc<Observations>,
) {
    let closing = registrar.closing();
    tokio::pin!(closing);
    let mut runner = Runner::new(registrar, observations);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let done = tokio::select! {
            () = &mut closing => return,
            Some(done) = runner.running.join_next() => Some(done),
            _ = tick.tick() => None,
        };
        match done {
            Some(done) => runner.finished(done),
            None => runner.tick(&view),
        }
    }
}

/// The runner's state between ticks.
struct Runner {
    registrar: Arc<Registrar>,
    /// What this replica saw of each check, and when.
    observations: Arc<Observations>,
    prober: Prober,
    /// The registrar's cluster: the one whose checks it runs.
    own: String,
    schedule: HashMap<String, Scheduled>,
    running: JoinSet<Done>,
    removing: HashSet<EndpointKey>,
    /// TTL checks being written critical.
    ttl_writing: HashSet<String>,
}

impl Runner {
    fn new(registrar: Arc<Registrar>, observations: Arc<Observations>) -> Self {
        Self {
            own: registrar.config().cluster_name.clone(),
            registrar,
            observations,
            prober: Prober::default(),
            schedule: HashMap::new(),
            running: JoinSet::new(),
            removing: HashSet::new(),
            ttl_writing: HashSet::new(),
        }
    }

    /// A task ended: what it held is free again.
    fn finished(&mut self, done: Result<Done, tokio::task::JoinError>) {
        match done {
            Ok(Done::Ran(id)) => {
                if let Some(s) = self.schedule.get_mut(&id) {
                    s.running = false;
                }
            }
            // Tried again at the next tick.
            Ok(Done::Removed(key, false)) => {
                self.removing.remove(&key);
            }
            Ok(Done::Expired(id)) => {
                self.ttl_writing.remove(&id);
            }
            Ok(Done::Removed(_, true)) | Err(_) => {}
        }
    }

    /// Observe the checks of `view` that are stored on endpoints of the
    /// registrar's cluster, start what is due among them, and forget the
    /// checks gone.
    fn tick(&mut self, view: &ConsulView) {
        let Some(snap) = self.registrar.state().store().snapshot() else {
            return;
        };
        let now = Instant::now();
        let mut seen = HashSet::new();
        for (id, key) in view.all_checks() {
            let Some(e) = snap.get(&key).filter(|e| e.cluster == self.own) else {
                continue;
            };
            let Some(c) = check::check(e, &id) else {
                continue;
            };
            seen.insert(id.clone());
            let observed = self.observations.observe(&key, &id, &c, now);
            if !self.deregister_if_overdue(&id, &key, &c, &observed, now) {
                self.start_if_due(id, key, c, &observed, now);
            }
        }
        self.observations.forget_unseen(now);
        self.schedule.retain(|id, _| seen.contains(id));
        self.removing.retain(|k| snap.contains(k));
    }

    /// Deregister endpoint `key` when this replica has seen its check `c`
    /// critical for longer than its `DeregisterCriticalServiceAfter`;
    /// whether it is being deregistered by this call (then the check does
    /// not run).
    fn deregister_if_overdue(
        &mut self,
        id: &str,
        key: &EndpointKey,
        c: &check::Check,
        observed: &Observed,
        now: Instant,
    ) -> bool {
        if !observed.deregister_due(c, now) || !self.removing.insert(key.clone()) {
            return false;
        }
        let (registrar, key, id) = (Arc::clone(&self.registrar), key.clone(), id.to_string());
        self.running.spawn(async move {
            let ok = deregister(&registrar, &key, &id).await;
            Done::Removed(key, ok)
        });
        true
    }

    /// Write critical a TTL check that lapsed, or run any other check whose
    /// time has come (registered again with another definition, it runs
    /// now), at most [`MAX_RUNNING`] at once.
    fn start_if_due(
        &mut self,
        id: String,
        key: EndpointKey,
        c: check::Check,
        observed: &Observed,
        now: Instant,
    ) {
        if let Probe::Ttl { ttl_ms } = c.probe {
            if observed.ttl_lapsed(&c, now) && self.ttl_writing.insert(id.clone()) {
                let (registrar, judged) = (Arc::clone(&self.registrar), Mark::of(&c));
                self.running.spawn(async move {
                    expire(&registrar, &key, &id, judged, ttl_ms).await;
                    Done::Expired(id)
                });
            }
            return;
        }
        let Some(every) = c.probe.interval() else {
            return;
        };
        let s = self
            .schedule
            .entry(id.clone())
            .or_insert_with(|| Scheduled {
                key: key.clone(),
                probe: c.probe.clone(),
                next: first_run(now, &id, every),
                running: false,
            });
        if s.probe != c.probe || s.key != key {
            // Registered again with another definition: run it soon.
            s.probe = c.probe.clone();
            s.key = key.clone();
            s.next = now;
        }
        if s.running || s.next > now || self.running.len() >= MAX_RUNNING {
            return;
        }
        s.running = true;
        s.next = now + every;
        let (registrar, prober, probe) =
            (Arc::clone(&self.registrar), self.prober.clone(), c.probe);
        self.running.spawn(async move {
            let (result, output) = prober.run(&probe).await;
            record_result(&registrar, &key, &id, result, &output).await;
            Done::Ran(id)
        });
    }
}

/// Write TTL check `id` critical, on condition that its stored state is
/// still the one judged lapsed (`judged`), as the state shows it now: a
/// report recorded meanwhile keeps it as it is.
async fn expire(
    registrar: &Arc<Registrar>,
    key: &EndpointKey,
    id: &str,
    judged: Mark,
    ttl_ms: u64,
) {
    let output = format!(
        "TTL expired: no report within {:?}",
        Duration::from_millis(ttl_ms)
    );
    let still = |c: &check::Check| Mark::of(c) == judged;
    set_status_if(registrar, key, id, Status::Critical, &output, still).await;
}

/// Record a run of check `id` of endpoint `key` that gave `result`,
/// damped as the check says ([`check::with_result`]): its new status or
/// its counts are written when they change.
async fn record_result(
    registrar: &Arc<Registrar>,
    key: &EndpointKey,
    id: &str,
    result: Status,
    output: &str,
) -> bool {
    let now_ms = check::now_ms();
    write_check(registrar, key, id, |e| {
        check::with_result(e, id, result, output, now_ms)
    })
    .await
}

/// Write check `id` of endpoint `key` as `status` when that is a change,
/// on condition that the check as the state holds it now satisfies
/// `still` (nothing is written otherwise).
async fn set_status_if(
    registrar: &Arc<Registrar>,
    key: &EndpointKey,
    id: &str,
    status: Status,
    output: &str,
    still: impl FnOnce(&check::Check) -> bool,
) -> bool {
    write_check(registrar, key, id, |e| {
        check::check(e, id)
            .filter(|c| still(c))
            .and_then(|_| check::with_status(e, id, status, output))
    })
    .await
}

/// Write endpoint `key` as `update` makes it from the state's copy
/// (`None`: nothing to write); whether the state is now stored (`false`
/// when the write failed).
async fn write_check(
    registrar: &Arc<Registrar>,
    key: &EndpointKey,
    id: &str,
    update: impl FnOnce(&waypost::Endpoint) -> Option<waypost::Endpoint>,
) -> bool {
    let Some(snap) = registrar.state().store().snapshot() else {
        return false;
    };
    let Some(e) = snap.get(key) else {
        return true;
    };
    let before = check::check(e, id).map(|c| c.status);
    let Some(updated) = update(e) else {
        return true;
    };
    let after = check::check(&updated, id);
    match registrar.write(Op::Register(updated), None).await {
        Ok(_) => {
            match after {
                Some(c) if Some(c.status) != before => {
                    tracing::info!(check = id, service = %key.service, id = %key.id, status = c.status.as_str(), output = %c.output, "check changed state");
                }
                Some(c) => {
                    tracing::debug!(check = id, service = %key.service, id = %key.id, successes = c.damping.successes, failures = c.damping.failures, "check result counted toward a change");
                }
                None => {}
            }
            true
        }
        Err(e) => {
            tracing::warn!(check = id, service = %key.service, id = %key.id, error = %e, "could not write a check's new state");
            false
        }
    }
}

/// Deregister endpoint `key`, on condition that its check `check` is still
/// critical as the state shows it now (a report may have come meanwhile);
/// whether it was removed.
async fn deregister(registrar: &Arc<Registrar>, key: &EndpointKey, check: &str) -> bool {
    let still_critical = registrar
        .state()
        .store()
        .snapshot()
        .and_then(|s| s.get(key).and_then(|e| check::check(e, check)))
        .is_some_and(|c| c.status == Status::Critical);
    if !still_critical {
        return false;
    }
    match registrar.write(Op::Deregister(key.clone()), None).await {
        Ok(_) => {
            tracing::info!(check, service = %key.service, id = %key.id, "deregistered: its check stayed critical past DeregisterCriticalServiceAfter");
            true
        }
        Err(e) => {
            tracing::warn!(check, service = %key.service, id = %key.id, error = %e, "could not deregister an endpoint whose check stayed critical");
            false
        }
    }
}
