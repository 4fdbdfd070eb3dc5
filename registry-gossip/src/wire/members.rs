//! [`MemberMessage`]: the membership sync, the bodies of `MemberPull` and
//! `MemberList` datagrams.
//!
//! SWIM spreads a membership change by piggybacking it a bounded number of
//! times, and a joiner learns from the answer to its announce only as many
//! members as fit one datagram. The sync completes both: a node asks a
//! member for its view when the two views' digests differ, and gets the
//! whole view back, in pages.

use std::net::SocketAddr;

use super::frame::{get_addr, put_addr, Kind};
use super::identity::{get_id, put_id};
use super::GossipId;
use crate::buf::{DecodeError, EncodeError, Reader, Writer};

/// Flag of a pull sent in answer to a pull: it is not answered by a
/// pull again.
const FLAG_BACK: u8 = 1;

/// A membership sync message.
///
/// Encoded as: `MemberPull`: `flags: u8` (bit 0: sent back), the cursor
/// (address family `0` for none, else `4`/`6`, octets, port), `count: u32`,
/// `digest: u64`; `MemberList`: the cursor of the next page (family `0`
/// when this is the last), a `u16` count, then identities (as in SWIM
/// packets). Integers are big-endian.
///
/// Frame kinds `4` (`MemberPull`) and `5` (`MemberList`); nodes that
/// predate them count them as malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberMessage {
    /// The sender's view of the active members (itself included) as a
    /// count and an order-independent digest; the receiver answers with
    /// its members when its own view differs. With `after` set, this asks
    /// for the next page of an answer in progress (the digest is not
    /// compared).
    Pull {
        /// Continue after this address (addresses ascending).
        after: Option<SocketAddr>,
        /// Members in the sender's view, itself included.
        count: u32,
        /// Digest of the sender's view.
        digest: u64,
        /// Sent in answer to a pull: not to be answered with a pull.
        back: bool,
    },
    /// A page of the sender's active members (itself included), by
    /// ascending address.
    List {
        /// When the answer was cut by its budget: its last address, where
        /// the next pull continues.
        next: Option<SocketAddr>,
        /// The members.
        members: Vec<GossipId>,
    },
}

fn put_cursor(w: &mut Writer, cursor: Option<SocketAddr>) {
    match cursor {
        None => w.u8(0),
        Some(addr) => put_addr(w, addr),
    }
}

fn get_cursor(r: &mut Reader<'_>) -> Result<Option<SocketAddr>, DecodeError> {
    if r.rest().first() == Some(&0) {
        r.u8()?;
        return Ok(None);
    }
    get_addr(r).map(Some)
}

impl MemberMessage {
    /// The datagram kind for this message.
    pub fn kind(&self) -> Kind {
        match self {
            MemberMessage::Pull { .. } => Kind::MemberPull,
            MemberMessage::List { .. } => Kind::MemberList,
        }
    }

    /// Encode the body.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut w = Writer::new();
        match self {
            MemberMessage::Pull {
                after,
                count,
                digest,
                back,
            } => {
                w.u8(if *back { FLAG_BACK } else { 0 });
                put_cursor(&mut w, *after);
                w.u32(*count);
                w.u64(*digest);
            }
            MemberMessage::List { next, members } => {
                put_cursor(&mut w, *next);
                w.count(members.len())?;
                for id in members {
                    put_id(&mut w, id)?;
                }
            }
        }
        Ok(w.buf)
    }

    /// Bytes a `List` body takes before its identities, at most.
    pub fn list_head_max() -> usize {
        1 + 16 + 2 + 2
    }

    /// Bytes `id` takes in a `List` body.
    pub fn id_len(id: &GossipId) -> usize {
        let ip = if id.addr.is_ipv4() { 4 } else { 16 };
        1 + ip + 2 + 1 + id.node.as_str().len() + 2
    }

    /// Decode the body of a datagram of `kind`.
    pub fn decode(kind: Kind, body: &[u8]) -> Result<MemberMessage, DecodeError> {
        let mut r = Reader::new(body);
        let msg = match kind {
            Kind::MemberPull => {
                let flags = r.u8()?;
                if flags & !FLAG_BACK != 0 {
                    return Err(DecodeError::Invalid("member pull flags"));
                }
                let after = get_cursor(&mut r)?;
                let count = r.u32()?;
                let digest = r.u64()?;
                MemberMessage::Pull {
                    after,
                    count,
                    digest,
                    back: flags & FLAG_BACK != 0,
                }
            }
            Kind::MemberList => {
                let next = get_cursor(&mut r)?;
                let n = r.u16()?;
                let mut members = Vec::with_capacity(usize::from(n).min(r.remaining() / 10));
                for _ in 0..n {
                    members.push(get_id(&mut r)?);
                }
                MemberMessage::List { next, members }
            }
            _ => return Err(DecodeError::Invalid("member sync kind")),
        };
        r.finish()?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::NodeId;

    fn id(port: u16, name: &str) -> GossipId {
        GossipId {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            node: NodeId::new(name),
            bump: port % 3,
        }
    }

    #[test]
    fn messages_round_trip() {
        let msgs = [
            MemberMessage::Pull {
                after: None,
                count: 7,
                digest: 0xdead_beef,
                back: false,
            },
            MemberMessage::Pull {
                after: Some("[::1]:9".parse().unwrap()),
                count: 0,
                digest: u64::MAX,
                back: true,
            },
            MemberMessage::List {
                next: Some(id(4, "x").addr),
                members: vec![id(1, "a"), id(2, "bb")],
            },
            MemberMessage::List {
                next: None,
                members: Vec::new(),
            },
        ];
        for m in msgs {
            let body = m.encode().unwrap();
            assert_eq!(MemberMessage::decode(m.kind(), &body).unwrap(), m);
            if let MemberMessage::List { members, .. } = &m {
                let ids: usize = members.iter().map(MemberMessage::id_len).sum();
                assert!(body.len() <= MemberMessage::list_head_max() + ids);
            }
            // Every truncation is an error, never a panic.
            for cut in 0..body.len() {
                assert!(MemberMessage::decode(m.kind(), &body[..cut]).is_err());
            }
        }
    }

    #[test]
    fn unknown_flags_are_refused() {
        let mut body = MemberMessage::Pull {
            after: None,
            count: 1,
            digest: 2,
            back: false,
        }
        .encode()
        .unwrap();
        body[0] = 2;
        assert!(MemberMessage::decode(Kind::MemberPull, &body).is_err());
    }
}
