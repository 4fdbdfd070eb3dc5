//! Framing and authentication of every datagram.
//!
//! A datagram is `b'G', version, kind, body…, tag`. With a shared key the
//! tag is the first [`TAG_LEN`] bytes of HMAC-SHA256 over everything before
//! it; without one there is no tag.

use hmac::{KeyInit, Mac};

/// First byte of every datagram.
const MAGIC: u8 = b'G';
/// Wire version.
const VERSION: u8 = 1;
/// Bytes of HMAC-SHA256 kept as the tag.
pub const TAG_LEN: usize = 16;
/// Bytes before the body: magic, version, kind.
pub const FRAME_HEAD: usize = 3;

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

/// Bytes a frame adds around a body: the head, and the tag when
/// datagrams are authenticated.
pub(crate) fn overhead(authenticated: bool) -> usize {
    FRAME_HEAD + if authenticated { TAG_LEN } else { 0 }
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
