//! [`DynamoDbConfig`]: which table, where, with which credentials, and how
//! to read and watch it.

use std::fmt;
use std::time::Duration;

use waypost::liveness::LivenessConfig;

/// Static credentials, for emulators and tests. Real deployments leave
/// [`DynamoDbConfig::credentials`] empty and use the usual AWS chain
/// (environment, profile, web identity, ECS, IMDS).
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    /// The access key id (not secret; shown by `Debug`).
    pub access_key_id: String,
    /// The secret access key (never shown by `Debug`).
    pub secret_access_key: String,
    /// An optional session token (never shown by `Debug`).
    pub session_token: Option<String>,
}

impl StaticCredentials {
    /// Credentials from an access key id and its secret.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        }
    }
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Whether [`crate::DynamoDbRegistry`] follows the table's stream.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchMode {
    /// Follow the table's DynamoDB Stream when it has one that carries new
    /// images (`NEW_IMAGE` or `NEW_AND_OLD_IMAGES`); without one the
    /// registry does not watch (`native_watch: false`), and
    /// [`waypost::stack::stack`] polls it. The default.
    #[default]
    Auto,
    /// Never follow the stream, even when the table has one: the registry
    /// reports `native_watch: false`, and [`waypost::stack::stack`]
    /// polls it with [`waypost::polling::Polling`].
    Polling,
    /// Keep a change log in the table (see "Change log" in the crate docs):
    /// every write also appends its changes under the next version of a
    /// counter item, in the same `TransactWriteItems`, and `watch()` reads
    /// the log after the last version it applied every `poll_interval`
    /// (one `Query`), scanning the table only on the first sync or when
    /// the versions it needs are gone. For many readers (more than the two
    /// a stream shard serves). Every writer of the table must use it.
    ChangeLog,
}

/// Most heads a change log can have.
pub const CHANGELOG_MAX_HEADS: u32 = 64;

/// Settings of [`crate::DynamoDbRegistry`].
///
/// Every field has a default (see each field); `table` is the only one most
/// deployments set. `Debug` never prints secrets.
///
/// ```
/// use std::time::Duration;
/// use waypost_dynamodb::DynamoDbConfig;
/// let cfg = DynamoDbConfig::new("registry")
///     .with_region("eu-west-1")
///     .with_endpoint_url("http://127.0.0.1:8000")
///     .with_static_credentials("test", "not-shown")
///     .with_poll_interval(Duration::from_secs(1));
/// assert!(!format!("{cfg:?}").contains("not-shown"));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct DynamoDbConfig {
    /// The table holding the endpoints. Default `registry`.
    pub table: String,
    /// AWS region. Default: from the usual chain (`AWS_REGION`, profile,
    /// IMDS); `us-east-1` when none is found.
    pub region: Option<String>,
    /// Endpoint URL for DynamoDB and DynamoDB Streams (an emulator such as
    /// moto or DynamoDB Local). Default: the regional AWS endpoints.
    pub endpoint_url: Option<String>,
    /// Static credentials. Default `None`: the usual AWS credential chain.
    pub credentials: Option<StaticCredentials>,
    /// Strongly consistent `Query` and `Scan` reads (twice the read cost),
    /// so a read after an acknowledged write sees it. Default `true`.
    pub consistent_reads: bool,
    /// Parallel segments of a snapshot's `Scan`. Default 1; raise it for
    /// tables of many megabytes.
    pub scan_segments: u32,
    /// How changes are followed. Default [`WatchMode::Auto`].
    pub watch: WatchMode,
    /// How often the stream watch checks that the table and its stream are
    /// still the ones it reads (clamped to 1 s to 60 s), and the interval
    /// of the scans it makes while the table it follows has lost its
    /// stream. (Polling a table that never had a stream is
    /// [`waypost::polling::PollingConfig::interval`]'s.) Default 5 s.
    pub poll_interval: Duration,
    /// Pause between two `GetRecords` rounds over the stream's shards when
    /// the last round found nothing. Default 250 ms (DynamoDB Streams allows
    /// about 5 `GetRecords` calls per second and shard).
    pub stream_poll_interval: Duration,
    /// Changes kept in memory so that a watch can resume with
    /// `watch(Some(version))` instead of getting a fresh snapshot.
    /// Default 4096.
    pub watch_history: usize,
    /// Name of the numeric TTL attribute (epoch seconds). Items whose TTL
    /// lies in the past are skipped by every read, because DynamoDB deletes
    /// expired items lazily (up to days later). Default `expires_at`;
    /// `None` disables the filter.
    pub ttl_attribute: Option<String>,
    /// When set (and `ttl_attribute` is set), every write stores
    /// `now + item_ttl` in the TTL attribute, so an endpoint that is not
    /// re-registered in time disappears. Default `None`: no expiry.
    pub item_ttl: Option<Duration>,
    /// How long change log items are kept ([`WatchMode::ChangeLog`]): each
    /// stores `now + changelog_retention` in `ttl_attribute`, so DynamoDB
    /// deletes it after that (lazily). A reader away for longer falls back
    /// to one `Scan`. Default 1 h (see the crate docs for why not more).
    pub changelog_retention: Duration,
    /// How often a change log reader checks the table itself
    /// ([`WatchMode::ChangeLog`]): a scan, jittered by ±20 %, whose
    /// difference to what watchers hold is published. It is how changes
    /// that bypass the log reach log readers: another tool's writes, and
    /// endpoints expired by `item_ttl` (reads skip expired items at once;
    /// DynamoDB deletes them later). At least 1 s. Default 5 min.
    pub changelog_check_interval: Duration,
    /// Heads of the change log ([`WatchMode::ChangeLog`]), 1 to
    /// [`crate::CHANGELOG_MAX_HEADS`]: each key's changes go to one head,
    /// and writers race only for the heads their batches share, so tens of
    /// writers committing every 100 ms need several (see "Change log" in
    /// the crate docs). Readers send one `Query` per head and sync. Every
    /// writer and reader of a table must use the same number. Default 1.
    pub changelog_heads: u32,
    /// Time limit of one API call including retries. Default 10 s.
    pub operation_timeout: Duration,
    /// Attempts per API call (the SDK's standard retry with backoff on
    /// throttling and transient errors). Default 3.
    pub max_attempts: u32,
    /// Liveness, kept in the table (one record per node, shared by every
    /// process using the table; see "Liveness" in the crate docs): a node
    /// silent for `suspect_after` (30 s) has its endpoints marked
    /// unhealthy, for `remove_after` (5 min) removed; each process sweeps
    /// every `sweep_interval` (10 s). Default [`LivenessConfig::default`].
    pub liveness: LivenessConfig,
    /// Create the table at [`crate::DynamoDbRegistry::connect`] when it is
    /// missing (on-demand capacity, with a stream when `watch` is
    /// [`WatchMode::Auto`], the only mode that reads it). Default false: a
    /// missing table is `NotFound`.
    pub create_table: bool,
}

impl Default for DynamoDbConfig {
    fn default() -> Self {
        Self {
            table: "registry".into(),
            region: None,
            endpoint_url: None,
            credentials: None,
            consistent_reads: true,
            scan_segments: 1,
            watch: WatchMode::Auto,
            poll_interval: Duration::from_secs(5),
            stream_poll_interval: Duration::from_millis(250),
            watch_history: 4096,
            ttl_attribute: Some("expires_at".into()),
            item_ttl: None,
            changelog_retention: Duration::from_secs(3600),
            changelog_check_interval: Duration::from_secs(300),
            changelog_heads: 1,
            operation_timeout: Duration::from_secs(10),
            max_attempts: 3,
            liveness: LivenessConfig::default(),
            create_table: false,
        }
    }
}

impl DynamoDbConfig {
    /// The defaults, for `table`.
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            ..Self::default()
        }
    }
    /// Set `create_table`.
    pub fn with_create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }
    /// Set `liveness`.
    pub fn with_liveness(mut self, liveness: LivenessConfig) -> Self {
        self.liveness = liveness;
        self
    }
    /// Set `region`.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }
    /// Set `endpoint_url`.
    pub fn with_endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self
    }
    /// Use static credentials instead of the AWS chain.
    pub fn with_static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some(StaticCredentials::new(access_key_id, secret_access_key));
        self
    }
    /// Set `consistent_reads`.
    pub fn with_consistent_reads(mut self, v: bool) -> Self {
        self.consistent_reads = v;
        self
    }
    /// Set `scan_segments` (at least 1).
    pub fn with_scan_segments(mut self, n: u32) -> Self {
        self.scan_segments = n.max(1);
        self
    }
    /// Set `watch`.
    pub fn with_watch(mut self, mode: WatchMode) -> Self {
        self.watch = mode;
        self
    }
    /// Set `poll_interval`.
    pub fn with_poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }
    /// Set `stream_poll_interval`.
    pub fn with_stream_poll_interval(mut self, d: Duration) -> Self {
        self.stream_poll_interval = d;
        self
    }
    /// Set `watch_history` (at least 1).
    pub fn with_watch_history(mut self, n: usize) -> Self {
        self.watch_history = n.max(1);
        self
    }
    /// Set `ttl_attribute`.
    pub fn with_ttl_attribute(mut self, name: Option<String>) -> Self {
        self.ttl_attribute = name;
        self
    }
    /// Set `changelog_check_interval` (at least 1 s).
    pub fn with_changelog_check_interval(mut self, d: Duration) -> Self {
        self.changelog_check_interval = d;
        self
    }
    /// Set `changelog_heads` (clamped to 1 to [`crate::CHANGELOG_MAX_HEADS`]).
    pub fn with_changelog_heads(mut self, n: u32) -> Self {
        self.changelog_heads = n.clamp(1, CHANGELOG_MAX_HEADS);
        self
    }
    /// Set `item_ttl`.
    pub fn with_item_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.item_ttl = ttl;
        self
    }
    /// Set `changelog_retention` (at least 1 s).
    pub fn with_changelog_retention(mut self, d: Duration) -> Self {
        self.changelog_retention = d.max(Duration::from_secs(1));
        self
    }
    /// Set `operation_timeout`.
    pub fn with_operation_timeout(mut self, d: Duration) -> Self {
        self.operation_timeout = d;
        self
    }
    /// Set `max_attempts` (at least 1).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Where requests go, for error messages: the endpoint URL, or the
    /// regional AWS endpoint.
    pub(crate) fn endpoint_name(&self, region: &str) -> String {
        match &self.endpoint_url {
            Some(url) => url.clone(),
            None => format!("https://dynamodb.{region}.amazonaws.com"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_secrets() {
        let mut cfg = DynamoDbConfig::new("t").with_static_credentials("AKIDEXAMPLE", "s3cr3t");
        if let Some(c) = cfg.credentials.as_mut() {
            c.session_token = Some("tok3n".into());
        }
        let s = format!("{cfg:?}");
        assert!(s.contains("AKIDEXAMPLE"), "{s}");
        assert!(!s.contains("s3cr3t") && !s.contains("tok3n"), "{s}");
    }
}
