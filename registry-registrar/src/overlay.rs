//! [`Overlay`]: optimistic writes shown at once in a cache and kept over
//! older news of the same keys until the source echoes them — how the
//! registrar broadcasts a write before the backend has it, and how an agent
//! reads its own write before the registrar confirms it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use waypost::cached::{CachedConfig, CachedRegistry, LocalWrites, UpstreamFilter};
use waypost::{Endpoint, EndpointKey, Event, Op, Registry, Result, Watch};

/// How long a local write wins over older news of its key unless the
/// source echoes it first: 30 s.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(30);

/// The keys written locally and not yet echoed by the source, each with
/// the value wanted (`None`: removed) and the end of its hold.
#[derive(Default)]
struct Holds {
    held: Mutex<HashMap<EndpointKey, (Option<Endpoint>, Instant)>>,
}

impl Holds {
    fn lock(&self) -> MutexGuard<'_, HashMap<EndpointKey, (Option<Endpoint>, Instant)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl UpstreamFilter for Holds {
    /// Keep local writes over older news: an event on a held key is dropped
    /// unless it carries the local value (which ends the hold) or the hold
    /// expired; a snapshot is patched with the held values.
    fn filter(&self, ev: Event) -> Option<Event> {
        let mut held = self.lock();
        if held.is_empty() {
            return Some(ev);
        }
        let now = Instant::now();
        held.retain(|_, (_, until)| *until > now);
        match ev {
            Event::Snapshot(fresh) => {
                let mut patched = fresh;
                held.retain(|key, (desired, _)| {
                    if patched.get(key) == desired.as_ref() {
                        return false;
                    }
                    patched = match desired {
                        Some(e) => patched.with_endpoint(e.clone()),
                        None => patched.without(key),
                    };
                    true
                });
                Some(Event::Snapshot(patched))
            }
            delta => {
                let Some(key) = delta.key() else {
                    return Some(delta);
                };
                let Some((desired, _)) = held.get(&key) else {
                    return Some(delta);
                };
                let value = match &delta {
                    Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                        Some(endpoint)
                    }
                    _ => None,
                };
                if value == desired.as_ref() {
                    held.remove(&key);
                    Some(delta)
                } else {
                    None
                }
            }
        }
    }

    fn reset(&self) {
        self.lock().clear();
    }
}

/// Optimistic writes over a [`CachedRegistry`]: [`Overlay::apply`] shows
/// them to local watchers at once, and the source's older news of those
/// keys is held back until the source echoes the local value (or the hold
/// ends); [`Overlay::undo`] takes one back. Make both with
/// [`Overlay::cache`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use waypost::cached::CachedConfig;
/// use waypost::memory::MemoryRegistry;
/// use waypost::{Endpoint, Op};
/// use waypost_registrar_client::Overlay;
/// let (cache, overlay) = Overlay::cache(MemoryRegistry::new(), CachedConfig::default())?;
/// cache.wait_until_ready().await;
/// // Shown at once, although the memory registry does not have it.
/// overlay.apply(&[Op::Register(Endpoint::new("api", "a", "127.0.0.1", 80))]);
/// assert_eq!(cache.store().list("api").map(|l| l.len()), Some(1));
/// # Ok::<(), waypost::Error>(()) });
/// ```
#[derive(Clone)]
pub struct Overlay {
    holds: Arc<Holds>,
    writer: LocalWrites,
    hold: Duration,
}

impl Overlay {
    /// A cache of `inner` (with `cfg`, numbered with its own versions so
    /// local and source changes form one sequence) and the overlay that
    /// writes into it, holding local writes for [`DEFAULT_HOLD`].
    pub fn cache<R: Registry + Watch>(
        inner: R,
        cfg: CachedConfig,
    ) -> Result<(CachedRegistry<R>, Overlay)> {
        let holds = Arc::new(Holds::default());
        let filter: Arc<dyn UpstreamFilter> = holds.clone();
        let (cache, writer) = CachedRegistry::with_local_writes(
            inner,
            cfg.with_local_versions(true).with_filter(filter),
        )?;
        let overlay = Overlay {
            holds,
            writer,
            hold: DEFAULT_HOLD,
        };
        Ok((cache, overlay))
    }

    /// Show `ops` at once, each held over older news of its key. Returns
    /// the events published (none before the first snapshot).
    pub fn apply(&self, ops: &[Op]) -> Vec<Event> {
        self.hold(ops);
        self.publish(ops)
    }

    /// Hold `ops`' keys over older news without showing them yet: for a
    /// write that is shown only once the source has committed it
    /// ([`Overlay::confirm`]). The source's echo, should it come first,
    /// ends the hold as usual.
    pub fn hold(&self, ops: &[Op]) {
        let until = Instant::now() + self.hold;
        let mut held = self.holds.lock();
        for op in ops {
            held.insert(op.key(), (desired(op), until));
        }
    }

    /// Show the committed `ops` that [`Overlay::hold`] held, unless the
    /// source has echoed them already: then the cache shows the source's
    /// value, and whatever the source said since, not a write that it has
    /// moved past. Returns the events published.
    pub fn confirm(&self, ops: &[Op]) -> Vec<Event> {
        let mut out = Vec::new();
        for op in ops {
            let key = op.key();
            let want = desired(op);
            let still_held = || {
                self.holds
                    .lock()
                    .get(&key)
                    .is_some_and(|(held, _)| *held == want)
            };
            out.extend(self.writer.apply_if(event(op), still_held));
        }
        out
    }

    /// End the holds of `ops`' keys without showing anything (a write that
    /// failed after [`Overlay::hold`]).
    pub fn release(&self, ops: &[Op]) {
        let mut held = self.holds.lock();
        for op in ops {
            held.remove(&op.key());
        }
    }

    /// Take local writes back: the holds of `ops`' keys end and `ops` (the
    /// values to show instead) are applied at once without a hold, so the
    /// source's later news of those keys is taken as it comes. Returns the
    /// events published.
    pub fn undo(&self, ops: &[Op]) -> Vec<Event> {
        self.release(ops);
        self.publish(ops)
    }

    fn publish(&self, ops: &[Op]) -> Vec<Event> {
        ops.iter()
            .flat_map(|op| self.writer.apply(event(op)))
            .collect()
    }
}

/// The value `op` leaves at its key (`None`: removed).
fn desired(op: &Op) -> Option<Endpoint> {
    match op {
        Op::Register(e) => Some(e.clone()),
        Op::Deregister(_) => None,
    }
}

/// `op` as a change to publish; the version is replaced by the cache's own.
fn event(op: &Op) -> Event {
    match op {
        Op::Register(endpoint) => Event::Added {
            version: waypost::Version::ZERO,
            endpoint: endpoint.clone(),
        },
        Op::Deregister(key) => Event::Removed {
            version: waypost::Version::ZERO,
            key: key.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use waypost::memory::MemoryRegistry;
    use waypost::testing::{ep, eventually};

    use super::*;

    /// A write committed and echoed before it is confirmed: the confirmation
    /// shows nothing more, and the key's next change from the source is
    /// not held back behind it.
    #[tokio::test]
    async fn an_echo_before_the_confirmation_ends_the_hold() {
        let inner = MemoryRegistry::new();
        let (cache, overlay) = Overlay::cache(inner.clone(), CachedConfig::default()).unwrap();
        cache.wait_until_ready().await;
        let e = ep("api", "a", 80);
        let op = Op::Register(e.clone());
        overlay.hold(std::slice::from_ref(&op));
        assert_eq!(
            cache.store().list("api"),
            Some(Vec::new()),
            "held, not shown"
        );
        inner.register(e.clone()).await.unwrap();
        eventually("the echo", || async {
            (cache.store().list("api") == Some(vec![e.clone()])).then_some(())
        })
        .await;
        assert!(overlay.confirm(&[op]).is_empty());
        inner.deregister(&e.key()).await.unwrap();
        eventually("the source's removal", || async {
            (cache.store().list("api") == Some(Vec::new())).then_some(())
        })
        .await;
    }

    /// Confirmed before the echo: shown at once, and older news of the key
    /// is held back until the echo.
    #[tokio::test]
    async fn a_confirmation_before_the_echo_shows_the_write() {
        let inner = MemoryRegistry::new();
        let (cache, overlay) = Overlay::cache(inner, CachedConfig::default()).unwrap();
        cache.wait_until_ready().await;
        let e = ep("api", "a", 80);
        let op = Op::Register(e.clone());
        overlay.hold(std::slice::from_ref(&op));
        assert_eq!(overlay.confirm(&[op]).len(), 1);
        assert_eq!(cache.store().list("api"), Some(vec![e]));
    }
}
