//! The wire format: framing and authentication of every datagram
//! ([`seal`], [`open`]), foca's codec for our identity ([`WireCodec`],
//! [`GossipId`]), registry entries ([`encode_entry`], [`decode_entry`]) and
//! anti-entropy messages ([`AeMessage`]) and the membership sync
//! ([`MemberMessage`]).
//!
//! Every decoder reads through [`Reader`], which checks each length against
//! what is left of the packet, so a truncated or forged packet is an
//! error, never a panic or an over-read.
//!
//! A datagram is `b'G', 1, kind, body…` without a key, and
//! `b'G', 2, kind, counter, destination, sender, body…, tag` with one (the
//! tag is the first [`TAG_LEN`] bytes of HMAC-SHA256 over everything before
//! it); see [`seal`].
//!
//! Public with the `sim` feature, for tests that craft, replay or fuzz
//! datagrams; [`GossipId`] is at the crate root too.

mod codec;
mod frame;
mod identity;
mod members;

// The module's public face (with the `sim` feature); without it the crate
// names some of these through their own modules.
#[cfg_attr(not(feature = "sim"), allow(unused_imports))]
pub use self::codec::{decode_body, swim_broadcasts, AeMessage, CodecError, WireCodec};
#[cfg_attr(not(feature = "sim"), allow(unused_imports))]
pub use self::frame::{
    open, seal, Frame, FrameError, FrameHeader, FrameKey, Kind, FRAME_HEAD, TAG_LEN, VERSION_KEYED,
    VERSION_PLAIN,
};
pub use self::identity::GossipId;
pub use self::members::MemberMessage;
#[cfg_attr(not(feature = "sim"), allow(unused_imports))]
pub use crate::buf::{DecodeError, EncodeError, Reader, Writer};
#[cfg_attr(not(feature = "sim"), allow(unused_imports))]
pub use crate::layout::{decode_entry, encode_entry, get_entry, put_entry};

pub(crate) use self::codec::swim_route;
pub(crate) use self::frame::overhead;
pub(crate) use self::identity::max_encoded_len as max_identity_len;
