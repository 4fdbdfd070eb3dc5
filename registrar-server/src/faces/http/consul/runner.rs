//! The checks the registrar runs for the endpoints of its cluster: HTTP,
//! TCP and gRPC checks on their interval (at most [`MAX_RUNNING`] at once,
//! each first run spread over its interval), TTL checks whose stored
//! deadline passed (any replica's report moves it, so any replica may
//! find it passed), and `DeregisterCriticalServiceAfter`. A check's new
//! state is written only when it changes.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use registry_api::{EndpointKey, Op};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::check::{self, Probe, Status};
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
    /// A TTL check's stored state was brought up to date (or that failed:
    /// tried again at the next tick).
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

/// Run the checks of `registrar`'s cluster until it closes.
pub(crate) async fn run(registrar: Arc<Registrar>, view: Arc<ConsulView>) {
    let closing = registrar.closing();
    tokio::pin!(closing);
    let mut runner = Runner::new(registrar);
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
    prober: Prober,
    /// The registrar's cluster: the one whose checks it runs.
    own: String,
    schedule: HashMap<String, Scheduled>,
    running: JoinSet<Done>,
    removing: HashSet<EndpointKey>,
    /// TTL checks whose stored state is being written.
    ttl_writing: HashSet<String>,
}

impl Runner {
    fn new(registrar: Arc<Registrar>) -> Self {
        Self {
            own: registrar.config().cluster_name.clone(),
            registrar,
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

    /// Start what is due among the checks of `view` that are stored on
    /// endpoints of the registrar's cluster, and forget the checks gone.
    fn tick(&mut self, view: &ConsulView) {
        let Some(snap) = self.registrar.state().store().snapshot() else {
            return;
        };
        let now = Instant::now();
        let now_ms = check::now_ms();
        let mut seen = HashSet::new();
        for (id, key) in view.all_checks() {
            let Some(e) = snap.get(&key).filter(|e| e.cluster == self.own) else {
                continue;
            };
            let Some(c) = check::check(e, &id) else {
                continue;
            };
            seen.insert(id.clone());
            if !self.deregister_if_overdue(&id, &key, &c, now_ms) {
                self.start_if_due(id, key, c, now, now_ms);
            }
        }
        self.schedule.retain(|id, _| seen.contains(id));
        self.removing.retain(|k| snap.contains(k));
    }

    /// Deregister endpoint `key` when its check `c` has been critical
    /// longer than its `DeregisterCriticalServiceAfter`; whether it is
    /// being deregistered by this call (then the check does not run).
    fn deregister_if_overdue(
        &mut self,
        id: &str,
        key: &EndpointKey,
        c: &check::Check,
        now_ms: u64,
    ) -> bool {
        let Some(after) = c.deregister_after_ms else {
            return false;
        };
        let overdue = now_ms.saturating_sub(c.since_ms) >= after;
        if c.status != Status::Critical || !overdue || !self.removing.insert(key.clone()) {
            return false;
        }
        let (registrar, key, id) = (Arc::clone(&self.registrar), key.clone(), id.to_string());
        self.running.spawn(async move {
            let ok = deregister(&registrar, &key, &id).await;
            Done::Removed(key, ok)
        });
        true
    }

    /// Bring a TTL check's stored state up to date, or run any other check
    /// whose time has come (registered again with another definition, it
    /// runs now), at most [`MAX_RUNNING`] at once.
    fn start_if_due(
        &mut self,
        id: String,
        key: EndpointKey,
        c: check::Check,
        now: Instant,
        now_ms: u64,
    ) {
        if let Probe::Ttl { ttl_ms } = c.probe {
            if let Some(due) = ttl_due(&c, now_ms) {
                if self.ttl_writing.insert(id.clone()) {
                    let registrar = Arc::clone(&self.registrar);
                    self.running.spawn(async move {
                        expire(&registrar, &key, &id, due, ttl_ms).await;
                        Done::Expired(id)
                    });
                }
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
            let (status, output) = prober.run(&probe).await;
            set_status(&registrar, &key, &id, status, &output).await;
            Done::Ran(id)
        });
    }
}

/// What a TTL check's stored state calls for at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TtlDue {
    /// Its deadline passed: it turns critical.
    Critical,
    /// Stored without a deadline (by an earlier version): give it one.
    Deadline,
}

fn ttl_due(c: &check::Check, now: u64) -> Option<TtlDue> {
    match c.expires_ms {
        None => Some(TtlDue::Deadline),
        Some(at) if now >= at && c.status != Status::Critical => Some(TtlDue::Critical),
        Some(_) => None,
    }
}

/// Write what [`ttl_due`] found, from the state as it is now (a report may
/// have moved the deadline meanwhile).
async fn expire(registrar: &Arc<Registrar>, key: &EndpointKey, id: &str, due: TtlDue, ttl_ms: u64) {
    let now = check::now_ms();
    let Some(e) = registrar
        .state()
        .store()
        .snapshot()
        .and_then(|s| s.get(key).cloned())
    else {
        return;
    };
    let Some(c) = check::check(&e, id) else {
        return;
    };
    if ttl_due(&c, now) != Some(due) {
        return;
    }
    match due {
        TtlDue::Critical => {
            let output = format!(
                "TTL expired: no report within {:?}",
                Duration::from_millis(ttl_ms)
            );
            set_status(registrar, key, id, Status::Critical, &output).await;
        }
        TtlDue::Deadline => {
            let mut c = c;
            c.expires_ms = c.deadline_from(now);
            let mut updated = e;
            check::put(&mut updated, id, &c);
            if let Err(err) = registrar.write(Op::Register(updated), None).await {
                tracing::warn!(check = id, service = %key.service, id = %key.id, error = %err, "could not store a TTL check's deadline");
            }
        }
    }
}

/// Write check `id` of endpoint `key` as `status` when that is a change;
/// whether the state is now stored (`false` when the write failed).
pub(crate) async fn set_status(
    registrar: &Arc<Registrar>,
    key: &EndpointKey,
    id: &str,
    status: Status,
    output: &str,
) -> bool {
    let Some(snap) = registrar.state().store().snapshot() else {
        return false;
    };
    let Some(updated) = snap
        .get(key)
        .and_then(|e| check::with_status(e, id, status, output))
    else {
        return true;
    };
    match registrar.write(Op::Register(updated), None).await {
        Ok(_) => {
            tracing::info!(check = id, service = %key.service, id = %key.id, status = status.as_str(), output, "check changed state");
            true
        }
        Err(e) => {
            tracing::warn!(check = id, service = %key.service, id = %key.id, error = %e, "could not write a check's new state");
            false
        }
    }
}

async fn deregister(registrar: &Arc<Registrar>, key: &EndpointKey, check: &str) -> bool {
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
