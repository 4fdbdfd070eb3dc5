//! Answers as a client reads them (decoded with `hickory-proto`): every
//! name form, the response codes, truncation, and a registry of 100,000
//! endpoints answered from the index without reading endpoints.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{Name, RData, Record};
use waypost::{Endpoint, Health, Snapshot, Version};

use super::*;
use crate::faces::dns::wire::query;

fn zone() -> Zone {
    Zone::new(&Name::from_ascii("registry.").unwrap(), 5)
}

fn index(version: u64, endpoints: impl IntoIterator<Item = Endpoint>) -> Index {
    let snap = Arc::new(Snapshot::from_endpoints(Version(version), endpoints));
    Index::empty().advance(&zone(), snap).0
}

/// The raw answer to `msg`, if any.
fn raw(index: Option<&Index>, msg: &[u8], transport: Transport) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    respond(&zone(), index, msg, transport, &mut Vec::new(), &mut out).then_some(out)
}

/// The answer to `name`/`qtype` over UDP, with EDNS of `edns` bytes when
/// given: its length and the message.
fn ask_with(index: Option<&Index>, name: &str, qtype: u16, edns: Option<u16>) -> (usize, Message) {
    let out = raw(index, &query(name, qtype, edns), Transport::Udp).unwrap();
    (out.len(), Message::from_vec(&out).unwrap())
}

fn ask(index: &Index, name: &str, qtype: u16) -> Message {
    ask_with(Some(index), name, qtype, None).1
}

fn address(r: &Record) -> String {
    match &r.data {
        RData::A(a) => a.0.to_string(),
        RData::AAAA(a) => a.0.to_string(),
        other => panic!("not an address: {other:?}"),
    }
}

fn addresses(m: &Message) -> BTreeSet<String> {
    m.answers.iter().map(address).collect()
}

fn web() -> Vec<Endpoint> {
    let web = |id: &str, ip: &str| Endpoint::new("web", id, ip, 8080).with_node("node-1");
    vec![
        web("a", "10.0.0.1").with_cluster("east"),
        web("b", "10.0.0.2")
            .with_cluster("west")
            .with_label("weight", "7"),
        web("c", "10.0.0.3").with_health(Health::Unhealthy),
        web("d", "fd00::4"),
        web("e", "db.example.com"),
    ]
}

#[test]
fn answers_every_name_form_as_documented() {
    let idx = index(0x1_0000_0007, web());
    let all = BTreeSet::from(["10.0.0.1".to_string(), "10.0.0.2".to_string()]);
    for name in [
        "web.registry.",
        "web.service.registry.",
        "_web._tcp.registry.",
        "_web._tcp.service.registry.",
    ] {
        let m = ask(&idx, name, rtype::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
        assert!(m.metadata.authoritative);
        assert_eq!(addresses(&m), all, "{name}");
        assert!(m
            .answers
            .iter()
            .all(|r| r.ttl == 5 && r.name.to_ascii() == name));
    }
    let east = ask(&idx, "web.east.registry.", rtype::A);
    assert_eq!(addresses(&east), BTreeSet::from(["10.0.0.1".to_string()]));
    let v6 = ask(&idx, "web.registry.", rtype::AAAA);
    assert_eq!(addresses(&v6), BTreeSet::from(["fd00::4".to_string()]));
    let any = ask(&idx, "web.registry.", rtype::ANY);
    assert_eq!(addresses(&any).len(), 3);
    // Names are matched without regard to case; the question is echoed
    // as asked.
    let upper = ask(&idx, "WEB.East.REGISTRY.", rtype::A);
    assert_eq!(upper.answers[0].name.to_ascii(), "WEB.East.REGISTRY.");
    assert_eq!(addresses(&upper), addresses(&east));

    // SRV: priority 1, the weight label, targets with their addresses; a
    // host name is its own target.
    let srv = ask(&idx, "_web._tcp.service.registry.", rtype::SRV);
    let mut got: Vec<(u16, u16, u16, String)> = srv
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::SRV(s) => (s.priority, s.weight, s.port, s.target.to_ascii()),
            other => panic!("not SRV: {other:?}"),
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (1, 1, 8080, "a.node-1.node.registry.".to_string()),
            (1, 1, 8080, "d.node-1.node.registry.".to_string()),
            (1, 1, 8080, "db.example.com.".to_string()),
            (1, 7, 8080, "b.node-1.node.registry.".to_string()),
        ]
    );
    let extra: BTreeSet<(String, String)> = srv
        .additionals
        .iter()
        .map(|r| (r.name.to_ascii(), address(r)))
        .collect();
    assert_eq!(
        extra,
        BTreeSet::from([
            ("a.node-1.node.registry.".into(), "10.0.0.1".into()),
            ("b.node-1.node.registry.".into(), "10.0.0.2".into()),
            ("d.node-1.node.registry.".into(), "fd00::4".into()),
        ])
    );
    let west = ask(&idx, "_web._udp.west.registry.", rtype::SRV);
    assert_eq!(west.answers.len(), 1);

    // Node names: the endpoint's address, whatever its health.
    let node = ask(&idx, "c.node-1.node.registry.", rtype::A);
    assert_eq!(addresses(&node), BTreeSet::from(["10.0.0.3".to_string()]));
    // Other types of existing names: no records.
    for (name, qtype) in [
        ("web.registry.", 15),
        ("a.node-1.node.registry.", rtype::SRV),
    ] {
        let m = ask(&idx, name, qtype);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty() && m.authorities.is_empty());
    }
}

#[test]
fn unknown_names_are_nxdomain_with_the_soa_and_others_are_refused() {
    let idx = index(0x1_0000_0007, web());
    for name in [
        "nothing.registry.",
        "web.north.registry.",
        "nothing.service.registry.",
        "x.node-1.node.registry.",
        "a.b.c.d.registry.",
        "_x.registry.",
    ] {
        let m = ask(&idx, name, rtype::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
        assert!(m.metadata.authoritative);
        assert!(m.answers.is_empty());
        let [soa] = m.authorities.as_slice() else {
            panic!("{name}: {m:?}");
        };
        assert_eq!(soa.name.to_ascii(), "registry.");
        let RData::SOA(soa_data) = &soa.data else {
            panic!("not a SOA: {soa:?}");
        };
        assert_eq!(soa_data.serial, 7, "the version's low 32 bits");
        assert_eq!(soa_data.minimum, 5);
        assert_eq!(soa_data.mname.to_ascii(), "ns.registry.");
        assert_eq!(soa_data.rname.to_ascii(), "hostmaster.registry.");
    }
    let apex = ask(&idx, "registry.", rtype::SOA);
    assert_eq!(apex.metadata.response_code, ResponseCode::NoError);
    assert_eq!(apex.answers.len(), 1);
    assert!(ask(&idx, "registry.", rtype::A).answers.is_empty());

    let out = ask(&idx, "example.com.", rtype::A);
    assert_eq!(out.metadata.response_code, ResponseCode::Refused);
    assert!(!out.metadata.authoritative);
    let (_, none) = ask_with(None, "web.registry.", rtype::A, None);
    assert_eq!(none.metadata.response_code, ResponseCode::ServFail);
}

#[test]
fn headers_edns_and_malformed_requests() {
    let idx = index(1, web());
    let (_, m) = ask_with(Some(&idx), "web.registry.", rtype::A, Some(4096));
    assert_eq!(m.metadata.id, 7);
    assert!(m.metadata.recursion_desired && !m.metadata.recursion_available);
    assert_eq!(m.queries.len(), 1);
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(EDNS_PAYLOAD));
    assert!(ask(&idx, "web.registry.", rtype::A).edns.is_none());

    // A response sent to the responder, or another opcode: NOTIMP.
    let mut not_query = query("web.registry.", rtype::A, None);
    not_query[2] |= 0x80;
    let m = Message::from_vec(&raw(Some(&idx), &not_query, Transport::Udp).unwrap()).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    // Two questions: FORMERR, both echoed.
    let mut two = query("web.registry.", rtype::A, None);
    let question = two[HEADER_LEN..].to_vec();
    two.extend(question);
    two[5] = 2;
    let m = Message::from_vec(&raw(Some(&idx), &two, Transport::Udp).unwrap()).unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(m.queries.len(), 2);
    // Not a message: no answer.
    assert_eq!(raw(Some(&idx), b"\x00\x01\x02", Transport::Udp), None);
}

/// `n` endpoints of `web`, each on a node of its own.
fn many(n: usize) -> Index {
    index(
        1,
        (0..n).map(|i| {
            let ip = format!("10.0.{}.{}", i / 256, i % 256);
            Endpoint::new("web", format!("e{i}"), ip, 80).with_node(format!("n{i}"))
        }),
    )
}

#[test]
fn without_edns_the_additional_section_goes_before_tc_is_set() {
    // Ten SRV records fit 512 bytes, not with their addresses.
    let idx = many(10);
    let (len, m) = ask_with(Some(&idx), "web.registry.", rtype::SRV, None);
    assert!(len <= 512, "{len}");
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 10);
    assert!(m.additionals.is_empty());
    let (whole, m) = ask_with(Some(&idx), "web.registry.", rtype::SRV, Some(1232));
    assert!(whole > 512 + 11);
    assert_eq!((m.answers.len(), m.additionals.len()), (10, 10));

    // Fourteen do not fit at all: TC, no records, the OPT kept.
    let idx = many(14);
    let (len, m) = ask_with(Some(&idx), "web.registry.", rtype::SRV, None);
    assert!(m.metadata.truncation);
    assert!(m.answers.is_empty() && m.additionals.is_empty());
    assert_eq!(m.queries.len(), 1);
    assert!(len < 512);
    let (_, m) = ask_with(Some(&idx), "web.registry.", rtype::SRV, Some(512));
    assert!(m.metadata.truncation && m.edns.is_some());
    // Over TCP all of it.
    let tcp = raw(
        Some(&idx),
        &query("web.registry.", rtype::SRV, None),
        Transport::Tcp,
    )
    .unwrap();
    let m = Message::from_vec(&tcp).unwrap();
    assert_eq!((m.answers.len(), m.additionals.len()), (14, 14));
    // Address records alone: all or TC.
    let idx = many(40);
    let (_, m) = ask_with(Some(&idx), "web.registry.", rtype::A, None);
    assert!(m.metadata.truncation && m.answers.is_empty());
    let (_, m) = ask_with(Some(&idx), "web.registry.", rtype::A, Some(1232));
    assert_eq!(m.answers.len(), 40);
}

#[test]
fn answers_beyond_a_pointers_reach_name_targets_whole() {
    // 700 SRV records (30 KB): the last targets lie past 16 KiB.
    let idx = many(700);
    let tcp = raw(
        Some(&idx),
        &query("web.registry.", rtype::SRV, None),
        Transport::Tcp,
    )
    .unwrap();
    assert!(tcp.len() > 0x4000);
    assert_eq!(
        &tcp[6..12],
        &[2, 188, 0, 0, 2, 188],
        "700 answers and additional records"
    );
    let m = Message::from_vec(&tcp).unwrap();
    assert_eq!((m.answers.len(), m.additionals.len()), (700, 700));
    let names: BTreeSet<String> = m.additionals.iter().map(|r| r.name.to_ascii()).collect();
    assert!(names.contains("e699.n699.node.registry."));
    assert_eq!(names.len(), 700);
    // Beyond a message's 64 KiB: TC over TCP too.
    let idx = many(2000);
    let tcp = raw(
        Some(&idx),
        &query("web.registry.", rtype::SRV, None),
        Transport::Tcp,
    )
    .unwrap();
    let m = Message::from_vec(&tcp).unwrap();
    assert!(m.metadata.truncation && m.answers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_names_and_nxdomain_at_100000_endpoints_read_no_endpoint() {
    use waypost::cached::CachedRegistry;
    use waypost::memory::MemoryRegistry;
    use waypost::{Batch, Op};

    const N: usize = 100_000;
    let memory = MemoryRegistry::new().with_max_batch(N);
    let ops = (0..N)
        .map(|i| {
            let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
            Op::Register(
                Endpoint::new(format!("svc-{}", i / 10), format!("e{i}"), ip, 8080)
                    .with_node(format!("node-{i}")),
            )
        })
        .collect();
    memory.apply(ops).await.unwrap();
    let cache = CachedRegistry::new(memory);
    cache.wait_until_ready().await;
    let store = cache.store().clone();
    assert!(
        store
            .wait_until(|s| s.len() == N, std::time::Duration::from_secs(60))
            .await
    );
    let indexer = super::super::index::Indexer::new(Arc::new(zone()), store);
    let built = indexer.view().unwrap();
    assert_eq!(built.size(), (N / 10, N));
    let read = indexer.endpoints_read();
    // Building read each endpoint twice (node names, then records).
    assert_eq!(read, 2 * N);

    let (mut key, mut out) = (Vec::new(), Vec::new());
    let mut answer = |name: &str, qtype| {
        let view = indexer.view().unwrap();
        let msg = query(name, qtype, Some(1232));
        assert!(respond(
            indexer.zone(),
            Some(&view),
            &msg,
            Transport::Udp,
            &mut key,
            &mut out
        ));
        Message::from_vec(&out).unwrap()
    };
    for i in (0..N).step_by(997) {
        let m = answer(&format!("e{i}.node-{i}.node.registry."), rtype::A);
        let want = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        assert_eq!(addresses(&m), BTreeSet::from([want]));
        let m = answer(&format!("nothing-{i}.registry."), rtype::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        let m = answer(&format!("e{i}.node-{}.node.registry.", i + 1), rtype::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        let m = answer(&format!("svc-{}.service.registry.", i / 10), rtype::SRV);
        assert_eq!(m.answers.len(), 10);
    }
    assert_eq!(
        indexer.endpoints_read(),
        read,
        "queries are answered from the index, reading no endpoint"
    );
}
