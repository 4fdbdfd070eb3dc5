//! [`CloudMapConfig`]: which namespace, how to read, how to write.

use std::num::NonZeroU32;
use std::time::Duration;

use waypost::liveness::LivenessConfig;

/// How `list` (and each service of a `snapshot`) reads instances.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// `DiscoverInstances` (the data-plane call; one request per service,
    /// at most 1000 instances, which is also Cloud Map's per-service quota).
    /// Its answer carries the service's instances revision, so revision
    /// skipping costs no extra call after a change. The default.
    #[default]
    Discover,
    /// `ListInstances` (the control-plane call, paginated).
    List,
}

/// What a write waits for.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Poll `GetOperation` until the operation succeeded (or failed, which
    /// is returned as an error). The default.
    #[default]
    Wait,
    /// Return as soon as Cloud Map accepted the request; the change shows up
    /// in reads once Cloud Map has applied it, and a failure of the
    /// operation is only logged by Cloud Map, not returned.
    FireAndForget,
}

/// The kind of namespace created when it is missing. An existing namespace
/// of any kind can be used: in a DNS namespace the services are created as
/// API-only (`Type: HTTP`, no DNS records).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NamespaceKind {
    /// An HTTP namespace: instances are found with `DiscoverInstances`
    /// only. The default.
    #[default]
    Http,
}

/// Settings of [`crate::CloudMapRegistry`].
///
/// ```
/// use std::time::Duration;
/// use waypost_cloudmap::{CloudMapConfig, ReadMode, WriteMode};
/// let cfg = CloudMapConfig::new("payments-prod")
///     .with_endpoint_url("http://127.0.0.1:5000")
///     .with_read_mode(ReadMode::List)
///     .with_write_mode(WriteMode::FireAndForget)
///     .with_full_poll_every(5);
/// assert_eq!(cfg.namespace, "payments-prod");
/// assert_eq!(cfg.operation_timeout, Duration::from_secs(60));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct CloudMapConfig {
    /// The namespace that holds this registry (one namespace per registry).
    pub namespace: String,
    /// Create the namespace when it does not exist (default true). When
    /// false, a missing namespace is [`waypost::Error::NotFound`].
    pub create_namespace: bool,
    /// The kind of namespace to create (default HTTP).
    pub namespace_kind: NamespaceKind,
    /// Endpoint URL of the Cloud Map API, for emulators and VPC endpoints;
    /// `None` (the default) uses the region's AWS endpoint. When set, the
    /// `data-` host prefix that AWS SDKs put in front of the data-plane
    /// calls (`DiscoverInstances`, `DiscoverInstancesRevision`) is removed,
    /// so both kinds of call go to this URL.
    pub endpoint_url: Option<String>,
    /// AWS region; `None` (the default) takes it from the environment.
    pub region: Option<String>,
    /// How `list` reads (default [`ReadMode::Discover`]).
    pub read_mode: ReadMode,
    /// What writes wait for (default [`WriteMode::Wait`]).
    pub write_mode: WriteMode,
    /// Longest wait for one Cloud Map operation in [`WriteMode::Wait`]
    /// (default 60 s); past it the write fails with `Unavailable`.
    pub operation_timeout: Duration,
    /// First pause between two `GetOperation` calls (default 50 ms); the
    /// pause doubles up to `operation_poll_max`.
    pub operation_poll_min: Duration,
    /// Longest pause between two `GetOperation` calls (default 1 s).
    pub operation_poll_max: Duration,
    /// Skip services whose `DiscoverInstancesRevision` did not change since
    /// the last snapshot (default true).
    pub revision_skip: bool,
    /// Every this many snapshots, read every service fully even when its
    /// revision did not change, because Cloud Map health-status changes do
    /// not bump the revision (default 10; 1 means always fully).
    pub full_poll_every: u32,
    /// Most requests in flight at once in a batch or a snapshot (default 8).
    pub concurrency: usize,
    /// Client-side limit on this registry's requests per second, all calls
    /// together (default 50). Cloud Map documents 1,000 `DiscoverInstances`
    /// per second steady (2,000 burst) and 3,000 `DiscoverInstancesRevision`
    /// per second for a whole account and region; the control-plane calls
    /// have no published rate, so the default stays far below all of them.
    pub requests_per_second: NonZeroU32,
    /// Requests allowed in one burst above the steady rate (default 20).
    pub burst: NonZeroU32,
    /// How many registries poll this namespace in all (every replica of
    /// every cluster; default 1). Only for the request budget: a snapshot
    /// warns when services × `replicas` ÷ the time between snapshots goes
    /// over Cloud Map's account rate for `DiscoverInstancesRevision`
    /// (3,000 per second), see "Request budget" in the crate docs.
    pub replicas: NonZeroU32,
    /// After a deregistration succeeded, repeat `DeregisterInstance` until
    /// Cloud Map answers `InstanceNotFound` (only in [`WriteMode::Wait`];
    /// default false). Needed with the `moto` emulator, which keeps one copy
    /// of an instance per `RegisterInstance` instead of replacing it and
    /// removes one copy per `DeregisterInstance`; on AWS it costs one extra
    /// request per deregistration.
    pub repeat_deregister: bool,
    /// Create services with a custom health check config and, after each
    /// registration in [`WriteMode::Wait`], set the instance's Cloud Map
    /// health status (`UpdateInstanceCustomHealthStatus`) from the
    /// endpoint's health, so consumers asking `DiscoverInstances` for
    /// `HEALTHY` instances skip unhealthy endpoints (default false).
    /// Services created without it (by others, or before) keep working;
    /// their health is then only the `registry.health` attribute.
    pub custom_health: bool,
    /// Liveness, kept in the namespace (one record per node in reserved
    /// services, shared by every process using the namespace; see
    /// "Liveness" in the crate docs): a node silent for `suspect_after`
    /// (30 s) has its endpoints marked unhealthy, for `remove_after`
    /// (5 min) removed; each registry sweeps every `sweep_interval` (10 s).
    /// Every registry on one namespace should use the same settings.
    /// Default [`LivenessConfig::default`].
    pub liveness: LivenessConfig,
    /// Static credentials, for emulators and tests (their `Debug` never
    /// shows the secret). Default `None`: the usual AWS credential chain
    /// (environment, profile, web identity, ECS, IMDS).
    pub credentials: Option<aws_sdk_servicediscovery::config::Credentials>,
}

impl CloudMapConfig {
    /// Defaults for the namespace `namespace`.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            create_namespace: true,
            namespace_kind: NamespaceKind::Http,
            endpoint_url: None,
            region: None,
            read_mode: ReadMode::Discover,
            write_mode: WriteMode::Wait,
            operation_timeout: Duration::from_secs(60),
            operation_poll_min: Duration::from_millis(50),
            operation_poll_max: Duration::from_secs(1),
            revision_skip: true,
            full_poll_every: 10,
            concurrency: 8,
            requests_per_second: NonZeroU32::new(50).unwrap_or(NonZeroU32::MIN),
            burst: NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN),
            replicas: NonZeroU32::MIN,
            repeat_deregister: false,
            custom_health: false,
            liveness: LivenessConfig::default(),
            credentials: None,
        }
    }

    /// Use static credentials instead of the AWS chain (emulators, tests).
    pub fn with_static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some(aws_sdk_servicediscovery::config::Credentials::new(
            access_key_id,
            secret_access_key,
            None,
            None,
            "static",
        ));
        self
    }

    /// Set `create_namespace`.
    pub fn with_create_namespace(mut self, v: bool) -> Self {
        self.create_namespace = v;
        self
    }
    /// Set `namespace_kind`.
    pub fn with_namespace_kind(mut self, v: NamespaceKind) -> Self {
        self.namespace_kind = v;
        self
    }
    /// Set `endpoint_url`.
    pub fn with_endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self
    }
    /// Set `region`.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }
    /// Set `read_mode`.
    pub fn with_read_mode(mut self, v: ReadMode) -> Self {
        self.read_mode = v;
        self
    }
    /// Set `write_mode`.
    pub fn with_write_mode(mut self, v: WriteMode) -> Self {
        self.write_mode = v;
        self
    }
    /// Set `operation_timeout`.
    pub fn with_operation_timeout(mut self, v: Duration) -> Self {
        self.operation_timeout = v;
        self
    }
    /// Set the pauses between two `GetOperation` calls.
    pub fn with_operation_poll(mut self, min: Duration, max: Duration) -> Self {
        self.operation_poll_min = min;
        self.operation_poll_max = max.max(min);
        self
    }
    /// Set `revision_skip`.
    pub fn with_revision_skip(mut self, v: bool) -> Self {
        self.revision_skip = v;
        self
    }
    /// Set `full_poll_every` (at least 1).
    pub fn with_full_poll_every(mut self, k: u32) -> Self {
        self.full_poll_every = k.max(1);
        self
    }
    /// Set `concurrency` (at least 1).
    pub fn with_concurrency(mut self, v: usize) -> Self {
        self.concurrency = v.max(1);
        self
    }
    /// Set `repeat_deregister`.
    pub fn with_repeat_deregister(mut self, v: bool) -> Self {
        self.repeat_deregister = v;
        self
    }
    /// Set `custom_health`.
    pub fn with_custom_health(mut self, v: bool) -> Self {
        self.custom_health = v;
        self
    }
    /// Set `liveness`.
    pub fn with_liveness(mut self, liveness: LivenessConfig) -> Self {
        self.liveness = liveness;
        self
    }
    /// Set `replicas`: how many registries poll this namespace in all.
    pub fn with_replicas(mut self, replicas: NonZeroU32) -> Self {
        self.replicas = replicas;
        self
    }
    /// Set the client-side rate limit: `per_second` steady, `burst` at once.
    pub fn with_rate_limit(mut self, per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        self.requests_per_second = per_second;
        self.burst = burst;
        self
    }
}
