//! Framing and authentication of every datagram.
//!
//! Two layouts, told apart by the version byte:
//!
//! - version 1, without a key: `b'G', 1, kind, body…`.
//! - version 2, with a shared key: `b'G', 2, kind, counter (u64),
//!   destination (family `4`/`6`, address octets, port), sender (one-byte
//!   length, node name), body…, tag`. The tag is the first [`TAG_LEN`]
//!   bytes of HMAC-SHA256 over everything before it, so the sender, the
//!   destination and the counter are authenticated with the body; the
//!   receiver uses them against replays (see `machine::replay`).
//!
//! A node with a key drops version-1 datagrams and one without drops
//! version-2 datagrams ([`FrameError::Version`]): keyed nodes of the two
//! versions do not talk to each other.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hmac::{KeyInit, Mac};

use crate::buf::{DecodeError, EncodeError, Reader, Writer};

/// First byte of every datagram.
const MAGIC: u8 = b'G';
/// Version of unauthenticated datagrams (no key).
pub const VERSION_PLAIN: u8 = 1;
/// Version of authenticated datagrams (shared key, replay header).
pub const VERSION_KEYED: u8 = 2;
/// Bytes of HMAC-SHA256 kept as the tag.
pub const TAG_LEN: usize = 16;
/// Bytes before the body (or the replay header): magic, version, kind.
pub const FRAME_HEAD: usize = 3;
/// Bytes of the replay header before the sender's name: counter, and the
/// largest destination (IPv6), plus the name's length byte.
const AUTH_HEAD_MAX: usize = 8 + 1 + 16 + 2 + 1;

/// Why a datagram was dropped before its body was looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not one of ours (magic differs, unknown version) or too short.
    #[error("not a gossip datagram")]
    NotOurs,
    /// A known version, but not the one this node speaks (a keyed node got
    /// an unkeyed or old-format datagram, or the other way round).
    #[error("frame version {found}, this node speaks version {expected}")]
    Version {
        /// The datagram's version byte.
        found: u8,
        /// The version this node accepts.
        expected: u8,
    },
    /// The authentication tag is missing or wrong.
    #[error("authentication failed")]
    BadTag,
    /// The tag is right but the replay header does not decode.
    #[error("bad replay header: {0}")]
    BadHeader(DecodeError),
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
    /// Membership sync: the sender's view digest, asking for the
    /// receiver's members when they differ.
    MemberPull = 4,
    /// Membership sync: a page of the sender's members.
    MemberList = 5,
}

impl Kind {
    pub(crate) fn from_u8(b: u8) -> Result<Kind, FrameError> {
        Ok(match b {
            0 => Kind::Swim,
            1 => Kind::Digest,
            2 => Kind::Want,
            3 => Kind::Push,
            4 => Kind::MemberPull,
            5 => Kind::MemberList,
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

/// The authenticated replay header of a keyed datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader<'a> {
    /// The sender's counter: strictly increasing over every datagram the
    /// sender seals, a wall-clock time in microseconds since the UNIX
    /// epoch (bumped by one when two datagrams share a microsecond).
    pub counter: u64,
    /// Where the sender addressed the datagram.
    pub dest: SocketAddr,
    /// The sender's node name.
    pub sender: &'a str,
}

/// A checked datagram: its kind, its replay header (keyed datagrams), its
/// body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What the body is.
    pub kind: Kind,
    /// The authenticated header; `None` without a key.
    pub header: Option<FrameHeader<'a>>,
    /// The body.
    pub body: &'a [u8],
}

/// Bytes a frame adds around a body: the head, and with a key the replay
/// header (for a sender name of `sender_len` bytes, IPv6 destination at
/// most) and the tag.
pub(crate) fn overhead(authenticated: bool, sender_len: usize) -> usize {
    FRAME_HEAD
        + if authenticated {
            AUTH_HEAD_MAX + sender_len + TAG_LEN
        } else {
            0
        }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// A shared key, ready to tag and check datagrams: the keyed HMAC state is
/// computed once, not per datagram.
#[derive(Clone)]
pub struct FrameKey(HmacSha256);

impl FrameKey {
    /// The key `key` (any length).
    pub fn new(key: &[u8]) -> Self {
        // HMAC takes keys of any length; the error case cannot happen.
        Self(
            <HmacSha256 as KeyInit>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC accepts any key length")),
        )
    }
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(<hidden>)")
    }
}

pub(super) fn put_addr(w: &mut Writer, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            w.u8(4);
            w.buf.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            w.u8(6);
            w.buf.extend_from_slice(&ip.octets());
        }
    }
    w.u16(addr.port());
}

pub(super) fn get_addr(r: &mut Reader<'_>) -> Result<SocketAddr, DecodeError> {
    let ip = match r.u8()? {
        4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>()?)),
        6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>()?)),
        _ => return Err(DecodeError::Invalid("destination address family")),
    };
    Ok(SocketAddr::new(ip, r.u16()?))
}

/// Frame `body` as a datagram of `kind`: version 1 without `auth`; with
/// `auth` (the key and the replay header) version 2, tagged. Fails only
/// when the sender's name is longer than 255 bytes.
pub fn seal(
    kind: Kind,
    body: &[u8],
    auth: Option<(&FrameKey, &FrameHeader<'_>)>,
) -> Result<Vec<u8>, EncodeError> {
    let Some((key, header)) = auth else {
        let mut out = Vec::with_capacity(FRAME_HEAD + body.len());
        out.extend_from_slice(&[MAGIC, VERSION_PLAIN, kind as u8]);
        out.extend_from_slice(body);
        return Ok(out);
    };
    let mut w = Writer {
        buf: Vec::with_capacity(overhead(true, header.sender.len()) + body.len()),
    };
    w.buf.extend_from_slice(&[MAGIC, VERSION_KEYED, kind as u8]);
    w.u64(header.counter);
    put_addr(&mut w, header.dest);
    w.str8(header.sender)?;
    w.buf.extend_from_slice(body);
    let mut m = key.0.clone();
    m.update(&w.buf);
    let tag = m.finalize().into_bytes();
    w.buf.extend_from_slice(&tag[..TAG_LEN]);
    Ok(w.buf)
}

/// Check a datagram's frame, and with `key` its tag; returns its kind,
/// replay header and body.
pub fn open<'a>(packet: &'a [u8], key: Option<&FrameKey>) -> Result<Frame<'a>, FrameError> {
    if packet.len() < FRAME_HEAD || packet[0] != MAGIC {
        return Err(FrameError::NotOurs);
    }
    let expected = if key.is_some() {
        VERSION_KEYED
    } else {
        VERSION_PLAIN
    };
    match packet[1] {
        v if v == expected => {}
        v @ (VERSION_PLAIN | VERSION_KEYED) => {
            return Err(FrameError::Version { found: v, expected })
        }
        _ => return Err(FrameError::NotOurs),
    }
    let Some(key) = key else {
        let kind = Kind::from_u8(packet[2])?;
        return Ok(Frame {
            kind,
            header: None,
            body: &packet[FRAME_HEAD..],
        });
    };
    if packet.len() < FRAME_HEAD + TAG_LEN {
        return Err(FrameError::BadTag);
    }
    let end = packet.len() - TAG_LEN;
    let mut m = key.0.clone();
    m.update(&packet[..end]);
    m.verify_truncated_left(&packet[end..])
        .map_err(|_| FrameError::BadTag)?;
    let kind = Kind::from_u8(packet[2])?;
    let mut r = Reader::new(&packet[FRAME_HEAD..end]);
    let counter = r.u64().map_err(FrameError::BadHeader)?;
    let dest = get_addr(&mut r).map_err(FrameError::BadHeader)?;
    let len = r.u8().map_err(FrameError::BadHeader)?;
    let name = r.bytes(usize::from(len)).map_err(FrameError::BadHeader)?;
    let sender = std::str::from_utf8(name)
        .map_err(|_| FrameError::BadHeader(DecodeError::Invalid("sender utf-8")))?;
    Ok(Frame {
        kind,
        header: Some(FrameHeader {
            counter,
            dest,
            sender,
        }),
        body: r.rest(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn k() -> FrameKey {
        FrameKey::new(b"k")
    }

    fn header(counter: u64) -> FrameHeader<'static> {
        FrameHeader {
            counter,
            dest: "[::1]:7946".parse().unwrap(),
            sender: "node-a",
        }
    }

    #[test]
    fn keyed_frames_roundtrip_and_authenticate_the_header() {
        let h = header(42);
        let sealed = seal(Kind::Push, b"body", Some((&k(), &h))).unwrap();
        assert_eq!(sealed[1], VERSION_KEYED);
        assert_eq!(sealed.len(), overhead(true, 6) + 4);
        let f = open(&sealed, Some(&k())).unwrap();
        assert_eq!(
            (f.kind, f.header, f.body),
            (Kind::Push, Some(h), &b"body"[..])
        );
        // Every byte before the tag is covered: the counter, the
        // destination and the sender cannot be changed.
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x10;
            assert!(open(&bad, Some(&k())).is_err(), "byte {i} not covered");
        }
    }

    #[test]
    fn versions_do_not_mix() {
        let plain = seal(Kind::Digest, b"x", None).unwrap();
        assert_eq!(
            open(&plain, Some(&k())),
            Err(FrameError::Version {
                found: 1,
                expected: 2
            })
        );
        let keyed = seal(Kind::Digest, b"x", Some((&k(), &header(1)))).unwrap();
        assert_eq!(
            open(&keyed, None),
            Err(FrameError::Version {
                found: 2,
                expected: 1
            })
        );
        assert_eq!(open(b"G\x07\x00", None), Err(FrameError::NotOurs));
        let f = open(&plain, None).unwrap();
        assert_eq!((f.kind, f.header, f.body), (Kind::Digest, None, &b"x"[..]));
    }

    #[test]
    fn a_long_sender_name_is_an_encode_error() {
        let name = "n".repeat(256);
        let h = FrameHeader {
            sender: &name,
            ..header(1)
        };
        assert!(seal(Kind::Swim, b"", Some((&k(), &h))).is_err());
    }
}
