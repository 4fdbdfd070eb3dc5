//! [`ClientConfig`], [`Ack`] and the direct-backend [`Fallback`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use waypost::{
    backend::{check_count, check_duration},
    Error, Heartbeat, Registry, Result,
};

use crate::tls::TlsFiles;

/// When a write is acknowledged: the registrar's `--ack` and the
/// per-request `ack` field / `x-registrar-ack` metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ack {
    /// As soon as the registrar validated, queued and broadcast it. A write
    /// the backend later refuses is undone, and the undo reaches agents on
    /// their stream with the refusal. Writes queued in a registrar that is
    /// killed before they reach the backend are lost (measured window in
    /// `docs/registrar/acknowledgement.md`); `RegistrarClient` re-asserts
    /// what it owns.
    #[default]
    Optimistic,
    /// Once the backend committed it; a refusal is the call's error.
    Durable,
}

impl Ack {
    /// `optimistic` or `durable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ack::Optimistic => "optimistic",
            Ack::Durable => "durable",
        }
    }
}

impl fmt::Display for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Ack {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "optimistic" => Ok(Ack::Optimistic),
            "durable" => Ok(Ack::Durable),
            other => Err(Error::invalid(
                "ack",
                format!(
                    "{:?} ({} bytes) is not an acknowledgement mode: optimistic or durable",
                    other.chars().take(64).collect::<String>(),
                    other.len()
                ),
            )),
        }
    }
}

/// A backend the agent writes to directly while no registrar answers.
pub trait Direct: Registry + Heartbeat {}
impl<T: Registry + Heartbeat> Direct for T {}

/// Writing to the backend directly while no registrar answers: when no
/// registrar replica has answered for `after`, [`crate::RegistrarClient`]
/// sends its writes and heartbeats to `backend` directly (reads go on from
/// its cache), and switches back — re-asserting its endpoints through the
/// registrar — when one answers again. It costs one backend connection per
/// agent while it lasts.
#[derive(Clone)]
pub struct Fallback {
    /// The backend the registrars write to.
    pub backend: Arc<dyn Direct>,
    /// How long no registrar must answer before the agent falls back.
    pub after: Duration,
}

impl fmt::Debug for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fallback")
            .field("backend", &self.backend.to_string())
            .field("after", &self.after)
            .finish()
    }
}

/// Settings of [`crate::RegistrarClient`].
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The registrar's address, e.g. `http://127.0.0.1:9443`.
    pub address: String,
    /// This agent's cluster, sent with every watch.
    pub cluster_name: String,
    /// This agent's node, sent with every watch.
    pub node_name: String,
    /// Timeout of one unary call. Default 10 s.
    pub request_timeout: Duration,
    /// Timeout of connecting. Default 5 s.
    pub connect_timeout: Duration,
    /// First and longest delay between stream reconnects (exponential with
    /// jitter). Default 200 ms and 30 s.
    pub reconnect: (Duration, Duration),
    /// Most writes kept for re-sending while the registrar is unreachable;
    /// one more answers [`Error::Overloaded`]. Default 10 000.
    pub max_pending: usize,
    /// How often queued writes are retried while the registrar is
    /// unreachable or refuses them. Default 1 s.
    pub retry_interval: Duration,
    /// Changes the local cache keeps so local watchers can resume. Default
    /// 4096.
    pub history: usize,
    /// mTLS: the registrar's CA bundle and this agent's certificate and
    /// key, re-read when the files change. `None` (the default): plaintext.
    pub tls: Option<TlsFiles>,
    /// When this client's writes are acknowledged. Default optimistic.
    pub ack: Ack,
    /// Direct writes while no registrar answers. Default none.
    pub fallback: Option<Fallback>,
}

impl ClientConfig {
    /// Settings for the registrar at `address`, as agent `node_name` of
    /// `cluster_name`.
    pub fn new(
        address: impl Into<String>,
        cluster_name: impl Into<String>,
        node_name: impl Into<String>,
    ) -> Self {
        Self {
            address: address.into(),
            cluster_name: cluster_name.into(),
            node_name: node_name.into(),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            reconnect: (Duration::from_millis(200), Duration::from_secs(30)),
            max_pending: 10_000,
            retry_interval: Duration::from_secs(1),
            history: 4096,
            tls: None,
            ack: Ack::Optimistic,
            fallback: None,
        }
    }

    /// Use mTLS with these files (`http://` or `https://` addresses alike
    /// are then reached over TLS).
    pub fn with_tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Set the timeouts of connecting and of one unary call.
    pub fn with_timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Set the reconnect delays.
    pub fn with_reconnect(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect = (min, max);
        self
    }

    /// Set `max_pending`.
    pub fn with_max_pending(mut self, n: usize) -> Self {
        self.max_pending = n;
        self
    }

    /// Set `history`.
    pub fn with_history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// Set `retry_interval`.
    pub fn with_retry_interval(mut self, d: Duration) -> Self {
        self.retry_interval = d;
        self
    }

    /// Set `ack`.
    pub fn with_ack(mut self, ack: Ack) -> Self {
        self.ack = ack;
        self
    }

    /// Fall back to `backend` when no registrar answered for `after`.
    pub fn with_fallback(mut self, backend: Arc<dyn Direct>, after: Duration) -> Self {
        self.fallback = Some(Fallback { backend, after });
        self
    }

    /// Check every setting; the error names it and its range.
    pub fn validate(&self) -> Result<()> {
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        check_duration("request_timeout", self.request_timeout, ms(1), hour)?;
        check_duration("connect_timeout", self.connect_timeout, ms(1), hour)?;
        check_duration("reconnect_min", self.reconnect.0, ms(1), hour)?;
        check_duration("reconnect_max", self.reconnect.1, self.reconnect.0, hour)?;
        check_count("max_pending", self.max_pending, 1, 10_000_000)?;
        check_duration("retry_interval", self.retry_interval, ms(1), hour)?;
        check_count("history", self.history, 1, 10_000_000)?;
        if let Some(f) = &self.fallback {
            check_duration("fallback_after", f.after, ms(1), hour)?;
        }
        Ok(())
    }
}
