//! [`Inner`]: the client, caches, rate limit and request counts shared by a
//! registry and its clones, and what the reads and writes build on: the
//! namespace, Cloud Map's asynchronous operations, the services.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_servicediscovery::config::Region;
use aws_sdk_servicediscovery::operation::create_http_namespace::CreateHttpNamespaceError;
use aws_sdk_servicediscovery::operation::create_service::CreateServiceError;
use aws_sdk_servicediscovery::types::{
    FilterCondition, HealthCheckCustomConfig, NamespaceType, OperationStatus, OperationTargetType,
    ServiceFilter, ServiceFilterName, ServiceTypeOption,
};
use aws_sdk_servicediscovery::Client;
use backon::{ExponentialBuilder, Retryable};
use futures::stream::{self, StreamExt, TryStreamExt};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use registry_api::{Endpoint, EndpointKey, Error, ErrorKind, Result, Snapshot, Version};

use crate::config::{CloudMapConfig, NamespaceKind, WriteMode};
use crate::error::{self, Call};
use crate::interceptor::StripDataPrefix;
use crate::mapping;

/// Most instances one `DiscoverInstances` call returns (and Cloud Map's
/// quota of instances per service).
pub(crate) const DISCOVER_MAX: i32 = 1000;
/// Largest batch [`registry_api::Batch::apply`] takes.
pub const MAX_BATCH: usize = 1000;

/// Request counts of one registry, for tests and capacity planning.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloudMapStats {
    /// Every API request made (all kinds).
    pub requests: u64,
    /// `GetOperation` calls made while waiting for writes.
    pub operation_polls: u64,
    /// `DiscoverInstancesRevision` calls.
    pub revision_calls: u64,
    /// Services whose instances were read (`DiscoverInstances` calls and
    /// `ListInstances` listings).
    pub instance_reads: u64,
    /// Services a snapshot took from its cache because their revision had
    /// not changed.
    pub skipped_services: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) operation_polls: AtomicU64,
    pub(crate) revision_calls: AtomicU64,
    pub(crate) instance_reads: AtomicU64,
    pub(crate) skipped_services: AtomicU64,
}

/// The client, caches and rate limit shared by a registry and its clones.
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) cfg: CloudMapConfig,
    pub(crate) namespace_id: String,
    /// An existing DNS namespace: services are created API-only (`HTTP`).
    pub(crate) dns_namespace: bool,
    /// Where the API is, for messages.
    pub(crate) endpoint: String,
    pub(crate) limiter: DefaultDirectRateLimiter,
    /// Our service name → Cloud Map service id.
    pub(crate) services: Mutex<HashMap<String, String>>,
    /// Cloud Map service id → whether it is in this namespace.
    pub(crate) service_namespaces: Mutex<HashMap<String, bool>>,
    pub(crate) key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) poll: Mutex<PollState>,
    pub(crate) cycle: AtomicU64,
    pub(crate) counters: Counters,
}

/// What the last snapshot saw: per Cloud Map service id its revision and
/// endpoints, and the snapshot itself with its version.
pub(crate) struct PollState {
    pub(crate) services: HashMap<String, (Option<i64>, Arc<Vec<Endpoint>>)>,
    pub(crate) last: Snapshot,
}

/// A service of the namespace: our name, Cloud Map id and Cloud Map name.
#[derive(Debug, Clone)]
pub(crate) struct ServiceRef {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) cm_name: String,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its state whole; a panic elsewhere
    // cannot leave it half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A request id unique to this call (`CreatorRequestId`, at most 64
/// characters): an SDK retry of the same call reuses it, so Cloud Map does
/// the work once.
pub(crate) fn request_id(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "registry-{kind}-{:x}-{:x}-{n:x}",
        std::process::id(),
        now_micros()
    )
}

/// Per-key serialization: holds the key's async mutex; the map entry goes
/// when nobody else wants it.
pub(crate) struct KeyGuard<'a> {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    entry: Arc<tokio::sync::Mutex<()>>,
    key: String,
    map: &'a Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut map = lock(self.map);
        // The map and this guard hold the only references: nobody waits.
        if Arc::strong_count(&self.entry) == 2 {
            map.remove(&self.key);
        }
    }
}

enum OpPoll {
    Pending(String),
    Done(Error),
}

/// A write prepared before anything is sent: validated and encoded.
pub(crate) enum Prepared {
    Put {
        ep: Endpoint,
        attrs: HashMap<String, String>,
    },
    Delete(EndpointKey),
}

impl Inner {
    /// The shared state for `cfg` over `sdk` (with `cfg.endpoint_url` and
    /// `cfg.region` applied), the namespace found or created.
    pub(crate) async fn open(
        sdk: aws_sdk_servicediscovery::Config,
        cfg: CloudMapConfig,
    ) -> Result<Self> {
        let mut builder = sdk.to_builder();
        if let Some(region) = &cfg.region {
            builder = builder.region(Region::new(region.clone()));
        }
        if let Some(url) = &cfg.endpoint_url {
            builder = builder.endpoint_url(url);
            if let Some(strip) = StripDataPrefix::new(url) {
                builder = builder.interceptor(strip);
            }
        }
        let sdk = builder.build();
        let endpoint = match (&cfg.endpoint_url, sdk.region()) {
            (Some(url), _) => url.clone(),
            (None, Some(region)) => format!("the AWS Cloud Map endpoint of region {region}"),
            (None, None) => "the AWS Cloud Map endpoint (no region set)".to_string(),
        };
        let quota = Quota::per_second(cfg.requests_per_second).allow_burst(cfg.burst);
        let mut inner = Inner {
            client: Client::from_conf(sdk),
            cfg,
            namespace_id: String::new(),
            dns_namespace: false,
            endpoint,
            limiter: RateLimiter::direct(quota),
            services: Mutex::new(HashMap::new()),
            service_namespaces: Mutex::new(HashMap::new()),
            key_locks: Mutex::new(HashMap::new()),
            poll: Mutex::new(PollState {
                services: HashMap::new(),
                last: Snapshot::empty(Version(now_micros())),
            }),
            cycle: AtomicU64::new(0),
            counters: Counters::default(),
        };
        (inner.namespace_id, inner.dns_namespace) = inner.resolve_namespace().await?;
        tracing::info!(
            namespace = %inner.cfg.namespace,
            namespace_id = %inner.namespace_id,
            endpoint = %inner.endpoint,
            "Cloud Map registry ready"
        );
        Ok(inner)
    }

    /// Request counts so far.
    pub(crate) fn stats(&self) -> CloudMapStats {
        let c = &self.counters;
        CloudMapStats {
            requests: c.requests.load(Ordering::Relaxed),
            operation_polls: c.operation_polls.load(Ordering::Relaxed),
            revision_calls: c.revision_calls.load(Ordering::Relaxed),
            instance_reads: c.instance_reads.load(Ordering::Relaxed),
            skipped_services: c.skipped_services.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn call<'a>(&'a self, op: &'a str, target: &'a str) -> Call<'a> {
        Call {
            op,
            target,
            endpoint: &self.endpoint,
        }
    }

    /// Wait for the client-side rate limit, then count the request.
    pub(crate) async fn throttle(&self) {
        self.limiter.until_ready().await;
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) async fn lock_key(&self, key: String) -> KeyGuard<'_> {
        let entry = Arc::clone(lock(&self.key_locks).entry(key.clone()).or_default());
        let guard = Arc::clone(&entry).lock_owned().await;
        KeyGuard {
            guard: Some(guard),
            entry,
            key,
            map: &self.key_locks,
        }
    }

    // ---- namespace ----

    /// The namespace's id and whether it is a DNS namespace.
    pub(crate) async fn find_namespace(&self) -> Result<Option<(String, bool)>> {
        let target = format!("namespace {}", self.cfg.namespace);
        let mut token = None;
        loop {
            self.throttle().await;
            let out = self
                .client
                .list_namespaces()
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| error::from_sdk(e, self.call("ListNamespaces", &target)))?;
            if let Some(ns) = out
                .namespaces()
                .iter()
                .find(|ns| ns.name() == Some(self.cfg.namespace.as_str()))
            {
                let dns = matches!(
                    ns.r#type(),
                    Some(NamespaceType::DnsPrivate | NamespaceType::DnsPublic)
                );
                return Ok(ns.id().map(|id| (id.to_string(), dns)));
            }
            match out.next_token() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(None),
            }
        }
    }

    pub(crate) async fn resolve_namespace(&self) -> Result<(String, bool)> {
        if let Some(found) = self.find_namespace().await? {
            return Ok(found);
        }
        let target = format!("namespace {}", self.cfg.namespace);
        if !self.cfg.create_namespace {
            return Err(Error::not_found(format!(
                "{target} at {} (creating it is turned off)",
                self.endpoint
            )));
        }
        match self.cfg.namespace_kind {
            NamespaceKind::Http => {}
        }
        self.throttle().await;
        let created = self
            .client
            .create_http_namespace()
            .name(&self.cfg.namespace)
            .creator_request_id(request_id("ns"))
            .description("service registry (registry-cloudmap)")
            .send()
            .await;
        let op_id = match created {
            Ok(out) => out
                .operation_id()
                .map(str::to_string)
                .ok_or_else(|| error::missing("CreateHttpNamespace", "OperationId", &target))?,
            Err(e) => {
                if let Some(CreateHttpNamespaceError::NamespaceAlreadyExists(exists)) =
                    e.as_service_error()
                {
                    // Another process created it first.
                    if let Some(id) = exists.namespace_id() {
                        return Ok((id.to_string(), false));
                    }
                    return self.find_namespace().await?.ok_or_else(|| {
                        Error::not_found(format!("{target}: reported as existing, but not listed"))
                    });
                }
                return Err(error::from_sdk(
                    e,
                    self.call("CreateHttpNamespace", &target),
                ));
            }
        };
        tracing::info!(namespace = %self.cfg.namespace, operation = %op_id, "creating the Cloud Map namespace");
        // Always waited for: nothing can be registered before it exists.
        let targets = self.wait_operation(&op_id, &target).await?;
        match targets.get(&OperationTargetType::Namespace) {
            Some(id) => Ok((id.clone(), false)),
            None => self
                .find_namespace()
                .await?
                .ok_or_else(|| Error::not_found(format!("{target}: created, but not listed"))),
        }
    }

    // ---- operations ----

    /// Poll `GetOperation` until `op_id` succeeded; its targets on success.
    pub(crate) async fn wait_operation(
        &self,
        op_id: &str,
        target: &str,
    ) -> Result<HashMap<OperationTargetType, String>> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.cfg.operation_poll_min)
            .with_max_delay(self.cfg.operation_poll_max)
            .with_factor(2.0)
            .with_total_delay(Some(self.cfg.operation_timeout))
            .without_max_times();
        let poll = || async {
            self.throttle().await;
            self.counters
                .operation_polls
                .fetch_add(1, Ordering::Relaxed);
            let out = self
                .client
                .get_operation()
                .operation_id(op_id)
                .send()
                .await
                .map_err(|e| OpPoll::Done(error::from_sdk(e, self.call("GetOperation", target))))?;
            let op = out
                .operation()
                .ok_or_else(|| OpPoll::Done(error::missing("GetOperation", "Operation", target)))?;
            match op.status() {
                Some(OperationStatus::Success) => Ok(op.targets().cloned().unwrap_or_default()),
                Some(OperationStatus::Fail) => Err(OpPoll::Done(error::from_failed_operation(
                    op_id,
                    op.error_code(),
                    op.error_message(),
                    target,
                ))),
                other => Err(OpPoll::Pending(
                    other
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_else(|| "pending".into()),
                )),
            }
        };
        poll.retry(backoff)
            .when(|e| matches!(e, OpPoll::Pending(_)))
            .await
            .map_err(|e| match e {
                OpPoll::Done(e) => e,
                OpPoll::Pending(status) => {
                    error::operation_timeout(op_id, &status, target, self.cfg.operation_timeout)
                }
            })
    }

    pub(crate) async fn finish(&self, op_id: Option<&str>, op: &str, target: &str) -> Result<()> {
        let op_id = op_id.ok_or_else(|| error::missing(op, "OperationId", target))?;
        match self.cfg.write_mode {
            WriteMode::Wait => self.wait_operation(op_id, target).await.map(|_| ()),
            WriteMode::FireAndForget => {
                tracing::debug!(operation = %op_id, %target, "{op} submitted, not waiting");
                Ok(())
            }
        }
    }

    // ---- services ----

    /// Every service of the namespace we can map back to our names; also
    /// refreshes the name → id cache.
    pub(crate) async fn list_services(&self) -> Result<Vec<ServiceRef>> {
        let target = format!("namespace {}", self.cfg.namespace);
        let filter = ServiceFilter::builder()
            .name(ServiceFilterName::NamespaceId)
            .values(&self.namespace_id)
            .condition(FilterCondition::Eq)
            .build()
            .map_err(|e| Error::internal(format!("building the ListServices filter: {e}")))?;
        let mut token = None;
        let mut found = Vec::new();
        loop {
            self.throttle().await;
            let out = self
                .client
                .list_services()
                .filters(filter.clone())
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| error::from_sdk(e, self.call("ListServices", &target)))?;
            for s in out.services() {
                let (Some(id), Some(cm_name)) = (s.id(), s.name()) else {
                    continue;
                };
                match mapping::service_from_cloud_map(cm_name, s.description()) {
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
        *lock(&self.services) = found
            .iter()
            .map(|s| (s.name.clone(), s.id.clone()))
            .collect();
        Ok(found)
    }

    /// The services that really are in this namespace. `ListServices` may
    /// ignore its namespace filter (moto does) and its answer does not say
    /// the namespace, so each service id is checked once with `GetService`
    /// (a service never moves) and the answer remembered.
    pub(crate) async fn in_namespace(&self, services: Vec<ServiceRef>) -> Result<Vec<ServiceRef>> {
        let unknown: Vec<String> = {
            let known = lock(&self.service_namespaces);
            services
                .iter()
                .filter(|s| !known.contains_key(&s.id))
                .map(|s| s.id.clone())
                .collect()
        };
        let checked: Vec<(String, bool)> = stream::iter(unknown)
            .map(|id| async move {
                let target = format!("service id {id}");
                self.throttle().await;
                let res = self.client.get_service().id(&id).send().await;
                match res {
                    Ok(out) => {
                        let ns = out.service().and_then(|s| s.namespace_id());
                        Ok((id, ns == Some(self.namespace_id.as_str())))
                    }
                    Err(e) => match error::from_sdk(e, self.call("GetService", &target)) {
                        // Deleted since it was listed.
                        e if e.kind() == ErrorKind::NotFound => Ok((id, false)),
                        e => Err(e),
                    },
                }
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .try_collect()
            .await?;
        let mut known = lock(&self.service_namespaces);
        known.extend(checked);
        Ok(services
            .into_iter()
            .filter(|s| known.get(&s.id).copied().unwrap_or(false))
            .collect())
    }

    pub(crate) fn cached_service(&self, service: &str) -> Option<String> {
        lock(&self.services).get(service).cloned()
    }

    /// The Cloud Map id of `service`, created when `create` is set and it
    /// does not exist; `None` when it does not exist and `create` is not set.
    pub(crate) async fn service_id(&self, service: &str, create: bool) -> Result<Option<String>> {
        if let Some(id) = self.cached_service(service) {
            return Ok(Some(id));
        }
        let _guard = self.lock_key(format!("service\0{service}")).await;
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
        let cm_name = mapping::service_name(service);
        let target = format!("service {service}");
        self.throttle().await;
        let mut req = self
            .client
            .create_service()
            .name(&cm_name)
            .namespace_id(&self.namespace_id)
            .creator_request_id(request_id("svc"));
        if cm_name != service {
            req = req.description(service);
        }
        if self.dns_namespace {
            req = req.r#type(ServiceTypeOption::Http);
        }
        if self.cfg.custom_health {
            req = req.health_check_custom_config(HealthCheckCustomConfig::builder().build());
        }
        let id = match req.send().await {
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
                _ => return Err(error::from_sdk(e, self.call("CreateService", &target))),
            },
        };
        tracing::debug!(%service, cloud_map_name = %cm_name, service_id = %id, "Cloud Map service ready");
        lock(&self.service_namespaces).insert(id.clone(), true);
        lock(&self.services).insert(service.to_string(), id.clone());
        Ok(Some(id))
    }

    pub(crate) fn forget_service(&self, service: &str) {
        lock(&self.services).remove(service);
    }

    /// [`Registry::probe`]: one `GetNamespace` of the namespace this
    /// registry resolved at connect. Cloud Map has no write that leaves
    /// nothing behind (every write is an operation with a history, and
    /// may create a service), so the probe only reads: it proves that Cloud
    /// Map answers, that the credentials are accepted and may read the
    /// namespace, and that the namespace still exists (`NotFound` when it
    /// was deleted). Costs one API request under the client's rate limit.
    pub(crate) async fn probe(&self) -> Result<()> {
        let target = format!("namespace {} ({})", self.cfg.namespace, self.namespace_id);
        self.throttle().await;
        let out = self
            .client
            .get_namespace()
            .id(&self.namespace_id)
            .send()
            .await
            .map_err(|e| error::from_sdk(e, self.call("GetNamespace", &target)))?;
        match out.namespace() {
            Some(_) => Ok(()),
            None => Err(error::missing("GetNamespace", "Namespace", &target)),
        }
    }
}
