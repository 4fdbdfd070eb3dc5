//! The receive path of [`Machine`]: a datagram is opened (frame, tag), with
//! a key admitted (its destination is this node, its counter is fresh:
//! `replay`), then handed to foca or to the anti-entropy exchange; and the
//! answers it produced for an address that is not a confirmed member are
//! cut to twice its size.
//!
//! Every drop is counted in [`Stats`](super::Stats) and in the
//! [`DROPPED_METRIC`](super::stats::DROPPED_METRIC) counter, and logged: at
//! `warn` for the 1st, 2nd, 4th, 8th… drop of a kind, else at `debug`.

use std::net::SocketAddr;

use super::member_sync;
use super::replay::Rejected;
use super::stats::{self, CAPPED_METRIC};
use super::{once_per, Machine};
use crate::crdt::micros;
use crate::wire::{self, AeMessage, FrameError, FrameHeader, Kind, MemberMessage};

/// Most bytes answered to an address that is not a confirmed member, per
/// byte of the datagram being answered.
pub(super) const UNCONFIRMED_ANSWER_RATIO: usize = 2;

impl Machine {
    /// Handle one datagram from `from`. Bad datagrams (malformed, failing
    /// authentication, of the other frame version, replayed, stale or
    /// from a clock too far ahead) are dropped and counted ([`Stats`]),
    /// never an error.
    ///
    /// [`Stats`]: super::Stats
    pub fn handle_datagram(
        &mut self,
        from: std::net::SocketAddr,
        data: &[u8],
        now: std::time::Duration,
    ) {
        self.set_now(now);
        self.stats.datagrams_in += 1;
        let frame = match wire::open(data, self.settings.key.as_ref()) {
            Ok(f) => f,
            Err(e) => {
                self.count_frame_error(from, &e);
                return;
            }
        };
        if let Some(header) = &frame.header {
            if !self.admit(from, header) {
                return;
            }
        }
        let start = self.outbox.mark();
        let (kind, body) = (frame.kind, frame.body);
        match kind {
            Kind::Swim => {
                // foca reads what it needs; a bad entry stops it at that
                // item. Check the whole body first so nothing half-applies.
                if let Err(e) = wire::decode_body(kind, body) {
                    self.stats.malformed += 1;
                    stats::dropped("malformed");
                    tracing::debug!(%from, error = %e, "dropped a malformed SWIM datagram");
                    return;
                }
                self.catch_up_if_stale(body);
                let backlog = self.membership.broadcast_backlog();
                if let Err(e) = self.membership.handle_data(body) {
                    self.stats.swim_errors += 1;
                    tracing::trace!(%from, error = %e, "foca refused a datagram");
                }
                if self.membership.broadcast_backlog() > backlog {
                    self.gossip_news();
                }
            }
            Kind::MemberPull | Kind::MemberList => match MemberMessage::decode(kind, body) {
                Ok(msg) => member_sync::handle(
                    &mut self.membership,
                    &mut self.outbox,
                    &self.settings,
                    &mut self.stats,
                    self.now,
                    from,
                    msg,
                ),
                Err(e) => {
                    self.stats.malformed += 1;
                    stats::dropped("malformed");
                    tracing::debug!(%from, error = %e, "dropped a malformed member sync datagram");
                    return;
                }
            },
            _ => match AeMessage::decode(kind, body) {
                Ok(msg) => self.handle_anti_entropy(from, msg),
                Err(e) => {
                    self.stats.malformed += 1;
                    stats::dropped("malformed");
                    tracing::debug!(%from, error = %e, "dropped a malformed anti-entropy datagram");
                    return;
                }
            },
        }
        self.pump();
        let sender = frame.header.map(|h| h.sender);
        self.cap_answers(from, sender, data.len(), start);
    }

    fn count_frame_error(&mut self, from: SocketAddr, e: &FrameError) {
        let (n, reason) = match e {
            FrameError::BadTag => {
                self.stats.auth_failures += 1;
                (self.stats.auth_failures, "auth")
            }
            FrameError::Version { .. } => {
                self.stats.version_mismatch += 1;
                (self.stats.version_mismatch, "version")
            }
            FrameError::NotOurs | FrameError::BadHeader(_) | FrameError::UnknownKind(_) => {
                self.stats.malformed += 1;
                (self.stats.malformed, "malformed")
            }
        };
        stats::dropped(reason);
        if reason != "malformed" && stats::warn_now(n) {
            tracing::warn!(%from, error = %e, dropped = n, "dropped a gossip datagram");
        } else {
            tracing::debug!(%from, error = %e, "dropped a gossip datagram");
        }
    }

    /// Whether a keyed datagram is for this node and fresh; counts and
    /// logs it when not.
    fn admit(&mut self, from: SocketAddr, header: &FrameHeader<'_>) -> bool {
        let me = self.membership.identity().addr;
        let for_me =
            header.dest == me || (me.ip().is_unspecified() && header.dest.port() == me.port());
        if !for_me {
            self.stats.misdirected += 1;
            stats::dropped("misdirected");
            let (n, dest, sender) = (self.stats.misdirected, header.dest, header.sender);
            if stats::warn_now(n) {
                tracing::warn!(%from, %dest, sender, dropped = n, "dropped a datagram addressed to another node");
            } else {
                tracing::debug!(%from, %dest, sender, "dropped a datagram addressed to another node");
            }
            return false;
        }
        let now_us = micros(self.now);
        let Err(rejected) = self.replays.admit(header.sender, header.counter, now_us) else {
            return true;
        };
        let (n, reason) = match rejected {
            Rejected::Replay { .. } | Rejected::TooOld { .. } => {
                self.stats.replays += 1;
                (self.stats.replays, "replay")
            }
            Rejected::Behind { .. } => {
                self.stats.stale += 1;
                (self.stats.stale, "stale")
            }
            Rejected::Ahead { .. } => {
                self.stats.skewed += 1;
                (self.stats.skewed, "skewed")
            }
        };
        stats::dropped(reason);
        let sender = header.sender;
        if stats::warn_now(n) {
            tracing::warn!(%from, sender, error = %rejected, dropped = n, "dropped a {reason} datagram");
        } else {
            tracing::debug!(%from, sender, error = %rejected, "dropped a {reason} datagram");
        }
        false
    }

    /// Whether `from` is the address of an active member (named `sender`,
    /// when the datagram names one): answers to it are not capped.
    fn confirmed(&self, from: SocketAddr, sender: Option<&str>) -> bool {
        self.membership
            .node_at(&from)
            .is_some_and(|node| sender.is_none_or(|s| node.as_str() == s))
    }

    /// Of the datagrams queued since `start` for `from`, keep at most
    /// [`UNCONFIRMED_ANSWER_RATIO`] times `request_len` bytes, in order,
    /// unless `from` is a confirmed member.
    fn cap_answers(
        &mut self,
        from: SocketAddr,
        sender: Option<&str>,
        request_len: usize,
        start: usize,
    ) {
        if !self.outbox.sent_to(from, start) || self.confirmed(from, sender) {
            return;
        }
        let allowance = request_len.saturating_mul(UNCONFIRMED_ANSWER_RATIO);
        let capped = self.outbox.cap(from, start, allowance);
        if capped == 0 {
            return;
        }
        self.stats.answers_capped += capped;
        metrics::counter!(CAPPED_METRIC).increment(capped);
        let n = self.stats.answers_capped;
        if stats::warn_now(n) {
            tracing::warn!(%from, capped, total = n, "withheld answers to an address that is not a confirmed member");
        } else {
            tracing::debug!(%from, capped, "withheld answers to an address that is not a confirmed member");
        }
    }

    fn handle_anti_entropy(&mut self, from: SocketAddr, msg: AeMessage) {
        let answers = self
            .anti_entropy
            .handle(&mut self.store.lock(), msg, &mut self.stats);
        for answer in &answers {
            self.send_anti_entropy(from, answer);
        }
    }
}

impl Machine {
    /// A SWIM body `body` that carries entries but is addressed to an
    /// earlier identity of this node (its sender has not yet learnt that
    /// this node was declared down and rejoined): foca drops it, entries
    /// and all, though the sender counts them as sent. Catch up from that
    /// sender by anti-entropy over the whole hash space, at most once per
    /// quarter of the anti-entropy interval.
    fn catch_up_if_stale(&mut self, body: &[u8]) {
        let Ok((src, dst)) = wire::swim_route(body) else {
            return;
        };
        let me = self.membership.identity();
        let stale = dst.addr == me.addr && dst.node == me.node && dst.bump != me.bump;
        if !stale || wire::swim_broadcasts(body).map_or(true, |items| items.is_empty()) {
            return;
        }
        if !once_per(
            &mut self.last_catch_up,
            self.now,
            self.settings.ae_interval / 4,
        ) {
            return;
        }
        tracing::debug!(peer = %src.addr, "entries sent to an earlier identity of this node; catching up from their sender");
        self.send_digest(src.addr, 0);
    }
}
