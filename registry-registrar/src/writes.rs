//! What a [`crate::RegistrarClient`] wrote and still asserts, and the task
//! that re-sends it: after the registrar was unreachable or restarted,
//! after a refusal whose cause was not the write itself, and to the
//! fallback backend while no registrar answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use registry_api::{Endpoint, EndpointKey, Error, Op, Result};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::client::{Inner, Refusal};
use crate::raw::StreamRefusal;

/// The desired value of each key this client wrote (`None`: removed), the
/// keys not yet accepted, and whether writes go to the fallback backend.
pub(crate) struct Writes {
    owned: Mutex<BTreeMap<EndpointKey, Option<Endpoint>>>,
    pending: Mutex<BTreeSet<EndpointKey>>,
    max_pending: usize,
    falling_back: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn desired(op: &Op) -> Option<Endpoint> {
    match op {
        Op::Register(e) => Some(e.clone()),
        Op::Deregister(_) => None,
    }
}

impl Writes {
    pub(crate) fn new(max_pending: usize) -> Self {
        Self {
            owned: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(BTreeSet::new()),
            max_pending,
            falling_back: AtomicBool::new(false),
        }
    }

    pub(crate) fn pending_len(&self) -> usize {
        lock(&self.pending).len()
    }

    pub(crate) fn owned_endpoints(&self) -> Vec<Endpoint> {
        lock(&self.owned).values().flatten().cloned().collect()
    }

    pub(crate) fn falling_back(&self) -> bool {
        self.falling_back.load(Ordering::Acquire)
    }

    /// Record `op` as this client's desire; returns the previous one.
    pub(crate) fn own(&self, op: &Op) -> Option<Option<Endpoint>> {
        lock(&self.owned).insert(op.key(), desired(op))
    }

    /// Put back what [`Writes::own`] replaced.
    pub(crate) fn restore(&self, key: &EndpointKey, previous: Option<Option<Endpoint>>) {
        let mut owned = lock(&self.owned);
        match previous {
            Some(v) => owned.insert(key.clone(), v),
            None => owned.remove(key),
        };
    }

    /// `op` was accepted: not pending any more; a removal is forgotten.
    pub(crate) fn sent(&self, op: &Op) {
        let key = op.key();
        lock(&self.pending).remove(&key);
        if let Op::Deregister(_) = op {
            let mut owned = lock(&self.owned);
            if owned.get(&key).is_some_and(Option::is_none) {
                owned.remove(&key);
            }
        }
    }

    /// Keep `key` for re-sending, while there is room.
    pub(crate) fn queue(&self, key: EndpointKey, cause: &Error) -> Result<()> {
        let mut pending = lock(&self.pending);
        if pending.len() >= self.max_pending && !pending.contains(&key) {
            return Err(Error::overloaded(format!(
                "registrar unreachable and {} writes already queued: {cause}",
                pending.len()
            )));
        }
        tracing::debug!(%key, error = %cause, "registrar unreachable; write queued");
        pending.insert(key);
        Ok(())
    }

    /// The ops to send: every owned key (`all`), or the pending ones.
    fn ops(&self, all: bool) -> Vec<Op> {
        let owned = lock(&self.owned);
        let pending = lock(&self.pending);
        owned
            .iter()
            .filter(|(k, _)| all || pending.contains(*k))
            .map(|(k, v)| match v {
                Some(e) => Op::Register(e.clone()),
                None => Op::Deregister(k.clone()),
            })
            .collect()
    }

    /// Whether `op` is what this client wants for its key now.
    fn wants(&self, op: &Op) -> bool {
        lock(&self.owned).get(&op.key()) == Some(&desired(op))
    }

    /// Stop asserting `key`.
    fn give_up(&self, key: &EndpointKey) {
        lock(&self.owned).remove(key);
        lock(&self.pending).remove(key);
    }

    fn mark_pending(&self, key: EndpointKey) {
        lock(&self.pending).insert(key);
    }
}

/// Re-send pending writes every `retry_interval`, every owned write when
/// the registrar restarted (a new epoch) or the client switches between
/// the registrar and the fallback backend, and handle refusals read from
/// the stream.
pub(crate) async fn reconcile_loop(
    inner: Weak<Inner>,
    mut connected: watch::Receiver<u64>,
    mut refusals: broadcast::Receiver<StreamRefusal>,
) {
    let (retry, started) = match inner.upgrade() {
        Some(i) => (i.cfg.retry_interval, Instant::now()),
        None => return,
    };
    let mut tick = tokio::time::interval(retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_epoch: Option<u64> = None;
    loop {
        let mut reassert = false;
        let refusal = tokio::select! {
            changed = connected.changed() => {
                if changed.is_err() {
                    return;
                }
                let Some(inner) = inner.upgrade() else { return };
                let epoch = *inner.cache.get_ref().epoch.borrow();
                let restarted = last_epoch.is_some() && epoch.is_some() && epoch != last_epoch;
                if epoch.is_some() {
                    last_epoch = epoch;
                }
                if restarted {
                    tracing::info!("registrar restarted; re-asserting this agent's endpoints");
                    reassert = true;
                }
                if inner.writes.falling_back.swap(false, Ordering::AcqRel) {
                    tracing::info!("a registrar answers again; writes go through it, re-asserting this agent's endpoints");
                    metrics::gauge!("agent_registrar_fallback_active").set(0.0);
                    reassert = true;
                }
                None
            }
            _ = tick.tick() => None,
            r = refusals.recv() => match r {
                Ok(r) => Some(r),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "refusals came faster than handled; re-asserting everything");
                    reassert = true;
                    None
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        let Some(inner) = inner.upgrade() else { return };
        inner.cache.store().record_metrics();
        if let Some(r) = refusal {
            on_refusal(&inner, r);
        }
        if maybe_fall_back(&inner, started) {
            reassert = true;
        }
        let ops = inner.writes.ops(reassert);
        for op in ops {
            match inner.send(&op, true).await {
                Ok(()) => {}
                Err(e) if e.is_request_fault() => {
                    tracing::warn!(key = %op.key(), error = %e, "a re-sent write was refused; no longer asserting it");
                    inner.writes.give_up(&op.key());
                }
                Err(e) => {
                    tracing::warn!(key = %op.key(), error = %e, "re-sending a write failed; will retry")
                }
            }
        }
    }
}

/// A refusal read from the stream: report it if it concerns what this
/// client wants now, then re-send it, or give it up when the write itself
/// was at fault.
fn on_refusal(inner: &Inner, r: StreamRefusal) {
    if !inner.writes.wants(&r.refused) {
        return;
    }
    let key = r.refused.key();
    let retrying = !r.error.is_request_fault();
    metrics::counter!(
        "agent_registrar_write_refusals_total",
        "kind" => kind_label(&r.error)
    )
    .increment(1);
    tracing::warn!(%key, error = %r.error, retrying, "the backend refused a write the registrar had acknowledged");
    if retrying {
        inner.writes.mark_pending(key.clone());
    } else {
        inner.writes.give_up(&key);
        inner.overlay.undo(std::slice::from_ref(&r.restored));
    }
    let _ = inner.refusals.send(Refusal {
        key,
        op: r.refused,
        error: r.error,
        retrying,
    });
}

fn kind_label(e: &Error) -> String {
    e.kind().to_string().replace(' ', "_")
}

/// Start falling back when no registrar answered for the configured time
/// (the cache's stream has been down that long, or never came up); returns
/// whether it just started.
fn maybe_fall_back(inner: &Arc<Inner>, started: Instant) -> bool {
    let Some(f) = &inner.cfg.fallback else {
        return false;
    };
    if inner.writes.falling_back() {
        return false;
    }
    let silent = inner.cache.cache_age().unwrap_or_else(|| started.elapsed());
    if silent < f.after {
        return false;
    }
    tracing::warn!(
        silent = ?silent,
        backend = %f.backend,
        "no registrar answered; writes and heartbeats go to the backend directly"
    );
    metrics::gauge!("agent_registrar_fallback_active").set(1.0);
    inner.writes.falling_back.store(true, Ordering::Release);
    true
}
