//! `GET /v1/watch`: the registry as Server-Sent Events, the same snapshot
//! and changes as gRPC's `WatchEndpoints`.
//!
//! - `snapshot` events carry `{"version", "endpoints": [...], "last"}`:
//!   the whole registry in key order, in chunks of the registrar's
//!   `snapshot_chunk` endpoints, encoded only when the connection takes
//!   the next one. Every chunk but the last has an empty `id:` (a client
//!   cut off inside a snapshot reconnects without `Last-Event-ID` and gets
//!   a whole one); the last has the version's token as its `id:`.
//! - `added`, `updated` carry `{"version", "endpoint"}`, `removed`
//!   `{"version", "service", "id", "endpoint"}` (the endpoint last stored
//!   under the key when the registrar remembers it, else `null`), each with
//!   `id: <version>`; a change that undoes a write the backend refused
//!   carries `"refusal": {"error": "…"}`.
//! - `error` carries `{"error": "…"}` and ends the stream (a client that
//!   fell behind by more than the registrar's `agent_buffer` events).
//!
//! A client that reconnects with `Last-Event-ID: <version>` (as browsers'
//! `EventSource` do by themselves) gets the changes after it, or a fresh
//! snapshot when the registrar no longer holds them or restarted since.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use serde::Serialize;
use waypost::{Endpoint, EndpointKey, Event, EventStream, Snapshot, Version, Watch};
use waypost_registrar_client::Token;

use super::ApiError;
use crate::engine::registrar::Registrar;
use crate::metrics::{names, Open};

/// The header a reconnecting client names its last event in.
pub const LAST_EVENT_ID: &str = "last-event-id";

#[derive(Serialize)]
struct Chunk<'a> {
    version: &'a str,
    endpoints: Vec<&'a Endpoint>,
    last: bool,
}

#[derive(Serialize)]
struct Change<'a> {
    version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    endpoint: Option<&'a Endpoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<Refusal>,
}

#[derive(Serialize)]
struct Refusal {
    error: String,
}

#[derive(Serialize)]
struct Failure {
    error: String,
}

/// One SSE client's position: the snapshot being sent, if any.
struct Feed {
    registrar: Arc<Registrar>,
    events: EventStream,
    chunk: usize,
    /// The snapshot being sent and the last key sent from it.
    sending: Option<(Snapshot, Option<EndpointKey>)>,
    done: bool,
    /// This stream in `registrar_http_sse_streams` while it lasts.
    _open: Open,
}

impl Feed {
    fn token(&self, version: Version) -> String {
        Token {
            epoch: self.registrar.epoch(),
            version,
        }
        .to_string()
    }

    /// The next chunk of the snapshot being sent, if any.
    fn next_chunk(&mut self) -> Option<SseEvent> {
        let (snap, last) = self.sending.take()?;
        let version = self.token(snap.version());
        let (endpoints, done) = snap.page(last.as_ref(), self.chunk);
        let next = endpoints.last().map(|e| e.key());
        let data = json(&Chunk {
            version: &version,
            endpoints,
            last: done,
        });
        let event = SseEvent::default()
            .event("snapshot")
            .id(if done { version.as_str() } else { "" })
            .data(data);
        if !done {
            self.sending = Some((snap, next));
        }
        Some(event)
    }

    fn change(&self, ev: Event) -> SseEvent {
        let version = self.token(ev.version());
        let refusal = self.registrar.refusal_at(ev.version()).map(|r| Refusal {
            error: r.error.to_string(),
        });
        let data = match &ev {
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => json(&Change {
                version: &version,
                service: None,
                id: None,
                endpoint: Some(endpoint),
                refusal,
            }),
            Event::Removed { version: v, key } => {
                let gone = self.registrar.state().store().removed(*v, key);
                json(&Change {
                    version: &version,
                    service: Some(&key.service),
                    id: Some(&key.id),
                    endpoint: gone.as_ref(),
                    refusal,
                })
            }
            Event::Snapshot(_) => String::new(),
        };
        SseEvent::default()
            .event(ev.type_name())
            .id(&version)
            .data(data)
    }

    async fn next(mut self) -> Option<(SseEvent, Self)> {
        if self.done {
            return None;
        }
        if let Some(ev) = self.next_chunk() {
            return Some((ev, self));
        }
        let ev = match self.events.next().await? {
            Ok(Event::Snapshot(snap)) => {
                self.sending = Some((snap, None));
                self.next_chunk()?
            }
            Ok(change) => self.change(change),
            Err(e) => {
                self.done = true;
                SseEvent::default().event("error").data(json(&Failure {
                    error: e.to_string(),
                }))
            }
        };
        Some((ev, self))
    }
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode the event: {e}\"}}"))
}

/// `GET /v1/watch`: see the module docs. `?last_event_id=` stands in for
/// the header where a client cannot set it.
pub(super) async fn watch(
    State(registrar): State<Arc<Registrar>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let from_query = raw.as_deref().and_then(|raw| {
        raw.split('&')
            .find_map(|p| p.strip_prefix("last_event_id="))
            .map(str::to_string)
    });
    let last = headers
        .get(LAST_EVENT_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(from_query)
        .unwrap_or_default();
    let from = registrar.resume_from(last.trim());
    tracing::debug!(last_event_id = %last, resume = from.is_some(), "SSE client watching");
    let feed = Feed {
        events: registrar.state().watch(from),
        chunk: registrar.config().snapshot_chunk.max(1),
        registrar: Arc::clone(&registrar),
        sending: None,
        done: false,
        _open: Open::new(names::HTTP_SSE_STREAMS, "/v1/watch"),
    };
    let stream = futures::stream::unfold(feed, Feed::next)
        .map(Ok)
        .take_until(registrar.closing());
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
