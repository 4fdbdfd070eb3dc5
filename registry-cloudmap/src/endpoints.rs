//! [`Endpoints`]: the namespace's endpoints, as instances of its services:
//! reading one service's (`DiscoverInstances`, `ListInstances`,
//! `DiscoverInstancesRevision`) and writing them (`RegisterInstance` with
//! its custom health status, `DeregisterInstance`), each write to one
//! instance serialized.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use aws_sdk_servicediscovery::error::ProvideErrorMetadata;
use aws_sdk_servicediscovery::operation::register_instance::RegisterInstanceError;
use aws_sdk_servicediscovery::types::{CustomHealthStatus, HealthStatus, HealthStatusFilter};
use waypost::{Endpoint, EndpointKey, Error, ErrorKind, Health, Op, Result};

use crate::client::{request_id, Client, DISCOVER_MAX};
use crate::config::{ReadMode, WriteMode};
use crate::error;
use crate::layout;
use crate::services::{ServiceRef, Services};

/// Largest batch [`waypost::Batch::apply`] takes.
pub const MAX_BATCH: usize = 1000;

/// The endpoints of one registry's namespace.
pub(crate) struct Endpoints {
    pub(crate) client: Arc<Client>,
    pub(crate) services: Services,
}

impl Endpoints {
    /// The endpoints in `client`'s namespace.
    pub(crate) fn new(client: Arc<Client>) -> Self {
        Self {
            services: Services::new(Arc::clone(&client)),
            client,
        }
    }

    /// The endpoints of `service`'s instances (id and attributes); an
    /// instance that is not an endpoint is skipped with a warning.
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
            match layout::decode(service, id, attrs.unwrap_or(&empty)) {
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
        self.client
            .counters
            .instance_reads
            .fetch_add(1, Ordering::Relaxed);
        let res = self
            .client
            .call("DiscoverInstances", &target, |c| {
                c.discover_instances()
                    .namespace_name(&self.client.cfg.namespace)
                    .service_name(cm_name)
                    .health_status(HealthStatusFilter::All)
                    .max_results(DISCOVER_MAX)
                    .send()
            })
            .await;
        let out = match res {
            Ok(out) => out,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if out.instances().len() >= DISCOVER_MAX as usize {
            tracing::warn!(%service, "DiscoverInstances returned its maximum of {DISCOVER_MAX}; reading with ListInstances");
            return match self.services.service_id(service, false).await? {
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
        // healthy attribute (not a draining one).
        for i in out.instances() {
            if i.health_status() == Some(&HealthStatus::Unhealthy) {
                let id = i.instance_id().unwrap_or_default();
                let id = i
                    .attributes()
                    .and_then(|a| a.get(layout::ATTR_ID))
                    .and_then(|v| layout::unescape(v))
                    .unwrap_or_else(|| id.to_string());
                // A draining endpoint stays draining (its custom health
                // status is unhealthy for Cloud Map's own readers).
                if let Some(ep) = eps
                    .iter_mut()
                    .find(|e| e.id == id && e.health == Health::Healthy)
                {
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
        self.client
            .counters
            .instance_reads
            .fetch_add(1, Ordering::Relaxed);
        let mut token = None;
        let mut raw: Vec<(String, Option<HashMap<String, String>>)> = Vec::new();
        loop {
            let out = self
                .client
                .call("ListInstances", &target, |c| {
                    c.list_instances()
                        .service_id(service_id)
                        .set_next_token(token)
                        .send()
                })
                .await?;
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

    /// `DiscoverInstancesRevision`; `None` when the service does not exist.
    pub(crate) async fn revision(&self, service: &str, cm_name: &str) -> Result<Option<i64>> {
        let target = format!("service {service}");
        self.client
            .counters
            .revision_calls
            .fetch_add(1, Ordering::Relaxed);
        let res = self
            .client
            .call("DiscoverInstancesRevision", &target, |c| {
                c.discover_instances_revision()
                    .namespace_name(&self.client.cfg.namespace)
                    .service_name(cm_name)
                    .send()
            })
            .await;
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
        match self.client.cfg.read_mode {
            ReadMode::Discover => Ok(self
                .discover(&s.name, &s.cm_name)
                .await?
                .unwrap_or((None, Vec::new()))),
            ReadMode::List => {
                // Revision first: a change between the two calls is then
                // seen again next time, never lost.
                let rev = if self.client.cfg.revision_skip {
                    self.revision(&s.name, &s.cm_name).await?
                } else {
                    None
                };
                Ok((rev, self.list_instances(&s.name, &s.id).await?))
            }
        }
    }

    /// The endpoints of `service`, as [`ReadMode`] says to read them.
    pub(crate) async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        let cm_name = layout::service_name(service);
        match self.client.cfg.read_mode {
            ReadMode::Discover => Ok(self
                .discover(service, &cm_name)
                .await?
                .map(|(_, eps)| eps)
                .unwrap_or_default()),
            ReadMode::List => match self.services.service_id(service, false).await? {
                Some(id) => {
                    let res = self.list_instances(service, &id).await;
                    match res {
                        Err(e) if e.kind() == ErrorKind::NotFound => {
                            self.services.forget_service(service);
                            Ok(Vec::new())
                        }
                        other => other,
                    }
                }
                None => Ok(Vec::new()),
            },
        }
    }

    // ---- writes ----

    /// `RegisterInstance` of a validated endpoint (its attributes checked
    /// against Cloud Map's limits first, [`layout::encode`]), creating its
    /// service on the first registration; then its custom health status
    /// when `custom_health` is set and writes wait.
    pub(crate) async fn put(&self, ep: &Endpoint) -> Result<()> {
        let attrs = layout::encode(ep)?;
        let target = format!("instance {}", ep.key());
        let _guard = self
            .client
            .lock_key(format!("instance\0{}\0{}", ep.service, ep.id))
            .await;
        let instance_id = layout::instance_id(&ep.id);
        let mut retried = false;
        loop {
            let service_id = self
                .services
                .service_id(&ep.service, true)
                .await?
                .ok_or_else(|| {
                    Error::internal(format!("service {} was not created", ep.service))
                })?;
            let res = self
                .client
                .send(|c| {
                    c.register_instance()
                        .service_id(&service_id)
                        .instance_id(&instance_id)
                        .creator_request_id(request_id("reg"))
                        .set_attributes(Some(attrs.clone()))
                        .send()
                })
                .await;
            // An SDK retry of a request Cloud Map already took: the
            // CreatorRequestId makes Cloud Map answer with the operation of
            // the first attempt, which is then what to wait for.
            let res = match res {
                Err(e) => match e.as_service_error() {
                    Some(RegisterInstanceError::DuplicateRequest(dup))
                        if dup.duplicate_operation_id().is_some() =>
                    {
                        let op = dup.duplicate_operation_id().map(str::to_string);
                        tracing::debug!(%target, operation = ?op, "RegisterInstance was a duplicate; following the first operation");
                        return self
                            .client
                            .finish(op.as_deref(), "RegisterInstance", &target)
                            .await;
                    }
                    _ => Err(error::from_sdk(
                        e,
                        self.client.about("RegisterInstance", &target),
                    )),
                },
                Ok(out) => Ok(out),
            };
            match res {
                Ok(out) => {
                    self.client
                        .finish(out.operation_id(), "RegisterInstance", &target)
                        .await?;
                    if self.client.cfg.custom_health
                        && self.client.cfg.write_mode == WriteMode::Wait
                    {
                        self.set_health(&service_id, &instance_id, ep, &target)
                            .await?;
                    }
                    return Ok(());
                }
                // The cached service was deleted behind our back: look again once.
                Err(e) if e.kind() == ErrorKind::NotFound && !retried => {
                    tracing::info!(service = %ep.service, "cached Cloud Map service is gone; looking it up again");
                    self.services.forget_service(&ep.service);
                    retried = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Set the instance's Cloud Map health status from `ep.health`; a
    /// service without a custom health config is left alone.
    pub(crate) async fn set_health(
        &self,
        service_id: &str,
        instance_id: &str,
        ep: &Endpoint,
        target: &str,
    ) -> Result<()> {
        let status = match ep.health {
            Health::Healthy => CustomHealthStatus::Healthy,
            // Cloud Map's own readers (DiscoverInstances asking for
            // healthy instances) must send a draining instance nothing new.
            Health::Unhealthy | Health::Draining => CustomHealthStatus::Unhealthy,
        };
        let res = self
            .client
            .send(|c| {
                c.update_instance_custom_health_status()
                    .service_id(service_id)
                    .instance_id(instance_id)
                    .status(status)
                    .send()
            })
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("CustomHealthNotFound") => {
                tracing::debug!(%target, "service has no custom health config; health kept as an attribute only");
                Ok(())
            }
            Err(e) => Err(error::from_sdk(
                e,
                self.client
                    .about("UpdateInstanceCustomHealthStatus", target),
            )),
        }
    }

    /// `DeregisterInstance` of `key`; an unknown instance or service is
    /// not an error.
    pub(crate) async fn delete(&self, key: &EndpointKey) -> Result<()> {
        let target = format!("instance {key}");
        let _guard = self
            .client
            .lock_key(format!("instance\0{}\0{}", key.service, key.id))
            .await;
        let Some(service_id) = self.services.service_id(&key.service, false).await? else {
            return Ok(());
        };
        let res = self
            .client
            .call("DeregisterInstance", &target, |c| {
                c.deregister_instance()
                    .service_id(&service_id)
                    .instance_id(layout::instance_id(&key.id))
                    .send()
            })
            .await;
        match res {
            Ok(out) => {
                self.client
                    .finish(out.operation_id(), "DeregisterInstance", &target)
                    .await?;
                if self.client.cfg.repeat_deregister
                    && self.client.cfg.write_mode == WriteMode::Wait
                {
                    self.deregister_copies(&service_id, key, &target).await?;
                }
                Ok(())
            }
            // Unknown instance (or service): nothing to remove.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if e.to_string().contains("ServiceNotFound") {
                    self.services.forget_service(&key.service);
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Deregister again until Cloud Map answers `InstanceNotFound` (see
    /// [`crate::CloudMapConfig::repeat_deregister`]); at most 16 more times.
    pub(crate) async fn deregister_copies(
        &self,
        service_id: &str,
        key: &EndpointKey,
        target: &str,
    ) -> Result<()> {
        for _ in 0..16 {
            let res = self
                .client
                .call("DeregisterInstance", target, |c| {
                    c.deregister_instance()
                        .service_id(service_id)
                        .instance_id(layout::instance_id(&key.id))
                        .send()
                })
                .await;
            match res {
                Ok(out) => {
                    tracing::debug!(%target, "removed another copy of the instance");
                    self.client
                        .finish(out.operation_id(), "DeregisterInstance", target)
                        .await?;
                }
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(Error::internal(format!(
            "{target}: Cloud Map still lists it after 17 deregistrations"
        )))
    }

    /// One op of a batch.
    pub(crate) async fn write(&self, op: Op) -> Result<()> {
        match op {
            Op::Register(ep) => self.put(&ep).await,
            Op::Deregister(key) => self.delete(&key).await,
        }
    }
}
