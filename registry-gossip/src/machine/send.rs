//! What the machine sends: each datagram framed (and with a key, sealed
//! with the next counter) into the outbox, and the broadcasts in SWIM's
//! datagrams counted for tombstone GC.

use std::net::SocketAddr;

use super::Machine;
use crate::crdt::micros;
use crate::layout;
use crate::wire::{self, FrameHeader, Kind};

impl Machine {
    /// Frame `body` for `to` and queue it. With a key the frame carries
    /// the next counter: one more than the last, and not behind the clock.
    pub(super) fn emit(&mut self, to: SocketAddr, kind: Kind, body: &[u8]) {
        let sealed = match self.settings.key.as_ref() {
            None => wire::seal(kind, body, None),
            Some(key) => {
                self.counter = self.counter.saturating_add(1).max(micros(self.now));
                let header = FrameHeader {
                    counter: self.counter,
                    dest: to,
                    sender: self.ownership.node().as_str(),
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
        self.stats.datagrams_out += 1;
        self.stats.bytes_out += packet.len() as u64;
        self.outbox.push((to, packet));
    }

    /// Count how many times each entry went out, for GC.
    pub(super) fn count_sent(&mut self, body: &[u8]) {
        let Ok(items) = wire::swim_broadcasts(body) else {
            return;
        };
        let mut st = self.store.lock();
        for item in items {
            let Ok(e) = layout::decode_entry(item) else {
                continue;
            };
            st.note_sent(&e);
        }
    }
}
