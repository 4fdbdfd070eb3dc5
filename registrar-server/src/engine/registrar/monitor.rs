//! The registrar's monitor: keeps [`crate::Status`] true.
//!
//! - The write queue's status: calls failing with a transient error mark
//!   the backend unreachable; a refusal of the backend as such (read-only,
//!   corrupt, missing table) makes the registrar refuse writes.
//! - A probe of the backend every `probe_interval` ([`waypost::Registry::probe`]):
//!   the same classification; it also notices an outage while nothing is
//!   written.
//! - While writes are refused, or after a refused write whose key could
//!   not be re-read, it heals: probe, then re-read the backend's whole
//!   state ([`waypost::cached::CachedRegistry::resync`]); only then is the
//!   registrar ready again.
//! - The background tasks: a write queue or a state task that ended makes
//!   the registrar fail (not ready, then exit non-zero).

use std::sync::{Arc, Weak};
use std::time::Duration;

use waypost::{Error, Registry};

use super::Registrar;

/// How often the background tasks are checked.
const TASK_CHECK: Duration = Duration::from_millis(500);

impl Registrar {
    /// The monitor task (see the module docs): until `this` is gone.
    pub(super) async fn monitor(this: Weak<Registrar>) {
        let Some(reg) = this.upgrade() else { return };
        let mut writer = reg.writer.status();
        let mut probe = tokio::time::interval(reg.cfg.probe_interval);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tasks = tokio::time::interval(TASK_CHECK);
        tasks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let first_snapshot = {
            let reg = Arc::clone(&reg);
            async move { reg.state.wait_until_ready().await }
        };
        drop(reg);
        tokio::pin!(first_snapshot);
        let mut synced = false;
        loop {
            let mut heal_now = false;
            tokio::select! {
                () = &mut first_snapshot, if !synced => {
                    synced = true;
                    if let Some(reg) = this.upgrade() {
                        reg.status.synced();
                    }
                }
                changed = writer.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let st = writer.borrow_and_update().clone();
                    let Some(reg) = this.upgrade() else { return };
                    match (st.failing_since, st.last_error) {
                        (None, _) => reg.status.backend_up(),
                        (Some(_), Some(e)) => reg.status.backend_failed(&e),
                        (Some(_), None) => {}
                    }
                }
                _ = probe.tick() => {
                    let Some(reg) = this.upgrade() else { return };
                    if needs_healing(&reg) {
                        heal_now = true;
                    } else {
                        match probe_once(&reg).await {
                            Ok(()) => reg.status.backend_up(),
                            Err(e) => reg.status.backend_failed(&e),
                        }
                    }
                }
                _ = tasks.tick() => {
                    let Some(reg) = this.upgrade() else { return };
                    if let Err(why) = reg.tasks_running() {
                        reg.status.fail(why);
                    }
                }
                () = wake(&this) => heal_now = true,
            }
            if !heal_now {
                continue;
            }
            let Some(reg) = this.upgrade() else { return };
            if needs_healing(&reg) {
                heal(&reg).await;
            }
        }
    }
}

async fn wake(this: &Weak<Registrar>) {
    match this.upgrade() {
        // The status outlives nothing it should not: hold it, not the
        // registrar, while waiting.
        Some(reg) => {
            let status = Arc::clone(&reg.status);
            drop(reg);
            status.heal_requested().await;
        }
        None => std::future::pending().await,
    }
}

fn needs_healing(reg: &Registrar) -> bool {
    reg.status.is_refusing() || reg.status.is_resyncing()
}

async fn probe_once(reg: &Registrar) -> waypost::Result<()> {
    match tokio::time::timeout(reg.cfg.probe_timeout, reg.backend.probe()).await {
        Ok(r) => r,
        Err(_) => Err(Error::unavailable(format!(
            "the backend did not answer a probe within {:?}",
            reg.cfg.probe_timeout
        ))),
    }
}

/// Probe; when the backend accepts writes, read its whole state again;
/// then the registrar is ready again. Retried on the next probe tick
/// otherwise.
async fn heal(reg: &Registrar) {
    if let Err(e) = probe_once(reg).await {
        tracing::warn!(error = %e, "the backend still refuses; probing again later");
        reg.status.backend_failed(&e);
        return;
    }
    reg.status.backend_up();
    match tokio::time::timeout(reg.cfg.probe_timeout, reg.state.resync()).await {
        Ok(()) => reg.status.accepting(),
        Err(_) => tracing::warn!(
            timeout = ?reg.cfg.probe_timeout,
            "re-reading the backend's state timed out; trying again later"
        ),
    }
}
