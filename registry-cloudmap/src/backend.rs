//! [`CloudMapRegistry`]: the backend over `aws-sdk-servicediscovery`; its
//! public face and trait implementations.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_servicediscovery::config::{BehaviorVersion, Region};
use aws_sdk_servicediscovery::Client;
use futures::stream::{self, StreamExt};
use registry_api::{
    backend::check_batch, Batch, Capabilities, Endpoint, EndpointKey, Op, Registry, Result,
    Snapshot,
};

use crate::config::CloudMapConfig;
use crate::core::{CloudMapStats, Inner, Prepared, MAX_BATCH};
use crate::mapping;

/// A [`Registry`] and [`Batch`] over one AWS Cloud Map namespace.
///
/// Cheap to clone (the clones share the client, caches and rate limit).
/// For a [`registry_api::Watch`], wrap it in [`registry_api::polling::Polling`]: its
/// `snapshot()` skips services whose `DiscoverInstancesRevision` did not
/// change, and reads everything every
/// [`full_poll_every`](CloudMapConfig::full_poll_every)-th time. See the
/// crate documentation for the mapping.
#[derive(Clone)]
pub struct CloudMapRegistry {
    inner: Arc<Inner>,
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
        Ok(Self {
            inner: Arc::new(Inner::open(sdk, cfg).await?),
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
        self.inner.stats()
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
            .with_atomic_writes(false)
            .with_max_batch(MAX_BATCH)
            .with_max_labels(mapping::MAX_LABELS)
            .with_max_encoded_len(mapping::MAX_ENCODED_LEN)
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
        check_batch(&ops, MAX_BATCH)?;
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

/// CloudMapRegistry has neither a watch (it is polled) nor heartbeats of its own: [`registry_api::stack::stack`] wraps it as its capabilities call
/// for.
impl registry_api::stack::IntoStack for CloudMapRegistry {
    fn into_stack(
        self,
        cfg: &registry_api::stack::StackConfig,
    ) -> registry_api::Result<std::sync::Arc<dyn registry_api::stack::Stack>> {
        registry_api::stack::registry_only(self, cfg)
    }
}
