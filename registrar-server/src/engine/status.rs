//! [`Status`]: what the registrar knows about its own health, read by
//! `/readyz`, by the write path and by the metrics.
//!
//! Two kinds of trouble are told apart (`docs/registrar/health.md` has
//! the table):
//!
//! - **The backend is unreachable or slow.** The registrar stays ready:
//!   agents keep their streams and cached reads, writes queue (bounded) and
//!   are acknowledged as configured. `/readyz` answers 200 with a body
//!   saying `degraded: backend unreachable since …`, and
//!   `registrar_backend_up` is 0.
//! - **The backend refuses writes for good, or a background task died.**
//!   The registrar stops acknowledging (writes answer `UNAVAILABLE` naming
//!   the cause) and `/readyz` answers 503, so agents and Kubernetes move to
//!   a healthy replica. A refusing backend is probed until it accepts
//!   writes again and its state has been re-read; a dead task makes the
//!   process drain what it can and exit non-zero.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::metrics::names;
use tokio::sync::watch;
use tokio::time::Instant;
use waypost::Error;

/// The registrar's health; one per registrar, shared by its parts.
#[derive(Debug)]
pub struct Status {
    state: Mutex<State>,
    failed: watch::Sender<Option<String>>,
    /// Wakes the monitor: a refusal to heal, a re-read to do.
    heal: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Waiting for files without which nothing is served (TLS
    /// certificates that do not exist yet): which, and why.
    waiting: Option<String>,
    /// The backend is not open yet: the last error opening it.
    opening: Option<String>,
    /// The first snapshot of the backend is in.
    synced: bool,
    /// The backend did not answer, since when and why.
    down: Option<Down>,
    /// The backend refuses writes for good: why.
    refusing: Option<String>,
    /// The whole state is being read again after a refusal or a lost feed.
    resyncing: bool,
}

#[derive(Debug, Clone)]
struct Down {
    since: SystemTime,
    at: Instant,
    cause: String,
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Serving; the text may say it is degraded.
    Ready(String),
    /// Not serving writes or not yet serving; the text says why.
    NotReady(String),
}

impl Default for Status {
    fn default() -> Self {
        Self {
            state: Mutex::new(State::default()),
            failed: watch::channel(None).0,
            heal: tokio::sync::Notify::new(),
        }
    }
}

/// Error messages quoted in the status are cut to this many characters.
const MAX_CAUSE: usize = 512;

fn cause(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    match waypost::backend::prefix(&s, MAX_CAUSE) {
        std::borrow::Cow::Borrowed(_) => s,
        cut => format!("{cut} ({} bytes)", s.len()),
    }
}

impl Status {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waiting for `what` (`Some`: TLS files that do not exist yet, named)
    /// before anything is served; `None`: no longer.
    pub fn waiting_for(&self, what: Option<String>) {
        self.lock().waiting = what.map(|w| cause(&w));
    }

    /// Opening the backend failed with `e`; it is retried.
    pub fn opening_failed(&self, e: &Error) {
        self.lock().opening = Some(cause(e));
    }

    /// The backend is open.
    pub fn opened(&self) {
        self.lock().opening = None;
    }

    /// The first snapshot of the backend is in.
    pub fn synced(&self) {
        self.lock().synced = true;
    }

    /// The backend answered.
    pub fn backend_up(&self) {
        let mut st = self.lock();
        if let Some(d) = st.down.take() {
            tracing::info!(
                down_for = ?d.at.elapsed(),
                "the backend answers again"
            );
        }
    }

    /// The backend did not answer (a transient failure).
    pub fn backend_unreachable(&self, e: &Error) {
        let mut st = self.lock();
        match &mut st.down {
            Some(d) => d.cause = cause(e),
            None => {
                tracing::warn!(error = %e, "the backend is unreachable; writes queue, reads go on from the last state");
                st.down = Some(Down {
                    since: SystemTime::now(),
                    at: Instant::now(),
                    cause: cause(e),
                });
            }
        }
    }

    /// The backend refuses writes for good (`e`): not ready, writes are
    /// refused, and the registrar heals (probes, then re-reads the
    /// backend's state) until it accepts them again.
    pub fn refuse(&self, e: &Error) {
        let mut st = self.lock();
        if st.refusing.is_none() {
            tracing::error!(error = %e, "the backend refuses writes: not ready, writes are refused until it accepts them again");
            self.heal.notify_one();
        }
        st.refusing = Some(cause(e));
    }

    /// A failure of the backend: transient ones mark it unreachable,
    /// refusals of the backend as such make the registrar refuse writes;
    /// a refusal of one request says nothing about the backend.
    pub fn backend_failed(&self, e: &Error) {
        if e.is_retryable() {
            self.backend_unreachable(e);
        } else if !e.is_request_fault() {
            self.refuse(e);
        }
    }

    /// The state must be read again whole (a refused write whose key
    /// could not be re-read, a lost change feed): not ready until done.
    pub fn request_resync(&self) {
        self.lock().resyncing = true;
        self.heal.notify_one();
    }

    /// Whether a re-read of the whole state is pending or running.
    pub fn is_resyncing(&self) -> bool {
        self.lock().resyncing
    }

    /// Resolves when healing was asked for.
    pub(crate) async fn heal_requested(&self) {
        self.heal.notified().await;
    }

    /// The backend accepts writes again and its state was re-read.
    pub fn accepting(&self) {
        let mut st = self.lock();
        if st.refusing.take().is_some() {
            tracing::info!("the backend accepts writes again; ready");
        }
        st.resyncing = false;
    }

    /// Whether the backend refuses writes.
    pub fn is_refusing(&self) -> bool {
        self.lock().refusing.is_some()
    }

    /// A background task died (`why`): the registrar is not ready and
    /// exits once it has drained what it can.
    pub fn fail(&self, why: impl std::fmt::Display) {
        let why = cause(&why);
        self.failed.send_if_modified(|f| {
            if f.is_none() {
                tracing::error!(cause = %why, "a background task died: not ready, shutting down");
                *f = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Why the registrar failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    /// Resolves with the cause once the registrar failed.
    pub fn failed(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut rx = self.failed.subscribe();
        async move {
            let failed = rx
                .wait_for(Option::is_some)
                .await
                .map(|f| f.clone().unwrap_or_default());
            match failed {
                Ok(why) => why,
                // The status is gone with its registrar: nothing failed.
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// The error a write gets while writes are refused, naming the cause.
    pub fn write_refusal(&self) -> Option<Error> {
        if let Some(f) = self.failure() {
            return Some(Error::unavailable(format!(
                "this registrar is shutting down: a background task died: {f}"
            )));
        }
        let st = self.lock();
        if let Some(w) = &st.waiting {
            return Some(Error::unavailable(format!(
                "this registrar is not serving yet: waiting for {w}"
            )));
        }
        if let Some(r) = &st.refusing {
            return Some(Error::unavailable(format!(
                "this registrar does not accept writes: the backend refuses them: {r}"
            )));
        }
        if let Some(o) = &st.opening {
            return Some(Error::unavailable(format!(
                "this registrar has not opened its backend yet: {o}"
            )));
        }
        None
    }

    /// How long the backend has been unreachable; `None` while it answers.
    pub fn down_for(&self) -> Option<Duration> {
        self.lock().down.as_ref().map(|d| d.at.elapsed())
    }

    /// Whether `/readyz` says ready, and what it says.
    pub fn readiness(&self) -> Readiness {
        if let Some(f) = self.failure() {
            return Readiness::NotReady(format!(
                "not ready: a background task died ({f}); draining and exiting"
            ));
        }
        let st = self.lock();
        if let Some(w) = &st.waiting {
            return Readiness::NotReady(format!("not ready: waiting for {w}"));
        }
        if let Some(o) = &st.opening {
            return Readiness::NotReady(format!(
                "not ready: cannot open the backend yet ({o}); retrying"
            ));
        }
        if let Some(r) = &st.refusing {
            return Readiness::NotReady(format!(
                "not ready: the backend refuses writes ({r}); probing until it accepts them"
            ));
        }
        if st.resyncing {
            return Readiness::NotReady(
                "not ready: reading the backend's whole state again".into(),
            );
        }
        if !st.synced {
            return Readiness::NotReady(
                "not ready: waiting for the first snapshot of the backend".into(),
            );
        }
        match &st.down {
            None => Readiness::Ready("ready".into()),
            Some(d) => Readiness::Ready(format!(
                "ready; degraded: backend unreachable since {} ({}); writes are queued and \
                 reads are served from the last state",
                humantime::format_rfc3339_seconds(d.since),
                d.cause
            )),
        }
    }

    /// Publish `registrar_backend_up` (1 or 0) and
    /// `registrar_backend_down_seconds` (how long it has been unreachable).
    pub fn publish_gauges(&self) {
        let down = self.down_for();
        metrics::gauge!(names::BACKEND_UP).set(if down.is_some() { 0.0 } else { 1.0 });
        metrics::gauge!(names::BACKEND_DOWN_SECONDS).set(down.map_or(0.0, |d| d.as_secs_f64()));
        metrics::gauge!(names::READY).set(match self.readiness() {
            Readiness::Ready(_) => 1.0,
            Readiness::NotReady(_) => 0.0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_is_ready_refusing_is_not() {
        let s = Status::default();
        assert!(matches!(s.readiness(), Readiness::NotReady(r) if r.contains("first snapshot")));
        s.synced();
        assert_eq!(s.readiness(), Readiness::Ready("ready".into()));
        s.backend_unreachable(&Error::unavailable("connection refused"));
        match s.readiness() {
            Readiness::Ready(r) => {
                assert!(r.contains("degraded: backend unreachable since"), "{r}");
                assert!(r.contains("connection refused"), "{r}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            s.write_refusal().is_none(),
            "an outage must not refuse writes"
        );
        s.backend_up();
        s.refuse(&Error::internal("database disk image is malformed"));
        assert!(matches!(s.readiness(), Readiness::NotReady(r) if r.contains("malformed")));
        let e = s.write_refusal().unwrap();
        assert!(e.to_string().contains("malformed"), "{e}");
        s.accepting();
        assert_eq!(s.readiness(), Readiness::Ready("ready".into()));
        s.fail("the write queue's flusher panicked");
        assert!(matches!(s.readiness(), Readiness::NotReady(r) if r.contains("flusher")));
        assert!(s.write_refusal().is_some());
    }

    #[test]
    fn waiting_for_files_comes_first() {
        let s = Status::default();
        s.opening_failed(&Error::unavailable("opening"));
        s.waiting_for(Some("the certificate /run/svid.pem (not found)".into()));
        assert!(
            matches!(s.readiness(), Readiness::NotReady(r) if r == "not ready: waiting for the certificate /run/svid.pem (not found)")
        );
        assert!(s.write_refusal().unwrap().to_string().contains("svid.pem"));
        s.waiting_for(None);
        assert!(matches!(s.readiness(), Readiness::NotReady(r) if r.contains("cannot open")));
    }

    #[test]
    fn long_causes_are_cut() {
        let long = "x".repeat(10_000);
        assert!(cause(&long).len() < 600);
    }
}
