//! The simulated network and clock of [`Sim`]: what a node sends is queued
//! with its delay (or, with instant delivery, handed over at the next
//! flush), and a step delivers what is due and fires the nodes' timers.
//! Datagrams in flight are in a heap, and with [`TickOrder::ByDeadline`]
//! the nodes' deadlines too, so such a step costs what happens in it.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use rand::RngExt;

use super::{Datagram, Delivery, Sim, TickOrder};

/// A datagram on its way, ordered by delivery time, then by when it was
/// sent.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct InFlight {
    at: Duration,
    seq: u64,
    from: usize,
    to: usize,
    data: Vec<u8>,
}

impl Sim {
    /// Advance the clock one step. Over a [`Delivery::Network`]: hand over
    /// the datagrams due, then fire the timers due. With
    /// [`Delivery::Instant`]: fire the timers due, then
    /// [`flush`](Self::flush).
    pub fn step(&mut self) {
        self.now += self.config.step;
        match self.config.delivery {
            Delivery::Network(_) => {
                self.deliver_due();
                self.tick_due();
            }
            Delivery::Instant => {
                self.tick_due();
                self.flush();
            }
        }
    }

    /// Step for `d` of simulated time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }

    /// Step until `cond` holds, for at most `limit` of simulated time;
    /// whether it held. The condition is checked before the first step,
    /// then every [`with_check_every`](super::SimConfig::with_check_every)
    /// steps, and once more at the end. With instant delivery, what is
    /// queued is flushed first.
    pub fn run_until(&mut self, limit: Duration, mut cond: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now + limit;
        self.flush();
        let mut n = 0u32;
        while self.now < end {
            if n.is_multiple_of(self.config.check_every) && cond(self) {
                return true;
            }
            n += 1;
            self.step();
        }
        cond(self)
    }

    /// With [`Delivery::Instant`]: hand every datagram the nodes have
    /// queued to its receiver, in passes over the senders in index order,
    /// until no node has anything left to send. Over a
    /// [`Delivery::Network`] datagrams wait for their time: nothing to do.
    pub fn flush(&mut self) {
        if self.config.delivery != Delivery::Instant {
            return;
        }
        loop {
            let mut moved = false;
            for from in 0..self.nodes.len() {
                let Some(m) = self.nodes[from].as_mut() else {
                    continue;
                };
                for (to, data) in m.take_outbox() {
                    moved = true;
                    match self.index.get(&to) {
                        Some(&t) => {
                            if self.deliver(from, t, data) {
                                self.note_deadline(t);
                            }
                        }
                        None => self.keep_unaddressed(to, data),
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Move node `i`'s outbox into the network (over a
    /// [`Delivery::Network`]) and note its next deadline.
    pub(super) fn collect(&mut self, i: usize) {
        if let Delivery::Network(network) = self.config.delivery {
            let Some(m) = self.nodes[i].as_mut() else {
                return;
            };
            for (to, data) in m.take_outbox() {
                let Some(&j) = self.index.get(&to) else {
                    self.keep_unaddressed(to, data);
                    continue;
                };
                if network.loss() > 0.0 && self.rng.random_bool(network.loss()) {
                    continue;
                }
                let duplicated =
                    network.duplication() > 0.0 && self.rng.random_bool(network.duplication());
                if duplicated {
                    self.send(&network, i, j, data.clone());
                }
                self.send(&network, i, j, data);
            }
        }
        self.note_deadline(i);
    }

    fn send(&mut self, network: &super::Network, from: usize, to: usize, data: Vec<u8>) {
        let delay = Duration::from_millis(self.rng.random_range(network.delay_ms()));
        self.seq += 1;
        self.flight.push(Reverse(InFlight {
            at: self.now + delay,
            seq: self.seq,
            from,
            to,
            data,
        }));
    }

    fn keep_unaddressed(&mut self, to: std::net::SocketAddr, data: Vec<u8>) {
        if self.config.record {
            self.unaddressed.push((to, data));
        }
    }

    /// Remember node `i`'s next deadline (for [`TickOrder::ByDeadline`]).
    pub(super) fn note_deadline(&mut self, i: usize) {
        if self.config.tick_order != TickOrder::ByDeadline {
            return;
        }
        if let Some(d) = self.nodes[i].as_ref().and_then(|m| m.next_deadline()) {
            // The node's deadline is on its own clock.
            self.deadlines.push(Reverse((self.clocks[i].global(d), i)));
        }
    }

    /// Hand every datagram due to its receiver, and what the receiver
    /// answers to the network (an answer delayed by zero arrives in this
    /// step too).
    fn deliver_due(&mut self) {
        let now = self.now;
        while self.flight.peek().is_some_and(|f| f.0.at <= now) {
            let Some(Reverse(f)) = self.flight.pop() else {
                break;
            };
            if self.deliver(f.from, f.to, f.data) {
                self.collect(f.to);
            }
        }
    }

    /// Hand `data` to node `to`, unless a partition or its death is in
    /// the way; whether it was handed over.
    fn deliver(&mut self, from: usize, to: usize, data: Vec<u8>) -> bool {
        if self.group[from] != self.group[to] {
            return false;
        }
        let from_addr = self.addrs[from];
        let now = self.clock(to);
        let Some(m) = self.nodes[to].as_mut() else {
            return false;
        };
        let started = Instant::now();
        m.handle_datagram(from_addr, &data, now);
        self.handle_time += started.elapsed();
        self.delivered += 1;
        if self.config.record {
            self.log.push(Datagram { from, to, data });
        }
        true
    }

    /// Fire the timers of every node due now, in the configured order.
    fn tick_due(&mut self) {
        let now = self.now;
        match self.config.tick_order {
            TickOrder::ByIndex => {
                for i in 0..self.nodes.len() {
                    self.tick_if_due(i);
                }
            }
            TickOrder::ByDeadline => {
                while self.deadlines.peek().is_some_and(|d| d.0 .0 <= now) {
                    let Some(Reverse((_, i))) = self.deadlines.pop() else {
                        break;
                    };
                    self.tick_if_due(i);
                }
            }
        }
    }

    /// Fire node `i`'s timers due by its clock.
    fn tick_if_due(&mut self, i: usize) {
        let now = self.clock(i);
        let Some(m) = self.nodes[i].as_mut() else {
            return;
        };
        if m.next_deadline().is_some_and(|d| d <= now) {
            m.tick(now);
            self.collect(i);
        }
    }
}
