//! What the machine sends: [`Outbox`], the datagrams framed (and with a
//! key, sealed with the next counter) and waiting to go, with what they
//! count; and [`count_broadcasts`], the broadcasts in SWIM's datagrams
//! counted for tombstone GC.

use std::net::SocketAddr;
use std::time::Duration;

use super::store::StoreHandle;
use crate::crdt::{micros, NodeId};
use crate::layout;
use crate::wire::{self, FrameHeader, FrameKey, Kind};

/// Datagrams framed for their destination and not yet taken, and the
/// framing state: the key, this node's name in the header, and the
/// counter of the last keyed datagram sealed.
pub(super) struct Outbox {
    packets: Vec<(SocketAddr, Vec<u8>)>,
    /// The shared authentication key, if datagrams are tagged.
    key: Option<FrameKey>,
    /// This node's name, the sender in every keyed header.
    sender: NodeId,
    /// The counter of the last keyed datagram sealed.
    counter: u64,
    /// Datagrams produced (less those withheld by [`Outbox::cap`]).
    pub(super) datagrams: u64,
    /// Bytes produced (less those withheld by [`Outbox::cap`]).
    pub(super) bytes: u64,
}

impl Outbox {
    /// An empty outbox sealing with `key` as `sender`.
    pub(super) fn new(key: Option<FrameKey>, sender: NodeId) -> Self {
        Self {
            packets: Vec::new(),
            key,
            sender,
            counter: 0,
            datagrams: 0,
            bytes: 0,
        }
    }

    /// Frame `body` for `to` and queue it. With a key the frame carries
    /// the next counter: one more than the last, and not behind `now`.
    pub(super) fn emit(&mut self, to: SocketAddr, kind: Kind, body: &[u8], now: Duration) {
        let sealed = match self.key.as_ref() {
            None => wire::seal(kind, body, None),
            Some(key) => {
                self.counter = self.counter.saturating_add(1).max(micros(now));
                let header = FrameHeader {
                    counter: self.counter,
                    dest: to,
                    sender: self.sender.as_str(),
                };
                wire::seal(kind, body, Some((key, &header)))
            }
        };
        let packet = match sealed {
            Ok(p) => p,
            Err(e) => {
                // Settings checked the name's length; cannot happen.
                tracing::warn!(%to, error = %e, "could not frame a datagram");
                return;
            }
        };
        self.datagrams += 1;
        self.bytes += packet.len() as u64;
        self.packets.push((to, packet));
    }

    /// Every queued datagram, with its destination, in order.
    pub(super) fn take(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        std::mem::take(&mut self.packets)
    }

    /// How many datagrams are queued: a mark for [`Outbox::sent_to`] and
    /// [`Outbox::cap`].
    pub(super) fn mark(&self) -> usize {
        self.packets.len()
    }

    /// Whether a datagram for `to` was queued since `start`.
    pub(super) fn sent_to(&self, to: SocketAddr, start: usize) -> bool {
        self.packets[start..].iter().any(|(dest, _)| *dest == to)
    }

    /// Of the datagrams queued since `start` for `to`, keep those that fit
    /// in `allowance` bytes, in order, and withhold the others (they are
    /// no longer counted as produced); the number withheld.
    pub(super) fn cap(&mut self, to: SocketAddr, start: usize, mut allowance: usize) -> u64 {
        let queued = self.packets.split_off(start);
        let mut capped = 0u64;
        for (dest, packet) in queued {
            if dest == to {
                if packet.len() > allowance {
                    capped += 1;
                    self.datagrams -= 1;
                    self.bytes -= packet.len() as u64;
                    continue;
                }
                allowance -= packet.len();
            }
            self.packets.push((dest, packet));
        }
        capped
    }
}

/// Count how many times each entry in the SWIM datagram `body` went out,
/// for GC.
pub(super) fn count_broadcasts(store: &StoreHandle, body: &[u8]) {
    let Ok(items) = wire::swim_broadcasts(body) else {
        return;
    };
    let mut st = store.lock();
    for item in items {
        let Ok(e) = layout::decode_entry(item) else {
            continue;
        };
        st.note_sent(&e);
    }
}
