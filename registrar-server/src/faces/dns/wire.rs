//! The DNS wire format as the responder needs it: reading a request's
//! header, question and EDNS size without copying (RFC 1035 4.1, RFC 6891
//! 6.1), and the constants and small writers the answers are built from.

/// The length of a message's header.
pub(crate) const HEADER_LEN: usize = 12;
/// The largest DNS name on the wire, length bytes and root included.
pub(crate) const MAX_NAME_LEN: usize = 255;
/// The longest label.
pub(crate) const MAX_LABEL_LEN: usize = 63;
/// The most labels a name of [`MAX_NAME_LEN`] bytes can have.
pub(crate) const MAX_LABELS: usize = 127;

/// Record types the responder answers or reads.
pub(crate) mod rtype {
    /// An IPv4 address.
    pub(crate) const A: u16 = 1;
    /// The zone's start of authority.
    pub(crate) const SOA: u16 = 6;
    /// An IPv6 address.
    pub(crate) const AAAA: u16 = 28;
    /// A service location (RFC 2782).
    pub(crate) const SRV: u16 = 33;
    /// The EDNS pseudo-record (RFC 6891).
    pub(crate) const OPT: u16 = 41;
    /// Any type (a question only).
    pub(crate) const ANY: u16 = 255;
}

/// The class of every record written: IN.
pub(crate) const CLASS_IN: u16 = 1;

/// Response codes (RFC 1035 4.1.1).
pub(crate) mod rcode {
    /// No error.
    pub(crate) const NOERROR: u16 = 0;
    /// The request could not be read as a query.
    pub(crate) const FORMERR: u16 = 1;
    /// The zone has no state yet.
    pub(crate) const SERVFAIL: u16 = 2;
    /// The name does not exist.
    pub(crate) const NXDOMAIN: u16 = 3;
    /// Not a query.
    pub(crate) const NOTIMP: u16 = 4;
    /// A name outside the zone (no recursion).
    pub(crate) const REFUSED: u16 = 5;
}

/// Header flag bits (the second 16-bit word).
pub(crate) mod flag {
    /// A response.
    pub(crate) const QR: u16 = 0x8000;
    /// The opcode's four bits.
    pub(crate) const OPCODE: u16 = 0x7800;
    /// Authoritative answer.
    pub(crate) const AA: u16 = 0x0400;
    /// Truncated.
    pub(crate) const TC: u16 = 0x0200;
    /// Recursion desired (copied from the request).
    pub(crate) const RD: u16 = 0x0100;
    /// Checking disabled (copied from the request).
    pub(crate) const CD: u16 = 0x0010;
}

/// A request as the responder reads it: everything borrowed from the
/// received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request<'a> {
    /// The message ID.
    pub(crate) id: u16,
    /// The header's flag word.
    pub(crate) flags: u16,
    /// How many questions it asks.
    pub(crate) qdcount: u16,
    /// The question section as received (it is echoed at the same offset,
    /// so names compressed within it stay valid).
    pub(crate) questions: &'a [u8],
    /// The question, when there is exactly one.
    pub(crate) question: Option<Question<'a>>,
    /// The UDP payload size of its OPT record, when it has one.
    pub(crate) edns: Option<u16>,
}

/// The one question of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Question<'a> {
    /// The name, uncompressed, in wire form.
    pub(crate) name: &'a [u8],
    /// The type asked for.
    pub(crate) qtype: u16,
}

impl Request<'_> {
    /// Whether it is a query (not a response, opcode QUERY).
    pub(crate) fn is_query(&self) -> bool {
        self.flags & (flag::QR | flag::OPCODE) == 0
    }

    /// The largest UDP answer it takes: 512 bytes, or the EDNS size it
    /// offers when larger.
    pub(crate) fn udp_limit(&self) -> usize {
        usize::from(self.edns.unwrap_or(512).max(512))
    }
}

/// Read a big-endian `u16` at `at`.
fn u16_at(msg: &[u8], at: usize) -> Option<u16> {
    let b = msg.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// The end of the (possibly compressed) name at `at`, and whether it was
/// written without compression; `None` when it runs past the message or
/// uses a reserved label type.
fn skip_name(msg: &[u8], mut at: usize) -> Option<(usize, bool)> {
    let start = at;
    loop {
        let len = *msg.get(at)?;
        match len & 0xC0 {
            0x00 if len == 0 => {
                let end = at + 1;
                return (end - start <= MAX_NAME_LEN).then_some((end, true));
            }
            0x00 => at += 1 + usize::from(len),
            0xC0 => {
                msg.get(at + 1)?;
                return Some((at + 2, false));
            }
            _ => return None,
        }
    }
}

/// Read `msg` as a request; `None` when it is not a whole DNS message
/// (too short, a section running past its end, a malformed name): such
/// datagrams get no answer.
pub(crate) fn parse(msg: &[u8]) -> Option<Request<'_>> {
    let id = u16_at(msg, 0)?;
    let flags = u16_at(msg, 2)?;
    let qdcount = u16_at(msg, 4)?;
    let ancount = u16_at(msg, 6)?;
    let nscount = u16_at(msg, 8)?;
    let arcount = u16_at(msg, 10)?;
    let mut at = HEADER_LEN;
    let mut question = None;
    for _ in 0..qdcount {
        let (end, plain) = skip_name(msg, at)?;
        let qtype = u16_at(msg, end)?;
        u16_at(msg, end + 2)?;
        if qdcount == 1 && plain {
            question = Some(Question {
                name: &msg[at..end],
                qtype,
            });
        }
        at = end + 4;
    }
    let questions = &msg[HEADER_LEN..at];
    let mut edns = None;
    for i in 0..u32::from(ancount) + u32::from(nscount) + u32::from(arcount) {
        let (end, _) = skip_name(msg, at)?;
        let rtype = u16_at(msg, end)?;
        let class = u16_at(msg, end + 2)?;
        let rdlen = usize::from(u16_at(msg, end + 8)?);
        let next = end + 10 + rdlen;
        if next > msg.len() {
            return None;
        }
        let additional = i >= u32::from(ancount) + u32::from(nscount);
        if additional && rtype == rtype::OPT && edns.is_none() {
            edns = Some(class);
        }
        at = next;
    }
    Some(Request {
        id,
        flags,
        qdcount,
        questions,
        question,
        edns,
    })
}

/// The labels of the uncompressed wire name `name`, root excluded, as
/// `(start, end)` offsets into it, in `out`; how many there are.
pub(crate) fn labels(name: &[u8], out: &mut [(u8, u8); MAX_LABELS]) -> usize {
    let mut n = 0;
    let mut at = 0;
    while let Some(&len) = name.get(at) {
        if len == 0 || n == MAX_LABELS {
            break;
        }
        let start = at + 1;
        let end = start + usize::from(len);
        // Names are at most 255 bytes, so offsets fit in a u8.
        out[n] = (start as u8, end.min(name.len()) as u8);
        n += 1;
        at = end;
    }
    n
}

/// `name` (a host name such as `db.example.com`, or a sanitized target)
/// in wire form, uncompressed; `None` when a label is empty or too long,
/// or the name is too long.
#[cfg(test)]
pub(crate) fn encode_dotted(name: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > MAX_LABEL_LEN {
            return None;
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    (out.len() <= MAX_NAME_LEN).then_some(out)
}

/// A compression pointer to `offset` (below 0x4000).
pub(crate) fn pointer(offset: usize) -> [u8; 2] {
    (0xC000 | (offset as u16 & 0x3FFF)).to_be_bytes()
}

/// The length of the uncompressed wire name starting `name`.
pub(crate) fn name_len(name: &[u8]) -> usize {
    let mut at = 0;
    while let Some(&len) = name.get(at) {
        at += 1 + usize::from(len);
        if len == 0 {
            break;
        }
    }
    at.min(name.len())
}

#[cfg(test)]
/// A query for `name`/`qtype` with id 7, RD set, and an OPT record of
/// `edns` bytes when given.
pub(crate) fn query(name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
    let mut m = vec![
        0,
        7,
        0x01,
        0x00,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
        u8::from(edns.is_some()),
    ];
    m.extend(encode_dotted(name).expect("a valid name"));
    m.extend(qtype.to_be_bytes());
    m.extend(CLASS_IN.to_be_bytes());
    if let Some(size) = edns {
        m.push(0);
        m.extend(rtype::OPT.to_be_bytes());
        m.extend(size.to_be_bytes());
        m.extend([0, 0, 0, 0, 0, 0]);
    }
    m
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_a_query_with_and_without_edns() {
        let plain = query("web.registry.", rtype::SRV, None);
        let r = parse(&plain).unwrap();
        assert_eq!((r.id, r.qdcount, r.edns), (7, 1, None));
        assert!(r.is_query());
        assert_eq!(r.udp_limit(), 512);
        let q = r.question.unwrap();
        assert_eq!(q.qtype, rtype::SRV);
        assert_eq!(q.name, &b"\x03web\x08registry\x00"[..]);
        assert_eq!(r.questions.len(), q.name.len() + 4);

        let edns = query("web.registry.", rtype::A, Some(1232));
        let r = parse(&edns).unwrap();
        assert_eq!(r.edns, Some(1232));
        assert_eq!(r.udp_limit(), 1232);
        // A size below 512 still allows 512.
        assert_eq!(parse(&query("a.", 1, Some(100))).unwrap().udp_limit(), 512);
    }

    #[test]
    fn truncated_or_malformed_messages_are_not_read() {
        let q = query("web.registry.", rtype::A, Some(1232));
        for cut in 0..q.len() {
            assert_eq!(parse(&q[..cut]), None, "cut at {cut}");
        }
        // A reserved label type (0x40).
        let mut bad = query("web.registry.", rtype::A, None);
        bad[HEADER_LEN] = 0x43;
        assert_eq!(parse(&bad), None);
        // A name over 255 bytes.
        let mut long = vec![0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for _ in 0..5 {
            long.push(60);
            long.extend([b'a'; 60]);
        }
        long.extend([0, 0, 1, 0, 1]);
        assert_eq!(parse(&long), None);
    }

    #[test]
    fn labels_and_names() {
        let name = encode_dotted("A.bc.registry.").unwrap();
        let mut out = [(0u8, 0u8); MAX_LABELS];
        let n = labels(&name, &mut out);
        let got: Vec<&[u8]> = out[..n]
            .iter()
            .map(|&(s, e)| &name[usize::from(s)..usize::from(e)])
            .collect();
        assert_eq!(got, [&b"A"[..], b"bc", b"registry"]);
        assert_eq!(name_len(&name), name.len());
        assert_eq!(pointer(12), [0xC0, 0x0C]);
        assert_eq!(encode_dotted("a..b"), None);
        assert_eq!(encode_dotted(&"x".repeat(64)), None);
    }
}
