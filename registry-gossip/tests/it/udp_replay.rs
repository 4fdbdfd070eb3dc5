//! Replay protection over real UDP on loopback: the test holds the shared
//! key and talks to a keyed node from raw sockets.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::net::UdpSocket;
use waypost::testing::{eventually, wait_limit};
use waypost::{Endpoint, Registry};
use waypost_gossip::sim::micros;
use waypost_gossip::wire::{self, AeMessage, FrameHeader, FrameKey};
use waypost_gossip::{Entry, GossipConfig, GossipRegistry, NodeId, Stamp};

const KEY: &[u8] = b"udp-replay-key";

fn now_us() -> u64 {
    micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap())
}

/// `msg` framed by the test's sender `tester` for `to`.
fn frame(msg: &AeMessage, to: SocketAddr, counter: u64) -> Vec<u8> {
    let header = FrameHeader {
        counter,
        dest: to,
        sender: "tester",
    };
    wire::seal(
        msg.kind(),
        &msg.encode().unwrap(),
        Some((&FrameKey::new(KEY), &header)),
    )
    .unwrap()
}

/// The next datagram on `sock`, from `from`, opened with the key and
/// decoded (bounded wait).
async fn answer(sock: &UdpSocket, from: SocketAddr) -> AeMessage {
    let mut buf = vec![0u8; 65_536];
    let (n, src) = tokio::time::timeout(wait_limit(), sock.recv_from(&mut buf))
        .await
        .expect("no answer")
        .unwrap();
    assert_eq!(src, from);
    let f = wire::open(&buf[..n], Some(&FrameKey::new(KEY))).unwrap();
    AeMessage::decode(f.kind, f.body).unwrap()
}

fn next_of(msg: &AeMessage) -> u64 {
    match msg {
        AeMessage::Want { next, .. } => *next,
        other => panic!("expected a want, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_digest_is_dropped_and_not_answered() {
    let cfg = GossipConfig::fast()
        .with_node_name("a")
        .with_auth_key(KEY.to_vec());
    let a = GossipRegistry::start(cfg).await.unwrap();
    let to = a.local_addr();
    let first = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let second = UdpSocket::bind("127.0.0.1:0").await.unwrap();

    // A valid digest (covering the whole hash space) is answered with a
    // want whose cursor is 0.
    let whole = AeMessage::Digest {
        lo: 0,
        hi: u64::MAX,
        items: vec![],
    };
    let original = frame(&whole, to, now_us());
    first.send_to(&original, to).await.unwrap();
    assert_eq!(next_of(&answer(&first, to).await), 0);

    // The same bytes from another socket (a spoofed source): dropped as a
    // replay.
    let replays = a.stats().replays;
    second.send_to(&original, to).await.unwrap();
    eventually("the replay to be counted", || async {
        (a.stats().replays > replays).then_some(())
    })
    .await;

    // A fresh digest of a part of the hash space (its want's cursor is
    // 1001) from the second socket: the first datagram that socket gets is
    // its answer, so the replay, handled before it, got none.
    let part = AeMessage::Digest {
        lo: 0,
        hi: 1000,
        items: vec![],
    };
    second
        .send_to(&frame(&part, to, now_us()), to)
        .await
        .unwrap();
    assert_eq!(next_of(&answer(&second, to).await), 1001);
    assert_eq!(a.stats().replays, replays + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_stamped_at_u64_max_is_refused() {
    let cfg = GossipConfig::fast()
        .with_node_name("a")
        .with_auth_key(KEY.to_vec());
    let a = GossipRegistry::start(cfg).await.unwrap();
    let to = a.local_addr();
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let clock = a.with_machine(|m| m.replica().clock());
    let push = AeMessage::Push {
        entries: vec![Entry::live(
            Endpoint::new("pinned", "x", "10.0.0.1", 80),
            Stamp {
                ts: u64::MAX,
                gen: 1,
                writer: NodeId::new("tester"),
            },
        )],
    };
    sock.send_to(&frame(&push, to, now_us()), to).await.unwrap();
    eventually("the entry to be refused", || async {
        (a.stats().entries_refused == 1).then_some(())
    })
    .await;
    assert!(a.list("pinned").await.unwrap().is_empty());
    assert_eq!(a.with_machine(|m| m.replica().clock()), clock);
}
