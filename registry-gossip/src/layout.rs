//! How an endpoint's register travels: one [`Entry`] as bytes. This is
//! both a SWIM custom-broadcast item and an element of an anti-entropy
//! push.
//!
//! An entry is `flags: u8` (bit 0: tombstone, bit 1: death tombstone),
//! `timestamp: u64`, `generation: u64`, `writer: str8`, `service: str16`,
//! `id: str16` and, for a live entry only, the endpoint: `address: str16`,
//! `port: u16`, `protocol: str8`, `cluster: str16`, `node: str16`,
//! `health: u8` (`0` healthy, `1` unhealthy, `2` draining) and `labels` (a count, then
//! `key: str16, value: str16` pairs). Integers are big-endian; `str8` and
//! `str16` are UTF-8 behind a one- or two-byte length.
//!
//! A decoded endpoint must pass [`waypost::backend::validate_endpoint`], labels
//! must be distinct, and a live entry cannot be marked dead; anything else
//! is a [`DecodeError`].

use waypost::{Endpoint, EndpointKey, Health};

use crate::buf::{DecodeError, EncodeError, Reader, Writer};
use crate::crdt::{Entry, NodeId, Stamp};

const FLAG_TOMBSTONE: u8 = 1;
const FLAG_DIED: u8 = 2;

fn put_health(h: Health) -> u8 {
    match h {
        Health::Healthy => 0,
        Health::Unhealthy => 1,
        Health::Draining => 2,
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

/// Read one entry; the endpoint must pass [`waypost::backend::validate_endpoint`].
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
            2 => Health::Draining,
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
