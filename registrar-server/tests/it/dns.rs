//! The DNS responder over loopback with a real resolver client
//! (hickory-resolver, UDP; TCP for the truncation case) and `dig` over UDP
//! and TCP: A and SRV answers follow registrations and deregistrations,
//! unhealthy endpoints are left out, unknown services and clusters are
//! NXDOMAIN.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::fast_client;
use common::protocols::start;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::op::{Message, Query};
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::TokioResolver;
use waypost::testing::eventually;
use waypost::{Endpoint, EndpointKey, Health, Registry};

const LIMIT: Duration = Duration::from_secs(30);

/// A resolver asking only the registrar at `addr`, over UDP (or TCP), a
/// fresh one per question so that nothing comes from its cache.
fn resolver(addr: SocketAddr, tcp: bool) -> TokioResolver {
    // UDP first, with TCP for truncated answers; or TCP only.
    let mut conns = if tcp {
        vec![ConnectionConfig::tcp()]
    } else {
        vec![ConnectionConfig::udp(), ConnectionConfig::tcp()]
    };
    for c in &mut conns {
        c.port = addr.port();
    }
    let ns = NameServerConfig::new(addr.ip(), true, conns);
    let mut builder = TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    );
    builder.options_mut().timeout = Duration::from_secs(5);
    builder.options_mut().attempts = 2;
    builder.build().unwrap()
}

/// The A records of `name`, or `None` for NXDOMAIN.
async fn a(addr: SocketAddr, name: &str) -> Option<BTreeSet<String>> {
    let r = resolver(addr, false);
    match tokio::time::timeout(LIMIT, r.lookup(name, RecordType::A))
        .await
        .unwrap()
    {
        Ok(l) => Some(
            l.answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::A(a) => Some(a.0.to_string()),
                    _ => None,
                })
                .collect(),
        ),
        Err(e) if e.is_nx_domain() => None,
        Err(e) if e.is_no_records_found() => Some(BTreeSet::new()),
        Err(e) => panic!("A {name}: {e}"),
    }
}

/// The SRV answers of `name` as `(weight, port, target)`, and the
/// additional section's A records as `(name, address)`.
async fn srv(
    addr: SocketAddr,
    name: &str,
    tcp: bool,
) -> (BTreeSet<(u16, u16, String)>, BTreeSet<(String, String)>) {
    let r = resolver(addr, tcp);
    let l = match tokio::time::timeout(LIMIT, r.lookup(name, RecordType::SRV))
        .await
        .unwrap()
    {
        Ok(l) => l,
        Err(e) if e.is_no_records_found() => return Default::default(),
        Err(e) => panic!("SRV {name}: {e}"),
    };
    let answers = l
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => {
                assert_eq!(s.priority, 1);
                Some((s.weight, s.port, s.target.to_ascii()))
            }
            _ => None,
        })
        .collect();
    let extra = l
        .additionals()
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((r.name.to_ascii(), a.0.to_string())),
            _ => None,
        })
        .collect();
    (answers, extra)
}

fn set<T: Clone + Ord>(items: &[T]) -> BTreeSet<T> {
    items.iter().cloned().collect()
}

fn ips(items: &[&str]) -> Option<BTreeSet<String>> {
    Some(items.iter().map(|s| s.to_string()).collect())
}

fn web(id: &str, ip: &str) -> Endpoint {
    Endpoint::new("web", id, ip, 8080).with_node("node-1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_and_srv_follow_registrations_health_and_removals() {
    let stack = start().await;
    let dns = stack.dns;
    let agent = fast_client(&stack.url(), "test", "node-1");
    // Nothing registered: NXDOMAIN.
    assert_eq!(a(dns, "web.service.registry.").await, None);

    agent.register(web("a", "10.0.0.1")).await.unwrap();
    agent
        .register(web("b", "10.0.0.2").with_label("weight", "7"))
        .await
        .unwrap();
    agent
        .register(web("c", "10.0.0.3").with_health(Health::Unhealthy))
        .await
        .unwrap();
    eventually("a and b (not the unhealthy c) in A answers", || async {
        (a(dns, "web.service.registry.").await == ips(&["10.0.0.1", "10.0.0.2"])).then_some(())
    })
    .await;

    let (answers, extra) = srv(dns, "web.service.registry.", false).await;
    assert_eq!(
        answers,
        set(&[
            (1, 8080, "a.node-1.node.registry.".to_string()),
            (7, 8080, "b.node-1.node.registry.".to_string()),
        ])
    );
    assert_eq!(
        extra,
        set(&[
            (
                "a.node-1.node.registry.".to_string(),
                "10.0.0.1".to_string()
            ),
            (
                "b.node-1.node.registry.".to_string(),
                "10.0.0.2".to_string()
            ),
        ])
    );
    // The RFC 2782 form names the same endpoints; the target resolves.
    let (rfc, _) = srv(dns, "_web._tcp.service.registry.", false).await;
    assert_eq!(rfc, answers);
    assert_eq!(a(dns, "b.node-1.node.registry.").await, ips(&["10.0.0.2"]));

    // c turns healthy: it joins; a is removed: it leaves.
    agent.register(web("c", "10.0.0.3")).await.unwrap();
    agent
        .deregister(&EndpointKey::new("web", "a"))
        .await
        .unwrap();
    eventually("b and c in A answers", || async {
        (a(dns, "web.service.registry.").await == ips(&["10.0.0.2", "10.0.0.3"])).then_some(())
    })
    .await;
    let (answers, _) = srv(dns, "web.service.registry.", false).await;
    let targets: BTreeSet<String> = answers.into_iter().map(|(_, _, t)| t).collect();
    assert_eq!(
        targets,
        set(&[
            "b.node-1.node.registry.".to_string(),
            "c.node-1.node.registry.".to_string()
        ])
    );
    assert_eq!(a(dns, "a.node-1.node.registry.").await, None);

    // All removed: NXDOMAIN again; unknown names too.
    agent
        .deregister(&EndpointKey::new("web", "b"))
        .await
        .unwrap();
    agent
        .deregister(&EndpointKey::new("web", "c"))
        .await
        .unwrap();
    eventually("web gone from DNS", || async {
        a(dns, "web.service.registry.")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(a(dns, "other.service.registry.").await, None);
    assert_eq!(a(dns, "x.registry.").await, None);
    stack.stop().await.unwrap();
}

/// An answer too large for a plain UDP message comes truncated; the
/// resolver then asks over TCP and gets all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_come_whole_over_tcp() {
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    for i in 0..60u16 {
        agent
            .register(web(&format!("endpoint-number-{i}"), &format!("10.0.1.{i}")))
            .await
            .unwrap();
    }
    let (answers, _) = eventually("60 SRV answers over TCP", || async {
        let got = srv(stack.dns, "web.service.registry.", true).await;
        (got.0.len() == 60).then_some(got)
    })
    .await;
    assert!(answers.iter().all(|(w, p, _)| (*w, *p) == (1, 8080)));
    // A plain UDP question (no EDNS: 512 bytes at most) gets the
    // truncated answer: TC set, no records, since the SRV records alone
    // do not fit.
    let resp = plain_udp(stack.dns, "web.service.registry.", RecordType::SRV).await;
    assert!(resp.metadata.truncation, "{resp:?}");
    assert!(resp.answers.is_empty());
    // The resolver, asking over UDP first, falls back to TCP on the
    // truncated answer and sees all 60.
    let (udp, _) = srv(stack.dns, "web.service.registry.", false).await;
    assert_eq!(udp.len(), 60);
    stack.stop().await.unwrap();
}

/// The answer to one question over UDP without EDNS (512 bytes at most).
async fn plain_udp(dns: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let mut q = Message::query();
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&q.to_vec().unwrap(), dns).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(LIMIT, sock.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(n <= 512, "{n} bytes over plain UDP");
    let resp = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(resp.metadata.id, q.metadata.id);
    resp
}

/// RFC 2181 9: an answer too long for plain UDP loses its additional
/// section first; TC is set only when the SRV records alone do not fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_udp_drops_the_additional_section_before_truncating() {
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    // Ten SRV records of `e<i>.node-1.node.registry.` take 468 bytes with
    // the question, 628 with their addresses.
    for i in 0..10u16 {
        agent
            .register(web(&format!("e{i}"), &format!("10.0.2.{i}")))
            .await
            .unwrap();
    }
    eventually("10 SRV answers over TCP", || async {
        (srv(stack.dns, "web.service.registry.", true).await.0.len() == 10).then_some(())
    })
    .await;
    let resp = plain_udp(stack.dns, "web.service.registry.", RecordType::SRV).await;
    assert!(!resp.metadata.truncation, "{resp:?}");
    assert_eq!(resp.answers.len(), 10);
    assert!(resp.additionals.is_empty());
    // Over TCP, or with EDNS, the addresses come too.
    let (answers, extra) = srv(stack.dns, "web.service.registry.", true).await;
    assert_eq!((answers.len(), extra.len()), (10, 10));

    // Three more: the SRV records alone pass 512 bytes.
    for i in 10..13u16 {
        agent
            .register(web(&format!("e{i}"), &format!("10.0.2.{i}")))
            .await
            .unwrap();
    }
    eventually("13 SRV answers over TCP", || async {
        (srv(stack.dns, "web.service.registry.", true).await.0.len() == 13).then_some(())
    })
    .await;
    let resp = plain_udp(stack.dns, "web.service.registry.", RecordType::SRV).await;
    assert!(resp.metadata.truncation, "{resp:?}");
    assert!(resp.answers.is_empty() && resp.additionals.is_empty());
    // A and AAAA answers of the same service still fit.
    let resp = plain_udp(stack.dns, "web.service.registry.", RecordType::A).await;
    assert!(!resp.metadata.truncation);
    assert_eq!(resp.answers.len(), 13);
    stack.stop().await.unwrap();
}

/// With `dig` (Debian's `dnsutils`, which `scripts/test` installs), over
/// UDP and TCP: A and SRV as an operator sees them, under every name form
/// (`<service>.<domain>`, `<service>.<cluster>.<domain>`, the RFC 2782
/// forms and Consul's `<service>.service.<domain>`), following a health
/// change and a removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_sees_a_and_srv_answers_under_every_name() {
    if std::process::Command::new("dig")
        .arg("-v")
        .output()
        .is_err()
    {
        panic!("dig is needed (scripts/test installs dnsutils)");
    }
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    agent
        .register(web("a", "10.0.0.1").with_cluster("east"))
        .await
        .unwrap();
    agent
        .register(
            web("b", "10.0.0.2")
                .with_cluster("west")
                .with_label("weight", "7"),
        )
        .await
        .unwrap();
    eventually("web/a and b in A answers", || async {
        (a(stack.dns, "web.registry.").await == ips(&["10.0.0.1", "10.0.0.2"])).then_some(())
    })
    .await;
    let dig = |name: &'static str, qtype: &'static str, tcp: bool| {
        let port = stack.dns.port().to_string();
        async move {
            let out = tokio::process::Command::new("dig")
                .args(["@127.0.0.1", "-p", &port, "+short", "+time=5", "+tries=2"])
                .arg(if tcp { "+tcp" } else { "+notcp" })
                .args([name, qtype])
                .output()
                .await
                .unwrap();
            let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect();
            lines.sort();
            lines.join(",")
        }
    };
    for tcp in [false, true] {
        for name in ["web.registry.", "web.service.registry."] {
            assert_eq!(
                dig(name, "A", tcp).await,
                "10.0.0.1,10.0.0.2",
                "{name} tcp={tcp}"
            );
        }
        assert_eq!(dig("web.east.registry.", "A", tcp).await, "10.0.0.1");
        assert_eq!(dig("web.west.registry.", "A", tcp).await, "10.0.0.2");
        assert_eq!(dig("web.north.registry.", "A", tcp).await, "");
        for name in [
            "_web._tcp.registry.",
            "_web._tcp.service.registry.",
            "web.registry.",
        ] {
            assert_eq!(
                dig(name, "SRV", tcp).await,
                "1 1 8080 a.node-1.node.registry.,1 7 8080 b.node-1.node.registry.",
                "{name} tcp={tcp}"
            );
        }
        assert_eq!(
            dig("_web._tcp.west.registry.", "SRV", tcp).await,
            "1 7 8080 b.node-1.node.registry."
        );
    }
    // A health change and a removal show under the cluster's name too.
    agent
        .register(
            web("a", "10.0.0.1")
                .with_cluster("east")
                .with_health(Health::Unhealthy),
        )
        .await
        .unwrap();
    agent
        .deregister(&EndpointKey::new("web", "b"))
        .await
        .unwrap();
    eventually("web gone from both clusters' answers", || async {
        (dig("web.registry.", "A", false).await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(dig("web.east.registry.", "A", true).await, "");
    stack.stop().await.unwrap();
}

/// An unknown cluster or service is NXDOMAIN under the names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_names_scope_answers_and_unknown_ones_are_nxdomain() {
    let stack = start().await;
    let dns = stack.dns;
    let agent = fast_client(&stack.url(), "test", "node-1");
    agent
        .register(web("a", "10.0.0.1").with_cluster("east"))
        .await
        .unwrap();
    eventually("web/a in A answers", || async {
        (a(dns, "web.east.registry.").await == ips(&["10.0.0.1"])).then_some(())
    })
    .await;
    assert_eq!(a(dns, "web.west.registry.").await, None);
    assert_eq!(a(dns, "db.registry.").await, None);
    let (answers, _) = srv(dns, "_web._tcp.east.registry.", false).await;
    assert_eq!(
        answers,
        set(&[(1, 8080, "a.node-1.node.registry.".to_string())])
    );
    stack.stop().await.unwrap();
}

/// A non-loopback DNS address is refused without --insecure, naming the
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_dns_address_is_refused_without_insecure() {
    let mut server =
        waypost_registrar_server::Opening::new(waypost_registrar_server::RegistrarConfig::new("t"));
    let dns = waypost_registrar_server::DnsListeners::bind("0.0.0.0:0".parse().unwrap())
        .await
        .unwrap();
    let cfg = waypost_registrar_server::DnsConfig::new("registry", Duration::from_secs(5)).unwrap();
    assert_eq!(cfg.domain(), "registry.");
    server.protocols.dns = Some((dns, cfg));
    let err = common::protocols::refusal(server).await;
    assert!(err.to_string().contains("dns_addr"), "{err}");
    assert!(err.to_string().contains("--insecure"), "{err}");
}

#[test]
fn a_ttl_above_five_seconds_or_a_bad_domain_is_refused() {
    assert!(waypost_registrar_server::DnsConfig::new("registry.", Duration::from_secs(6)).is_err());
    assert!(waypost_registrar_server::DnsConfig::new(".", Duration::from_secs(1)).is_err());
    assert!(waypost_registrar_server::DnsConfig::new("a..b", Duration::from_secs(1)).is_err());
}
