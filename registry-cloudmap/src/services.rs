//! [`Services`]: the namespace's services, our service names as Cloud Map
//! services (found, checked to be in this namespace, created on the first
//! registration), the reserved services that hold node records, and the
//! caches of their ids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_servicediscovery::operation::create_service::CreateServiceError;
use aws_sdk_servicediscovery::types::{
    FilterCondition, HealthCheckCustomConfig, ServiceFilter, ServiceFilterName, ServiceTypeOption,
};
use futures::stream::{self, StreamExt, TryStreamExt};
use waypost::{Error, ErrorKind, Result};

use crate::client::{lock, request_id, Client};
use crate::error;
use crate::layout;

/// A service of the namespace: our name, Cloud Map id and Cloud Map name.
#[derive(Debug, Clone)]
pub(crate) struct ServiceRef {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) cm_name: String,
}

/// The services of one registry's namespace, and what it knows of them.
pub(crate) struct Services {
    client: Arc<Client>,
    /// Our service name → Cloud Map service id.
    by_name: Mutex<HashMap<String, String>>,
    /// Reserved Cloud Map service name (node records) → its id.
    node_services: Mutex<HashMap<String, String>>,
    /// Cloud Map service id → whether it is in this namespace.
    namespaces: Mutex<HashMap<String, bool>>,
}

impl Services {
    /// The services of `client`'s namespace, none known yet.
    pub(crate) fn new(client: Arc<Client>) -> Self {
        Self {
            client,
            by_name: Mutex::new(HashMap::new()),
            node_services: Mutex::new(HashMap::new()),
            namespaces: Mutex::new(HashMap::new()),
        }
    }

    /// Every service of the namespace we can map back to our names; also
    /// refreshes the name → id cache.
    pub(crate) async fn list_services(&self) -> Result<Vec<ServiceRef>> {
        let target = format!("namespace {}", self.client.cfg.namespace);
        let filter = ServiceFilter::builder()
            .name(ServiceFilterName::NamespaceId)
            .values(&self.client.namespace_id)
            .condition(FilterCondition::Eq)
            .build()
            .map_err(|e| Error::internal(format!("building the ListServices filter: {e}")))?;
        let mut token = None;
        let mut found = Vec::new();
        // The services holding node records: never services of endpoints.
        let mut reserved = Vec::new();
        loop {
            let out = self
                .client
                .call("ListServices", &target, |c| {
                    c.list_services()
                        .filters(filter.clone())
                        .set_next_token(token)
                        .send()
                })
                .await?;
            for s in out.services() {
                let (Some(id), Some(cm_name)) = (s.id(), s.name()) else {
                    continue;
                };
                if layout::is_node_service(cm_name) {
                    reserved.push(ServiceRef {
                        name: cm_name.to_string(),
                        id: id.to_string(),
                        cm_name: cm_name.to_string(),
                    });
                    continue;
                }
                match layout::service_from_cloud_map(cm_name, s.description()) {
                    Some(name) => found.push(ServiceRef {
                        name,
                        id: id.to_string(),
                        cm_name: cm_name.to_string(),
                    }),
                    None => tracing::warn!(
                        service = %cm_name,
                        "skipping a Cloud Map service whose hashed name does not match its description"
                    ),
                }
            }
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        let found = self.in_namespace(found).await?;
        let reserved = self.in_namespace(reserved).await?;
        *lock(&self.by_name) = found
            .iter()
            .map(|s| (s.name.clone(), s.id.clone()))
            .collect();
        *lock(&self.node_services) = reserved.into_iter().map(|s| (s.cm_name, s.id)).collect();
        Ok(found)
    }

    /// The services that really are in this namespace. `ListServices` may
    /// ignore its namespace filter (moto does) and its answer does not say
    /// the namespace, so each service id is checked once with `GetService`
    /// (a service never moves) and the answer remembered.
    pub(crate) async fn in_namespace(&self, services: Vec<ServiceRef>) -> Result<Vec<ServiceRef>> {
        let unknown: Vec<String> = {
            let known = lock(&self.namespaces);
            services
                .iter()
                .filter(|s| !known.contains_key(&s.id))
                .map(|s| s.id.clone())
                .collect()
        };
        let checked: Vec<(String, bool)> = stream::iter(unknown)
            .map(|id| async move {
                let target = format!("service id {id}");
                let res = self
                    .client
                    .call("GetService", &target, |c| c.get_service().id(&id).send())
                    .await;
                match res {
                    Ok(out) => {
                        let ns = out.service().and_then(|s| s.namespace_id());
                        Ok((id, ns == Some(self.client.namespace_id.as_str())))
                    }
                    // Deleted since it was listed.
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok((id, false)),
                    Err(e) => Err(e),
                }
            })
            .buffer_unordered(self.client.cfg.concurrency.max(1))
            .try_collect()
            .await?;
        let mut known = lock(&self.namespaces);
        known.extend(checked);
        Ok(services
            .into_iter()
            .filter(|s| known.get(&s.id).copied().unwrap_or(false))
            .collect())
    }

    /// The id of `service` as last seen, if any.
    pub(crate) fn cached_service(&self, service: &str) -> Option<String> {
        lock(&self.by_name).get(service).cloned()
    }

    /// The Cloud Map id of `service`, created when `create` is set and it
    /// does not exist; `None` when it does not exist and `create` is not set.
    pub(crate) async fn service_id(&self, service: &str, create: bool) -> Result<Option<String>> {
        if let Some(id) = self.cached_service(service) {
            return Ok(Some(id));
        }
        let _guard = self.client.lock_key(format!("service\0{service}")).await;
        if let Some(id) = self.cached_service(service) {
            return Ok(Some(id));
        }
        if let Some(s) = self
            .list_services()
            .await?
            .into_iter()
            .find(|s| s.name == service)
        {
            return Ok(Some(s.id));
        }
        if !create {
            return Ok(None);
        }
        let cm_name = layout::service_name(service);
        let description = (cm_name != service).then_some(service);
        let id = self
            .create_service(
                &cm_name,
                description,
                self.client.cfg.custom_health,
                service,
            )
            .await?;
        tracing::debug!(%service, cloud_map_name = %cm_name, service_id = %id, "Cloud Map service ready");
        lock(&self.by_name).insert(service.to_string(), id.clone());
        Ok(Some(id))
    }

    /// The Cloud Map id of the reserved service `cm_name` that holds node
    /// records ([`layout::node_service`]), created when `create` is set and
    /// it does not exist; `None` when it does not exist and `create` is
    /// not set.
    pub(crate) async fn node_service_id(
        &self,
        cm_name: &str,
        create: bool,
    ) -> Result<Option<String>> {
        let cached = || lock(&self.node_services).get(cm_name).cloned();
        if let Some(id) = cached() {
            return Ok(Some(id));
        }
        let _guard = self
            .client
            .lock_key(format!("node-service\0{cm_name}"))
            .await;
        if let Some(id) = cached() {
            return Ok(Some(id));
        }
        self.list_services().await?;
        if let Some(id) = cached() {
            return Ok(Some(id));
        }
        if !create {
            return Ok(None);
        }
        let id = self
            .create_service(
                cm_name,
                Some("node liveness records (waypost-cloudmap)"),
                false,
                cm_name,
            )
            .await?;
        tracing::debug!(cloud_map_name = %cm_name, service_id = %id, "Cloud Map service for node records ready");
        lock(&self.node_services).insert(cm_name.to_string(), id.clone());
        Ok(Some(id))
    }

    /// The names of the reserved services known to hold node records.
    pub(crate) fn node_service_names(&self) -> Vec<String> {
        lock(&self.node_services).keys().cloned().collect()
    }

    /// Forget the id of the reserved service `cm_name` (it was deleted).
    pub(crate) fn forget_node_service(&self, cm_name: &str) {
        lock(&self.node_services).remove(cm_name);
    }

    /// `CreateService` of `cm_name` in this namespace (API-only in a DNS
    /// namespace; with a custom health config when `custom_health`); the
    /// id of the existing service when another process created it first.
    /// `service` names it in errors.
    async fn create_service(
        &self,
        cm_name: &str,
        description: Option<&str>,
        custom_health: bool,
        service: &str,
    ) -> Result<String> {
        let target = format!("service {service}");
        let client = &*self.client;
        let res = client
            .send(|c| {
                let mut req = c
                    .create_service()
                    .name(cm_name)
                    .namespace_id(&client.namespace_id)
                    .creator_request_id(request_id("svc"))
                    .set_description(description.map(str::to_string));
                if client.dns_namespace {
                    req = req.r#type(ServiceTypeOption::Http);
                }
                if custom_health {
                    req =
                        req.health_check_custom_config(HealthCheckCustomConfig::builder().build());
                }
                req.send()
            })
            .await;
        let id = match res {
            Ok(out) => out
                .service()
                .and_then(|s| s.id())
                .map(str::to_string)
                .ok_or_else(|| error::missing("CreateService", "Service.Id", &target))?,
            Err(e) => match e.as_service_error() {
                Some(CreateServiceError::ServiceAlreadyExists(exists))
                    if exists.service_id().is_some() =>
                {
                    exists.service_id().unwrap_or_default().to_string()
                }
                _ => {
                    return Err(error::from_sdk(
                        e,
                        self.client.about("CreateService", &target),
                    ))
                }
            },
        };
        lock(&self.namespaces).insert(id.clone(), true);
        Ok(id)
    }

    /// Forget the id of `service` (it was deleted).
    pub(crate) fn forget_service(&self, service: &str) {
        lock(&self.by_name).remove(service);
    }
}
