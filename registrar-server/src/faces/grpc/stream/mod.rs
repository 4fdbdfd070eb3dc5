//! One agent's `WatchEndpoints` stream: the registrar's events as protobuf
//! messages, with the first snapshot encoded lazily, one chunk each time
//! the transport asks for the next message.
//!
//! **Encoded once, sent to all.** With
//! [`StreamEncoding::Shared`](crate::engine::config::StreamEncoding) (the default) a delta
//! is encoded to protobuf by the first stream that sends it, and a snapshot
//! chunk of one version by the first stream that reaches it; every other
//! stream sends the same [`bytes::Bytes`] ([`shared`]). The stream yields
//! [`Frame`]s, which `WatchEndpoints`' own codec ([`codec`]) copies into
//! tonic's write buffer, so tonic still gathers what a lagging stream has
//! queued into one write (up to the codec's 8 KiB yield threshold,
//! [`codec::YIELD_THRESHOLD`]).
//! [`StreamEncoding::PerStream`](crate::engine::config::StreamEncoding) encodes every
//! message for every stream, as before; it is kept to measure against.
//!
//! What a stream holds, so what a client that never reads costs:
//!
//! - **Its snapshot**: a [`Snapshot`] (a persistent map, shared with the
//!   registrar's state and every other stream of the same version) and a
//!   cursor ([`cursor`]: the last key sent). A message of at most
//!   [`RegistrarConfig::snapshot_chunk`](crate::engine::config::RegistrarConfig) endpoints
//!   and [`RegistrarConfig::snapshot_chunk_bytes`](crate::engine::config::RegistrarConfig)
//!   bytes (16 KiB by default) is encoded (or taken from the shared memo)
//!   only when tonic polls for the next message. Tonic polls when hyper
//!   asks for the next body chunk, and hyper asks as long as HTTP/2 has
//!   queued less than the client's flow-control window; once the queue
//!   reaches the window, hyper holds one more body chunk and waits for
//!   the window to open. So beyond what the window took, a stream that
//!   never reads holds the rest of one tonic batch queued in HTTP/2 and
//!   one batch in hyper, each at most the codec's yield threshold plus
//!   one message: under 64 KiB at the defaults, whatever the size of the
//!   registry. The shared memo is held by the registrar, not the stream:
//!   at most one snapshot's chunks (the newest a stream is sending), freed
//!   when no stream sends that snapshot any more.
//! - **Its deltas**: at most
//!   [`RegistrarConfig::agent_buffer`](crate::engine::config::RegistrarConfig) events
//!   (1024 by default) queued behind the snapshot; one more and the stream
//!   is cut off with `RESOURCE_EXHAUSTED` (the agent reconnects and resumes
//!   from its last version, or gets a fresh snapshot). A stream on the
//!   registrar's one feed ([`fanout`], the default) holds only its place
//!   in the feed's channel, which keeps each change once for all streams
//!   (and cuts off a stream more than `agent_buffer`, rounded up to a power
//!   of two, behind). A stream with a subscription of its own (resuming
//!   from an older version, or a baseline encoding) has its own queue, and
//!   the registrar keeps the encodings of the last
//!   [`encodings::DELTA_WINDOW`] events for those streams together.
//!
//! The messages on the wire are the ones the proto documents: a snapshot is
//! one or more `FULL_SNAPSHOT` events in key order, each of at most
//! `snapshot_chunk` endpoints and `snapshot_chunk_bytes` bytes (a single
//! larger endpoint is a message of its own), the last (or the only, empty
//! one) with `snapshot_last` set.
//! For an agent that could not be resumed by version and said what it
//! holds (`held`), the first snapshot holds only the services whose
//! digest differs ([`waypost_registrar_client::Digests`]), each chunk flagged
//! `snapshot_partial`. When the agent's total (`held_total`) is the
//! registrar's own for that snapshot, the answer is the empty partial
//! snapshot and the summary is not read; agents holding the same as one
//! answered before get that answer again, its messages encoded once for
//! all of them ([`request`]).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::Status;
use waypost::{Endpoint, Error, Event, EventStream, Op, Snapshot, Version};
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::{EndpointEvent, WriteRefusal};
use waypost_registrar_client::proto::registry::v1::ServiceEndpoint;
use waypost_registrar_client::{endpoint_to_proto, status_from_error, Digests, Token};

use crate::engine::config::StreamEncoding;
use crate::engine::registrar::Registrar;

pub(crate) mod codec;
mod cursor;
pub(crate) mod encodings;
pub(crate) mod fanout;
pub(crate) mod request;

pub(crate) use codec::Frame;
use cursor::{ChunkBounds, Cursor};
use fanout::{Feed, Item};
use request::Held;

use crate::engine::streams::StreamGuard;
use crate::metrics::names;

/// Where a stream's events come from.
enum Source {
    /// A subscription of its own to the registrar's state.
    Own(EventStream),
    /// The registrar's one feed ([`fanout`]).
    Feed(Feed),
    /// Cut off: nothing more.
    Ended,
}

/// `registrar_event_broadcast_total`, one handle per type (looked up once
/// per stream, not once per message).
struct Broadcasts([metrics::Counter; 4]);

impl Broadcasts {
    const TYPES: [&'static str; 4] = [
        "full_snapshot",
        "endpoint_added",
        "endpoint_removed",
        "endpoint_updated",
    ];

    fn new() -> Self {
        Self(Self::TYPES.map(|t| metrics::counter!(names::EVENT_BROADCAST_TOTAL, "type" => t)))
    }

    fn count(&self, label: &str) {
        if let Some(i) = Self::TYPES.iter().position(|t| *t == label) {
            self.0[i].increment(1);
        }
    }
}

/// What the gRPC face's streams share: the one feed of the registrar's
/// state ([`fanout`]) and the encodings ([`shared`]).
pub(crate) struct Feeds {
    pub(crate) fanout: Arc<fanout::Fanout>,
    pub(crate) encodings: Arc<encodings::Encodings>,
    /// The services' content digests, for agents resuming by content.
    pub(crate) digests: Digests,
    /// The last partial snapshot sent to an agent resuming by content.
    pub(crate) partials: request::Partials,
}

impl Feeds {
    /// The feeds of `registrar`'s state (observed from now on).
    pub(crate) fn of(registrar: &Registrar) -> Self {
        let fanout = Arc::new(fanout::Fanout::new(registrar.config().agent_buffer));
        registrar.state().store().observe(Arc::clone(&fanout) as _);
        Self {
            fanout,
            encodings: Arc::default(),
            digests: Digests::new(),
            partials: request::Partials::default(),
        }
    }
}

/// One agent's stream of `EndpointEvent`s (see the module docs).
pub(crate) struct AgentStream {
    source: Source,
    registrar: Arc<Registrar>,
    feeds: Arc<Feeds>,
    epoch: u64,
    chunk: ChunkBounds,
    encoding: StreamEncoding,
    snapshot: Option<Cursor>,
    /// What the agent holds, when it could not resume by version: its
    /// first snapshot is then only what differs.
    held: Option<Held>,
    guard: StreamGuard,
    broadcasts: Broadcasts,
}

impl AgentStream {
    /// The messages for `events`, a watch of `registrar`'s state, encoded
    /// as `encoding` says.
    pub(crate) fn new(
        registrar: Arc<Registrar>,
        feeds: Arc<Feeds>,
        events: EventStream,
        encoding: StreamEncoding,
    ) -> Self {
        Self::from_source(registrar, feeds, Source::Own(events), encoding)
    }

    /// Send only what differs from `held` (an agent's summary) in place
    /// of the first snapshot.
    pub(crate) fn holding(mut self, held: Option<Held>) -> Self {
        let Some(held) = held else { return self };
        self.held = Some(held);
        // A fed stream's first snapshot is already in place: begun again.
        if let Some(cursor) = self.snapshot.take() {
            self.begin_snapshot(cursor.snap);
        }
        self
    }

    /// The messages of the registrar's feed: `first` (unless resuming),
    /// then what `feed` brings after it. Always shared encoding.
    pub(crate) fn fed(
        registrar: Arc<Registrar>,
        feeds: Arc<Feeds>,
        first: Option<Snapshot>,
        feed: Feed,
    ) -> Self {
        let mut stream =
            Self::from_source(registrar, feeds, Source::Feed(feed), StreamEncoding::Shared);
        if let Some(snap) = first {
            stream.begin_snapshot(snap);
        }
        stream
    }

    fn from_source(
        registrar: Arc<Registrar>,
        feeds: Arc<Feeds>,
        source: Source,
        encoding: StreamEncoding,
    ) -> Self {
        let guard = StreamGuard::new(Arc::clone(registrar.stream_counters()));
        Self {
            source,
            feeds,
            epoch: registrar.epoch(),
            chunk: ChunkBounds::of(registrar.config()),
            encoding,
            registrar,
            snapshot: None,
            held: None,
            guard,
            broadcasts: Broadcasts::new(),
        }
    }

    fn token(&self, version: Version) -> String {
        Token {
            epoch: self.epoch,
            version,
        }
        .to_string()
    }

    /// A delta as its protobuf message, with the refusal it undoes if any;
    /// `gone` gives what a removal took away.
    fn delta(&self, ev: &Event, gone: impl FnOnce() -> Option<Endpoint>) -> EndpointEvent {
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
                (EventType::EndpointAdded, endpoint_to_proto(endpoint))
            }
            Event::Updated { endpoint, .. } => {
                (EventType::EndpointUpdated, endpoint_to_proto(endpoint))
            }
            // The last endpoint stored under the key, so that a client
            // tracking endpoints by address knows which one went; only
            // the service and id when the state no longer remembers it.
            Event::Removed { key, .. } => (
                EventType::EndpointRemoved,
                match gone() {
                    Some(gone) => endpoint_to_proto(&gone),
                    None => ServiceEndpoint {
                        service_name: key.service.clone(),
                        id: key.id.clone(),
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
            refusal,
            ..Default::default()
        }
    }

    /// A delta as a frame: shared with every stream that sends the same
    /// event, or this stream's own.
    fn delta_frame(&self, ev: &Event) -> Frame {
        let gone = || match ev {
            Event::Removed { version, key } => {
                self.registrar.state().store().removed(*version, key)
            }
            _ => None,
        };
        if !self.encoding.shares_encodings() {
            self.registrar.stream_counters().encoded(1);
            return Frame::Own(Box::new(self.delta(ev, gone)));
        }
        let (bytes, encoded) = self
            .feeds
            .encodings
            .delta(ev, || codec::encode(&self.delta(ev, gone)));
        if encoded {
            self.registrar.stream_counters().encoded(1);
        }
        Frame::Shared(bytes)
    }

    /// A change from the feed as a frame, encoded once for every stream.
    fn fed_frame(&self, delta: &fanout::Delta) -> Frame {
        let (bytes, encoded) =
            delta.bytes(|| codec::encode(&self.delta(&delta.event, || delta.gone.clone())));
        if encoded {
            self.registrar.stream_counters().encoded(1);
        }
        Frame::Shared(bytes)
    }

    /// The next chunk of the snapshot being sent, if any.
    fn next_chunk(&mut self) -> Option<Frame> {
        let cursor = self.snapshot.as_mut()?;
        let (frame, bytes, encoded) = cursor.next(self.chunk, self.encoding);
        let left = cursor.left as u64;
        if left == 0 {
            self.snapshot = None;
        }
        self.guard.set_pending(left);
        self.broadcasts.count("full_snapshot");
        let counters = &self.registrar.stream_counters();
        if encoded {
            counters.encoded(1);
        }
        counters.chunks.fetch_add(1, Ordering::Relaxed);
        counters.bytes.fetch_add(bytes, Ordering::Relaxed);
        metrics::counter!(names::SNAPSHOT_BYTES_TOTAL).increment(bytes);
        Some(frame)
    }

    /// Start sending `snap`: its first chunk.
    fn start_snapshot(&mut self, snap: Snapshot) -> Option<Frame> {
        self.begin_snapshot(snap);
        // Never `None`: even an empty snapshot is one message.
        self.next_chunk()
    }

    /// Make `snap` the snapshot to send next: only what differs from
    /// what the agent holds, when it said.
    fn begin_snapshot(&mut self, snap: Snapshot) {
        let version = self.token(snap.version());
        let shares = self.encoding.shares_encodings();
        let (snap, partial, memo) = match self.held.take() {
            Some(held) => match held.answer(&self.feeds.digests, &self.feeds.partials, &snap) {
                Ok(answer) => {
                    tracing::debug!(
                        endpoints = answer.partial.len(),
                        removed = answer.removed.len(),
                        reading = ?answer.reading,
                        "agent resumed by content"
                    );
                    // Shared with the agents answered the same, if any.
                    let memo = answer.memo.filter(|_| shares);
                    (answer.partial, Some(answer.removed), memo)
                }
                // Not a summary: what a request without one gets.
                Err(error) => {
                    tracing::warn!(%error, "an agent's summary does not decode: a full snapshot");
                    let memo = shares.then(|| self.feeds.encodings.snapshot_memo(&snap));
                    (snap, None, memo.flatten())
                }
            },
            None => {
                let memo = shares.then(|| self.feeds.encodings.snapshot_memo(&snap));
                (snap, None, memo.flatten())
            }
        };
        let left = snap.len();
        self.snapshot = Some(Cursor {
            version,
            snap,
            last: None,
            left,
            index: 0,
            memo,
            partial,
        });
        self.guard.set_pending(left as u64);
    }

    /// The next message from this stream's own subscription.
    fn poll_own(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame, Status>>> {
        let Source::Own(events) = &mut self.source else {
            return Poll::Ready(None);
        };
        Poll::Ready(match std::task::ready!(events.poll_next_unpin(cx)) {
            None => None,
            Some(Err(e)) => Some(Err(status_from_error(&e))),
            Some(Ok(Event::Snapshot(snap))) => self.start_snapshot(snap).map(Ok),
            Some(Ok(delta)) => {
                self.broadcasts.count(type_label(&delta));
                Some(Ok(self.delta_frame(&delta)))
            }
        })
    }

    /// The next message from the registrar's feed.
    fn poll_feed(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame, Status>>> {
        loop {
            let Source::Feed(feed) = &mut self.source else {
                return Poll::Ready(None);
            };
            let item = match std::task::ready!(feed.rx.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(item)) => item,
                Some(Err(BroadcastStreamRecvError::Lagged(_))) => {
                    self.source = Source::Ended;
                    let capacity = self.registrar.config().agent_buffer;
                    return Poll::Ready(Some(Err(status_from_error(&Error::overloaded(format!(
                        "watch stream fell more than {capacity} events behind and was cut \
                             off; resubscribe to get a fresh snapshot"
                    ))))));
                }
            };
            match &*item {
                Item::Delta(d) if d.event.version() <= feed.after => continue,
                Item::Delta(d) => {
                    self.broadcasts.count(type_label(&d.event));
                    return Poll::Ready(Some(Ok(self.fed_frame(d))));
                }
                Item::Snapshot(snap) => {
                    feed.after = snap.version();
                    let snap = snap.clone();
                    return Poll::Ready(self.start_snapshot(snap).map(Ok));
                }
                Item::Failed(e) => {
                    self.source = Source::Ended;
                    return Poll::Ready(Some(Err(status_from_error(e))));
                }
            }
        }
    }
}

impl Stream for AgentStream {
    type Item = Result<Frame, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(frame) = this.next_chunk() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match this.source {
            Source::Own(_) => this.poll_own(cx),
            Source::Feed(_) => this.poll_feed(cx),
            Source::Ended => Poll::Ready(None),
        }
    }
}

fn type_label(ev: &Event) -> &'static str {
    match ev {
        Event::Snapshot(_) => "full_snapshot",
        Event::Added { .. } => "endpoint_added",
        Event::Removed { .. } => "endpoint_removed",
        Event::Updated { .. } => "endpoint_updated",
    }
}
