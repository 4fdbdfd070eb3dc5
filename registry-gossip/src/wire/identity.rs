//! [`GossipId`], the identity SWIM knows a node by, and its encoding:
//! address family (`4` or `6`), address octets, port, node name (one-byte
//! length), rejoin counter.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::buf::{DecodeError, EncodeError, Reader, Writer};
use crate::crdt::NodeId;

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

/// Append `id`.
pub(super) fn put_id(w: &mut Writer, id: &GossipId) -> Result<(), EncodeError> {
    super::frame::put_addr(w, id.addr);
    w.str8(id.node.as_str())?;
    w.u16(id.bump);
    Ok(())
}

/// Read one identity.
pub(super) fn get_id(r: &mut Reader<'_>) -> Result<GossipId, DecodeError> {
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

/// The most bytes an encoded identity of `node` takes (IPv6).
pub(crate) fn max_encoded_len(node: &NodeId) -> usize {
    1 + 16 + 2 + 1 + node.as_str().len() + 2
}
