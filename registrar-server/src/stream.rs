//! One agent's `WatchEndpoints` stream: the registrar's events as protobuf
//! messages, with the first snapshot encoded lazily, one chunk each time
//! the transport asks for the next message.
//!
//! What a stream holds, so what a client that never reads costs:
//!
//! - **Its snapshot**: a [`Snapshot`] (a persistent map, shared with the
//!   registrar's state and every other stream of the same version) and a
//!   cursor (the last key sent). A chunk of at most
//!   [`RegistrarConfig::snapshot_chunk`](crate::RegistrarConfig) endpoints
//!   is encoded only when tonic polls for the next message, which it does
//!   only once hyper has sent what it had and the client's HTTP/2
//!   flow-control window has room. Beyond the window the transport holds
//!   at most two tonic batches (each under 32 KiB plus one chunk), so a
//!   stream that never reads costs its client's window plus about two
//!   chunks, whatever the size of the registry.
//! - **Its deltas**: at most
//!   [`RegistrarConfig::agent_buffer`](crate::RegistrarConfig) events
//!   (1024 by default) queued behind the snapshot; one more and the stream
//!   is cut off with `RESOURCE_EXHAUSTED` (the agent reconnects and resumes
//!   from its last version, or gets a fresh snapshot).
//!
//! The messages on the wire are the ones the proto documents: a snapshot is
//! one or more `FULL_SNAPSHOT` events of `snapshot_chunk` endpoints in key
//! order, the last (or the only, empty one) with `snapshot_last` set.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use prost::Message;
use registry_api::{EndpointKey, Event, EventStream, Op, Snapshot, Version};
use registry_registrar::proto::registrar::v1::endpoint_event::EventType;
use registry_registrar::proto::registrar::v1::{EndpointEvent, WriteRefusal};
use registry_registrar::proto::registry::v1::ServiceEndpoint;
use registry_registrar::{endpoint_to_proto, status_from_error, Token};
use tonic::Status;

use crate::Registrar;

/// Counters of the registrar's watch streams ([`Registrar::watch_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WatchStats {
    /// Open `WatchEndpoints` streams.
    pub streams: usize,
    /// `FULL_SNAPSHOT` messages encoded since the start.
    pub snapshot_chunks: u64,
    /// Their encoded size in bytes.
    pub snapshot_bytes: u64,
    /// Endpoints of first snapshots that open streams have not encoded yet.
    pub pending_endpoints: u64,
}

/// The live counters behind [`WatchStats`], mirrored to the metrics.
#[derive(Debug, Default)]
pub(crate) struct StreamCounters {
    streams: AtomicUsize,
    chunks: AtomicU64,
    bytes: AtomicU64,
    pending: AtomicU64,
}

impl StreamCounters {
    pub(crate) fn stats(&self) -> WatchStats {
        WatchStats {
            streams: self.streams.load(Ordering::Relaxed),
            snapshot_chunks: self.chunks.load(Ordering::Relaxed),
            snapshot_bytes: self.bytes.load(Ordering::Relaxed),
            pending_endpoints: self.pending.load(Ordering::Relaxed),
        }
    }

    fn add_pending(&self, n: u64) {
        self.pending.fetch_add(n, Ordering::Relaxed);
        metrics::gauge!("registrar_snapshot_pending_endpoints").increment(n as f64);
    }

    fn sub_pending(&self, n: u64) {
        self.pending.fetch_sub(n, Ordering::Relaxed);
        metrics::gauge!("registrar_snapshot_pending_endpoints").decrement(n as f64);
    }
}

/// Counts an open stream (and the endpoints its unsent snapshot holds)
/// while alive.
struct StreamGuard {
    counters: Arc<StreamCounters>,
    pending: u64,
}

impl StreamGuard {
    fn new(counters: Arc<StreamCounters>) -> Self {
        counters.streams.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!("registrar_connected_agents").increment(1.0);
        Self {
            counters,
            pending: 0,
        }
    }

    fn set_pending(&mut self, n: u64) {
        if n > self.pending {
            self.counters.add_pending(n - self.pending);
        } else if n < self.pending {
            self.counters.sub_pending(self.pending - n);
        }
        self.pending = n;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.set_pending(0);
        self.counters.streams.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("registrar_connected_agents").decrement(1.0);
    }
}

/// Where a stream is in sending one snapshot.
struct Cursor {
    snap: Snapshot,
    version: String,
    /// The last key sent; `None` before the first chunk.
    last: Option<EndpointKey>,
    /// Endpoints not sent yet.
    left: usize,
}

impl Cursor {
    /// The next `FULL_SNAPSHOT` message (at most `chunk` endpoints) and
    /// whether it was the last.
    fn next_chunk(&mut self, chunk: usize) -> (EndpointEvent, bool) {
        let eps: Vec<ServiceEndpoint> = self
            .snap
            .after(self.last.as_ref())
            .take(chunk)
            .map(endpoint_to_proto)
            .collect();
        if let Some(p) = eps.last() {
            self.last = Some(EndpointKey::new(p.service_name.clone(), p.id.clone()));
        }
        self.left = self.left.saturating_sub(eps.len());
        let last = self.left == 0;
        let msg = EndpointEvent {
            r#type: EventType::FullSnapshot as i32,
            service_name: String::new(),
            protocol: 0,
            endpoint: None,
            version: self.version.clone(),
            snapshot_endpoints: eps,
            snapshot_last: last,
            refusal: None,
        };
        (msg, last)
    }
}

/// One agent's stream of `EndpointEvent`s (see the module docs).
pub(crate) struct AgentStream {
    events: EventStream,
    registrar: Arc<Registrar>,
    epoch: u64,
    chunk: usize,
    snapshot: Option<Cursor>,
    guard: StreamGuard,
}

impl AgentStream {
    /// The messages for `events`, a watch of `registrar`'s state.
    pub(crate) fn new(registrar: Arc<Registrar>, events: EventStream) -> Self {
        let guard = StreamGuard::new(Arc::clone(&registrar.streams));
        Self {
            events,
            epoch: registrar.epoch(),
            chunk: registrar.config().snapshot_chunk.max(1),
            registrar,
            snapshot: None,
            guard,
        }
    }

    fn token(&self, version: Version) -> String {
        Token {
            epoch: self.epoch,
            version,
        }
        .to_string()
    }

    /// A delta as its protobuf message, with the refusal it undoes if any.
    fn delta(&self, ev: Event) -> EndpointEvent {
        let version = self.token(ev.version());
        let refusal = self
            .registrar
            .refusal_at(ev.version())
            .map(|r| WriteRefusal {
                code: status_from_error(&r.error).code() as i32,
                message: r.error.to_string(),
                refused: match &r.op {
                    Op::Register(e) => Some(endpoint_to_proto(e)),
                    Op::Deregister(_) => None,
                },
            });
        let (ty, ep) = match ev {
            Event::Added { endpoint, .. } => {
                (EventType::EndpointAdded, endpoint_to_proto(&endpoint))
            }
            Event::Updated { endpoint, .. } => {
                (EventType::EndpointUpdated, endpoint_to_proto(&endpoint))
            }
            // The last endpoint stored under the key, so that a client
            // tracking endpoints by address knows which one went; only
            // the service and id when the state no longer remembers it.
            Event::Removed { version, key } => (
                EventType::EndpointRemoved,
                match self.registrar.state().store().removed(version, &key) {
                    Some(gone) => endpoint_to_proto(&gone),
                    None => ServiceEndpoint {
                        service_name: key.service,
                        id: key.id,
                        ..Default::default()
                    },
                },
            ),
            // Snapshots go through the cursor; never passed here.
            Event::Snapshot(_) => (EventType::FullSnapshot, ServiceEndpoint::default()),
        };
        EndpointEvent {
            r#type: ty as i32,
            service_name: ep.service_name.clone(),
            protocol: ep.protocol,
            endpoint: Some(ep),
            version,
            snapshot_endpoints: Vec::new(),
            snapshot_last: false,
            refusal,
        }
    }

    /// The next chunk of the snapshot being sent, if any.
    fn next_chunk(&mut self) -> Option<EndpointEvent> {
        let cursor = self.snapshot.as_mut()?;
        let (msg, last) = cursor.next_chunk(self.chunk);
        let left = cursor.left as u64;
        if last {
            self.snapshot = None;
        }
        self.guard.set_pending(left);
        let counters = &self.registrar.streams;
        counters.chunks.fetch_add(1, Ordering::Relaxed);
        let bytes = msg.encoded_len() as u64;
        counters.bytes.fetch_add(bytes, Ordering::Relaxed);
        metrics::counter!("registrar_snapshot_bytes_total").increment(bytes);
        Some(msg)
    }
}

impl Stream for AgentStream {
    type Item = Result<EndpointEvent, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let msg = match this.next_chunk() {
            Some(msg) => msg,
            None => match std::task::ready!(this.events.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(status_from_error(&e)))),
                Some(Ok(Event::Snapshot(snap))) => {
                    let left = snap.len();
                    this.snapshot = Some(Cursor {
                        version: this.token(snap.version()),
                        snap,
                        last: None,
                        left,
                    });
                    this.guard.set_pending(left as u64);
                    // Never `None`: even an empty snapshot is one message.
                    match this.next_chunk() {
                        Some(msg) => msg,
                        None => return Poll::Ready(None),
                    }
                }
                Some(Ok(delta)) => this.delta(delta),
            },
        };
        metrics::counter!("registrar_event_broadcast_total", "type" => type_label(msg.r#type))
            .increment(1);
        Poll::Ready(Some(Ok(msg)))
    }
}

fn type_label(ty: i32) -> &'static str {
    match EventType::try_from(ty) {
        Ok(EventType::FullSnapshot) => "full_snapshot",
        Ok(EventType::EndpointAdded) => "endpoint_added",
        Ok(EventType::EndpointRemoved) => "endpoint_removed",
        Ok(EventType::EndpointUpdated) => "endpoint_updated",
        Err(_) => "unknown",
    }
}
