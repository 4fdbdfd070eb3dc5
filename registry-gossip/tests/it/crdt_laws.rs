//! Property tests: the merge is a join (commutative, associative,
//! idempotent, order-insensitive), entries survive the wire format, and
//! the decoder never panics on arbitrary bytes.

use std::time::Duration;

use proptest::prelude::*;
use waypost::{Endpoint, EndpointKey, Health};
use waypost_gossip::wire::{self, Kind};
use waypost_gossip::{Entry, GossipConfig, Machine, NodeId, Replica, Stamp};

fn entry() -> impl Strategy<Value = Entry> {
    (
        0..4u8,
        0..6u64,
        0..3u64,
        0..3u8,
        prop::option::of((1..4u16, 0..2u8, any::<bool>())),
        any::<bool>(),
    )
        .prop_map(|(id, ts, gen, writer, value, died)| {
            let key = EndpointKey::new("s", format!("k{id}"));
            let stamp = Stamp {
                ts,
                gen,
                writer: NodeId::new(format!("n{writer}")),
            };
            match value {
                Some((port, addr, unhealthy)) => {
                    let mut ep = Endpoint::new("s", key.id.clone(), format!("10.0.0.{addr}"), port);
                    if unhealthy {
                        ep = ep.with_health(Health::Unhealthy);
                    }
                    Entry::live(ep, stamp)
                }
                None => Entry {
                    died,
                    ..Entry::tombstone(key, stamp)
                },
            }
        })
}

fn replica(entries: &[Entry]) -> Replica {
    let mut r = Replica::new();
    for e in entries {
        r.merge(e.clone());
    }
    r
}

fn registers(r: &Replica) -> Vec<Entry> {
    r.entries().cloned().collect()
}

fn join(a: &Replica, b: &Replica) -> Replica {
    let mut out = a.clone();
    out.merge_all(b);
    out
}

proptest! {
    #[test]
    fn merge_is_commutative(a in prop::collection::vec(entry(), 0..12), b in prop::collection::vec(entry(), 0..12)) {
        let (ra, rb) = (replica(&a), replica(&b));
        prop_assert_eq!(registers(&join(&ra, &rb)), registers(&join(&rb, &ra)));
    }

    #[test]
    fn merge_is_associative(
        a in prop::collection::vec(entry(), 0..8),
        b in prop::collection::vec(entry(), 0..8),
        c in prop::collection::vec(entry(), 0..8),
    ) {
        let (ra, rb, rc) = (replica(&a), replica(&b), replica(&c));
        prop_assert_eq!(
            registers(&join(&join(&ra, &rb), &rc)),
            registers(&join(&ra, &join(&rb, &rc)))
        );
    }

    #[test]
    fn merge_is_idempotent(a in prop::collection::vec(entry(), 0..12)) {
        let ra = replica(&a);
        prop_assert_eq!(registers(&join(&ra, &ra)), registers(&ra));
    }

    #[test]
    fn any_delivery_order_gives_the_same_state(
        (a, shuffled) in prop::collection::vec(entry(), 0..16)
            .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
    ) {
        let mut dup = shuffled.clone();
        dup.extend(shuffled.iter().take(3).cloned());
        prop_assert_eq!(registers(&replica(&a)), registers(&replica(&dup)));
    }

    #[test]
    fn entries_roundtrip_through_the_wire(e in entry()) {
        let bytes = wire::encode_entry(&e).unwrap();
        prop_assert_eq!(wire::decode_entry(&bytes).unwrap(), e);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600), kind in 0..5u8) {
        let mut framed = vec![b'G', 1, kind];
        framed.extend_from_slice(&bytes);
        let mut keyed = vec![b'G', 2, kind];
        keyed.extend_from_slice(&bytes);
        for packet in [&bytes[..], &framed[..], &keyed[..]] {
            if let Ok(f) = wire::open(packet, None) {
                let _ = wire::decode_body(f.kind, f.body);
            }
            let _ = wire::open(packet, Some(&wire::FrameKey::new(b"key")));
        }
        for k in [Kind::Swim, Kind::Digest, Kind::Want, Kind::Push] {
            let _ = wire::decode_body(k, &bytes);
        }
        let _ = wire::decode_entry(&bytes);
    }

    #[test]
    fn a_node_survives_garbage(packets in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..20)) {
        let addr = "127.0.0.1:40000".parse().unwrap();
        let mut m = Machine::new(&GossipConfig::fast(), addr, NodeId::new("n"), 1, Duration::ZERO).unwrap();
        let from = "127.0.0.1:40001".parse().unwrap();
        for (i, p) in packets.iter().enumerate() {
            let mut framed = vec![b'G', 1, (i % 4) as u8];
            framed.extend_from_slice(p);
            m.handle_datagram(from, &framed, Duration::from_millis(i as u64));
        }
        prop_assert!(m.endpoints().is_empty());
        let s = m.stats();
        prop_assert_eq!(s.datagrams_in, packets.len() as u64);
    }
}

#[test]
fn truncations_of_a_real_entry_are_errors() {
    let e = Entry::live(
        Endpoint::new("svc", "id", "10.0.0.1", 80).with_label("k", "v"),
        Stamp {
            ts: 3,
            gen: 1,
            writer: NodeId::new("n1"),
        },
    );
    let bytes = wire::encode_entry(&e).unwrap();
    for n in 0..bytes.len() {
        assert!(
            wire::decode_entry(&bytes[..n]).is_err(),
            "prefix of {n} bytes decoded"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(wire::decode_entry(&longer).is_err());
}

#[test]
fn a_tag_from_another_key_fails() {
    let header = wire::FrameHeader {
        counter: 1,
        dest: "127.0.0.1:1".parse().unwrap(),
        sender: "n",
    };
    let sealed = wire::seal(
        Kind::Digest,
        b"body",
        Some((&wire::FrameKey::new(b"k1"), &header)),
    )
    .unwrap();
    assert!(wire::open(&sealed, Some(&wire::FrameKey::new(b"k1"))).is_ok());
    assert_eq!(
        wire::open(&sealed, Some(&wire::FrameKey::new(b"k2"))),
        Err(wire::FrameError::BadTag)
    );
    let mut flipped = sealed.clone();
    flipped[4] ^= 1;
    assert_eq!(
        wire::open(&flipped, Some(&wire::FrameKey::new(b"k1"))),
        Err(wire::FrameError::BadTag)
    );
}

#[test]
fn dissemination_is_twice_log2_plus_one() {
    use waypost_gossip::dissemination_count as d;
    assert_eq!(
        (d(1), d(2), d(3), d(4), d(5), d(8), d(9), d(1024)),
        (1, 3, 5, 5, 7, 7, 9, 21)
    );
}
