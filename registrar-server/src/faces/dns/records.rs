//! Records encoded once, as they go into an answer: built when the index
//! takes a change of the registry, copied into each answer as they are.
//!
//! An answer's records are named by the question, so their owner is a
//! compression pointer to the question's name (offset 12 in every
//! answer). An SRV record's target is written whole (RFC 2782: no
//! compression in its RDATA); the address records of the additional
//! section name those targets with pointers, which depend on where the
//! answer section starts and are filled in per answer ([`SrvSet`]).

use std::net::IpAddr;

use hickory_proto::rr::Name;
use waypost::{Endpoint, Health};

use super::wire::{name_len, pointer, rtype, CLASS_IN, HEADER_LEN};
use super::zone::{wire_of, Zone};

/// The label giving an endpoint's SRV weight.
const WEIGHT_LABEL: &str = "weight";

/// Records of one name, encoded back to back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Rrs {
    /// The records.
    pub(crate) bytes: Vec<u8>,
    /// How many.
    pub(crate) count: usize,
}

impl Rrs {
    /// Append one record: type, TTL and RDATA (its owner written by
    /// `owner`).
    fn push(&mut self, owner: &[u8], rtype: u16, ttl: u32, rdata: &[&[u8]]) {
        let len: usize = rdata.iter().map(|p| p.len()).sum();
        self.bytes.extend_from_slice(owner);
        self.bytes.extend_from_slice(&rtype.to_be_bytes());
        self.bytes.extend_from_slice(&CLASS_IN.to_be_bytes());
        self.bytes.extend_from_slice(&ttl.to_be_bytes());
        // RDATA here is at most 6 bytes and a name of 255.
        self.bytes.extend_from_slice(&(len as u16).to_be_bytes());
        for part in rdata {
            self.bytes.extend_from_slice(part);
        }
        self.count += 1;
    }

    /// Append an A or AAAA record of `ip` owned by `owner`.
    fn push_address(&mut self, owner: &[u8], ip: IpAddr, ttl: u32) {
        match ip {
            IpAddr::V4(v4) => self.push(owner, rtype::A, ttl, &[&v4.octets()]),
            IpAddr::V6(v6) => self.push(owner, rtype::AAAA, ttl, &[&v6.octets()]),
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }
}

/// The owner of an answer's records: the question's name.
const QUESTION: [u8; 2] = [0xC0, HEADER_LEN as u8];

/// The A and AAAA records of one name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Addresses {
    /// The A records.
    pub(crate) a: Rrs,
    /// The AAAA records.
    pub(crate) aaaa: Rrs,
}

impl Addresses {
    /// Add the record of `ip`.
    pub(crate) fn add(&mut self, ip: IpAddr, ttl: u32) {
        match ip {
            IpAddr::V4(_) => self.a.push_address(&QUESTION, ip, ttl),
            IpAddr::V6(_) => self.aaaa.push_address(&QUESTION, ip, ttl),
        }
    }

    /// Give back what the records did not use of their buffers (they are
    /// kept for as long as the name does not change).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.a.bytes.shrink_to_fit();
        self.aaaa.bytes.shrink_to_fit();
    }
}

/// A name's SRV records and the addresses of their targets.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SrvSet {
    /// The SRV records (the answer section).
    pub(crate) answer: Rrs,
    /// The targets' A/AAAA records (the additional section), each owner a
    /// two-byte placeholder for a pointer to its target.
    pub(crate) extra: Rrs,
    /// Per record of `extra`: where it starts in `extra`, and where its
    /// target starts in `answer`.
    pub(crate) owners: Vec<(usize, usize)>,
    /// The length of `extra` with every owner written whole (for an
    /// answer section too long for pointers to reach into).
    pub(crate) extra_whole_len: usize,
}

impl SrvSet {
    /// Append the additional section to `out`, whose answer section
    /// starts at `answer_at`: owners as pointers to the targets, or whole
    /// names when a target lies beyond a pointer's reach.
    pub(crate) fn write_extra(&self, out: &mut Vec<u8>, answer_at: usize) {
        let reach = self.owners.last().map_or(0, |&(_, t)| answer_at + t);
        if reach < 0x4000 {
            let base = out.len();
            out.extend_from_slice(&self.extra.bytes);
            for &(at, target) in &self.owners {
                out[base + at..base + at + 2].copy_from_slice(&pointer(answer_at + target));
            }
            return;
        }
        for (i, &(at, target)) in self.owners.iter().enumerate() {
            let end = self
                .owners
                .get(i + 1)
                .map_or(self.extra.bytes.len(), |&(next, _)| next);
            let name = &self.answer.bytes[target..];
            out.extend_from_slice(&name[..name_len(name)]);
            out.extend_from_slice(&self.extra.bytes[at + 2..end]);
        }
    }

    /// The length [`SrvSet::write_extra`] writes with the answer section
    /// at `answer_at`.
    pub(crate) fn extra_len(&self, answer_at: usize) -> usize {
        match self.owners.last() {
            Some(&(_, t)) if answer_at + t >= 0x4000 => self.extra_whole_len,
            _ => self.extra.len(),
        }
    }
}

/// The records of a set of endpoints under one name: addresses and SRV.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RecordSets {
    /// A and AAAA.
    pub(crate) addresses: Addresses,
    /// SRV, with the targets' addresses.
    pub(crate) srv: SrvSet,
}

/// The weight of `e`'s SRV record: its `weight` label, or 1 without one
/// or when it is not 0-65535.
fn weight(e: &Endpoint) -> u16 {
    e.labels
        .get(WEIGHT_LABEL)
        .and_then(|w| w.parse::<u16>().ok())
        .unwrap_or(1)
}

/// `address` (a host name) as an SRV target in wire form; `None` when it
/// is not a DNS name.
fn host_target(address: &str) -> Option<Vec<u8>> {
    let mut name = Name::from_ascii(address).ok()?;
    name.set_fqdn(true);
    Some(wire_of(&name))
}

impl RecordSets {
    /// The records of the healthy ones of `endpoints` (in their order):
    /// the IPv4 and IPv6 addresses (host names are left out), and one SRV
    /// record each, of priority 1, targeting `<id>.<node>.node.<domain>`
    /// with its address in the additional section, or the host name
    /// itself.
    pub(crate) fn of<'a>(zone: &Zone, endpoints: impl IntoIterator<Item = &'a Endpoint>) -> Self {
        let mut out = RecordSets::default();
        let ttl = zone.ttl;
        for e in endpoints
            .into_iter()
            .filter(|e| e.health == Health::Healthy)
        {
            let ip = e.address.parse::<IpAddr>().ok();
            if let Some(ip) = ip {
                out.addresses.add(ip, ttl);
            }
            let target = match ip {
                Some(_) => zone.target(e).map(|(_, wire)| wire),
                None => host_target(&e.address),
            };
            let Some(target) = target else { continue };
            let srv = &mut out.srv;
            // The target follows the fixed part: owner (2), type, class,
            // TTL, length (10), priority, weight, port (6).
            let at = srv.answer.len() + 18;
            let fixed = [1u16, weight(e), e.port].map(u16::to_be_bytes).concat();
            srv.answer
                .push(&QUESTION, rtype::SRV, ttl, &[&fixed, &target]);
            if let Some(ip) = ip {
                srv.owners.push((srv.extra.len(), at));
                srv.extra.push_address(&[0, 0], ip, ttl);
                srv.extra_whole_len += target.len() + srv.extra.len()
                    - srv.owners.last().map_or(0, |&(start, _)| start)
                    - 2;
            }
        }
        out.addresses.shrink_to_fit();
        out.srv.answer.bytes.shrink_to_fit();
        out.srv.extra.bytes.shrink_to_fit();
        out.srv.owners.shrink_to_fit();
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::faces::dns::wire::encode_dotted;

    fn zone() -> Zone {
        Zone::new(&Name::from_ascii("registry.").unwrap(), 5)
    }

    #[test]
    fn healthy_endpoints_give_addresses_and_srv_records() {
        let z = zone();
        let eps = [
            Endpoint::new("web", "a", "10.0.0.1", 80).with_node("n1"),
            Endpoint::new("web", "b", "::1", 81).with_label("weight", "7"),
            Endpoint::new("web", "c", "db.example.com", 82).with_label("weight", "x"),
            Endpoint::new("web", "d", "10.0.0.4", 83).with_health(Health::Unhealthy),
            // Draining: serving what it has, taking nothing new, so no
            // record sends it anything.
            Endpoint::new("web", "e", "10.0.0.5", 84).with_health(Health::Draining),
        ];
        let r = RecordSets::of(&z, &eps);
        assert_eq!((r.addresses.a.count, r.addresses.aaaa.count), (1, 1));
        assert_eq!(
            r.addresses.a.bytes,
            [0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 10, 0, 0, 1]
        );
        assert_eq!(r.srv.answer.count, 3);
        assert_eq!(r.srv.extra.count, 2);
        // The first SRV record: priority 1, weight 1, port 80, its target.
        let target = encode_dotted("a.n1.node.registry.").unwrap();
        assert_eq!(&r.srv.answer.bytes[12..18], &[0, 1, 0, 1, 0, 80]);
        assert_eq!(&r.srv.answer.bytes[18..18 + target.len()], &target[..]);
        assert_eq!(r.srv.owners[0], (0, 18));
        // A host name is the target itself, with nothing additional.
        let host = encode_dotted("db.example.com.").unwrap();
        let rec = r.srv.answer.bytes.windows(host.len()).any(|w| w == host);
        assert!(rec, "the host name is a target");
    }

    #[test]
    fn additional_owners_point_at_targets_or_are_written_whole() {
        let z = zone();
        let eps = [
            Endpoint::new("web", "a", "10.0.0.1", 80).with_node("n1"),
            Endpoint::new("web", "b", "10.0.0.2", 80).with_node("n1"),
        ];
        let srv = RecordSets::of(&z, &eps).srv;
        let mut near = Vec::new();
        srv.write_extra(&mut near, 40);
        assert_eq!(near.len(), srv.extra_len(40));
        assert_eq!(&near[..2], &pointer(40 + 18));
        let second = srv.owners[1];
        assert_eq!(&near[second.0..second.0 + 2], &pointer(40 + second.1));

        let far = 0x4000;
        let mut whole = Vec::new();
        srv.write_extra(&mut whole, far);
        assert_eq!(whole.len(), srv.extra_len(far));
        let a = encode_dotted("a.n1.node.registry.").unwrap();
        assert_eq!(&whole[..a.len()], &a[..]);
        assert_eq!(&whole[a.len()..a.len() + 2], &rtype::A.to_be_bytes());
        let b = encode_dotted("b.n1.node.registry.").unwrap();
        let at = a.len() + 14;
        assert_eq!(&whole[at..at + b.len()], &b[..]);
        assert_eq!(whole.len(), a.len() + b.len() + 2 * 14);
    }
}
