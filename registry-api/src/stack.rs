//! [`stack`]: a backend wrapped in the combinators its capabilities call
//! for, so that everything above it (a cache, a write queue, a server) sees
//! a registry that watches natively and tracks liveness.
//!
//! - No native watch ([`Capabilities::native_watch`] false): wrapped in
//!   [`Polling`], which turns `snapshot()` into a watch.
//! - No native liveness ([`Capabilities::native_liveness`] false): wrapped
//!   in [`Liveness`], the generic heartbeat sweeper, outside `Polling` so
//!   it sees every registration.
//!
//! Each backend says which traits it implements itself by implementing
//! [`IntoStack`] with one of [`by_capabilities`], [`with_liveness`] or
//! [`polled_with_liveness`]; what is wrapped is then decided from its
//! capabilities at run time (a DynamoDB table without a stream is polled).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use waypost::memory::MemoryRegistry;
//! use waypost::stack::{stack, StackConfig};
//! let reg = stack(MemoryRegistry::new(), &StackConfig::default())?;
//! // Memory watches natively but has no liveness of its own.
//! assert_eq!(reg.to_string(), "Liveness(Memory)");
//! # Ok::<(), waypost::Error>(()) });
//! ```

use std::sync::Arc;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::liveness::{Liveness, LivenessConfig};
use crate::polling::{Polling, PollingConfig};
use crate::traits::{Batch, Heartbeat, Registry, Watch};

/// A registry with everything the combinators and servers above it expect:
/// batches, a watch and heartbeats.
pub trait Stack: Batch + Watch + Heartbeat {}
impl<T: Batch + Watch + Heartbeat + ?Sized> Stack for T {}

/// Settings of the combinators [`stack`] may add.
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct StackConfig {
    /// For [`Polling`], when the backend does not watch natively.
    pub polling: PollingConfig,
    /// For [`Liveness`], when the backend has no liveness of its own.
    pub liveness: LivenessConfig,
}

impl StackConfig {
    /// Set `polling`.
    pub fn with_polling(mut self, polling: PollingConfig) -> Self {
        self.polling = polling;
        self
    }
    /// Set `liveness`.
    pub fn with_liveness(mut self, liveness: LivenessConfig) -> Self {
        self.liveness = liveness;
        self
    }
}

/// How a backend becomes a [`Stack`]: implemented by each backend with one
/// of [`by_capabilities`], [`with_liveness`] or [`polled_with_liveness`], by the traits
/// it implements.
pub trait IntoStack: Sized {
    /// Wrap `self` as its capabilities call for.
    fn into_stack(self, cfg: &StackConfig) -> Result<Arc<dyn Stack>>;
}

/// Wrap `backend` in the combinators its capabilities call for; see the
/// module documentation.
pub fn stack<B: IntoStack>(backend: B, cfg: &StackConfig) -> Result<Arc<dyn Stack>> {
    backend.into_stack(cfg)
}

fn caps(b: &impl Registry) -> Capabilities {
    b.capabilities()
}

/// For a backend implementing all four traits: [`Polling`] when it does
/// not watch natively, [`Liveness`] when it has no liveness of its own.
pub fn by_capabilities<B: Batch + Watch + Heartbeat>(
    b: B,
    cfg: &StackConfig,
) -> Result<Arc<dyn Stack>> {
    let c = caps(&b);
    let liveness = cfg.liveness.clone();
    Ok(match (c.native_watch, c.native_liveness) {
        (true, true) => Arc::new(b),
        (true, false) => Arc::new(Liveness::with_config(b, liveness)?),
        (false, true) => Arc::new(Polling::with_config(b, cfg.polling.clone())?),
        (false, false) => Arc::new(Liveness::with_config(
            Polling::with_config(b, cfg.polling.clone())?,
            liveness,
        )?),
    })
}

/// For a backend without heartbeats of its own: always [`Liveness`], and
/// [`Polling`] when it does not watch natively.
pub fn with_liveness<B: Batch + Watch>(b: B, cfg: &StackConfig) -> Result<Arc<dyn Stack>> {
    let liveness = cfg.liveness.clone();
    if caps(&b).native_watch {
        Ok(Arc::new(Liveness::with_config(b, liveness)?))
    } else {
        let polled = Polling::with_config(b, cfg.polling.clone())?;
        Ok(Arc::new(Liveness::with_config(polled, liveness)?))
    }
}

/// For a backend with neither a watch nor heartbeats: [`Polling`] inside
/// [`Liveness`].
pub fn polled_with_liveness<B: Batch>(b: B, cfg: &StackConfig) -> Result<Arc<dyn Stack>> {
    let polled = Polling::with_config(b, cfg.polling.clone())?;
    Ok(Arc::new(Liveness::with_config(
        polled,
        cfg.liveness.clone(),
    )?))
}
