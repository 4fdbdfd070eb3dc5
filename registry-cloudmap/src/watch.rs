//! How this backend is watched. Cloud Map has no change feed: the registry
//! reports `native_watch: false`, and [`waypost::stack::stack`] wraps
//! it in [`waypost::polling::Polling`], which turns `snapshot()` into a
//! watch. This module makes those snapshots cheap: a service whose
//! `DiscoverInstancesRevision` did not change since the last snapshot is
//! taken from it, and every [`full_poll_every`] snapshots read everything
//! (Cloud Map's health-status changes do not bump the revision). A
//! snapshot gets a new version only when its endpoints changed.
//!
//! [`full_poll_every`]: crate::CloudMapConfig::full_poll_every

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt, TryStreamExt};
use waypost::backend::VersionClock;
use waypost::{Endpoint, Result, Snapshot, Version};

use crate::client::lock;
use crate::endpoints::Endpoints;
use crate::services::ServiceRef;

/// A service's revision and endpoints, as a snapshot read them.
type Seen = (Option<i64>, Arc<Vec<Endpoint>>);

/// The snapshots of one registry (shared by its clones): what the last one
/// saw, so the next can skip what did not change.
pub(crate) struct SnapshotCache {
    last: Mutex<LastSnapshot>,
    /// Snapshots taken so far (every `full_poll_every`-th reads everything).
    cycle: AtomicU64,
    /// Versions of snapshots whose endpoints changed.
    clock: VersionClock,
    /// When the last snapshot started, and whether the budget warning is
    /// on (it is logged when it starts to apply, and when it stops).
    budget: Mutex<(Option<Instant>, bool)>,
}

/// Cloud Map's documented account rate for `DiscoverInstancesRevision`
/// per region (requests per second).
pub(crate) const ACCOUNT_REVISION_RATE: f64 = 3000.0;

/// What a snapshot every `interval` over `services` services costs, when
/// it goes over a budget: the rate this registry needs against its own
/// limit (`rps`), and the rate `replicas` such registries need against
/// the account's. `None` when both fit.
pub(crate) fn over_budget(
    services: usize,
    replicas: u32,
    interval: Duration,
    rps: u32,
) -> Option<String> {
    let secs = interval.as_secs_f64().max(0.001);
    // At least one revision call per service and snapshot.
    let per_replica = services as f64 / secs;
    let fleet = per_replica * f64::from(replicas);
    let mut why = Vec::new();
    if per_replica > f64::from(rps) {
        why.push(format!(
            "{services} services every {interval:?} need {per_replica:.0} requests/s, over this registry's limit of {rps}/s: a snapshot takes at least {:.1} s",
            services as f64 / f64::from(rps)
        ));
    }
    if fleet > ACCOUNT_REVISION_RATE {
        why.push(format!(
            "{replicas} registries × {services} services every {interval:?} need {fleet:.0} DiscoverInstancesRevision calls/s, over the account's {ACCOUNT_REVISION_RATE:.0}/s"
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// What the last snapshot saw.
struct LastSnapshot {
    /// Per Cloud Map service id: its revision and endpoints.
    services: HashMap<String, Seen>,
    /// The snapshot itself, with its version.
    snapshot: Snapshot,
}

impl SnapshotCache {
    pub(crate) fn new() -> Self {
        let clock = VersionClock::new();
        let snapshot = Snapshot::empty(clock.next());
        Self {
            last: Mutex::new(LastSnapshot {
                services: HashMap::new(),
                snapshot,
            }),
            cycle: AtomicU64::new(0),
            clock,
            budget: Mutex::new((None, false)),
        }
    }

    /// Every endpoint in the namespace: services whose revision did not change since
    /// the last snapshot are taken from it (unless this is a full cycle),
    /// the others read; at the last snapshot's version when nothing
    /// changed, at a new one otherwise.
    pub(crate) async fn snapshot(&self, endpoints: &Endpoints) -> Result<Snapshot> {
        let cfg = &endpoints.client.cfg;
        let services = endpoints.services.list_services().await?;
        self.check_budget(endpoints, services.len());
        let cycle = self.cycle.fetch_add(1, Ordering::Relaxed);
        let every = u64::from(cfg.full_poll_every.max(1));
        let full = !cfg.revision_skip || cycle.is_multiple_of(every);
        let seen: HashMap<String, Seen> = lock(&self.last).services.clone();
        let results: Vec<(String, Seen)> = stream::iter(services)
            .map(|s| {
                let cached = if full { None } else { seen.get(&s.id).cloned() };
                read_or_reuse(endpoints, s, cached)
            })
            .buffer_unordered(cfg.concurrency.max(1))
            .try_collect()
            .await?;
        let fresh = Snapshot::from_endpoints(
            Version::ZERO,
            results.iter().flat_map(|(_, (_, eps))| eps.iter().cloned()),
        );
        let mut last = lock(&self.last);
        last.services = results.into_iter().collect();
        if !last.snapshot.same_endpoints(&fresh) {
            last.snapshot = fresh.at_version(self.clock.next());
        }
        Ok(last.snapshot.clone())
    }
}

impl SnapshotCache {
    /// Warn (once, until it fits again) when snapshots as often as the
    /// last two came need more requests than the budget allows.
    fn check_budget(&self, endpoints: &Endpoints, services: usize) {
        let cfg = &endpoints.client.cfg;
        let now = Instant::now();
        let mut b = lock(&self.budget);
        let Some(prev) = b.0.replace(now) else {
            return;
        };
        let over = over_budget(
            services,
            cfg.replicas.get(),
            now.duration_since(prev),
            cfg.requests_per_second.get(),
        );
        match (over, b.1) {
            (Some(why), false) => {
                tracing::warn!(namespace = %cfg.namespace, "Cloud Map request budget exceeded: {why}; poll less often, or use fewer services");
                b.1 = true;
            }
            (None, true) => {
                tracing::info!(namespace = %cfg.namespace, "Cloud Map requests within budget again");
                b.1 = false;
            }
            _ => {}
        }
    }
}

/// One service for a snapshot: `cached` when it is given with a revision
/// and the service's revision is still that one, else read.
async fn read_or_reuse(
    endpoints: &Endpoints,
    s: ServiceRef,
    cached: Option<Seen>,
) -> Result<(String, Seen)> {
    if let Some((Some(old_rev), eps)) = cached {
        let rev = endpoints.revision(&s.name, &s.cm_name).await?;
        if rev == Some(old_rev) {
            endpoints
                .client
                .counters
                .skipped_services
                .fetch_add(1, Ordering::Relaxed);
            return Ok((s.id, (rev, eps)));
        }
    }
    let (rev, eps) = endpoints.read_service(&s).await?;
    Ok((s.id, (rev, Arc::new(eps))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_arithmetic() {
        // 10k services at 50 requests/s: at least 200 s per snapshot.
        let w = over_budget(10_000, 1, Duration::from_secs(5), 50).expect("over");
        assert!(w.contains("at least 200.0 s"), "{w}");
        // 100 replicas × 10k services / 5 s = 200k calls/s > 3,000/s.
        let w = over_budget(10_000, 100, Duration::from_secs(300), 50).expect("over");
        assert!(w.contains("3333 DiscoverInstancesRevision"), "{w}");
        assert!(!w.contains("this registry's limit"), "{w}");
        // 100 services, 2 replicas, every 5 s: 20 + 40 requests/s.
        assert_eq!(over_budget(100, 2, Duration::from_secs(5), 50), None);
    }
}
