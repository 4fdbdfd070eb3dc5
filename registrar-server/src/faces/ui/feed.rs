//! One page's event stream: the registrar's state as Server-Sent Events.
//!
//! Events (each `data` is one JSON object):
//!
//! - `status`: the registrar itself ([`StatusMsg`]), at once and every
//!   second; before the backend is open, the only event.
//! - `snapshot`: every endpoint, in key order, in pages of the
//!   registrar's `snapshot_chunk` endpoints (`{version, endpoints: [...],
//!   last}`; an empty registry is one empty page), first on each
//!   subscription to the state, and again whenever the subscription had to
//!   be renewed (the page replaces what it held once the `last` page is
//!   in). A page is encoded only when the one before it is queued for the
//!   browser, so a large registry costs the server one page at a time.
//! - `upsert`: an endpoint added or changed (`{version, endpoint}`).
//! - `remove`: an endpoint removed (`{version, service, id}`).
//! - `problem`: the subscription failed (`{message}`); a fresh snapshot
//!   follows once it is renewed.
//!
//! Endpoints are [`waypost::Endpoint`]s in their serde form.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::response::sse::Event as SseEvent;
use futures::StreamExt;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use waypost::{Endpoint, Event, Version};
use waypost_registrar_client::Token;

use crate::engine::registrar::Registrar;
use crate::engine::registrar::Slot;
use crate::engine::status::{Readiness, Status};
use crate::metrics::{names, Open};

/// How often the status is sent (and a closed subscription renewed).
const TICK: Duration = Duration::from_secs(1);

/// The registrar's own state, as the page shows it.
#[derive(Debug, Serialize)]
pub(super) struct StatusMsg {
    /// The backend is open (the rest is empty until it is).
    opened: bool,
    /// Whether `/readyz` says ready.
    ready: bool,
    /// What `/readyz` says.
    readiness: String,
    /// The backend answers.
    backend_up: bool,
    /// How long it has not, in seconds.
    backend_down_secs: Option<u64>,
    /// Writes waiting for the backend.
    write_queue_depth: usize,
    /// The queue's capacity.
    write_queue_capacity: usize,
    /// Open `WatchEndpoints` streams (connected agents).
    agent_streams: usize,
    /// This run's epoch.
    epoch: Option<u64>,
    /// The token of the current state.
    version: Option<String>,
    /// How stale the state may be (zero while the backend's feed
    /// delivers), in seconds; `None` before the first snapshot.
    cache_age_secs: Option<f64>,
    /// When this replica last accepted each node's heartbeat, in
    /// milliseconds since the Unix epoch.
    heartbeats: BTreeMap<String, u64>,
    /// The server's clock, in the same unit (ages are computed from it).
    now_ms: u64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl StatusMsg {
    fn new(status: &Status, registrar: Option<&Registrar>) -> Self {
        let (ready, readiness) = match status.readiness() {
            Readiness::Ready(text) => (true, text),
            Readiness::NotReady(text) => (false, text),
        };
        let down = status.down_for();
        let mut msg = Self {
            opened: registrar.is_some(),
            ready,
            readiness,
            backend_up: down.is_none(),
            backend_down_secs: down.map(|d| d.as_secs()),
            write_queue_depth: 0,
            write_queue_capacity: 0,
            agent_streams: 0,
            epoch: None,
            version: None,
            cache_age_secs: None,
            heartbeats: BTreeMap::new(),
            now_ms: unix_ms(SystemTime::now()),
        };
        if let Some(r) = registrar {
            msg.write_queue_depth = r.queue_depth();
            msg.write_queue_capacity = r.config().write_queue_capacity;
            msg.agent_streams = r.watch_stats().streams;
            msg.epoch = Some(r.epoch());
            msg.version = Some(r.token().to_string());
            msg.cache_age_secs = r.state().cache_age().map(|d| d.as_secs_f64());
            msg.heartbeats = r
                .heartbeats()
                .into_iter()
                .map(|(node, at)| (node, unix_ms(at)))
                .collect();
        }
        msg
    }
}

#[derive(Serialize)]
struct SnapshotMsg<'a> {
    version: String,
    endpoints: Vec<&'a Endpoint>,
    /// The snapshot's last page.
    last: bool,
}

#[derive(Serialize)]
struct UpsertMsg<'a> {
    version: String,
    endpoint: &'a Endpoint,
}

#[derive(Serialize)]
struct RemoveMsg<'a> {
    version: String,
    service: &'a str,
    id: &'a str,
}

#[derive(Serialize)]
struct ProblemMsg {
    message: String,
}

/// Where one page's events go; sending fails once the page is gone or the
/// server stops.
struct Page {
    tx: mpsc::Sender<SseEvent>,
    stop: watch::Receiver<bool>,
}

impl Page {
    /// Send `data` as the event `name`; `false` when the stream is over.
    async fn send(&mut self, name: &str, data: &impl Serialize) -> bool {
        let json = match serde_json::to_string(data) {
            Ok(json) => json,
            Err(e) => {
                tracing::warn!(event = name, error = %e, "cannot encode a dashboard event");
                return true;
            }
        };
        let ev = SseEvent::default().event(name).data(json);
        tokio::select! {
            sent = self.tx.send(ev) => sent.is_ok(),
            () = stopped(&mut self.stop) => false,
        }
    }

    /// Wait `d`; `false` when the stream is over meanwhile.
    async fn pause(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = stopped(&mut self.stop) => false,
            () = self.tx.closed() => false,
        }
    }
}

/// Resolves once the server stops (or its stop signal is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Feed one page until it goes away or the server stops.
pub(super) async fn run(
    status: Arc<Status>,
    slot: Slot,
    stop: watch::Receiver<bool>,
    tx: mpsc::Sender<SseEvent>,
) {
    let mut page = Page { tx, stop };
    let _open = Open::new(names::HTTP_SSE_STREAMS, "/ui/events");
    // Before the backend is open there is only the status to show.
    let registrar = loop {
        if let Some(r) = slot.get() {
            break Arc::clone(r);
        }
        if !page.send("status", &StatusMsg::new(&status, None)).await || !page.pause(TICK).await {
            return;
        }
    };
    let token = |version: Version| {
        Token {
            epoch: registrar.epoch(),
            version,
        }
        .to_string()
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = registrar.state().store().watch(None);
    loop {
        let mut stop = page.stop.clone();
        let next = tokio::select! {
            () = stopped(&mut stop) => return,
            _ = tick.tick() => {
                let msg = StatusMsg::new(registrar.status(), Some(&registrar));
                if !page.send("status", &msg).await {
                    return;
                }
                continue;
            }
            next = events.next() => next,
        };
        let sent = match next {
            Some(Ok(Event::Snapshot(snap))) => {
                let version = token(snap.version());
                let chunk = registrar.config().snapshot_chunk.max(1);
                let mut after = None;
                loop {
                    let (endpoints, last) = snap.page(after.as_ref(), chunk);
                    let next = endpoints.last().map(|e| e.key());
                    let msg = SnapshotMsg {
                        version: version.clone(),
                        endpoints,
                        last,
                    };
                    if !page.send("snapshot", &msg).await {
                        break false;
                    }
                    if last {
                        break true;
                    }
                    after = next;
                }
            }
            Some(Ok(Event::Added { version, endpoint }))
            | Some(Ok(Event::Updated { version, endpoint })) => {
                let msg = UpsertMsg {
                    version: token(version),
                    endpoint: &endpoint,
                };
                page.send("upsert", &msg).await
            }
            Some(Ok(Event::Removed { version, key })) => {
                let msg = RemoveMsg {
                    version: token(version),
                    service: &key.service,
                    id: &key.id,
                };
                page.send("remove", &msg).await
            }
            // Cut off (too slow a page) or the state's feed failed: start
            // again from a fresh snapshot.
            Some(Err(e)) => {
                let msg = ProblemMsg {
                    message: e.to_string(),
                };
                let sent = page.send("problem", &msg).await && page.pause(TICK).await;
                events = registrar.state().store().watch(None);
                sent
            }
            None => {
                let sent = page.pause(TICK).await;
                events = registrar.state().store().watch(None);
                sent
            }
        };
        if !sent {
            return;
        }
    }
}
