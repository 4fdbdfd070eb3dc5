//! Reads: one service's instances, snapshots that skip services whose
//! revision did not change.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use aws_sdk_servicediscovery::types::{HealthStatus, HealthStatusFilter};
use futures::stream::{self, StreamExt, TryStreamExt};
use registry_api::{Endpoint, ErrorKind, Health, Result, Snapshot, Version};

use crate::config::ReadMode;
use crate::core::{lock, now_micros, Inner, ServiceRef, DISCOVER_MAX};
use crate::error;
use crate::mapping;

impl Inner {
    pub(crate) fn decode_all<'a>(
        &self,
        service: &str,
        instances: impl Iterator<Item = (&'a str, Option<&'a HashMap<String, String>>)>,
    ) -> Vec<Endpoint> {
        let empty = HashMap::new();
        // Keyed by id, a later copy of an instance replacing an earlier
        // one: emulators keep one copy per re-registration, newest last.
        let mut eps: BTreeMap<String, Endpoint> = BTreeMap::new();
        for (id, attrs) in instances {
            match mapping::decode(service, id, attrs.unwrap_or(&empty)) {
                Ok(ep) => {
                    eps.insert(ep.id.clone(), ep);
                }
                Err(why) => {
                    tracing::warn!(%service, instance = %id, %why, "skipping a Cloud Map instance")
                }
            }
        }
        eps.into_values().collect()
    }

    /// `DiscoverInstances`: the endpoints and the revision; `None` when the
    /// service does not exist.
    pub(crate) async fn discover(
        &self,
        service: &str,
        cm_name: &str,
    ) -> Result<Option<(Option<i64>, Vec<Endpoint>)>> {
        let target = format!("service {service}");
        self.throttle().await;
        self.counters.instance_reads.fetch_add(1, Ordering::Relaxed);
        let res = self
            .client
            .discover_instances()
            .namespace_name(&self.cfg.namespace)
            .service_name(cm_name)
            .health_status(HealthStatusFilter::All)
            .max_results(DISCOVER_MAX)
            .send()
            .await
            .map_err(|e| error::from_sdk(e, self.call("DiscoverInstances", &target)));
        let out = match res {
            Ok(out) => out,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if out.instances().len() >= DISCOVER_MAX as usize {
            tracing::warn!(%service, "DiscoverInstances returned its maximum of {DISCOVER_MAX}; reading with ListInstances");
            return match self.service_id(service, false).await? {
                Some(id) => self
                    .list_instances(service, &id)
                    .await
                    .map(|eps| Some((None, eps))),
                None => Ok(None),
            };
        }
        let mut eps = self.decode_all(
            service,
            out.instances()
                .iter()
                .map(|i| (i.instance_id().unwrap_or_default(), i.attributes())),
        );
        // Cloud Map's own health status (custom health checks) overrides a
        // healthy attribute.
        for i in out.instances() {
            if i.health_status() == Some(&HealthStatus::Unhealthy) {
                let id = i.instance_id().unwrap_or_default();
                let id = i
                    .attributes()
                    .and_then(|a| a.get(mapping::ATTR_ID))
                    .and_then(|v| mapping::unescape(v))
                    .unwrap_or_else(|| id.to_string());
                if let Some(ep) = eps.iter_mut().find(|e| e.id == id) {
                    ep.health = Health::Unhealthy;
                }
            }
        }
        Ok(Some((out.instances_revision(), eps)))
    }

    /// `ListInstances`, every page.
    pub(crate) async fn list_instances(
        &self,
        service: &str,
        service_id: &str,
    ) -> Result<Vec<Endpoint>> {
        let target = format!("service {service}");
        self.counters.instance_reads.fetch_add(1, Ordering::Relaxed);
        let mut token = None;
        let mut raw: Vec<(String, Option<HashMap<String, String>>)> = Vec::new();
        loop {
            self.throttle().await;
            let out = self
                .client
                .list_instances()
                .service_id(service_id)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| error::from_sdk(e, self.call("ListInstances", &target)))?;
            raw.extend(out.instances().iter().map(|i| {
                (
                    i.id().unwrap_or_default().to_string(),
                    i.attributes().cloned(),
                )
            }));
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        Ok(self.decode_all(service, raw.iter().map(|(id, a)| (id.as_str(), a.as_ref()))))
    }

    pub(crate) async fn revision(&self, service: &str, cm_name: &str) -> Result<Option<i64>> {
        let target = format!("service {service}");
        self.throttle().await;
        self.counters.revision_calls.fetch_add(1, Ordering::Relaxed);
        let res = self
            .client
            .discover_instances_revision()
            .namespace_name(&self.cfg.namespace)
            .service_name(cm_name)
            .send()
            .await
            .map_err(|e| error::from_sdk(e, self.call("DiscoverInstancesRevision", &target)));
        match res {
            Ok(out) => Ok(out.instances_revision()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One service's endpoints and revision, read fresh.
    pub(crate) async fn read_service(
        &self,
        s: &ServiceRef,
    ) -> Result<(Option<i64>, Vec<Endpoint>)> {
        match self.cfg.read_mode {
            ReadMode::Discover => Ok(self
                .discover(&s.name, &s.cm_name)
                .await?
                .unwrap_or((None, Vec::new()))),
            ReadMode::List => {
                // Revision first: a change between the two calls is then
                // seen again next time, never lost.
                let rev = if self.cfg.revision_skip {
                    self.revision(&s.name, &s.cm_name).await?
                } else {
                    None
                };
                Ok((rev, self.list_instances(&s.name, &s.id).await?))
            }
        }
    }

    /// One service for a snapshot: from the cache when its revision did not
    /// change and this is not a full cycle.
    pub(crate) async fn poll_service(
        &self,
        s: ServiceRef,
        cached: Option<(Option<i64>, Arc<Vec<Endpoint>>)>,
        full: bool,
    ) -> Result<(String, Option<i64>, Arc<Vec<Endpoint>>)> {
        if let (false, Some((Some(old_rev), eps))) = (full, &cached) {
            let rev = self.revision(&s.name, &s.cm_name).await?;
            if rev == Some(*old_rev) {
                self.counters
                    .skipped_services
                    .fetch_add(1, Ordering::Relaxed);
                return Ok((s.id, rev, Arc::clone(eps)));
            }
        }
        let (rev, eps) = self.read_service(&s).await?;
        Ok((s.id, rev, Arc::new(eps)))
    }

    pub(crate) async fn snapshot(&self) -> Result<Snapshot> {
        let services = self.list_services().await?;
        let cycle = self.cycle.fetch_add(1, Ordering::Relaxed);
        let every = u64::from(self.cfg.full_poll_every.max(1));
        let full = !self.cfg.revision_skip || cycle.is_multiple_of(every);
        let cache: HashMap<String, (Option<i64>, Arc<Vec<Endpoint>>)> =
            lock(&self.poll).services.clone();
        let results: Vec<(String, Option<i64>, Arc<Vec<Endpoint>>)> = stream::iter(services)
            .map(|s| {
                let cached = cache.get(&s.id).cloned();
                self.poll_service(s, cached, full)
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .try_collect()
            .await?;
        let fresh = Snapshot::from_endpoints(
            Version::ZERO,
            results.iter().flat_map(|(_, _, eps)| eps.iter().cloned()),
        );
        let mut st = lock(&self.poll);
        st.services = results
            .into_iter()
            .map(|(id, rev, eps)| (id, (rev, eps)))
            .collect();
        if !st.last.same_endpoints(&fresh) {
            let version = Version((st.last.version().0 + 1).max(now_micros()));
            st.last = fresh.at_version(version);
        }
        Ok(st.last.clone())
    }

    pub(crate) async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        let cm_name = mapping::service_name(service);
        match self.cfg.read_mode {
            ReadMode::Discover => Ok(self
                .discover(service, &cm_name)
                .await?
                .map(|(_, eps)| eps)
                .unwrap_or_default()),
            ReadMode::List => match self.service_id(service, false).await? {
                Some(id) => {
                    let res = self.list_instances(service, &id).await;
                    match res {
                        Err(e) if e.kind() == ErrorKind::NotFound => {
                            self.forget_service(service);
                            Ok(Vec::new())
                        }
                        other => other,
                    }
                }
                None => Ok(Vec::new()),
            },
        }
    }
}
