//! [`CloudMapRegistry`]: the backend over `aws-sdk-servicediscovery`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_servicediscovery::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_servicediscovery::config::{
    BehaviorVersion, ConfigBag, Intercept, Region, RuntimeComponents,
};
use aws_sdk_servicediscovery::error::{BoxError, ProvideErrorMetadata};
use aws_sdk_servicediscovery::operation::create_http_namespace::CreateHttpNamespaceError;
use aws_sdk_servicediscovery::operation::create_service::CreateServiceError;
use aws_sdk_servicediscovery::operation::register_instance::RegisterInstanceError;
use aws_sdk_servicediscovery::types::{
    CustomHealthStatus, FilterCondition, HealthCheckCustomConfig, HealthStatus, HealthStatusFilter,
    NamespaceType, OperationStatus, OperationTargetType, ServiceFilter, ServiceFilterName,
    ServiceTypeOption,
};
use aws_sdk_servicediscovery::Client;
use backon::{ExponentialBuilder, Retryable};
use futures::stream::{self, StreamExt, TryStreamExt};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use registry_api::{
    validate_ops, Batch, Capabilities, Endpoint, EndpointKey, Error, ErrorKind, Health, Op,
    Registry, Result, Snapshot, Version,
};

use crate::config::{CloudMapConfig, NamespaceKind, ReadMode, WriteMode};
use crate::error::{self, Call};
use crate::mapping;

/// Most instances one `DiscoverInstances` call returns (and Cloud Map's
/// quota of instances per service).
const DISCOVER_MAX: i32 = 1000;
/// Largest batch [`Batch::apply`] takes.
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
struct Counters {
    requests: AtomicU64,
    operation_polls: AtomicU64,
    revision_calls: AtomicU64,
    instance_reads: AtomicU64,
    skipped_services: AtomicU64,
}

/// A [`Registry`] and [`Batch`] over one AWS Cloud Map namespace.
///
/// Cheap to clone (the clones share the client, caches and rate limit).
/// For a [`registry_api::Watch`], wrap it in [`registry_api::Polling`]: its
/// `snapshot()` skips services whose `DiscoverInstancesRevision` did not
/// change, and reads everything every
/// [`full_poll_every`](CloudMapConfig::full_poll_every)-th time. See the
/// crate documentation for the mapping.
#[derive(Clone)]
pub struct CloudMapRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    cfg: CloudMapConfig,
    namespace_id: String,
    /// An existing DNS namespace: services are created API-only (`HTTP`).
    dns_namespace: bool,
    /// Where the API is, for messages.
    endpoint: String,
    limiter: DefaultDirectRateLimiter,
    /// Our service name → Cloud Map service id.
    services: Mutex<HashMap<String, String>>,
    /// Cloud Map service id → whether it is in this namespace.
    service_namespaces: Mutex<HashMap<String, bool>>,
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    poll: Mutex<PollState>,
    cycle: AtomicU64,
    counters: Counters,
}

/// What the last snapshot saw: per Cloud Map service id its revision and
/// endpoints, and the snapshot itself with its version.
struct PollState {
    services: HashMap<String, (Option<i64>, Arc<Vec<Endpoint>>)>,
    last: Snapshot,
}

/// A service of the namespace: our name, Cloud Map id and Cloud Map name.
#[derive(Debug, Clone)]
struct ServiceRef {
    name: String,
    id: String,
    cm_name: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its state whole; a panic elsewhere
    // cannot leave it half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A request id unique to this call (`CreatorRequestId`, at most 64
/// characters): an SDK retry of the same call reuses it, so Cloud Map does
/// the work once.
fn request_id(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "registry-{kind}-{:x}-{:x}-{n:x}",
        std::process::id(),
        now_micros()
    )
}

/// Removes the `data-` host prefix that the SDK puts in front of the
/// data-plane calls when the endpoint is a custom URL (an emulator, a VPC
/// endpoint), where no `data-` host exists. The Rust SDK has no setting
/// for this (boto3's `inject_host_prefix=False`).
#[derive(Debug)]
struct StripDataPrefix {
    prefixed: String,
    plain: String,
}

impl StripDataPrefix {
    fn new(endpoint_url: &str) -> Option<Self> {
        let (scheme, rest) = endpoint_url.split_once("://")?;
        let authority = rest.split('/').next()?;
        Some(Self {
            prefixed: format!("{scheme}://data-{authority}"),
            plain: format!("{scheme}://{authority}"),
        })
    }
}

impl Intercept for StripDataPrefix {
    fn name(&self) -> &'static str {
        "StripDataPrefix"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> std::result::Result<(), BoxError> {
        let request = context.request_mut();
        if let Some(rest) = request.uri().strip_prefix(&self.prefixed) {
            let uri = format!("{}{rest}", self.plain);
            request.set_uri(uri)?;
        }
        Ok(())
    }
}

/// Per-key serialization: holds the key's async mutex; the map entry goes
/// when nobody else wants it.
struct KeyGuard<'a> {
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
enum Prepared {
    Put {
        ep: Endpoint,
        attrs: HashMap<String, String>,
    },
    Delete(EndpointKey),
}

impl CloudMapRegistry {
    /// Connect with credentials and region from the environment (the
    /// standard AWS chain), then find or create the namespace.
    pub async fn connect(cfg: CloudMapConfig) -> Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &cfg.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let shared = loader.load().await;
        Self::with_sdk_config(aws_sdk_servicediscovery::Config::from(&shared), cfg).await
    }

    /// Connect with a ready SDK configuration (credentials, retries,
    /// timeouts); `cfg.endpoint_url` and `cfg.region` override it when set.
    pub async fn with_sdk_config(
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
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The namespace's name.
    pub fn namespace(&self) -> &str {
        &self.inner.cfg.namespace
    }

    /// The namespace's Cloud Map id.
    pub fn namespace_id(&self) -> &str {
        &self.inner.namespace_id
    }

    /// The settings in use.
    pub fn config(&self) -> &CloudMapConfig {
        &self.inner.cfg
    }

    /// The SDK client, for calls this crate does not make.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Request counts so far.
    pub fn stats(&self) -> CloudMapStats {
        let c = &self.inner.counters;
        CloudMapStats {
            requests: c.requests.load(Ordering::Relaxed),
            operation_polls: c.operation_polls.load(Ordering::Relaxed),
            revision_calls: c.revision_calls.load(Ordering::Relaxed),
            instance_reads: c.instance_reads.load(Ordering::Relaxed),
            skipped_services: c.skipped_services.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    fn call<'a>(&'a self, op: &'a str, target: &'a str) -> Call<'a> {
        Call {
            op,
            target,
            endpoint: &self.endpoint,
        }
    }

    /// Wait for the client-side rate limit, then count the request.
    async fn throttle(&self) {
        self.limiter.until_ready().await;
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
    }

    async fn lock_key(&self, key: String) -> KeyGuard<'_> {
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
    async fn find_namespace(&self) -> Result<Option<(String, bool)>> {
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

    async fn resolve_namespace(&self) -> Result<(String, bool)> {
        if let Some(found) = self.find_namespace().await? {
            return Ok(found);
        }
        let target = format!("namespace {}", self.cfg.namespace);
        if !self.cfg.create_namespace {
            return Err(Error::NotFound {
                what: format!("{target} at {} (creating it is turned off)", self.endpoint),
            });
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
                    return self.find_namespace().await?.ok_or_else(|| Error::NotFound {
                        what: format!("{target}: reported as existing, but not listed"),
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
            None => self.find_namespace().await?.ok_or_else(|| Error::NotFound {
                what: format!("{target}: created, but not listed"),
            }),
        }
    }

    // ---- operations ----

    /// Poll `GetOperation` until `op_id` succeeded; its targets on success.
    async fn wait_operation(
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

    async fn finish(&self, op_id: Option<&str>, op: &str, target: &str) -> Result<()> {
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
    async fn list_services(&self) -> Result<Vec<ServiceRef>> {
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
    async fn in_namespace(&self, services: Vec<ServiceRef>) -> Result<Vec<ServiceRef>> {
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

    fn cached_service(&self, service: &str) -> Option<String> {
        lock(&self.services).get(service).cloned()
    }

    /// The Cloud Map id of `service`, created when `create` is set and it
    /// does not exist; `None` when it does not exist and `create` is not set.
    async fn service_id(&self, service: &str, create: bool) -> Result<Option<String>> {
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

    fn forget_service(&self, service: &str) {
        lock(&self.services).remove(service);
    }

    // ---- writes ----

    async fn put(&self, ep: &Endpoint, attrs: &HashMap<String, String>) -> Result<()> {
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
    async fn set_health(
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

    async fn delete(&self, key: &EndpointKey) -> Result<()> {
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
    async fn deregister_copies(
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

    // ---- reads ----

    fn decode_all<'a>(
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
    async fn discover(
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
    async fn list_instances(&self, service: &str, service_id: &str) -> Result<Vec<Endpoint>> {
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

    async fn revision(&self, service: &str, cm_name: &str) -> Result<Option<i64>> {
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
    async fn read_service(&self, s: &ServiceRef) -> Result<(Option<i64>, Vec<Endpoint>)> {
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
    async fn poll_service(
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

    async fn snapshot(&self) -> Result<Snapshot> {
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

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
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

    /// [`Registry::probe`]: one `GetNamespace` of the namespace this
    /// registry resolved at connect. Cloud Map has no write that leaves
    /// nothing behind (every write is an operation with a history, and
    /// may create a service), so the probe only reads: it proves that Cloud
    /// Map answers, that the credentials are accepted and may read the
    /// namespace, and that the namespace still exists (`NotFound` when it
    /// was deleted). Costs one API request under the client's rate limit.
    async fn probe(&self) -> Result<()> {
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

    async fn apply_one(&self, p: Prepared) -> Result<()> {
        match p {
            Prepared::Put { ep, attrs } => self.put(&ep, &attrs).await,
            Prepared::Delete(key) => self.delete(&key).await,
        }
    }
}

impl fmt::Display for CloudMapRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloudMap({})", self.inner.cfg.namespace)
    }
}

impl fmt::Debug for CloudMapRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudMapRegistry")
            .field("namespace", &self.inner.cfg.namespace)
            .field("namespace_id", &self.inner.namespace_id)
            .field("endpoint", &self.inner.endpoint)
            .field("read_mode", &self.inner.cfg.read_mode)
            .field("write_mode", &self.inner.cfg.write_mode)
            .finish()
    }
}

#[async_trait]
impl Registry for CloudMapRegistry {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        endpoint.validate()?;
        let attrs = mapping::encode(&endpoint)?;
        self.inner.put(&endpoint, &attrs).await
    }

    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.inner.delete(key).await
    }

    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.inner.list(service).await
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_native_watch(false)
            .with_resumable_watch(false)
            .with_atomic_batch(false)
            .with_max_batch(MAX_BATCH)
            .with_persistent(true)
            .with_max_labels(mapping::MAX_LABELS)
    }

    /// A read only (`GetNamespace`): Cloud Map has no write without a
    /// visible effect. `NotFound` when the namespace was deleted,
    /// `Unauthorized` when the credentials are refused, `Unavailable` when
    /// Cloud Map does not answer.
    async fn probe(&self) -> Result<()> {
        self.inner.probe().await
    }
}

#[async_trait]
impl Batch for CloudMapRegistry {
    /// Not atomic: the net op of each key (the last one) is applied, up to
    /// [`CloudMapConfig::concurrency`] at once under the rate limit. Every
    /// op is validated and encoded before anything is sent; when some
    /// writes fail, the others may have been applied and the first error
    /// is returned.
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        validate_ops(&ops)?;
        if ops.len() > MAX_BATCH {
            return Err(Error::invalid(
                "ops",
                format!("{} ops, more than max_batch {MAX_BATCH}", ops.len()),
            ));
        }
        let mut net: BTreeMap<EndpointKey, Prepared> = BTreeMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            let prepared = match op {
                Op::Register(ep) => {
                    let attrs =
                        mapping::encode(&ep).map_err(|e| e.in_field(&format!("ops[{i}].")))?;
                    Prepared::Put { ep, attrs }
                }
                Op::Deregister(key) => Prepared::Delete(key),
            };
            let key = match &prepared {
                Prepared::Put { ep, .. } => ep.key(),
                Prepared::Delete(k) => k.clone(),
            };
            net.insert(key, prepared);
        }
        let total = net.len();
        let results: Vec<Result<()>> = stream::iter(net.into_values())
            .map(|p| self.inner.apply_one(p))
            .buffer_unordered(self.inner.cfg.concurrency.max(1))
            .collect()
            .await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        if failed > 0 {
            tracing::warn!(registry = %self, failed, total, "batch partly failed");
        }
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}
