//! Answering one DNS query from a snapshot of the registry.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use waypost::{Endpoint, Health, Snapshot};

/// The largest UDP answer offered to EDNS clients.
const EDNS_PAYLOAD: u16 = 1232;

/// What the responder answers for: its zone and the records' TTL.
#[derive(Debug, Clone)]
pub(crate) struct Zone {
    /// The domain, fully qualified and lowercase (`registry.`).
    pub(crate) domain: Name,
    /// The TTL of every record, in seconds.
    pub(crate) ttl: u32,
}

/// What a name in the zone stands for.
#[derive(Debug, PartialEq, Eq)]
enum Lookup {
    /// A service's endpoints, of one cluster when `cluster` is given:
    /// `<service>.<domain>`, `<service>.<cluster>.<domain>`,
    /// `<service>.service.<domain>`, or the RFC 2782 forms
    /// `_<service>._<proto>.<domain>`, `_<service>._<proto>.<cluster>.<domain>`
    /// and `_<service>._<proto>.service.<domain>`.
    Service {
        service: String,
        cluster: Option<String>,
    },
    /// `<id>.<node>.node.<domain>`: an SRV target.
    Node(Name),
    /// The zone's apex.
    Apex,
    /// Anything else in the zone.
    Unknown,
}

impl Lookup {
    fn service(service: &str, cluster: Option<&str>) -> Self {
        Lookup::Service {
            service: service.trim_start_matches('_').to_string(),
            cluster: cluster.map(str::to_string),
        }
    }
}

/// A name's labels as text, lowercase.
fn labels(name: &Name) -> Vec<String> {
    name.iter()
        .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
        .collect()
}

/// One DNS label from `s`: characters other than letters, digits and `-`
/// become `-` (an id such as `10.0.0.1:80` would otherwise span labels).
fn label(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    if out.is_empty() {
        "-".to_string()
    } else {
        out
    }
}

impl Zone {
    fn classify(&self, name: &Name) -> Lookup {
        let name = name.to_lowercase();
        let zone_labels = self.domain.num_labels() as usize;
        let all = labels(&name);
        let Some(inner) = all.len().checked_sub(zone_labels).map(|n| &all[..n]) else {
            return Lookup::Unknown;
        };
        let srv = |svc: &str, proto: &str| svc.starts_with('_') && proto.starts_with('_');
        match inner {
            [] => Lookup::Apex,
            [rest @ .., kind] if kind == "service" && !rest.is_empty() => match rest {
                [svc, proto] if srv(svc, proto) => Lookup::service(svc, None),
                _ => Lookup::Service {
                    service: rest.join("."),
                    cluster: None,
                },
            },
            [_, _, kind] if kind == "node" => Lookup::Node(name),
            [svc, proto] if srv(svc, proto) => Lookup::service(svc, None),
            [svc, proto, cluster] if srv(svc, proto) => Lookup::service(svc, Some(cluster)),
            [svc] if !svc.starts_with('_') => Lookup::service(svc, None),
            [svc, cluster] if !svc.starts_with('_') => Lookup::service(svc, Some(cluster)),
            _ => Lookup::Unknown,
        }
    }

    /// The SRV target of `e`: `<id>.<node or service>.node.<domain>`.
    pub(crate) fn target(&self, e: &Endpoint) -> Option<Name> {
        let node = if e.node.is_empty() {
            &e.service
        } else {
            &e.node
        };
        Name::from_ascii(format!("{}.{}.node", label(&e.id), label(node)))
            .ok()?
            .append_domain(&self.domain)
            .ok()
    }

    fn address_record(&self, name: &Name, e: &Endpoint, rtype: RecordType) -> Option<Record> {
        let ip: IpAddr = e.address.parse().ok()?;
        let rdata = match (ip, rtype) {
            (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => RData::A(A(v4)),
            (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => RData::AAAA(AAAA(v6)),
            _ => return None,
        };
        Some(Record::from_rdata(name.clone(), self.ttl, rdata))
    }

    fn soa(&self, serial: u64) -> Option<Record> {
        let mname = Name::from_ascii("ns")
            .ok()?
            .append_domain(&self.domain)
            .ok()?;
        let rname = Name::from_ascii("hostmaster")
            .ok()?
            .append_domain(&self.domain)
            .ok()?;
        let soa = SOA::new(mname, rname, serial as u32, 3600, 600, 86400, self.ttl);
        Some(Record::from_rdata(
            self.domain.clone(),
            self.ttl,
            RData::SOA(soa),
        ))
    }

    /// The answer to `request` from `snapshot` (`None`: not loaded yet,
    /// SERVFAIL).
    pub(crate) fn answer(&self, request: &Message, snapshot: Option<&Snapshot>) -> Message {
        let mut resp = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
        resp.metadata = Metadata::response_from_request(&request.metadata);
        resp.add_queries(request.queries.iter().cloned());
        if request.edns.is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            resp.set_edns(edns);
        }
        let code = self.fill(request, snapshot, &mut resp);
        resp.metadata.response_code = code;
        resp
    }

    fn fill(
        &self,
        request: &Message,
        snapshot: Option<&Snapshot>,
        resp: &mut Message,
    ) -> ResponseCode {
        if request.metadata.op_code != OpCode::Query
            || request.metadata.message_type != MessageType::Query
        {
            return ResponseCode::NotImp;
        }
        let [query] = request.queries.as_slice() else {
            return ResponseCode::FormErr;
        };
        if !self.domain.zone_of(query.name()) {
            return ResponseCode::Refused;
        }
        resp.metadata.authoritative = true;
        let Some(snap) = snapshot else {
            return ResponseCode::ServFail;
        };
        let name = query.name();
        let rtype = query.query_type();
        match self.classify(name) {
            Lookup::Service { service, cluster } => {
                let endpoints: Vec<&Endpoint> = endpoints_of(snap, &service)
                    .filter(|e| {
                        cluster
                            .as_ref()
                            .is_none_or(|c| e.cluster.eq_ignore_ascii_case(c))
                    })
                    .collect();
                if endpoints.is_empty() {
                    return self.nxdomain(snap, resp);
                }
                for e in endpoints
                    .into_iter()
                    .filter(|e| e.health == Health::Healthy)
                {
                    match rtype {
                        RecordType::SRV => self.add_srv(name, e, resp),
                        _ => {
                            if let Some(r) = self.address_record(name, e, rtype) {
                                resp.add_answer(r);
                            }
                        }
                    }
                }
                ResponseCode::NoError
            }
            Lookup::Node(node) => {
                let endpoints: Vec<&Endpoint> = snap
                    .iter()
                    .filter(|e| self.target(e).is_some_and(|t| t == node))
                    .collect();
                if endpoints.is_empty() {
                    return self.nxdomain(snap, resp);
                }
                for e in endpoints {
                    if let Some(r) = self.address_record(name, e, rtype) {
                        resp.add_answer(r);
                    }
                }
                ResponseCode::NoError
            }
            Lookup::Apex => {
                if matches!(rtype, RecordType::SOA | RecordType::ANY) {
                    if let Some(soa) = self.soa(snap.version().0) {
                        resp.add_answer(soa);
                    }
                }
                ResponseCode::NoError
            }
            Lookup::Unknown => self.nxdomain(snap, resp),
        }
    }

    fn nxdomain(&self, snap: &Snapshot, resp: &mut Message) -> ResponseCode {
        if let Some(soa) = self.soa(snap.version().0) {
            resp.add_authority(soa);
        }
        ResponseCode::NXDomain
    }

    /// An SRV answer for `e`; the target's address in the additional
    /// section when the address is an IP, else the address (a host name)
    /// is the target.
    fn add_srv(&self, name: &Name, e: &Endpoint, resp: &mut Message) {
        let weight = e
            .labels
            .get("weight")
            .and_then(|w| w.parse::<u16>().ok())
            .unwrap_or(1);
        let ip = e.address.parse::<IpAddr>().is_ok();
        let target = if ip {
            self.target(e)
        } else {
            Name::from_ascii(&e.address).ok().map(|mut n| {
                n.set_fqdn(true);
                n
            })
        };
        let Some(target) = target else { return };
        resp.add_answer(Record::from_rdata(
            name.clone(),
            self.ttl,
            RData::SRV(SRV::new(1, weight, e.port, target.clone())),
        ));
        if ip {
            if let Some(r) = self.address_record(&target, e, RecordType::ANY) {
                resp.add_additional(r);
            }
        }
    }
}

/// The endpoints of `service` (matched without regard to case): its key
/// range when the name is stored as asked (lowercase, as names usually
/// are), else a scan for a name that differs only in case.
fn endpoints_of<'a>(
    snap: &'a Snapshot,
    service: &'a str,
) -> Box<dyn Iterator<Item = &'a Endpoint> + 'a> {
    if snap.service(service).next().is_some() {
        Box::new(snap.service(service))
    } else {
        Box::new(
            snap.iter()
                .filter(move |e| e.service.eq_ignore_ascii_case(service)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone() -> Zone {
        Zone {
            domain: Name::from_ascii("registry.").expect("a name"),
            ttl: 5,
        }
    }

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a name")
    }

    #[test]
    fn classifies_names_in_the_zone() {
        let z = zone();
        let web = Lookup::service("web", None);
        let east = Lookup::service("web", Some("east"));
        for (q, want) in [
            ("web.service.registry.", &web),
            ("WEB.Service.registry.", &web),
            ("_web._tcp.service.registry.", &web),
            ("web.registry.", &web),
            ("_web._tcp.registry.", &web),
            ("web.east.registry.", &east),
            ("Web.EAST.registry.", &east),
            ("_web._udp.east.registry.", &east),
        ] {
            assert_eq!(&z.classify(&name(q)), want, "{q}");
        }
        assert_eq!(z.classify(&name("registry.")), Lookup::Apex);
        assert_eq!(z.classify(&name("_x.registry.")), Lookup::Unknown);
        assert_eq!(z.classify(&name("a.b.c.d.registry.")), Lookup::Unknown);
        assert!(matches!(
            z.classify(&name("a.n1.node.registry.")),
            Lookup::Node(_)
        ));
    }

    #[test]
    fn targets_are_single_labels_per_part() {
        let e = Endpoint::new("web", "10.0.0.1:80", "10.0.0.1", 80).with_node("Node_1");
        assert_eq!(
            zone().target(&e).expect("a target").to_ascii(),
            "10-0-0-1-80.node-1.node.registry."
        );
    }
}
