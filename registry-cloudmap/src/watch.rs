//! How this backend is watched. Cloud Map has no change feed: the registry
//! reports `native_watch: false`, and [`registry_api::stack::stack`] wraps
//! it in [`registry_api::polling::Polling`], which turns `snapshot()` into a
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

use futures::stream::{self, StreamExt, TryStreamExt};
use registry_api::backend::VersionClock;
use registry_api::{Endpoint, Result, Snapshot, Version};

use crate::core::{lock, Namespace};
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
        }
    }

    /// Every endpoint of `ns`: services whose revision did not change since
    /// the last snapshot are taken from it (unless this is a full cycle),
    /// the others read; at the last snapshot's version when nothing
    /// changed, at a new one otherwise.
    pub(crate) async fn snapshot(&self, ns: &Namespace) -> Result<Snapshot> {
        let services = ns.list_services().await?;
        let cycle = self.cycle.fetch_add(1, Ordering::Relaxed);
        let every = u64::from(ns.cfg.full_poll_every.max(1));
        let full = !ns.cfg.revision_skip || cycle.is_multiple_of(every);
        let seen: HashMap<String, Seen> = lock(&self.last).services.clone();
        let results: Vec<(String, Seen)> = stream::iter(services)
            .map(|s| {
                let cached = if full { None } else { seen.get(&s.id).cloned() };
                ns.read_or_reuse(s, cached)
            })
            .buffer_unordered(ns.cfg.concurrency.max(1))
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

impl Namespace {
    /// One service for a snapshot: `cached` when it is given with a
    /// revision and the service's revision is still that one, else read.
    async fn read_or_reuse(&self, s: ServiceRef, cached: Option<Seen>) -> Result<(String, Seen)> {
        if let Some((Some(old_rev), eps)) = cached {
            let rev = self.revision(&s.name, &s.cm_name).await?;
            if rev == Some(old_rev) {
                self.counters
                    .skipped_services
                    .fetch_add(1, Ordering::Relaxed);
                return Ok((s.id, (rev, eps)));
            }
        }
        let (rev, eps) = self.read_service(&s).await?;
        Ok((s.id, (rev, Arc::new(eps))))
    }
}
