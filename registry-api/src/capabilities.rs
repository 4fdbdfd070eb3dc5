//! [`Capabilities`]: what a backend does, precisely.

/// What a backend does, precisely. Combinators, servers and the
/// conformance suite decide from this, never from the backend's name.
///
/// ```
/// let caps = waypost::Capabilities::default()
///     .with_native_watch(true)
///     .with_max_batch(128);
/// assert!(caps.native_watch && !caps.atomic_writes);
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend pushes every change (no polling): watchers see each
    /// intermediate state, not only the latest one.
    pub native_watch: bool,
    /// `watch(Some(v))` resumes with only the changes after `v` while the
    /// backend still holds them.
    pub resumable_watch: bool,
    /// [`crate::Batch::apply`] is all-or-nothing: after a failed call none
    /// of its ops is stored.
    pub atomic_writes: bool,
    /// Readers (`list`, `snapshot`, a watch) never see part of a batch:
    /// all of its changes or none.
    pub isolated_reads: bool,
    /// The most ops one [`crate::Batch::apply`] call takes; more are
    /// refused (see [`crate::Batch`]).
    pub max_batch: usize,
    /// The backend detects dead nodes itself (leases, SWIM), and
    /// [`crate::Heartbeat::heartbeat`] is its liveness signal.
    pub native_liveness: bool,
    /// Most labels one endpoint may carry here (at most
    /// [`crate::limits::MAX_LABELS`]; Cloud Map allows fewer).
    pub max_labels: usize,
    /// Largest endpoint the backend stores, as measured by
    /// [`crate::limits::encoded_len`] (at most
    /// [`crate::limits::MAX_ENCODED_LEN`]; Cloud Map allows less).
    pub max_encoded_len: usize,
    /// An endpoint written without a cluster is stored in the writer's
    /// own cluster (the registrar and its agents), not with an empty one.
    pub assigns_cluster: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            native_watch: false,
            resumable_watch: false,
            atomic_writes: false,
            isolated_reads: false,
            max_batch: 1,
            native_liveness: false,
            max_labels: crate::limits::MAX_LABELS,
            max_encoded_len: crate::limits::MAX_ENCODED_LEN,
            assigns_cluster: false,
        }
    }
}

impl Capabilities {
    /// Set `assigns_cluster`.
    pub fn with_assigns_cluster(mut self, v: bool) -> Self {
        self.assigns_cluster = v;
        self
    }
    /// Set `native_watch`.
    pub fn with_native_watch(mut self, v: bool) -> Self {
        self.native_watch = v;
        self
    }
    /// Set `resumable_watch`.
    pub fn with_resumable_watch(mut self, v: bool) -> Self {
        self.resumable_watch = v;
        self
    }
    /// Set `atomic_writes`.
    pub fn with_atomic_writes(mut self, v: bool) -> Self {
        self.atomic_writes = v;
        self
    }
    /// Set `isolated_reads`.
    pub fn with_isolated_reads(mut self, v: bool) -> Self {
        self.isolated_reads = v;
        self
    }
    /// Set `max_batch` (at least 1).
    pub fn with_max_batch(mut self, v: usize) -> Self {
        self.max_batch = v.max(1);
        self
    }
    /// Set `native_liveness`.
    pub fn with_native_liveness(mut self, v: bool) -> Self {
        self.native_liveness = v;
        self
    }
    /// Set `max_labels` (capped at [`crate::limits::MAX_LABELS`]).
    pub fn with_max_labels(mut self, v: usize) -> Self {
        self.max_labels = v.min(crate::limits::MAX_LABELS);
        self
    }
    /// Set `max_encoded_len` (capped at [`crate::limits::MAX_ENCODED_LEN`]).
    pub fn with_max_encoded_len(mut self, v: usize) -> Self {
        self.max_encoded_len = v.min(crate::limits::MAX_ENCODED_LEN);
        self
    }
}
