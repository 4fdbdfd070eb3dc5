//! The codecs of what datagram bodies carry: foca's SWIM messages (for
//! [`WireCodec`]), the registry entries piggybacked on them, and the
//! anti-entropy messages.
//!
//! A SWIM message is a header (source identity and incarnation,
//! destination identity, message type and its fields) followed, for most
//! types, by membership updates (a count, then identity, incarnation and
//! state each) and then custom broadcasts (`u16 length, bytes` items,
//! each one [`crate::layout`] entry). Anti-entropy bodies are described on
//! [`AeMessage`].

use bytes::{Buf, BufMut};
use foca::{Header, Member, Message, State};

use super::frame::Kind;
use super::identity::{get_id, put_id, GossipId};
use crate::buf::{DecodeError, EncodeError, Reader, Writer};
use crate::crdt::Entry;
use crate::layout::{decode_entry, get_entry, put_entry};

// ------------------------------------------------------------- foca codec

/// foca's [`foca::Codec`] for [`GossipId`], in this module's format.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireCodec;

fn put_header(w: &mut Writer, h: &Header<GossipId>) -> Result<(), EncodeError> {
    put_id(w, &h.src)?;
    w.u16(h.src_incarnation);
    put_id(w, &h.dst)?;
    match &h.message {
        Message::Ping(n) => {
            w.u8(0);
            w.u8(*n);
        }
        Message::Ack(n) => {
            w.u8(1);
            w.u8(*n);
        }
        Message::PingReq {
            target,
            probe_number,
        } => {
            w.u8(2);
            put_id(w, target)?;
            w.u8(*probe_number);
        }
        Message::IndirectPing {
            origin,
            probe_number,
        } => {
            w.u8(3);
            put_id(w, origin)?;
            w.u8(*probe_number);
        }
        Message::IndirectAck {
            target,
            probe_number,
        } => {
            w.u8(4);
            put_id(w, target)?;
            w.u8(*probe_number);
        }
        Message::ForwardedAck {
            origin,
            probe_number,
        } => {
            w.u8(5);
            put_id(w, origin)?;
            w.u8(*probe_number);
        }
        Message::Announce => w.u8(6),
        Message::Feed => w.u8(7),
        Message::Gossip => w.u8(8),
        Message::Broadcast => w.u8(9),
        Message::TurnUndead => w.u8(10),
    }
    Ok(())
}

fn get_header(r: &mut Reader<'_>) -> Result<Header<GossipId>, DecodeError> {
    let src = get_id(r)?;
    let src_incarnation = r.u16()?;
    let dst = get_id(r)?;
    let message = match r.u8()? {
        0 => Message::Ping(r.u8()?),
        1 => Message::Ack(r.u8()?),
        2 => Message::PingReq {
            target: get_id(r)?,
            probe_number: r.u8()?,
        },
        3 => Message::IndirectPing {
            origin: get_id(r)?,
            probe_number: r.u8()?,
        },
        4 => Message::IndirectAck {
            target: get_id(r)?,
            probe_number: r.u8()?,
        },
        5 => Message::ForwardedAck {
            origin: get_id(r)?,
            probe_number: r.u8()?,
        },
        6 => Message::Announce,
        7 => Message::Feed,
        8 => Message::Gossip,
        9 => Message::Broadcast,
        10 => Message::TurnUndead,
        _ => return Err(DecodeError::Invalid("message type")),
    };
    Ok(Header {
        src,
        src_incarnation,
        dst,
        message,
    })
}

fn put_member(w: &mut Writer, m: &Member<GossipId>) -> Result<(), EncodeError> {
    put_id(w, m.id())?;
    w.u16(m.incarnation());
    w.u8(match m.state() {
        State::Alive => 0,
        State::Suspect => 1,
        State::Down => 2,
    });
    Ok(())
}

fn get_member(r: &mut Reader<'_>) -> Result<Member<GossipId>, DecodeError> {
    let id = get_id(r)?;
    let incarnation = r.u16()?;
    let state = match r.u8()? {
        0 => State::Alive,
        1 => State::Suspect,
        2 => State::Down,
        _ => return Err(DecodeError::Invalid("member state")),
    };
    Ok(Member::new(id, incarnation, state))
}

/// Write `w` into `buf` whole, or not at all.
fn put_all(w: Writer, mut buf: impl BufMut) -> Result<(), EncodeError> {
    if buf.remaining_mut() < w.buf.len() {
        return Err(EncodeError::Full);
    }
    buf.put_slice(&w.buf);
    Ok(())
}

/// Run `f` over the contiguous bytes of `buf` and advance past what it read.
fn read_from<T>(
    mut buf: impl Buf,
    f: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let chunk = buf.chunk();
    let total = chunk.len();
    let mut r = Reader::new(chunk);
    let out = f(&mut r)?;
    let used = total - r.remaining();
    buf.advance(used);
    Ok(out)
}

/// Encoding or decoding failed inside foca.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// See [`EncodeError`].
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// See [`DecodeError`].
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

impl foca::Codec<GossipId> for WireCodec {
    type Error = CodecError;

    fn encode_header(
        &mut self,
        header: &Header<GossipId>,
        buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        let mut w = Writer::new();
        put_header(&mut w, header)?;
        Ok(put_all(w, buf)?)
    }

    fn decode_header(&mut self, buf: impl Buf) -> Result<Header<GossipId>, Self::Error> {
        Ok(read_from(buf, get_header)?)
    }

    fn encode_member(
        &mut self,
        member: &Member<GossipId>,
        buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        let mut w = Writer::new();
        put_member(&mut w, member)?;
        Ok(put_all(w, buf)?)
    }

    fn decode_member(&mut self, buf: impl Buf) -> Result<Member<GossipId>, Self::Error> {
        Ok(read_from(buf, get_member)?)
    }
}

/// The sender and the addressee of a SWIM body, from its header.
pub(crate) fn swim_route(body: &[u8]) -> Result<(GossipId, GossipId), DecodeError> {
    let header = get_header(&mut Reader::new(body))?;
    Ok((header.src, header.dst))
}

/// The custom broadcasts (registry entries) inside an outgoing or incoming
/// foca packet body: everything after the header and the membership
/// updates, as `u16 length, bytes` items.
pub fn swim_broadcasts(body: &[u8]) -> Result<Vec<&[u8]>, DecodeError> {
    let mut r = Reader::new(body);
    let header = get_header(&mut r)?;
    match header.message {
        Message::Announce | Message::TurnUndead => return Ok(Vec::new()),
        Message::Broadcast => {}
        _ => {
            if r.remaining() >= 2 {
                let n = r.u16()?;
                for _ in 0..n {
                    get_member(&mut r)?;
                }
            }
        }
    }
    let mut items = Vec::new();
    while r.remaining() > 2 {
        let n = r.u16()?;
        items.push(r.bytes(usize::from(n))?);
    }
    r.finish()?;
    Ok(items)
}

// ----------------------------------------------------------- anti-entropy

/// An anti-entropy message (the body of a `Digest`, `Want` or `Push`
/// datagram).
///
/// Encoded as: `Digest`: `lo: u64, hi: u64`, a count, then `(hash: u64,
/// fingerprint: u64)` pairs; `Want`: `next: u64, differed: u8`, a count,
/// then `hash: u64` items; `Push`: a count, then entries. Counts are
/// `u16`, integers big-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AeMessage {
    /// The sender's registers with key hashes in `lo..=hi`, as
    /// `(key hash, fingerprint)`, ordered by hash.
    Digest {
        /// First hash covered.
        lo: u64,
        /// Last hash covered.
        hi: u64,
        /// Every register of the sender in the range.
        items: Vec<(u64, u64)>,
    },
    /// The key hashes the digest's receiver wants, and where the digest's
    /// sender should start its next page (`0` after a full pass).
    Want {
        /// Hashes whose entries the sender of the digest should push.
        hashes: Vec<u64>,
        /// Cursor for the next page.
        next: u64,
        /// Whether the two replicas differed in this range.
        differed: bool,
    },
    /// Full entries.
    Push {
        /// The entries.
        entries: Vec<Entry>,
    },
}

impl AeMessage {
    /// The datagram kind for this message.
    pub fn kind(&self) -> Kind {
        match self {
            AeMessage::Digest { .. } => Kind::Digest,
            AeMessage::Want { .. } => Kind::Want,
            AeMessage::Push { .. } => Kind::Push,
        }
    }

    /// Encode the body.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut w = Writer::new();
        match self {
            AeMessage::Digest { lo, hi, items } => {
                w.u64(*lo);
                w.u64(*hi);
                w.count(items.len())?;
                for (h, f) in items {
                    w.u64(*h);
                    w.u64(*f);
                }
            }
            AeMessage::Want {
                hashes,
                next,
                differed,
            } => {
                w.u64(*next);
                w.u8(u8::from(*differed));
                w.count(hashes.len())?;
                for h in hashes {
                    w.u64(*h);
                }
            }
            AeMessage::Push { entries } => {
                w.count(entries.len())?;
                for e in entries {
                    put_entry(&mut w, e)?;
                }
            }
        }
        Ok(w.buf)
    }

    /// Decode the body of a datagram of `kind`.
    pub fn decode(kind: Kind, body: &[u8]) -> Result<AeMessage, DecodeError> {
        let mut r = Reader::new(body);
        let msg = match kind {
            Kind::Swim | Kind::MemberPull | Kind::MemberList => {
                return Err(DecodeError::Invalid("anti-entropy kind"))
            }
            Kind::Digest => {
                let lo = r.u64()?;
                let hi = r.u64()?;
                let n = r.u16()?;
                let mut items = Vec::with_capacity(usize::from(n).min(r.remaining() / 16));
                for _ in 0..n {
                    items.push((r.u64()?, r.u64()?));
                }
                AeMessage::Digest { lo, hi, items }
            }
            Kind::Want => {
                let next = r.u64()?;
                let differed = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("flag")),
                };
                let n = r.u16()?;
                let mut hashes = Vec::with_capacity(usize::from(n).min(r.remaining() / 8));
                for _ in 0..n {
                    hashes.push(r.u64()?);
                }
                AeMessage::Want {
                    hashes,
                    next,
                    differed,
                }
            }
            Kind::Push => {
                let n = r.u16()?;
                let mut entries = Vec::new();
                for _ in 0..n {
                    entries.push(get_entry(&mut r)?);
                }
                AeMessage::Push { entries }
            }
        };
        r.finish()?;
        Ok(msg)
    }
}

/// Decode any datagram body fully (used by the fuzz test): foca packets
/// are parsed down to their entries, anti-entropy messages whole.
pub fn decode_body(kind: Kind, body: &[u8]) -> Result<(), DecodeError> {
    match kind {
        Kind::Swim => {
            for item in swim_broadcasts(body)? {
                decode_entry(item)?;
            }
            Ok(())
        }
        Kind::MemberPull | Kind::MemberList => super::MemberMessage::decode(kind, body).map(|_| ()),
        other => AeMessage::decode(other, body).map(|_| ()),
    }
}
