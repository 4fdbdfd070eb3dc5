//! Writes: registering, health and deregistering instances.

use std::collections::HashMap;

use aws_sdk_servicediscovery::error::ProvideErrorMetadata;
use aws_sdk_servicediscovery::operation::register_instance::RegisterInstanceError;
use aws_sdk_servicediscovery::types::CustomHealthStatus;
use registry_api::{Endpoint, EndpointKey, Error, ErrorKind, Health, Result};

use crate::config::WriteMode;
use crate::core::{request_id, Inner, Prepared};
use crate::error;
use crate::mapping;

impl Inner {
    pub(crate) async fn put(&self, ep: &Endpoint, attrs: &HashMap<String, String>) -> Result<()> {
        let target = format!("instance {}", ep.key());
        let _guard = self
            .lock_key(format!("instance\0{}\0{}", ep.service, ep.id))
            .await;
        let instance_id = mapping::instance_id(&ep.id);
        let mut retried = false;
        loop {
            let service_id = self.service_id(&ep.service, true).await?.ok_or_else(|| {
                Error::internal(format!("service {} was not created", ep.service))
            })?;
            self.throttle().await;
            let res = self
                .client
                .register_instance()
                .service_id(&service_id)
                .instance_id(&instance_id)
                .creator_request_id(request_id("reg"))
                .set_attributes(Some(attrs.clone()))
                .send()
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
                            .finish(op.as_deref(), "RegisterInstance", &target)
                            .await;
                    }
                    _ => Err(error::from_sdk(e, self.call("RegisterInstance", &target))),
                },
                Ok(out) => Ok(out),
            };
            match res {
                Ok(out) => {
                    self.finish(out.operation_id(), "RegisterInstance", &target)
                        .await?;
                    if self.cfg.custom_health && self.cfg.write_mode == WriteMode::Wait {
                        self.set_health(&service_id, &instance_id, ep, &target)
                            .await?;
                    }
                    return Ok(());
                }
                // The cached service was deleted behind our back: look again once.
                Err(e) if e.kind() == ErrorKind::NotFound && !retried => {
                    tracing::info!(service = %ep.service, "cached Cloud Map service is gone; looking it up again");
                    self.forget_service(&ep.service);
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
            Health::Unhealthy => CustomHealthStatus::Unhealthy,
        };
        self.throttle().await;
        let res = self
            .client
            .update_instance_custom_health_status()
            .service_id(service_id)
            .instance_id(instance_id)
            .status(status)
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("CustomHealthNotFound") => {
                tracing::debug!(%target, "service has no custom health config; health kept as an attribute only");
                Ok(())
            }
            Err(e) => Err(error::from_sdk(
                e,
                self.call("UpdateInstanceCustomHealthStatus", target),
            )),
        }
    }

    pub(crate) async fn delete(&self, key: &EndpointKey) -> Result<()> {
        let target = format!("instance {key}");
        let _guard = self
            .lock_key(format!("instance\0{}\0{}", key.service, key.id))
            .await;
        let Some(service_id) = self.service_id(&key.service, false).await? else {
            return Ok(());
        };
        self.throttle().await;
        let res = self
            .client
            .deregister_instance()
            .service_id(&service_id)
            .instance_id(mapping::instance_id(&key.id))
            .send()
            .await
            .map_err(|e| error::from_sdk(e, self.call("DeregisterInstance", &target)));
        match res {
            Ok(out) => {
                self.finish(out.operation_id(), "DeregisterInstance", &target)
                    .await?;
                if self.cfg.repeat_deregister && self.cfg.write_mode == WriteMode::Wait {
                    self.deregister_copies(&service_id, key, &target).await?;
                }
                Ok(())
            }
            // Unknown instance (or service): nothing to remove.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if e.to_string().contains("ServiceNotFound") {
                    self.forget_service(&key.service);
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Deregister again until Cloud Map answers `InstanceNotFound` (see
    /// [`CloudMapConfig::repeat_deregister`]); at most 16 more times.
    pub(crate) async fn deregister_copies(
        &self,
        service_id: &str,
        key: &EndpointKey,
        target: &str,
    ) -> Result<()> {
        for _ in 0..16 {
            self.throttle().await;
            let res = self
                .client
                .deregister_instance()
                .service_id(service_id)
                .instance_id(mapping::instance_id(&key.id))
                .send()
                .await
                .map_err(|e| error::from_sdk(e, self.call("DeregisterInstance", target)));
            match res {
                Ok(out) => {
                    tracing::debug!(%target, "removed another copy of the instance");
                    self.finish(out.operation_id(), "DeregisterInstance", target)
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

    pub(crate) async fn apply_one(&self, p: Prepared) -> Result<()> {
        match p {
            Prepared::Put { ep, attrs } => self.put(&ep, &attrs).await,
            Prepared::Delete(key) => self.delete(&key).await,
        }
    }
}
