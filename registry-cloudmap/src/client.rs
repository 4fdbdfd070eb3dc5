//! [`Client`]: the connection to the Cloud Map namespace that holds one
//! registry, shared by every part of the registry and its clones: the SDK
//! client (with the interceptor custom endpoint URLs need), the namespace's
//! name and id, the client-side rate limit and request counts, every call
//! made through [`Client::call`] (throttled, counted, its errors mapped by
//! [`crate::error`]), the per-key write locks, and waiting for Cloud Map's
//! asynchronous operations. Finding or creating the namespace is in
//! [`crate::admin`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_servicediscovery::config::http::HttpResponse;
use aws_sdk_servicediscovery::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_servicediscovery::config::{ConfigBag, Intercept, Region, RuntimeComponents};
use aws_sdk_servicediscovery::error::{BoxError, ProvideErrorMetadata, SdkError};
use aws_sdk_servicediscovery::types::{OperationStatus, OperationTargetType};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use waypost::backend::backoff;
use waypost::Result;

use crate::config::{CloudMapConfig, WriteMode};
use crate::error::{self, Call};

/// Most instances one `DiscoverInstances` call returns (and Cloud Map's
/// quota of instances per service).
pub(crate) const DISCOVER_MAX: i32 = 1000;

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
    /// Reads of node liveness records (`DiscoverInstances` or
    /// `ListInstances` of a reserved service).
    pub record_reads: u64,
    /// Writes of node liveness records (`RegisterInstance` and
    /// `DeregisterInstance` of a reserved service).
    pub record_writes: u64,
}

/// The request counts behind [`CloudMapStats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) operation_polls: AtomicU64,
    pub(crate) revision_calls: AtomicU64,
    pub(crate) instance_reads: AtomicU64,
    pub(crate) skipped_services: AtomicU64,
    pub(crate) record_reads: AtomicU64,
    pub(crate) record_writes: AtomicU64,
}

/// The SDK client, namespace, rate limit and request counts shared by a
/// registry and its clones.
pub(crate) struct Client {
    pub(crate) sdk: aws_sdk_servicediscovery::Client,
    pub(crate) cfg: CloudMapConfig,
    pub(crate) namespace_id: String,
    /// An existing DNS namespace: services are created API-only (`HTTP`).
    pub(crate) dns_namespace: bool,
    /// Where the API is, for messages.
    pub(crate) endpoint: String,
    limiter: DefaultDirectRateLimiter,
    /// One async mutex per key being written (see [`KeyGuard`]).
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) counters: Counters,
}

/// Lock one of the registry's caches.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its state whole; a panic elsewhere
    // cannot leave it half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request id unique to this call (`CreatorRequestId`, at most 64
/// characters): an SDK retry of the same call reuses it, so Cloud Map does
/// the work once.
pub(crate) fn request_id(kind: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!("registry-{kind}-{:x}-{micros:x}-{n:x}", std::process::id())
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

/// Where a Cloud Map operation is.
enum OperationState {
    /// Succeeded, with its targets.
    Done(HashMap<OperationTargetType, String>),
    /// Not finished: its status.
    Pending(String),
}

impl Client {
    /// The namespace of `cfg` over `sdk` (with `cfg.endpoint_url` and
    /// `cfg.region` applied), found or created.
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
        let mut ns = Client {
            sdk: aws_sdk_servicediscovery::Client::from_conf(sdk),
            cfg,
            namespace_id: String::new(),
            dns_namespace: false,
            endpoint,
            limiter: RateLimiter::direct(quota),
            key_locks: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        };
        (ns.namespace_id, ns.dns_namespace) = ns.resolve_namespace().await?;
        tracing::info!(
            namespace = %ns.cfg.namespace,
            namespace_id = %ns.namespace_id,
            endpoint = %ns.endpoint,
            "Cloud Map registry ready"
        );
        Ok(ns)
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
            record_reads: c.record_reads.load(Ordering::Relaxed),
            record_writes: c.record_writes.load(Ordering::Relaxed),
        }
    }

    /// What a call is about, for its errors.
    pub(crate) fn about<'a>(&'a self, op: &'a str, target: &'a str) -> Call<'a> {
        Call {
            op,
            target,
            endpoint: &self.endpoint,
        }
    }

    /// One SDK request, `f` (which sends it), made once the client-side
    /// rate limit allows and counted; its error as the SDK gives it, for
    /// the callers that tell service errors apart.
    pub(crate) async fn send<'a, T, E, Fut>(
        &'a self,
        f: impl FnOnce(&'a aws_sdk_servicediscovery::Client) -> Fut,
    ) -> std::result::Result<T, SdkError<E, HttpResponse>>
    where
        Fut: Future<Output = std::result::Result<T, SdkError<E, HttpResponse>>>,
    {
        self.limiter.until_ready().await;
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        f(&self.sdk).await
    }

    /// [`Client::send`], its error mapped ([`error::from_sdk`]) as a
    /// failure of `op` about `target`.
    pub(crate) async fn call<'a, T, E, Fut>(
        &'a self,
        op: &str,
        target: &str,
        f: impl FnOnce(&'a aws_sdk_servicediscovery::Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        self.send(f)
            .await
            .map_err(|e| error::from_sdk(e, self.about(op, target)))
    }

    /// Wait until no other write holds `key`, and hold it.
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

    /// Poll `GetOperation` until `op_id` succeeded, pausing from
    /// `operation_poll_min` to `operation_poll_max` ([`backoff`]); its
    /// targets on success, the failure as an error, `Unavailable` when it
    /// is still pending after `operation_timeout`.
    pub(crate) async fn wait_operation(
        &self,
        op_id: &str,
        target: &str,
    ) -> Result<HashMap<OperationTargetType, String>> {
        let (min, max) = (self.cfg.operation_poll_min, self.cfg.operation_poll_max);
        let deadline = tokio::time::Instant::now() + self.cfg.operation_timeout;
        let mut delays = backoff(min, max);
        loop {
            let status = match self.operation_state(op_id, target).await? {
                OperationState::Done(targets) => return Ok(targets),
                OperationState::Pending(status) => status,
            };
            let delay = delays.next().unwrap_or(max);
            if tokio::time::Instant::now() + delay > deadline {
                let waited = self.cfg.operation_timeout;
                return Err(error::operation_timeout(op_id, &status, target, waited));
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// One `GetOperation`: done, pending, or its failure as an error.
    async fn operation_state(&self, op_id: &str, target: &str) -> Result<OperationState> {
        self.counters
            .operation_polls
            .fetch_add(1, Ordering::Relaxed);
        let out = self
            .call("GetOperation", target, |c| {
                c.get_operation().operation_id(op_id).send()
            })
            .await?;
        let op = out
            .operation()
            .ok_or_else(|| error::missing("GetOperation", "Operation", target))?;
        match op.status() {
            Some(OperationStatus::Success) => Ok(OperationState::Done(
                op.targets().cloned().unwrap_or_default(),
            )),
            Some(OperationStatus::Fail) => Err(error::from_failed_operation(
                op_id,
                op.error_code(),
                op.error_message(),
                target,
            )),
            other => Ok(OperationState::Pending(
                other.map_or_else(|| "pending".to_string(), |s| s.as_str().to_string()),
            )),
        }
    }

    /// After a write was accepted as operation `op_id`: wait for it in
    /// [`WriteMode::Wait`], return at once in
    /// [`WriteMode::FireAndForget`].
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
