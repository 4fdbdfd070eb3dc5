//! [`balanced_channel`]: a `tonic` channel balanced over a service's healthy
//! endpoints, kept current by a watch (feature `tonic`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint as TonicEndpoint};

use crate::discover::discover;
use crate::error::Result;
use crate::model::{Endpoint, EndpointKey};
use crate::traits::Watch;

type KeepFn = Arc<dyn Fn(&Endpoint) -> bool + Send + Sync>;

/// Settings of [`balanced_channel`].
#[non_exhaustive]
#[derive(Clone, Default)]
pub struct ChannelConfig {
    /// TLS for every connection (`https://`); `None`: plaintext `http://`.
    pub tls: Option<ClientTlsConfig>,
    /// Only endpoints for which this is true (on top of the service name
    /// and health), e.g. a zone label.
    pub filter: Option<KeepFn>,
    /// Timeout of connecting to one endpoint. Default: tonic's (none).
    pub connect_timeout: Option<Duration>,
    /// Timeout of one call. Default: none.
    pub timeout: Option<Duration>,
}

impl fmt::Debug for ChannelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelConfig")
            .field("tls", &self.tls.is_some())
            .field("filter", &self.filter.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ChannelConfig {
    /// Connect with TLS.
    pub fn with_tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
    /// Keep only endpoints for which `keep` is true.
    pub fn with_filter(mut self, keep: impl Fn(&Endpoint) -> bool + Send + Sync + 'static) -> Self {
        self.filter = Some(Arc::new(keep));
        self
    }
    /// Set the connect timeout.
    pub fn with_connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = Some(d);
        self
    }
    /// Set the timeout of one call.
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
}

/// A `tonic` [`Channel`] balanced (power of two choices, by pending
/// requests) over the healthy endpoints of `service`, kept current by
/// `watch`: a new endpoint gets requests once connected, one removed or
/// marked unhealthy gets none after the change is delivered. Built on
/// tonic's `Channel::balance_channel`, fed by the same diffing as
/// [`crate::discover::discover`] (snapshots after a resync change only
/// what changed). The feeding task ends when the channel and all its
/// clones are dropped. Must be called inside a Tokio runtime.
///
/// An endpoint whose address cannot form a URI is left out and logged.
///
/// ```no_run
/// # async fn demo(reg: std::sync::Arc<waypost::memory::MemoryRegistry>) -> waypost::Result<()> {
/// use waypost::channel::{balanced_channel, ChannelConfig};
/// let channel = balanced_channel(reg, "greeter", ChannelConfig::default())?;
/// // let mut client = GreeterClient::new(channel);
/// # Ok(()) }
/// ```
pub fn balanced_channel<W: Watch>(watch: W, service: &str, cfg: ChannelConfig) -> Result<Channel> {
    let (channel, tx) = Channel::balance_channel::<EndpointKey>(1024);
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let config = cfg.clone();
    let make = move |ep: &Endpoint| tonic_endpoint(ep, scheme, &config);
    let mut changes = discover(watch, make).service(service);
    if let Some(keep) = cfg.filter.clone() {
        changes = changes.filter(move |ep| keep(ep));
    }
    let service = service.to_string();
    tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            // `discover` never yields an error; it watches again.
            let Ok(change) = change else { continue };
            let change = match change {
                tower::discover::Change::Insert(key, Some(ep)) => Change::Insert(key, ep),
                tower::discover::Change::Insert(key, None) => {
                    tracing::warn!(%key, "an endpoint without a usable address is left out");
                    continue;
                }
                tower::discover::Change::Remove(key) => Change::Remove(key),
            };
            if tx.send(change).await.is_err() {
                tracing::debug!(%service, "the balanced channel is gone; stop feeding it");
                return;
            }
        }
    });
    Ok(channel)
}

fn tonic_endpoint(ep: &Endpoint, scheme: &str, cfg: &ChannelConfig) -> Option<TonicEndpoint> {
    let host = if ep.address.contains(':') {
        format!("[{}]", ep.address)
    } else {
        ep.address.clone()
    };
    let mut e = TonicEndpoint::from_shared(format!("{scheme}://{host}:{}", ep.port)).ok()?;
    if let Some(tls) = &cfg.tls {
        e = e.tls_config(tls.clone()).ok()?;
    }
    if let Some(d) = cfg.connect_timeout {
        e = e.connect_timeout(d);
    }
    if let Some(d) = cfg.timeout {
        e = e.timeout(d);
    }
    Some(e.tcp_nodelay(true))
}
