//! The registrar's `WatchEndpoints` stream as registry events: the
//! [`RpcClient`]'s [`Watch`], and the decoder that assembles chunked
//! snapshots, checks epochs and hands refusals to the client.

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use registry_api::{Endpoint, Error, Event, EventStream, Op, Result, Snapshot, Version, Watch};
use tokio::sync::{broadcast, watch};

use crate::error::error_from_status;
use crate::layout::{endpoint_from_proto, key_from_parts, Token};
use crate::proto::registrar::v1::endpoint_event::EventType;
use crate::proto::registrar::v1::{EndpointEvent, WatchEndpointsRequest, WriteRefusal};
use crate::rpc::{RpcClient, StreamRefusal};

/// Turns the registrar's events into ours, assembling chunked snapshots.
struct Decoder {
    buffered: Vec<Endpoint>,
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
                Event::Snapshot(Snapshot::from_endpoints(token.version, eps))
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
        if !self.announced {
            self.announced = true;
            self.connected.send_modify(|n| *n += 1);
        }
        Ok(Some(out))
    }
}

impl Decoder {
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
        let req = WatchEndpointsRequest {
            cluster_name: self.cfg.cluster_name.clone(),
            node_name: self.cfg.node_name.clone(),
            last_version,
        };
        let mut grpc = self.grpc.clone();
        let addr = self.cfg.address.clone();
        let mut decoder = Decoder {
            buffered: Vec::new(),
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
