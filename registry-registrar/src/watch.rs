//! The registrar's `WatchEndpoints` stream as registry events: the
//! [`RpcClient`]'s [`Watch`], and the decoder that assembles chunked
//! snapshots, checks epochs and hands refusals to the client.

use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt};
use tokio::sync::{broadcast, watch};
use waypost::{Endpoint, Error, Event, EventStream, Op, Result, Snapshot, Version, Watch};

use crate::digest::merge_partial;
use crate::error::error_from_status;
use crate::layout::{endpoint_from_proto, key_from_parts, Token};
use crate::proto::registrar::v1::endpoint_event::EventType;
use crate::proto::registrar::v1::{EndpointEvent, WatchEndpointsRequest, WriteRefusal};
use crate::rpc::{RpcClient, StreamRefusal};

/// Turns the registrar's events into ours, assembling chunked snapshots.
struct Decoder {
    buffered: Vec<Endpoint>,
    /// The snapshot being assembled is partial (`snapshot_partial`).
    partial: bool,
    /// What this stream's request summarized: what a partial snapshot
    /// applies to.
    base: Option<Snapshot>,
    /// What the client holds after the events decoded so far.
    mirror: Arc<Mutex<Option<Snapshot>>>,
    epoch: Arc<watch::Sender<Option<u64>>>,
    connected: Arc<watch::Sender<u64>>,
    refusals: broadcast::Sender<StreamRefusal>,
    addr: String,
    announced: bool,
}

impl Decoder {
    fn decode(&mut self, ev: EndpointEvent) -> Result<Option<Event>> {
        let token: Token = ev.version.parse()?;
        let out = match EventType::try_from(ev.r#type) {
            Ok(EventType::FullSnapshot) => {
                self.partial |= ev.snapshot_partial;
                for (i, p) in ev.snapshot_endpoints.into_iter().enumerate() {
                    self.buffered.push(endpoint_from_proto(
                        p,
                        &format!("snapshot_endpoints[{i}]."),
                    )?);
                }
                if !ev.snapshot_last {
                    return Ok(None);
                }
                self.epoch.send_replace(Some(token.epoch));
                let eps = std::mem::take(&mut self.buffered);
                if std::mem::take(&mut self.partial) {
                    let base = self.base.take().ok_or_else(|| {
                        Error::internal(
                            "registrar sent a partial snapshot to a client holding nothing",
                        )
                    })?;
                    let removed = &ev.snapshot_removed_services;
                    Event::Snapshot(merge_partial(&base, token.version, eps, removed))
                } else {
                    Event::Snapshot(Snapshot::from_endpoints(token.version, eps))
                }
            }
            Ok(kind) => {
                if *self.epoch.borrow() != Some(token.epoch) {
                    return Err(Error::internal(format!(
                        "registrar sent version {token} of another epoch without a snapshot"
                    )));
                }
                let p = ev.endpoint.ok_or_else(|| {
                    Error::internal("registrar sent an event without an endpoint")
                })?;
                let event = match kind {
                    EventType::EndpointRemoved => Event::Removed {
                        version: token.version,
                        key: key_from_parts(p.service_name, p.id)?,
                    },
                    EventType::EndpointAdded => Event::Added {
                        version: token.version,
                        endpoint: endpoint_from_proto(p, "endpoint.")?,
                    },
                    _ => Event::Updated {
                        version: token.version,
                        endpoint: endpoint_from_proto(p, "endpoint.")?,
                    },
                };
                if let Some(r) = ev.refusal {
                    self.refusal(r, &event)?;
                }
                event
            }
            Err(_) => {
                return Err(Error::internal(format!(
                    "registrar sent unknown event type {}",
                    ev.r#type
                )))
            }
        };
        self.remember(&out);
        if !self.announced {
            self.announced = true;
            self.connected.send_modify(|n| *n += 1);
        }
        Ok(Some(out))
    }
}

impl Decoder {
    /// Keep what the client holds after `event`, for the next stream's
    /// summary. A change no newer than what is held (another stream of
    /// this client sent it already) is not applied twice.
    fn remember(&self, event: &Event) {
        let mut held = self.mirror.lock().unwrap_or_else(|p| p.into_inner());
        match (event, held.as_mut()) {
            (Event::Snapshot(snap), _) => *held = Some(snap.clone()),
            (delta, Some(snap)) if delta.version() > snap.version() => snap.apply(delta),
            _ => {}
        }
    }

    /// Hand a refusal carried by `event` (its undo) to the client.
    fn refusal(&self, r: WriteRefusal, event: &Event) -> Result<()> {
        let restored = match event {
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                Op::Register(endpoint.clone())
            }
            Event::Removed { key, .. } => Op::Deregister(key.clone()),
            Event::Snapshot(_) => return Ok(()),
        };
        let refused = match r.refused {
            Some(p) => Op::Register(endpoint_from_proto(p, "refusal.refused.")?),
            None => Op::Deregister(restored.key()),
        };
        let status = tonic::Status::new(tonic::Code::from(r.code), r.message);
        let error = error_from_status(&status, &self.addr);
        // No receiver (no client listening) is fine.
        let _ = self.refusals.send(StreamRefusal {
            refused,
            restored,
            error,
        });
        Ok(())
    }
}

impl Watch for RpcClient {
    fn watch(&self, from: Option<Version>) -> EventStream {
        let last_version = match (from, *self.epoch.borrow()) {
            (Some(version), Some(epoch)) => Token { epoch, version }.to_string(),
            _ => String::new(),
        };
        // Resuming: say what is held too, for a registrar of another epoch.
        let base = match from {
            Some(_) => self.held.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            None => None,
        };
        let held = base.as_ref().and_then(|snap| self.digests.held(snap));
        // With its total, which spares a registrar that holds the same the
        // reading of the summary.
        let held_total = base
            .as_ref()
            .filter(|_| held.is_some())
            .map(|snap| self.digests.total(snap));
        let req = WatchEndpointsRequest {
            cluster_name: self.cfg.cluster_name.clone(),
            node_name: self.cfg.node_name.clone(),
            last_version,
            held,
            held_total,
        };
        let mut grpc = self.grpc.clone();
        let addr = self.cfg.address.clone();
        let mut decoder = Decoder {
            buffered: Vec::new(),
            partial: false,
            base,
            mirror: Arc::clone(&self.held),
            epoch: Arc::clone(&self.epoch),
            connected: Arc::clone(&self.connected),
            refusals: self.refusals.clone(),
            addr: self.cfg.address.clone(),
            announced: false,
        };
        stream::once(async move { grpc.watch_endpoints(req).await })
            .flat_map(move |res| match res {
                Ok(resp) => resp.into_inner().boxed(),
                Err(status) => stream::once(async move { Err(status) }).boxed(),
            })
            .filter_map(move |item| {
                let out = match item {
                    Ok(ev) => decoder.decode(ev).transpose(),
                    Err(status) => Some(Err(error_from_status(&status, &addr))),
                };
                futures::future::ready(out)
            })
            .boxed()
    }
}
