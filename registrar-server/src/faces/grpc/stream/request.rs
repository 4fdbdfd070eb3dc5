//! The `WatchEndpoints` request as the registrar reads it: the proto's
//! `WatchEndpointsRequest`, with the agent's summary (`held`) kept as its
//! bytes until it is needed. An agent that sends its summary's total
//! (`held_total`) and holds what the registrar holds is answered without
//! the summary being decoded: its 5,000 digests, at 100,000 endpoints in
//! 20-endpoint services, are most of what resuming such an agent costs.
//! Agents that hold the same (the same total) and resume against the same
//! state are sent the same partial snapshot: the last one is kept
//! ([`Partials`]), so it is found once, not per agent, and its messages
//! are encoded once for all of them.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message;
use waypost::{Snapshot, Version};
use waypost_registrar_client::proto::registrar::v1::{
    HeldServices, HeldTotal, WatchEndpointsRequest,
};
use waypost_registrar_client::{total_digest, Digests};

use super::encodings::{MemoUse, SnapshotMemo};

/// The request's fields as on the wire, `held` undecoded: the same field
/// numbers and types as the proto's `WatchEndpointsRequest` (a message
/// field and a bytes field are both length-delimited on the wire).
#[derive(Clone, PartialEq, Message)]
struct Wire {
    #[prost(string, tag = "1")]
    cluster_name: String,
    #[prost(string, tag = "2")]
    node_name: String,
    #[prost(string, tag = "3")]
    last_version: String,
    #[prost(bytes = "bytes", optional, tag = "4")]
    held: Option<Bytes>,
    #[prost(message, optional, tag = "5")]
    held_total: Option<HeldTotal>,
}

/// An agent's `WatchEndpoints` request.
#[derive(Debug, Clone, Default)]
pub(crate) struct WatchRequest {
    /// The agent's cluster.
    pub(crate) cluster_name: String,
    /// The agent's node.
    pub(crate) node_name: String,
    /// The resume token, empty for none.
    pub(crate) last_version: String,
    /// What the agent holds, when it said.
    pub(crate) held: Option<Held>,
}

impl WatchRequest {
    /// The request in `buf`, a `WatchEndpointsRequest` on the wire.
    pub(crate) fn decode(buf: impl bytes::Buf) -> Result<Self, prost::DecodeError> {
        let wire = Wire::decode(buf)?;
        Ok(Self {
            cluster_name: wire.cluster_name,
            node_name: wire.node_name,
            last_version: wire.last_version,
            held: wire.held.map(|services| Held {
                services: Summary::Encoded(services),
                total: wire.held_total,
            }),
        })
    }
}

impl From<WatchEndpointsRequest> for WatchRequest {
    fn from(req: WatchEndpointsRequest) -> Self {
        Self {
            cluster_name: req.cluster_name,
            node_name: req.node_name,
            last_version: req.last_version,
            held: req.held.map(|services| Held {
                services: Summary::Decoded(services),
                total: req.held_total,
            }),
        }
    }
}

/// The agent's summary of what it holds, and its total when it sent one.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    services: Summary,
    total: Option<HeldTotal>,
}

/// A summary, decoded or still as its bytes.
#[derive(Debug, Clone)]
enum Summary {
    Encoded(Bytes),
    Decoded(HeldServices),
}

/// How an agent's summary was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Its total matched: the summary was not read.
    ByTotal,
    /// Its total is that of the last agent answered against the same
    /// state: that answer again, the summary not read.
    Remembered,
    /// Service by service, the summary of so many services.
    ByService(usize),
}

/// The answer to an agent's summary: the partial snapshot, the services
/// it holds that are gone, and how the summary was read.
pub(crate) struct Answer {
    /// The endpoints of the services that differ, at the snapshot's version.
    pub(crate) partial: Snapshot,
    /// The services the agent holds that have no endpoint any more.
    pub(crate) removed: Vec<String>,
    /// How it was found.
    pub(crate) reading: Reading,
    /// The encoded messages of `partial` that agents answered the same
    /// share, when it is the kept answer.
    pub(crate) memo: Option<MemoUse>,
}

/// The last answer found service by service, with the totals it answers:
/// the agent's (checked against its summary) and the registrar's, and
/// its messages as encoded for the last version it was sent at.
struct Kept {
    theirs: HeldTotal,
    ours: HeldTotal,
    removed: Vec<String>,
    memo: Mutex<Arc<SnapshotMemo>>,
}

impl Kept {
    /// The partial snapshot at `version`, with the memo of its messages
    /// there (a new one when the version moved on).
    fn at(&self, version: Version) -> (Snapshot, MemoUse) {
        let mut memo = self.memo.lock().unwrap_or_else(|p| p.into_inner());
        if memo.snapshot().version() != version {
            *memo = SnapshotMemo::detached(memo.snapshot().at_version(version));
        }
        (memo.snapshot().clone(), memo.use_detached())
    }
}

/// The last partial snapshot answered, shared by a registrar's streams.
#[derive(Default)]
pub(crate) struct Partials(Mutex<Option<Arc<Kept>>>);

impl Partials {
    fn get(&self, theirs: HeldTotal, ours: HeldTotal) -> Option<Arc<Kept>> {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.as_ref()
            .filter(|k| k.theirs == theirs && k.ours == ours)
            .map(Arc::clone)
    }

    fn keep(&self, kept: Kept) -> Arc<Kept> {
        let kept = Arc::new(kept);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&kept));
        kept
    }
}

impl Held {
    /// The answer to this summary against `snap`: from the totals alone
    /// when they agree, the last answer when it was for the same totals,
    /// else service by service. An error when the summary does not decode.
    pub(crate) fn answer(
        self,
        digests: &Digests,
        partials: &Partials,
        snap: &Snapshot,
    ) -> Result<Answer, prost::DecodeError> {
        let version = snap.version();
        let ours = digests.total(snap);
        if let Some(theirs) = self.total {
            if theirs == ours {
                return Ok(Answer {
                    partial: Snapshot::empty(version),
                    removed: Vec::new(),
                    reading: Reading::ByTotal,
                    memo: None,
                });
            }
            if let Some(kept) = partials.get(theirs, ours) {
                let (partial, memo) = kept.at(version);
                return Ok(Answer {
                    partial,
                    removed: kept.removed.clone(),
                    reading: Reading::Remembered,
                    memo: Some(memo),
                });
            }
        }
        let services = match self.services {
            Summary::Decoded(s) => s,
            Summary::Encoded(bytes) => HeldServices::decode(bytes)?,
        };
        let diff = digests.differing(snap, &services);
        let partial = diff.snapshot(snap, version);
        let reading = Reading::ByService(services.services.len());
        // Kept for others only when the total is the summary's own.
        if let Some(theirs) = self.total {
            let listed = services
                .services
                .iter()
                .map(|s| (s.service_name.as_str(), s.digest));
            if services
                .services
                .is_sorted_by(|a, b| a.service_name < b.service_name)
                && total_digest(listed) == theirs
            {
                let kept = partials.keep(Kept {
                    theirs,
                    ours,
                    removed: diff.removed.clone(),
                    memo: Mutex::new(SnapshotMemo::detached(partial.clone())),
                });
                let (partial, memo) = kept.at(version);
                return Ok(Answer {
                    partial,
                    removed: diff.removed,
                    reading,
                    memo: Some(memo),
                });
            }
        }
        Ok(Answer {
            partial,
            removed: diff.removed,
            reading,
            memo: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::encodings::Chunk;
    use super::*;
    use waypost::testing::ep;

    fn state() -> Snapshot {
        Snapshot::from_endpoints(
            Version(4),
            [ep("a", "1", 1), ep("b", "1", 2), ep("c", "1", 3)],
        )
    }

    /// `held` (with its total when `total`) as an agent sends it, read
    /// as the registrar reads it.
    fn sent(held: &Snapshot, total: bool) -> WatchRequest {
        let agent = Digests::new();
        let req = WatchEndpointsRequest {
            cluster_name: "c".into(),
            node_name: "n".into(),
            last_version: "9.3".into(),
            held: agent.held(held),
            held_total: total.then(|| agent.total(held)),
        };
        WatchRequest::decode(req.encode_to_vec().as_slice()).expect("decodes")
    }

    #[test]
    fn the_request_reads_as_the_proto_says() {
        let req = sent(&state(), true);
        assert_eq!(
            (req.cluster_name.as_str(), req.node_name.as_str()),
            ("c", "n")
        );
        assert_eq!(req.last_version, "9.3");
        let held = req.held.expect("held");
        assert!(matches!(held.services, Summary::Encoded(_)));
        assert_eq!(held.total.map(|t| t.services), Some(3));
        // Without a summary, no summary (a total alone is not read).
        let bare = WatchEndpointsRequest {
            held_total: Some(HeldTotal::default()),
            ..Default::default()
        };
        let read = WatchRequest::decode(bare.encode_to_vec().as_slice()).expect("decodes");
        assert!(read.held.is_none());
        // An empty summary is a summary.
        let empty = WatchEndpointsRequest {
            held: Some(HeldServices::default()),
            ..Default::default()
        };
        let read = WatchRequest::decode(empty.encode_to_vec().as_slice()).expect("decodes");
        assert!(read.held.is_some());
    }

    /// The registrar's answer to an agent holding `held` (with its total
    /// when `total`), against `now`.
    fn answered(
        held: &Snapshot,
        total: bool,
        (registrar, partials): (&Digests, &Partials),
        now: &Snapshot,
    ) -> Answer {
        sent(held, total)
            .held
            .expect("held")
            .answer(registrar, partials, now)
            .expect("decodes")
    }

    /// The services `answer` names, and those it says are gone.
    fn named(answer: &Answer) -> (Vec<&str>, Vec<&str>) {
        let mut services: Vec<&str> = answer.partial.iter().map(|e| e.service.as_str()).collect();
        services.dedup();
        (
            services,
            answer.removed.iter().map(String::as_str).collect(),
        )
    }

    #[test]
    fn a_matching_total_is_the_empty_partial_without_reading_the_summary() {
        let (registrar, partials) = (Digests::new(), Partials::default());
        let now = state().at_version(Version(77));
        let answer = answered(&state(), true, (&registrar, &partials), &now);
        assert_eq!(answer.reading, Reading::ByTotal);
        assert_eq!(named(&answer), (vec![], vec![]));
        assert_eq!(answer.partial.version(), Version(77));
    }

    #[test]
    fn a_total_that_differs_reads_the_summary_once_for_all_who_hold_the_same() {
        let (registrar, partials) = (Digests::new(), Partials::default());
        let now = state()
            .with_endpoint(ep("b", "2", 2))
            .without(&ep("c", "1", 3).key());
        let first = answered(&state(), true, (&registrar, &partials), &now);
        assert_eq!(first.reading, Reading::ByService(3));
        assert_eq!(named(&first), (vec!["b"], vec!["c"]));
        assert_eq!(first.partial.len(), 2);
        // Another agent holding the same: the same answer, not read again.
        let again = answered(
            &state(),
            true,
            (&registrar, &partials),
            &now.at_version(Version(8)),
        );
        assert_eq!(again.reading, Reading::Remembered);
        assert_eq!(named(&again), named(&first));
        assert_eq!(again.partial.version(), Version(8));
        // Its messages encoded once for every agent answered at version 8;
        // at another version, encoded again.
        let encode = |n: u8| {
            move || Chunk {
                bytes: Bytes::from(vec![n]),
                last: None,
                count: 2,
            }
        };
        let memo = |a: Answer| a.memo.expect("the kept answer's messages");
        let (one, encoded) = memo(again).chunk(0, encode(1)).expect("a chunk");
        assert!(encoded);
        let twice = answered(
            &state(),
            true,
            (&registrar, &partials),
            &now.at_version(Version(8)),
        );
        let (two, encoded) = memo(twice).chunk(0, encode(2)).expect("a chunk");
        assert!(!encoded);
        assert_eq!(two.bytes, one.bytes);
        let later = answered(
            &state(),
            true,
            (&registrar, &partials),
            &now.at_version(Version(9)),
        );
        assert_eq!(later.reading, Reading::Remembered);
        let (three, encoded) = memo(later).chunk(0, encode(3)).expect("a chunk");
        assert!(encoded);
        assert_eq!(&three.bytes[..], &[3]);
        // Holding something else, or against another state: read.
        let other = state().with_endpoint(ep("a", "2", 1));
        let answer = answered(&other, true, (&registrar, &partials), &now);
        assert_eq!(answer.reading, Reading::ByService(3));
        assert_eq!(named(&answer).0, ["a", "b"]);
        let later = now.with_endpoint(ep("d", "1", 1));
        let answer = answered(&state(), true, (&registrar, &partials), &later);
        assert_eq!(answer.reading, Reading::ByService(3));
        assert_eq!(named(&answer), (vec!["b", "d"], vec!["c"]));
    }

    #[test]
    fn a_total_that_is_not_its_summary_s_is_not_kept() {
        let (registrar, partials) = (Digests::new(), Partials::default());
        let now = state().with_endpoint(ep("d", "1", 1));
        let mut wrong = sent(&state(), true).held.expect("held");
        wrong.total = Some(HeldTotal {
            digest: 1,
            services: 3,
        });
        let answer = wrong
            .clone()
            .answer(&registrar, &partials, &now)
            .expect("decodes");
        assert_eq!(named(&answer).0, ["d"]);
        let again = wrong.answer(&registrar, &partials, &now).expect("decodes");
        assert_eq!(again.reading, Reading::ByService(3));
    }

    #[test]
    fn a_summary_without_its_total_is_read_as_before() {
        let (registrar, partials) = (Digests::new(), Partials::default());
        for _ in 0..2 {
            let answer = answered(&state(), false, (&registrar, &partials), &state());
            assert_eq!(answer.reading, Reading::ByService(3));
            assert_eq!(named(&answer), (vec![], vec![]));
        }
        let now = state().with_endpoint(ep("d", "1", 1));
        let answer = answered(&state(), false, (&registrar, &partials), &now);
        assert_eq!(named(&answer).0, ["d"]);
    }

    #[test]
    fn a_summary_that_does_not_decode_is_an_error() {
        let wire = Wire {
            held: Some(Bytes::from_static(&[0x0a, 0x05, 0x01])),
            ..Default::default()
        };
        let req =
            WatchRequest::decode(wire.encode_to_vec().as_slice()).expect("the request decodes");
        let held = req.held.expect("held");
        let answer = held.answer(&Digests::new(), &Partials::default(), &state());
        assert!(answer.is_err());
    }
}
