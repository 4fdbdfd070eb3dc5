//! Answering one DNS message from the index: the request read in place,
//! the answer written into a buffer the caller reuses, its records copied
//! from those encoded when the index was built.
//!
//! An answer too long for the transport's limit (over UDP 512 bytes, or
//! the EDNS size the client offers) is cut as RFC 2181 section 9 says: the
//! additional section goes first, and only when the answer section alone
//! does not fit is TC set, with no records, so that the client asks again
//! over TCP.

use super::index::Index;
use super::records::{Rrs, SrvSet};
use super::wire::{self, flag, pointer, rcode, rtype, Request, CLASS_IN, HEADER_LEN};
use super::zone::{Lookup, Zone};

/// The largest UDP answer offered to EDNS clients.
pub(crate) const EDNS_PAYLOAD: u16 = 1232;
/// The length of the OPT record an EDNS answer ends with.
const OPT_LEN: usize = 11;
/// The largest DNS message (over TCP, its length is 16 bits).
const MAX_MESSAGE: usize = 65535;

/// The transport a message came over, which bounds its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// UDP: 512 bytes, or the client's EDNS size.
    Udp,
    /// TCP: a whole message.
    Tcp,
}

/// What goes after the question.
enum Body<'i> {
    /// No records.
    Empty,
    /// The zone's SOA, in the answer section (a question for the apex's
    /// SOA) or in the authority section (NXDOMAIN).
    Soa {
        /// In the authority section.
        authority: bool,
        /// The serial.
        serial: u32,
    },
    /// Address records: A, AAAA, or both (ANY).
    Addresses(&'i Rrs, Option<&'i Rrs>),
    /// SRV records with their targets' addresses.
    Srv(&'i SrvSet),
}

/// The answer to `msg` from `index` (`None`: the registrar has no state
/// yet, SERVFAIL) written into `out` (cleared first), bounded by what
/// `transport` carries; false when `msg` is not a DNS message and gets
/// no answer. `key` is scratch space for the names looked up.
pub(crate) fn respond(
    zone: &Zone,
    index: Option<&Index>,
    msg: &[u8],
    transport: Transport,
    key: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> bool {
    let Some(req) = wire::parse(msg) else {
        return false;
    };
    out.clear();
    out.extend_from_slice(&[0; HEADER_LEN]);
    out.extend_from_slice(req.questions);
    let limit = match transport {
        Transport::Udp => req.udp_limit(),
        Transport::Tcp => MAX_MESSAGE,
    };
    let mut flags = flag::QR | (req.flags & (flag::OPCODE | flag::RD | flag::CD));
    let (code, body) = decide(zone, index, &req, &mut flags, key);
    let counts = write_body(zone, &req, body, limit, &mut flags, out);
    let additional = counts[2] + u16::from(req.edns.is_some());
    if req.edns.is_some() {
        out.push(0);
        out.extend_from_slice(&rtype::OPT.to_be_bytes());
        out.extend_from_slice(&EDNS_PAYLOAD.to_be_bytes());
        out.extend_from_slice(&[0; 6]);
    }
    let header = [
        req.id,
        flags | code,
        req.qdcount,
        counts[0],
        counts[1],
        additional,
    ];
    for (i, word) in header.iter().enumerate() {
        out[2 * i..2 * i + 2].copy_from_slice(&word.to_be_bytes());
    }
    true
}

/// The response code and what answers `req`; sets AA for names in the
/// zone.
fn decide<'i>(
    zone: &Zone,
    index: Option<&'i Index>,
    req: &Request<'_>,
    flags: &mut u16,
    key: &mut Vec<u8>,
) -> (u16, Body<'i>) {
    if !req.is_query() {
        return (rcode::NOTIMP, Body::Empty);
    }
    let Some(question) = req.question.filter(|_| req.qdcount == 1) else {
        return (rcode::FORMERR, Body::Empty);
    };
    let lookup = zone.classify(question.name, key);
    if lookup == Lookup::Outside {
        return (rcode::REFUSED, Body::Empty);
    }
    *flags |= flag::AA;
    let Some(index) = index else {
        return (rcode::SERVFAIL, Body::Empty);
    };
    let nxdomain = (
        rcode::NXDOMAIN,
        Body::Soa {
            authority: true,
            serial: index.serial(),
        },
    );
    let qtype = question.qtype;
    let addresses = |a: &'i Rrs, aaaa: &'i Rrs| match qtype {
        rtype::A => Body::Addresses(a, None),
        rtype::AAAA => Body::Addresses(aaaa, None),
        rtype::ANY => Body::Addresses(a, Some(aaaa)),
        _ => Body::Empty,
    };
    let body = match lookup {
        Lookup::Service { service, cluster } => {
            let Some(entry) = index.service(service) else {
                return nxdomain;
            };
            let records = match cluster {
                None => &entry.all,
                Some(c) => match entry.clusters.get(c) {
                    Some(r) => r,
                    None => return nxdomain,
                },
            };
            match qtype {
                rtype::SRV => Body::Srv(&records.srv),
                _ => addresses(&records.addresses.a, &records.addresses.aaaa),
            }
        }
        Lookup::Node(key) => match index.node(key) {
            Some(node) => addresses(&node.addresses.a, &node.addresses.aaaa),
            None => return nxdomain,
        },
        Lookup::Apex if matches!(qtype, rtype::SOA | rtype::ANY) => Body::Soa {
            authority: false,
            serial: index.serial(),
        },
        Lookup::Apex => Body::Empty,
        Lookup::Unknown | Lookup::Outside => return nxdomain,
    };
    (rcode::NOERROR, body)
}

/// Write `body` after the question in `out`, within `limit` bytes with
/// the OPT record still to come; the answer, authority and additional
/// counts (OPT not included). Sets TC when the answer section does not
/// fit.
fn write_body(
    zone: &Zone,
    req: &Request<'_>,
    body: Body<'_>,
    limit: usize,
    flags: &mut u16,
    out: &mut Vec<u8>,
) -> [u16; 3] {
    let room = limit.saturating_sub(out.len() + if req.edns.is_some() { OPT_LEN } else { 0 });
    // Counts fit 16 bits whenever the records fit a message.
    let count = |n: usize| n as u16;
    match body {
        Body::Empty => [0, 0, 0],
        Body::Soa { authority, serial } => {
            let name = req.question.map_or(&[][..], |q| q.name);
            let domain = HEADER_LEN + zone.domain_offset(name);
            write_soa(zone, domain, serial, out);
            if authority {
                [0, 1, 0]
            } else {
                [1, 0, 0]
            }
        }
        Body::Addresses(first, second) => {
            let second_len = second.map_or(0, Rrs::len);
            if first.len() + second_len > room {
                *flags |= flag::TC;
                return [0, 0, 0];
            }
            out.extend_from_slice(&first.bytes);
            if let Some(s) = second {
                out.extend_from_slice(&s.bytes);
            }
            [count(first.count + second.map_or(0, |s| s.count)), 0, 0]
        }
        Body::Srv(srv) => {
            let answer_at = out.len();
            if srv.answer.len() > room {
                *flags |= flag::TC;
                return [0, 0, 0];
            }
            out.extend_from_slice(&srv.answer.bytes);
            if srv.answer.len() + srv.extra_len(answer_at) > room {
                return [count(srv.answer.count), 0, 0];
            }
            srv.write_extra(out, answer_at);
            [count(srv.answer.count), 0, count(srv.extra.count)]
        }
    }
}

/// Append the zone's SOA record, its owner and the domain in its names a
/// pointer to the domain at `domain` (in the question).
fn write_soa(zone: &Zone, domain: usize, serial: u32, out: &mut Vec<u8>) {
    let at = pointer(domain);
    out.extend_from_slice(&at);
    out.extend_from_slice(&rtype::SOA.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&zone.ttl.to_be_bytes());
    let rdata_at = out.len();
    out.extend_from_slice(&[0, 0]);
    // MNAME ns.<domain>, RNAME hostmaster.<domain>.
    out.extend_from_slice(b"\x02ns");
    out.extend_from_slice(&at);
    out.extend_from_slice(b"\x0ahostmaster");
    out.extend_from_slice(&at);
    for n in [serial, 3600, 600, 86400, zone.ttl] {
        out.extend_from_slice(&n.to_be_bytes());
    }
    let len = (out.len() - rdata_at - 2) as u16;
    out[rdata_at..rdata_at + 2].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
