//! The zone the responder answers for: its domain and TTL, the names it
//! gives endpoints (SRV targets), and what a question's name stands for.

use hickory_proto::rr::Name;
use waypost::Endpoint;

use super::wire::{self, MAX_LABELS, MAX_LABEL_LEN, MAX_NAME_LEN};

/// What the responder answers for: its zone and the records' TTL.
#[derive(Debug, Clone)]
pub(crate) struct Zone {
    /// The domain, fully qualified and lowercase (`registry.`).
    pub(crate) domain: Name,
    /// The domain in wire form, lowercase, root included.
    wire: Box<[u8]>,
    /// The domain's labels (the root not counted).
    labels: usize,
    /// The TTL of every record, in seconds.
    pub(crate) ttl: u32,
}

/// What a question's name stands for; the keys are lowercase text
/// written into the caller's scratch buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup<'k> {
    /// A name outside the zone.
    Outside,
    /// The zone's apex.
    Apex,
    /// A service's endpoints, of one cluster when `cluster` is given:
    /// `<service>.<domain>`, `<service>.<cluster>.<domain>`,
    /// `<service>.service.<domain>`, or the RFC 2782 forms
    /// `_<service>._<proto>.<domain>`, `_<service>._<proto>.<cluster>.<domain>`
    /// and `_<service>._<proto>.service.<domain>`.
    Service {
        /// The service's name, lowercase.
        service: &'k str,
        /// The cluster's name, lowercase.
        cluster: Option<&'k str>,
    },
    /// `<id>.<node>.node.<domain>` (an SRV target), as `<id>.<node>`.
    Node(&'k str),
    /// Anything else in the zone.
    Unknown,
}

/// One DNS label from `s`: characters other than letters, digits and `-`
/// become `-` (an id such as `10.0.0.1:80` would otherwise span labels),
/// lowercase, at most 63 of them.
pub(crate) fn label(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(MAX_LABEL_LEN)
        .collect();
    if out.is_empty() {
        "-".to_string()
    } else {
        out
    }
}

/// `name`'s labels in wire form, uncompressed, root included.
pub(crate) fn wire_of(name: &Name) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for l in name.iter() {
        out.push(l.len() as u8);
        out.extend_from_slice(l);
    }
    out.push(0);
    out
}

/// Whether a label starts with `_`, as the RFC 2782 forms' do.
fn underscored(l: &[u8]) -> bool {
    l.first() == Some(&b'_')
}

impl Zone {
    /// The zone of `domain` (fully qualified, not the root) with records
    /// of `ttl` seconds.
    pub(crate) fn new(domain: &Name, ttl: u32) -> Self {
        let domain = domain.to_lowercase();
        Self {
            wire: wire_of(&domain).into_boxed_slice(),
            labels: domain.num_labels() as usize,
            domain,
            ttl,
        }
    }

    /// The key of `e`'s SRV target `<id>.<node or service>.node.<domain>`
    /// (its first two labels, `<id>.<node>`) and the whole name in wire
    /// form; `None` when the name would be too long.
    pub(crate) fn target(&self, e: &Endpoint) -> Option<(String, Vec<u8>)> {
        let node = if e.node.is_empty() {
            &e.service
        } else {
            &e.node
        };
        let (id, node) = (label(&e.id), label(node));
        let mut wire = Vec::with_capacity(id.len() + node.len() + 7 + self.wire.len());
        for l in [id.as_str(), node.as_str(), "node"] {
            wire.push(l.len() as u8);
            wire.extend_from_slice(l.as_bytes());
        }
        wire.extend_from_slice(&self.wire);
        (wire.len() <= MAX_NAME_LEN).then(|| (format!("{id}.{node}"), wire))
    }

    /// Where the domain starts in `name` (a question's name in wire form,
    /// in the zone: see [`Zone::classify`]).
    pub(crate) fn domain_offset(&self, name: &[u8]) -> usize {
        name.len().saturating_sub(self.wire.len())
    }

    /// What `name` (a question's name in wire form, uncompressed) stands
    /// for, matched without regard to case. Its keys are written into
    /// `key` (cleared first). Consul's form wins where a name could be
    /// read two ways: `web.service.<domain>` is service `web` of every
    /// cluster, never a cluster named `service`.
    pub(crate) fn classify<'k>(&self, name: &[u8], key: &'k mut Vec<u8>) -> Lookup<'k> {
        let mut offsets = [(0u8, 0u8); MAX_LABELS];
        let n = wire::labels(name, &mut offsets);
        let label = |i: usize| {
            let (s, e) = offsets[i];
            &name[usize::from(s)..usize::from(e)]
        };
        let Some(inner) = n.checked_sub(self.labels) else {
            return Lookup::Outside;
        };
        // The zone's labels end the name: compared from the start of the
        // first of them, so a label that merely ends with the domain's
        // bytes does not match. Length bytes are below 64, which case
        // folding leaves alone.
        let start = usize::from(offsets[inner].0).saturating_sub(1);
        if !name[start..].eq_ignore_ascii_case(&self.wire) {
            return Lookup::Outside;
        }
        key.clear();
        let srv = |a: &[u8], b: &[u8]| underscored(a) && underscored(b);
        let is = |l: &[u8], word: &str| l.eq_ignore_ascii_case(word.as_bytes());
        let (service, cluster): (&[&[u8]], Option<&[u8]>) = match inner {
            0 => return Lookup::Apex,
            _ if inner >= 2 && is(label(inner - 1), "service") => {
                if inner == 3 && srv(label(0), label(1)) {
                    (&[trim(label(0))], None)
                } else {
                    // Consul's form: every label before `service` (a
                    // service name may hold dots).
                    return self.service_of((0..inner - 1).map(label), None, key);
                }
            }
            3 if is(label(2), "node") => {
                return self.node_of(label(0), label(1), key);
            }
            2 if srv(label(0), label(1)) => (&[trim(label(0))], None),
            3 if srv(label(0), label(1)) => (&[trim(label(0))], Some(label(2))),
            1 if !underscored(label(0)) => (&[label(0)], None),
            2 if !underscored(label(0)) => (&[label(0)], Some(label(1))),
            _ => return Lookup::Unknown,
        };
        self.service_of(service.iter().copied(), cluster, key)
    }

    /// [`Lookup::Service`] of the labels of `service` joined by dots and
    /// of `cluster`, lowercase.
    fn service_of<'l, 'k>(
        &self,
        service: impl Iterator<Item = &'l [u8]>,
        cluster: Option<&[u8]>,
        key: &'k mut Vec<u8>,
    ) -> Lookup<'k> {
        for (i, l) in service.enumerate() {
            if i > 0 {
                key.push(b'.');
            }
            key.extend(l.iter().map(u8::to_ascii_lowercase));
        }
        let split = key.len();
        if let Some(c) = cluster {
            key.extend(c.iter().map(u8::to_ascii_lowercase));
        }
        let (service, cluster_key) = key.split_at(split);
        let (Ok(service), Ok(cluster_key)) = (
            std::str::from_utf8(service),
            std::str::from_utf8(cluster_key),
        ) else {
            return Lookup::Unknown;
        };
        Lookup::Service {
            service,
            cluster: cluster.map(|_| cluster_key),
        }
    }

    /// [`Lookup::Node`] of `<id>.<node>`, lowercase.
    fn node_of<'k>(&self, id: &[u8], node: &[u8], key: &'k mut Vec<u8>) -> Lookup<'k> {
        key.extend(id.iter().map(u8::to_ascii_lowercase));
        key.push(b'.');
        key.extend(node.iter().map(u8::to_ascii_lowercase));
        match std::str::from_utf8(key) {
            Ok(k) => Lookup::Node(k),
            Err(_) => Lookup::Unknown,
        }
    }
}

/// A label without its leading underscores (`_web` is service `web`).
fn trim(l: &[u8]) -> &[u8] {
    let n = l.iter().take_while(|&&b| b == b'_').count();
    &l[n..]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::faces::dns::wire::encode_dotted;

    pub(crate) fn zone() -> Zone {
        Zone::new(&Name::from_ascii("registry.").unwrap(), 5)
    }

    fn classify(z: &Zone, name: &str) -> String {
        let mut key = Vec::new();
        match z.classify(&encode_dotted(name).unwrap(), &mut key) {
            Lookup::Service { service, cluster } => format!("service {service} {cluster:?}"),
            Lookup::Node(n) => format!("node {n}"),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn classifies_names_in_the_zone() {
        let z = zone();
        for (q, want) in [
            ("web.service.registry.", "service web None"),
            ("WEB.Service.REGISTRY.", "service web None"),
            ("_web._tcp.service.registry.", "service web None"),
            ("a.b.service.registry.", "service a.b None"),
            ("_web.service.registry.", "service _web None"),
            ("web.registry.", "service web None"),
            ("_web._tcp.registry.", "service web None"),
            ("web.east.registry.", "service web Some(\"east\")"),
            ("Web.EAST.registry.", "service web Some(\"east\")"),
            ("_web._udp.east.registry.", "service web Some(\"east\")"),
            ("__web._udp.registry.", "service web None"),
            ("a.N1.Node.registry.", "node a.n1"),
            ("registry.", "Apex"),
            ("REGISTRY.", "Apex"),
            ("_x.registry.", "Unknown"),
            ("a.b.c.d.registry.", "Unknown"),
            ("web.other.", "Outside"),
            ("web.xregistry.", "Outside"),
            ("com.", "Outside"),
        ] {
            assert_eq!(classify(&z, q), want, "{q}");
        }
    }

    #[test]
    fn a_label_that_holds_the_domain_bytes_is_not_the_domain() {
        // One label "x\x08registry" ends with the domain's wire bytes.
        let z = zone();
        let mut name = vec![10, b'x', 8];
        name.extend(b"registry");
        name.push(0);
        assert_eq!(z.classify(&name, &mut Vec::new()), Lookup::Outside);
    }

    #[test]
    fn targets_are_single_labels_per_part() {
        let z = zone();
        let e = Endpoint::new("web", "10.0.0.1:80", "10.0.0.1", 80).with_node("Node_1");
        let (key, wire) = z.target(&e).unwrap();
        assert_eq!(key, "10-0-0-1-80.node-1");
        assert_eq!(
            wire,
            encode_dotted("10-0-0-1-80.node-1.node.registry.").unwrap()
        );
        // Without a node, the service names it.
        let e = Endpoint::new("web", "a", "10.0.0.1", 80);
        assert_eq!(z.target(&e).unwrap().0, "a.web");
        // A name past 255 bytes has no target.
        let long = Zone::new(
            &Name::from_ascii(format!("{}.{}.", "d".repeat(63), "e".repeat(63))).unwrap(),
            5,
        );
        let e = Endpoint::new("s".repeat(63), "i".repeat(63), "10.0.0.1", 80);
        assert_eq!(long.target(&e), None);
    }
}
