//! Where a stream is in sending its first snapshot, and how the next
//! `FULL_SNAPSHOT` message is cut: at most
//! [`RegistrarConfig::snapshot_chunk`](crate::engine::config::RegistrarConfig) endpoints
//! and [`RegistrarConfig::snapshot_chunk_bytes`](crate::engine::config::RegistrarConfig)
//! encoded bytes, in key order after the last endpoint sent.

use prost::Message;
use waypost::{EndpointKey, Snapshot};
use waypost_registrar_client::endpoint_to_proto;
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::EndpointEvent;
use waypost_registrar_client::proto::registry::v1::ServiceEndpoint;

use super::codec::{self, Frame};
use super::encodings::{Chunk, MemoUse};
use crate::engine::config::StreamEncoding;

/// Where a stream is in sending one snapshot.
pub(super) struct Cursor {
    pub(super) snap: Snapshot,
    pub(super) version: String,
    /// The last key sent; `None` before the first chunk.
    pub(super) last: Option<EndpointKey>,
    /// Endpoints not sent yet.
    pub(super) left: usize,
    /// Chunks sent.
    pub(super) index: usize,
    /// The chunks other streams of this snapshot encoded (shared encoding).
    pub(super) memo: Option<MemoUse>,
    /// A partial snapshot (resumed by content): the services the agent
    /// holds that are gone, said on the last chunk.
    pub(super) partial: Option<Vec<String>>,
}

/// How large one `FULL_SNAPSHOT` message may be: at most `endpoints`
/// endpoints and `bytes` encoded bytes, whichever comes first (always at
/// least one endpoint, so an endpoint larger than `bytes` is a message of
/// its own).
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkBounds {
    pub(super) endpoints: usize,
    pub(super) bytes: usize,
}

impl ChunkBounds {
    pub(super) fn of(config: &crate::engine::config::RegistrarConfig) -> Self {
        Self {
            endpoints: config.snapshot_chunk.max(1),
            bytes: config.snapshot_chunk_bytes.max(1),
        }
    }
}

/// The bytes `ep` adds to an `EndpointEvent` as one of its
/// `snapshot_endpoints` (field 6: a one-byte key, the length, the message).
fn snapshot_endpoint_len(ep: &ServiceEndpoint) -> usize {
    let len = ep.encoded_len();
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

impl Cursor {
    /// The next `FULL_SNAPSHOT` message (the endpoints after `last` that
    /// fit in `bounds`), the last key it holds and how many endpoints.
    pub(super) fn build(&self, bounds: ChunkBounds) -> (EndpointEvent, Option<EndpointKey>, usize) {
        let mut msg = EndpointEvent {
            r#type: EventType::FullSnapshot as i32,
            version: self.version.clone(),
            // Counted in the size as if set; cleared below if not last.
            snapshot_last: true,
            snapshot_partial: self.partial.is_some(),
            ..Default::default()
        };
        // What the message holds besides its endpoints, at most (the
        // removed services go only on the last message).
        let removed = self.partial.as_deref().unwrap_or_default();
        let mut size =
            msg.encoded_len() + prost::encoding::string::encoded_len_repeated(10, removed);
        for endpoint in self.snap.after(self.last.as_ref()) {
            if msg.snapshot_endpoints.len() >= bounds.endpoints {
                break;
            }
            let ep = endpoint_to_proto(endpoint);
            let len = snapshot_endpoint_len(&ep);
            if !msg.snapshot_endpoints.is_empty() && size + len > bounds.bytes {
                break;
            }
            size += len;
            msg.snapshot_endpoints.push(ep);
        }
        let last = match msg.snapshot_endpoints.last() {
            Some(p) => Some(EndpointKey::new(p.service_name.clone(), p.id.clone())),
            None => self.last.clone(),
        };
        let count = msg.snapshot_endpoints.len();
        msg.snapshot_last = self.left.saturating_sub(count) == 0;
        if msg.snapshot_last {
            msg.snapshot_removed_services = removed.to_vec();
        }
        (msg, last, count)
    }

    /// The next chunk as a frame, its size in bytes, and whether this
    /// stream encoded it (rather than taking another stream's).
    pub(super) fn next(
        &mut self,
        bounds: ChunkBounds,
        encoding: StreamEncoding,
    ) -> (Frame, u64, bool) {
        let shared = match &self.memo {
            Some(memo) if encoding.shares_encodings() => memo.chunk(self.index, || {
                let (msg, last, count) = self.build(bounds);
                Chunk {
                    bytes: codec::encode(&msg),
                    last,
                    count,
                }
            }),
            _ => None,
        };
        let (frame, len, encoded) = match shared {
            Some((c, encoded)) => {
                self.last = c.last;
                self.left = self.left.saturating_sub(c.count);
                (
                    Frame::Shared(c.bytes.clone()),
                    c.bytes.len() as u64,
                    encoded,
                )
            }
            None => {
                // Encoded by the codec, into this stream's buffer.
                let (msg, last, count) = self.build(bounds);
                self.last = last;
                self.left = self.left.saturating_sub(count);
                let len = msg.encoded_len() as u64;
                (Frame::Own(Box::new(msg)), len, true)
            }
        };
        self.index += 1;
        (frame, len, encoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::{Endpoint, Version};

    fn endpoints(n: usize) -> Vec<Endpoint> {
        (0..n)
            .map(|i| {
                Endpoint::new(
                    format!("svc-{:04}", i / 10),
                    format!("ep-{i}"),
                    "10.0.0.1",
                    8080,
                )
            })
            .collect()
    }

    fn cursor(snap: Snapshot, partial: Option<Vec<String>>) -> Cursor {
        Cursor {
            left: snap.len(),
            snap,
            version: "1.7".into(),
            last: None,
            index: 0,
            memo: None,
            partial,
        }
    }

    /// Every message of `cursor`'s snapshot, cut by `bounds`.
    fn messages(mut cursor: Cursor, bounds: ChunkBounds) -> Vec<EndpointEvent> {
        let mut out = Vec::new();
        loop {
            let (frame, len, encoded) = cursor.next(bounds, StreamEncoding::PerStream);
            assert!(encoded);
            let msg = frame.into_message().unwrap();
            assert_eq!(msg.encoded_len() as u64, len);
            let last = msg.snapshot_last;
            out.push(msg);
            if last {
                assert_eq!(cursor.left, 0);
                return out;
            }
        }
    }

    #[test]
    fn messages_stop_at_the_byte_bound_before_the_endpoint_bound() {
        let snap = Snapshot::from_endpoints(Version(7), endpoints(3000));
        let bounds = ChunkBounds {
            endpoints: 1000,
            bytes: 16 * 1024,
        };
        let msgs = messages(cursor(snap.clone(), None), bounds);
        assert!(msgs.len() > 3, "{} messages", msgs.len());
        for m in &msgs {
            assert!(m.encoded_len() <= bounds.bytes, "{}", m.encoded_len());
            assert!(m.snapshot_endpoints.len() < bounds.endpoints);
        }
        // Each full message is as full as the bound allows: one more
        // endpoint would not fit.
        let one = snapshot_endpoint_len(&msgs[0].snapshot_endpoints[0]);
        assert!(msgs[0].encoded_len() + one > bounds.bytes);
        let sent: Vec<_> = msgs
            .iter()
            .flat_map(|m| m.snapshot_endpoints.clone())
            .collect();
        let expected: Vec<_> = snap.iter().map(endpoint_to_proto).collect();
        assert_eq!(sent, expected);
        let flags: Vec<bool> = msgs.iter().map(|m| m.snapshot_last).collect();
        assert_eq!(flags.iter().filter(|f| **f).count(), 1);
        assert!(flags[flags.len() - 1]);
    }

    #[test]
    fn the_endpoint_bound_still_holds_when_it_comes_first() {
        let snap = Snapshot::from_endpoints(Version(7), endpoints(250));
        let bounds = ChunkBounds {
            endpoints: 100,
            bytes: 16 * 1024,
        };
        let sizes: Vec<usize> = messages(cursor(snap, None), bounds)
            .iter()
            .map(|m| m.snapshot_endpoints.len())
            .collect();
        assert_eq!(sizes, [100, 100, 50]);
    }

    #[test]
    fn an_endpoint_larger_than_the_byte_bound_is_a_message_of_its_own() {
        let mut eps = endpoints(3);
        eps[1] = eps[1].clone().with_label("big", "x".repeat(4000));
        let snap = Snapshot::from_endpoints(Version(7), eps);
        let bounds = ChunkBounds {
            endpoints: 1000,
            bytes: 1024,
        };
        let msgs = messages(cursor(snap, None), bounds);
        let sizes: Vec<usize> = msgs.iter().map(|m| m.snapshot_endpoints.len()).collect();
        assert_eq!(sizes, [1, 1, 1]);
        assert!(msgs[1].encoded_len() > bounds.bytes);
    }

    #[test]
    fn a_partial_snapshot_counts_its_removed_services_in_the_bound() {
        let removed: Vec<String> = (0..100).map(|i| format!("gone-{i:03}")).collect();
        let snap = Snapshot::from_endpoints(Version(7), endpoints(300));
        let bounds = ChunkBounds {
            endpoints: 1000,
            bytes: 4 * 1024,
        };
        let msgs = messages(cursor(snap, Some(removed.clone())), bounds);
        assert!(msgs.len() > 1);
        for m in &msgs {
            assert!(m.snapshot_partial);
            assert!(m.encoded_len() <= bounds.bytes, "{}", m.encoded_len());
        }
        let last = msgs.last().unwrap();
        assert_eq!(last.snapshot_removed_services, removed);
        assert!(msgs[..msgs.len() - 1]
            .iter()
            .all(|m| m.snapshot_removed_services.is_empty()));
    }

    #[test]
    fn an_empty_snapshot_is_one_message_flagged_last() {
        let snap = Snapshot::from_endpoints(Version(7), Vec::new());
        let bounds = ChunkBounds {
            endpoints: 1000,
            bytes: 16 * 1024,
        };
        let msgs = messages(cursor(snap, None), bounds);
        assert_eq!(msgs.len(), 1);
        assert!(msgs[0].snapshot_endpoints.is_empty());
    }
}
