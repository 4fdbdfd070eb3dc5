//! [`RegistrarConfig`]: the registrar's settings, checked before anything
//! starts.

use std::time::Duration;

use waypost::{
    backend::{check_count, check_duration},
    Error, Result,
};
pub use waypost_registrar_client::Ack;

/// Settings of the registrar. By default writes are flushed to the backend
/// every 100 ms or as soon as 50 are queued. (How often a backend without
/// a native watch is polled, 5 s by default, is
/// the `sync_interval` of [`crate::stack_config`].)
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct RegistrarConfig {
    /// This registrar's cluster (logged, and the default of the agents'
    /// `--cluster-name`; endpoints carry their own `cluster`).
    pub cluster_name: String,
    /// Flush the write queue at least this often. Default 100 ms; 1 ms to
    /// 1 h.
    pub write_batch_interval: Duration,
    /// Flush as soon as this many writes are queued. Default 50.
    pub write_batch_ops: usize,
    /// Most writes queued; one more gets `RESOURCE_EXHAUSTED`. Default
    /// 10 000; 1 to 10 000 000.
    pub write_queue_capacity: usize,
    /// Events buffered per agent stream before it is cut off with
    /// `RESOURCE_EXHAUSTED` (the agent resumes from its last version).
    /// Default 1024.
    pub agent_buffer: usize,
    /// Versions kept so a reconnecting agent gets only what it missed.
    /// Default 8192.
    pub history: usize,
    /// Most endpoints per snapshot message (a `FULL_SNAPSHOT` message of
    /// `WatchEndpoints`, a page of the HTTP watch and of the dashboard's
    /// feed). Default 1000; 1 to 1 000 000. `WatchEndpoints` messages are
    /// also bounded by [`snapshot_chunk_bytes`](Self::snapshot_chunk_bytes),
    /// whichever bound a message reaches first.
    pub snapshot_chunk: usize,
    /// Most encoded bytes per `FULL_SNAPSHOT` message of `WatchEndpoints`
    /// (the protobuf message, without gRPC's 5-byte prefix); a single
    /// endpoint larger than this is a message of its own. Default 16 KiB
    /// (16 384); 1 to 4 MiB (the message size gRPC clients accept by
    /// default). A stream takes its next message (encoded, or shared by a
    /// stream of the same version) only when its client's flow-control
    /// window takes it, so what a stream that stops reading holds of its
    /// snapshot beyond the window is about two messages: under 64 KiB at
    /// the default, whatever the size of the registry.
    pub snapshot_chunk_bytes: usize,
    /// When writes are acknowledged unless a request says otherwise.
    /// Default optimistic.
    pub ack: Ack,
    /// How often the backend is probed (reachable, writable); also the
    /// pace of retries while it refuses writes. Default 5 s; 10 ms to 1 h.
    pub probe_interval: Duration,
    /// Longest wait for one probe or one full re-read of the backend.
    /// Default 30 s; 10 ms to 1 h.
    pub probe_timeout: Duration,
    /// Longest drain of the write queue at shutdown; what is not written by
    /// then is logged by key and failed to durable callers. Default 20 s
    /// (below Kubernetes' 30 s grace period); 0 to 1 h.
    pub drain_timeout: Duration,
    /// How agent streams' messages are encoded. Default
    /// [`StreamEncoding::Shared`].
    pub stream_encoding: StreamEncoding,
}

/// How the messages of agent streams (`WatchEndpoints`) are encoded. The
/// messages on the wire are the same either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StreamEncoding {
    /// Each event, and each snapshot chunk of a version, is encoded to
    /// protobuf once and the same bytes go to every stream; the streams
    /// read the state's changes from one feed (one copy of each event for
    /// all of them). A stream resuming from an older version than the
    /// current one replays the history through a subscription of its own.
    #[default]
    Shared,
    /// Encoded once as with `Shared`, but every stream holds a
    /// subscription of its own to the state (each event copied into each
    /// stream's channel). Hidden: not for use, only a baseline that
    /// `registrar-load` measures `Shared` against.
    #[doc(hidden)]
    SharedPerSubscriber,
    /// Every stream encodes every message it sends. Hidden: not for use,
    /// only a baseline that `registrar-load` measures `Shared` against.
    #[doc(hidden)]
    PerStream,
}

impl StreamEncoding {
    /// Whether streams share encodings (all but `PerStream`).
    pub(crate) fn shares_encodings(self) -> bool {
        !matches!(self, Self::PerStream)
    }
}

impl RegistrarConfig {
    /// Defaults for cluster `cluster_name`.
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            write_batch_interval: Duration::from_millis(100),
            write_batch_ops: 50,
            write_queue_capacity: 10_000,
            agent_buffer: 1024,
            history: 8192,
            snapshot_chunk: 1000,
            snapshot_chunk_bytes: DEFAULT_SNAPSHOT_CHUNK_BYTES,
            ack: Ack::Optimistic,
            probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(20),
            stream_encoding: StreamEncoding::Shared,
        }
    }

    /// Set `write_batch_interval`.
    pub fn with_write_batch_interval(mut self, d: Duration) -> Self {
        self.write_batch_interval = d;
        self
    }

    /// Set `write_queue_capacity`.
    pub fn with_write_queue_capacity(mut self, n: usize) -> Self {
        self.write_queue_capacity = n;
        self
    }

    /// Set `history`.
    pub fn with_history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// Set `agent_buffer`.
    pub fn with_agent_buffer(mut self, n: usize) -> Self {
        self.agent_buffer = n;
        self
    }

    /// Set `stream_encoding`.
    pub fn with_stream_encoding(mut self, encoding: StreamEncoding) -> Self {
        self.stream_encoding = encoding;
        self
    }

    /// Set `snapshot_chunk`.
    pub fn with_snapshot_chunk(mut self, n: usize) -> Self {
        self.snapshot_chunk = n;
        self
    }

    /// Set `snapshot_chunk_bytes`.
    pub fn with_snapshot_chunk_bytes(mut self, n: usize) -> Self {
        self.snapshot_chunk_bytes = n;
        self
    }

    /// Set `ack`.
    pub fn with_ack(mut self, ack: Ack) -> Self {
        self.ack = ack;
        self
    }

    /// Set `probe_interval`.
    pub fn with_probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = d;
        self
    }

    /// Set `drain_timeout`.
    pub fn with_drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// Check every setting against its documented range; the error names
    /// the setting.
    pub fn validate(&self) -> Result<()> {
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        waypost::backend::check_name("cluster_name", &self.cluster_name, false)?;
        check_duration(
            "write_batch_interval",
            self.write_batch_interval,
            ms(1),
            hour,
        )?;
        check_count("write_batch_ops", self.write_batch_ops, 1, 10_000_000)?;
        check_count(
            "write_queue_capacity",
            self.write_queue_capacity,
            1,
            10_000_000,
        )?;
        check_count("agent_buffer", self.agent_buffer, 1, 10_000_000)?;
        check_count("history", self.history, 1, 10_000_000)?;
        check_count("snapshot_chunk", self.snapshot_chunk, 1, 1_000_000)?;
        check_count(
            "snapshot_chunk_bytes",
            self.snapshot_chunk_bytes,
            1,
            4 * 1024 * 1024,
        )?;
        check_duration("probe_interval", self.probe_interval, ms(10), hour)?;
        check_duration("probe_timeout", self.probe_timeout, ms(10), hour)?;
        check_duration("drain_timeout", self.drain_timeout, Duration::ZERO, hour)
    }
}

/// The default of [`RegistrarConfig::snapshot_chunk_bytes`]: 16 KiB, one
/// HTTP/2 frame at the protocol's default frame size.
pub const DEFAULT_SNAPSHOT_CHUNK_BYTES: usize = 16 * 1024;

/// The metadata key that picks the acknowledgement of one write.
pub const ACK_METADATA: &str = "x-registrar-ack";

/// `text` as an acknowledgement mode, or an error naming `field` that
/// quotes the first 64 characters of the value.
pub(crate) fn parse_ack(field: &str, text: &str) -> Result<Ack, Error> {
    text.parse::<Ack>().map_err(|_| {
        let shown: String = text.chars().take(64).collect();
        Error::invalid(
            field,
            format!(
                "{shown:?} ({} bytes) is not optimistic or durable",
                text.len()
            ),
        )
    })
}

/// The largest request message the registrar decodes by default: 64 KiB,
/// four times the largest valid endpoint
/// ([`waypost::limits::MAX_ENCODED_LEN`]). Larger requests are
/// refused (`OUT_OF_RANGE`) before they are read whole.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024;
