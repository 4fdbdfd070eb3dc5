//! The wire format: framing and authentication of every datagram, foca's
//! codec for our identity, registry entries, and anti-entropy messages.
//!
//! Every decoder reads through [`Reader`], which checks each length against
//! what is left of the packet, so a truncated or forged packet is an
//! error, never a panic or an over-read.
//!
//! A datagram is `b'G', version, kind, body…, tag`. With a shared key the
//! tag is the first [`TAG_LEN`] bytes of HMAC-SHA256 over everything before
//! it; without one there is no tag.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Buf, BufMut};
use foca::{Header, Member, Message, State};
use hmac::{KeyInit, Mac};
use registry_api::{Endpoint, EndpointKey, Health};

use crate::crdt::{Entry, NodeId, Stamp};

/// First byte of every datagram.
const MAGIC: u8 = b'G';
/// Wire version.
const VERSION: u8 = 1;
/// Bytes of HMAC-SHA256 kept as the tag.
pub const TAG_LEN: usize = 16;
/// Bytes before the body: magic, version, kind.
pub const FRAME_HEAD: usize = 3;

/// Why a packet could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A length ran past the end of the packet.
    #[error("truncated: needed {needed} bytes, {left} left")]
    Truncated {
        /// Bytes the field needed.
        needed: usize,
        /// Bytes left in the packet.
        left: usize,
    },
    /// A field held a value that cannot be.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// The decoded endpoint does not pass validation.
    #[error("invalid endpoint: {0}")]
    Endpoint(String),
    /// Bytes were left over after the last field.
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

/// Why a datagram was dropped before its body was looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not one of ours (magic or version differ) or too short.
    #[error("not a gossip datagram")]
    NotOurs,
    /// The authentication tag is missing or wrong.
    #[error("authentication failed")]
    BadTag,
    /// Unknown message kind.
    #[error("unknown kind {0}")]
    UnknownKind(u8),
}

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A foca (SWIM) packet, with registry entries piggybacked.
    Swim = 0,
    /// Anti-entropy: a page of digests.
    Digest = 1,
    /// Anti-entropy: the hashes the digest's receiver wants.
    Want = 2,
    /// Anti-entropy: full entries.
    Push = 3,
}

impl Kind {
    fn from_u8(b: u8) -> Result<Kind, FrameError> {
        Ok(match b {
            0 => Kind::Swim,
            1 => Kind::Digest,
            2 => Kind::Want,
            3 => Kind::Push,
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; the error case cannot happen.
    <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

/// Frame `body` as a datagram of `kind`, tagged when `key` is set.
pub fn seal(kind: Kind, body: &[u8], key: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEAD + body.len() + TAG_LEN);
    out.extend_from_slice(&[MAGIC, VERSION, kind as u8]);
    out.extend_from_slice(body);
    if let Some(key) = key {
        let mut m = mac(key);
        m.update(&out);
        let tag = m.finalize().into_bytes();
        out.extend_from_slice(&tag[..TAG_LEN]);
    }
    out
}

/// Check a datagram's frame and tag; returns its kind and body.
pub fn open<'a>(packet: &'a [u8], key: Option<&[u8]>) -> Result<(Kind, &'a [u8]), FrameError> {
    if packet.len() < FRAME_HEAD || packet[0] != MAGIC || packet[1] != VERSION {
        return Err(FrameError::NotOurs);
    }
    let body_end = match key {
        Some(key) => {
            if packet.len() < FRAME_HEAD + TAG_LEN {
                return Err(FrameError::BadTag);
            }
            let end = packet.len() - TAG_LEN;
            let mut m = mac(key);
            m.update(&packet[..end]);
            m.verify_truncated_left(&packet[end..])
                .map_err(|_| FrameError::BadTag)?;
            end
        }
        None => packet.len(),
    };
    let kind = Kind::from_u8(packet[2])?;
    Ok((kind, &packet[FRAME_HEAD..body_end]))
}

/// A bounds-checked cursor over a packet.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// The unread bytes.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Fail unless everything was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated {
                needed: n,
                left: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    /// Big-endian u16.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    /// Big-endian u64.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn string(&mut self, len: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(len)?.to_vec()).map_err(|_| DecodeError::Invalid("utf-8"))
    }
    /// A string with a one-byte length.
    pub fn str8(&mut self) -> Result<String, DecodeError> {
        let n = self.u8()?;
        self.string(usize::from(n))
    }
    /// A string with a two-byte length.
    pub fn str16(&mut self) -> Result<String, DecodeError> {
        let n = self.u16()?;
        self.string(usize::from(n))
    }
}

/// Append helpers; lengths that do not fit their prefix are errors.
pub struct Writer {
    /// The bytes written so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self { buf: Vec::new() }
    }
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn str8(&mut self, s: &str) -> Result<(), EncodeError> {
        let n = u8::try_from(s.len()).map_err(|_| EncodeError::TooLong("short string"))?;
        self.u8(n);
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn str16(&mut self, s: &str) -> Result<(), EncodeError> {
        let n = u16::try_from(s.len()).map_err(|_| EncodeError::TooLong("string"))?;
        self.u16(n);
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn count(&mut self, n: usize) -> Result<(), EncodeError> {
        self.u16(u16::try_from(n).map_err(|_| EncodeError::TooLong("list"))?);
        Ok(())
    }
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

/// Why something could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A value is longer than its length prefix allows.
    #[error("{0} too long for the wire format")]
    TooLong(&'static str),
    /// The destination buffer is full.
    #[error("buffer full")]
    Full,
}

// ---------------------------------------------------------------- identity

/// A node's SWIM identity: its address, its name, and a counter bumped each
/// time it rejoins after being declared down.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GossipId {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its node name (the writer of its entries).
    pub node: NodeId,
    /// Rejoin counter.
    pub bump: u16,
}

impl foca::Identity for GossipId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            addr: self.addr,
            node: self.node.clone(),
            bump: self.bump.wrapping_add(1),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        // Wrapping comparison: the later bump wins even across overflow.
        let diff = self.bump.wrapping_sub(adversary.bump);
        diff != 0 && diff < u16::MAX / 2
    }
}

fn put_id(w: &mut Writer, id: &GossipId) -> Result<(), EncodeError> {
    match id.addr.ip() {
        IpAddr::V4(ip) => {
            w.u8(4);
            w.buf.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            w.u8(6);
            w.buf.extend_from_slice(&ip.octets());
        }
    }
    w.u16(id.addr.port());
    w.str8(id.node.as_str())?;
    w.u16(id.bump);
    Ok(())
}

fn get_id(r: &mut Reader<'_>) -> Result<GossipId, DecodeError> {
    let ip = match r.u8()? {
        4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>()?)),
        6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>()?)),
        _ => return Err(DecodeError::Invalid("address family")),
    };
    let port = r.u16()?;
    let node = NodeId(r.str8()?);
    let bump = r.u16()?;
    Ok(GossipId {
        addr: SocketAddr::new(ip, port),
        node,
        bump,
    })
}

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

// ---------------------------------------------------------------- entries

const FLAG_TOMBSTONE: u8 = 1;
const FLAG_DIED: u8 = 2;

fn put_health(h: Health) -> u8 {
    match h {
        Health::Healthy => 0,
        Health::Unhealthy => 1,
    }
}

/// Append one entry.
pub fn put_entry(w: &mut Writer, e: &Entry) -> Result<(), EncodeError> {
    let mut flags = 0;
    if e.is_tombstone() {
        flags |= FLAG_TOMBSTONE;
    }
    if e.died {
        flags |= FLAG_DIED;
    }
    w.u8(flags);
    w.u64(e.stamp.ts);
    w.u64(e.stamp.gen);
    w.str8(e.stamp.writer.as_str())?;
    w.str16(&e.key.service)?;
    w.str16(&e.key.id)?;
    if let Some(ep) = &e.value {
        w.str16(&ep.address)?;
        w.u16(ep.port);
        w.str8(ep.protocol.as_str())?;
        w.str16(&ep.cluster)?;
        w.str16(&ep.node)?;
        w.u8(put_health(ep.health));
        w.count(ep.labels.len())?;
        for (k, v) in &ep.labels {
            w.str16(k)?;
            w.str16(v)?;
        }
    }
    Ok(())
}

/// Read one entry; the endpoint must pass [`registry_api::backend::validate_endpoint`].
pub fn get_entry(r: &mut Reader<'_>) -> Result<Entry, DecodeError> {
    let flags = r.u8()?;
    if flags & !(FLAG_TOMBSTONE | FLAG_DIED) != 0 {
        return Err(DecodeError::Invalid("entry flags"));
    }
    let stamp = Stamp {
        ts: r.u64()?,
        gen: r.u64()?,
        writer: NodeId(r.str8()?),
    };
    let key = EndpointKey::new(r.str16()?, r.str16()?);
    let value = if flags & FLAG_TOMBSTONE != 0 {
        None
    } else {
        let address = r.str16()?;
        let port = r.u16()?;
        let protocol = r
            .str8()?
            .parse()
            .map_err(|_| DecodeError::Invalid("protocol"))?;
        let cluster = r.str16()?;
        let node = r.str16()?;
        let health = match r.u8()? {
            0 => Health::Healthy,
            1 => Health::Unhealthy,
            _ => return Err(DecodeError::Invalid("health")),
        };
        let mut ep = Endpoint::new(key.service.clone(), key.id.clone(), address, port)
            .with_protocol(protocol)
            .with_cluster(cluster)
            .with_node(node)
            .with_health(health);
        let n = r.u16()?;
        for _ in 0..n {
            let k = r.str16()?;
            let v = r.str16()?;
            ep.labels.insert(k, v);
        }
        if usize::from(n) != ep.labels.len() {
            return Err(DecodeError::Invalid("duplicate label"));
        }
        ep.validate()
            .map_err(|e| DecodeError::Endpoint(e.to_string()))?;
        Some(ep)
    };
    if value.is_some() && flags & FLAG_DIED != 0 {
        return Err(DecodeError::Invalid("live entry marked dead"));
    }
    Ok(Entry {
        key,
        stamp,
        value,
        died: flags & FLAG_DIED != 0,
    })
}

/// One entry as bytes (a custom broadcast item).
pub fn encode_entry(e: &Entry) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::new();
    put_entry(&mut w, e)?;
    Ok(w.buf)
}

/// Decode exactly one entry from `bytes`.
pub fn decode_entry(bytes: &[u8]) -> Result<Entry, DecodeError> {
    let mut r = Reader::new(bytes);
    let e = get_entry(&mut r)?;
    r.finish()?;
    Ok(e)
}

// ----------------------------------------------------------- anti-entropy

/// An anti-entropy message (the body of a `Digest`, `Want` or `Push`
/// datagram).
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
            Kind::Swim => return Err(DecodeError::Invalid("anti-entropy kind")),
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
        other => AeMessage::decode(other, body).map(|_| ()),
    }
}
