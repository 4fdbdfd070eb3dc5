//! [`Guarded`]: the one wrapper test harnesses use to keep a fixture (a
//! temp directory, a server, a peer node) alive beside a registry.

use crate::traits::{Batch, Heartbeat, Registry, Watch};

/// A registry that keeps something alive beside it (a temp directory, a
/// server fixture, a peer node) and forwards every trait method to it, so a
/// `make()` for [`conformance_tests!`](crate::conformance_tests) can return
/// one value. Test harnesses use this one wrapper (rather than `Deref` or
/// forwarding by hand); what a test needs of the fixture it reaches
/// through [`Guarded::guard`] / [`Guarded::guard_mut`].
///
/// ```
/// use waypost::{testing::Guarded, memory::MemoryRegistry};
/// let dir = std::env::temp_dir(); // stands for a tempfile::TempDir
/// let reg = Guarded::new(MemoryRegistry::new(), dir);
/// assert_eq!(reg.to_string(), "Memory");
/// ```
pub struct Guarded<R> {
    inner: R,
    _guard: Box<dyn std::any::Any + Send + Sync>,
}

impl<R> Guarded<R> {
    /// `inner`, with `guard` dropped only after it.
    pub fn new(inner: R, guard: impl std::any::Any + Send + Sync) -> Self {
        Self {
            inner,
            _guard: Box::new(guard),
        }
    }

    /// The registry.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The guard, if it is a `G`.
    pub fn guard<G: 'static>(&self) -> Option<&G> {
        self._guard.downcast_ref::<G>()
    }

    /// The guard, mutably (to kill or restart a server), if it is a `G`.
    pub fn guard_mut<G: 'static>(&mut self) -> Option<&mut G> {
        self._guard.downcast_mut::<G>()
    }

    /// The registry and the guard, if it is a `G`.
    pub fn into_parts<G: 'static>(self) -> (R, Option<G>) {
        let guard = self._guard.downcast::<G>().ok().map(|b| *b);
        (self.inner, guard)
    }
}

impl<R: Registry> std::fmt::Display for Guarded<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

impl<R: Registry> std::fmt::Debug for Guarded<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.inner, f)
    }
}

crate::forward! {
    impl[R: Registry] Registry for Guarded<R> {
        forward to inner: register, deregister, list, list_shared, snapshot, capabilities, probe;
    }
}

crate::forward! {
    impl[R: Batch] Batch for Guarded<R> {
        forward to inner: apply, max_batch;
    }
}

crate::forward! {
    impl[R: Watch] Watch for Guarded<R> {
        forward to inner: watch;
    }
}

crate::forward! {
    impl[R: Heartbeat] Heartbeat for Guarded<R> {
        forward to inner: heartbeat;
    }
}
