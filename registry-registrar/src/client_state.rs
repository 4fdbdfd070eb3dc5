//! [`ClientState`]: what a [`crate::RegistrarClient`] and its reconcile
//! task share (the cache over the [`RpcClient`], the overlay of local
//! writes, what the client asserts, the settings), and that task: it
//! re-sends what the client wrote after the registrar was unreachable or
//! restarted, after a refusal whose cause was not the write itself, and to
//! the fallback backend while no registrar answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use waypost::cached::CachedRegistry;
use waypost::{Endpoint, EndpointKey, Error, ErrorKind, Op, Registry, Result};

use crate::config::ClientConfig;
use crate::overlay::Overlay;
use crate::rpc::{RpcClient, StreamRefusal};

/// A write of this client that the backend refused after the registrar
/// acknowledged it (optimistic mode): the registrar undid it and said why
/// on the watch stream.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The key written.
    pub key: EndpointKey,
    /// The refused write.
    pub op: Op,
    /// Why the backend refused it.
    pub error: Error,
    /// Whether this client sends it again: yes unless the write itself was
    /// at fault ([`Error::is_request_fault`]), in which case the client
    /// stops asserting it and its local cache shows the registrar's value.
    pub retrying: bool,
}

/// What a [`crate::RegistrarClient`] and its reconcile task share.
pub(crate) struct ClientState {
    pub(crate) cache: CachedRegistry<RpcClient>,
    pub(crate) overlay: Overlay,
    pub(crate) writes: Writes,
    /// One send of a key at a time: a caller's write and the re-send of an
    /// earlier desire of the same key never overtake each other.
    pub(crate) keys: KeyLocks,
    pub(crate) cfg: ClientConfig,
    pub(crate) refusals: broadcast::Sender<Refusal>,
}

impl ClientState {
    /// Send one write to the registrar, or to the fallback backend while
    /// falling back. With `queue`, an unreachable registrar keeps the write
    /// pending (Ok) while there is room.
    pub(crate) async fn send(&self, op: &Op, queue: bool) -> Result<()> {
        let key = op.key();
        let res = match (&self.cfg.fallback, self.writes.falling_back()) {
            (Some(f), true) => match op {
                Op::Register(e) => f.backend.register(e.clone()).await,
                Op::Deregister(k) => f.backend.deregister(k).await,
            },
            _ => self.cache.get_ref().send(op, self.cfg.ack).await,
        };
        match res {
            Ok(()) => {
                self.writes.sent(op);
                Ok(())
            }
            Err(e) if queue && e.kind() == ErrorKind::Unavailable => self.writes.queue(key, &e),
            Err(e) => Err(e),
        }
    }
}

/// A lock per key, held across deciding what to send for the key and
/// sending it; a key's entry is dropped once no one holds or waits for it.
#[derive(Default)]
pub(crate) struct KeyLocks {
    map: Mutex<BTreeMap<EndpointKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// [`KeyLocks::lock`]'s guard.
pub(crate) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: EndpointKey,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Wait for `key`'s lock.
    pub(crate) async fn lock(&self, key: &EndpointKey) -> KeyGuard<'_> {
        let m = Arc::clone(lock(&self.map).entry(key.clone()).or_default());
        KeyGuard {
            locks: self,
            key: key.clone(),
            guard: Some(m.lock_owned().await),
        }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = lock(&self.locks.map);
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

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

    /// A durable write of `key` failed without an answer (the registrar
    /// was unreachable mid-call): it may still have been applied. After
    /// [`Writes::restore`], send the key's state from before the write
    /// again until the registrar accepts it, so the registry does not keep
    /// a write its caller was told failed: the restored desire, or, for a
    /// key that held nothing before (`was_absent`), its removal. A key that
    /// held another writer's endpoint is left as the registrar has it.
    pub(crate) fn compensate(
        &self,
        key: &EndpointKey,
        previous: Option<Option<Endpoint>>,
        was_absent: bool,
        cause: &Error,
    ) {
        match previous {
            Some(_) => {}
            None if was_absent => {
                lock(&self.owned).insert(key.clone(), None);
            }
            None => return,
        }
        if let Err(e) = self.queue(key.clone(), cause) {
            tracing::warn!(%key, error = %e, "cannot queue the undo of a write whose outcome is unknown");
        }
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
    state: Weak<ClientState>,
    mut connected: watch::Receiver<u64>,
    mut refusals: broadcast::Receiver<StreamRefusal>,
) {
    let (retry, started) = match state.upgrade() {
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
                let Some(state) = state.upgrade() else { return };
                let epoch = *state.cache.get_ref().epoch.borrow();
                let restarted = last_epoch.is_some() && epoch.is_some() && epoch != last_epoch;
                if epoch.is_some() {
                    last_epoch = epoch;
                }
                if restarted {
                    tracing::info!("registrar restarted; re-asserting this agent's endpoints");
                    reassert = true;
                }
                if state.writes.falling_back.swap(false, Ordering::AcqRel) {
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
        let Some(state) = state.upgrade() else { return };
        state.cache.store().record_metrics();
        if let Some(r) = refusal {
            on_refusal(&state, r);
        }
        if maybe_fall_back(&state, started) {
            reassert = true;
        }
        let ops = state.writes.ops(reassert);
        for op in ops {
            // A caller may have written the key since the ops were read:
            // send only what is still wanted, never over a newer write.
            let _key = state.keys.lock(&op.key()).await;
            if !state.writes.wants(&op) {
                continue;
            }
            match state.send(&op, true).await {
                Ok(()) => {}
                Err(e) if e.is_request_fault() => {
                    tracing::warn!(key = %op.key(), error = %e, "a re-sent write was refused; no longer asserting it");
                    state.writes.give_up(&op.key());
                }
                Err(e) => {
                    // Whatever the kind (a timeout, an overloaded registrar),
                    // the next tick sends it again.
                    tracing::warn!(key = %op.key(), error = %e, "re-sending a write failed; will retry");
                    state.writes.mark_pending(op.key());
                }
            }
        }
    }
}

/// A refusal read from the stream: report it if it concerns what this
/// client wants now, then re-send it, or give it up when the write itself
/// was at fault.
fn on_refusal(state: &ClientState, r: StreamRefusal) {
    if !state.writes.wants(&r.refused) {
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
        state.writes.mark_pending(key.clone());
    } else {
        state.writes.give_up(&key);
        state.overlay.undo(std::slice::from_ref(&r.restored));
    }
    let _ = state.refusals.send(Refusal {
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
fn maybe_fall_back(state: &Arc<ClientState>, started: Instant) -> bool {
    let Some(f) = &state.cfg.fallback else {
        return false;
    };
    if state.writes.falling_back() {
        return false;
    }
    let silent = state.cache.cache_age().unwrap_or_else(|| started.elapsed());
    if silent < f.after {
        return false;
    }
    tracing::warn!(
        silent = ?silent,
        backend = %f.backend,
        "no registrar answered; writes and heartbeats go to the backend directly"
    );
    metrics::gauge!("agent_registrar_fallback_active").set(1.0);
    state.writes.falling_back.store(true, Ordering::Release);
    true
}
