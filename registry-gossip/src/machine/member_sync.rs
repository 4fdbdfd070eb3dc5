//! The membership sync: how a node learns the members SWIM's piggybacking
//! has not brought it.
//!
//! SWIM alone is slow to form a full membership: a joiner learns from the
//! answer to its announce only the members that fit one datagram, and the
//! others learn of it from a bounded number of piggybacked updates, then
//! by being probed. So, besides SWIM:
//!
//! - **On joining** (the first member comes up after a time alone), a node
//!   pulls that member's whole view: the member answers with every active
//!   member it knows, in pages of one datagram, up to the anti-entropy
//!   budget per pull; a cut answer names its last address and the joiner
//!   pulls again from there.
//! - **Every probe period** a node sends a random member (the first two
//!   times after joining: the member it joined through) its view's count
//!   and digest (about 20 bytes); every half gossip interval instead while
//!   its view changed within the last probe period (a cluster forming). When the member's view differs it answers
//!   with its view as above and, unless the pull was itself sent back,
//!   pulls the sender's view back. Views that agree cost the one small
//!   datagram.
//!
//! Members learned this way are applied to foca as alive and not gossiped
//! further (they are the other node's knowledge, not news); an identity
//! foca knows to be down, or renewed, stays as foca has it.

use std::net::SocketAddr;

use super::Machine;
use crate::wire::{GossipId, MemberMessage};

impl Machine {
    /// While the view is changing the sync runs every half gossip
    /// interval; once it has been stable for a probe period, every probe
    /// period.
    pub(super) fn member_sync_period(&self) -> std::time::Duration {
        let s = &self.settings;
        if self.now.saturating_sub(self.view_changed_at) < s.member_sync_every {
            s.member_sync_fast
        } else {
            s.member_sync_every
        }
    }

    /// The periodic sync: offer a member our view's digest. The first
    /// few after joining go to the member joined through (while a cluster
    /// forms, every joiner announced itself there), then to a random
    /// member.
    pub(super) fn member_sync_round(&mut self) {
        if let Some((addr, left)) = self.join_peer.take() {
            if left > 0 && self.membership.is_member_addr(&addr) {
                self.join_peer = Some((addr, left - 1));
                self.send_member_pull(addr, None, false);
                return;
            }
        }
        if let Some(peer) = self.membership.random_member(&mut self.rng) {
            self.send_member_pull(peer, None, false);
        }
    }

    /// Ask `to` for its view (after `after`, for a page in progress).
    pub(super) fn send_member_pull(
        &mut self,
        to: SocketAddr,
        after: Option<SocketAddr>,
        back: bool,
    ) {
        let (count, digest) = self.membership.view_digest();
        self.send_member_message(
            to,
            &MemberMessage::Pull {
                after,
                count,
                digest,
                back,
            },
        );
    }

    pub(super) fn handle_member_message(&mut self, from: SocketAddr, msg: MemberMessage) {
        match msg {
            MemberMessage::Pull {
                after,
                count,
                digest,
                back,
            } => {
                if after.is_none() {
                    if (count, digest) == self.membership.view_digest() {
                        self.stats.member_syncs_equal += 1;
                        return;
                    }
                    if !back {
                        self.send_member_pull(from, None, true);
                    }
                }
                self.send_member_pages(from, after);
            }
            MemberMessage::List { next, members } => {
                self.stats.members_received += members.len() as u64;
                if let Err(e) = self.membership.learn(members) {
                    self.stats.swim_errors += 1;
                    tracing::debug!(%from, error = %e, "could not apply a member list");
                }
                if next.is_some() {
                    self.send_member_pull(from, next, true);
                }
            }
        }
    }

    /// Answer a pull from `to`: our view after `after`, in datagrams, up
    /// to the budget; when the budget cuts it, the last datagram names its
    /// last address, where the next pull continues.
    fn send_member_pages(&mut self, to: SocketAddr, after: Option<SocketAddr>) {
        let room = self
            .settings
            .max_packet
            .saturating_sub(self.settings.overhead() + MemberMessage::list_head_max());
        let mut budget = self.settings.ae_budget;
        // The pages below stop within `budget + room` bytes: copy a little
        // more than that of the view (so a cut answer still names where to
        // go on), not all of it.
        let (mut copied, mut cut) = (0usize, false);
        let enough = budget.saturating_add(2 * room);
        let view = self.membership.view_after(after, |id| {
            cut = copied > enough;
            copied += MemberMessage::id_len(id);
            !cut
        });
        let mut page: Vec<GossipId> = Vec::new();
        let mut used = 0;
        for id in view {
            let len = MemberMessage::id_len(&id);
            if used + len > room && !page.is_empty() {
                let sent = std::mem::take(&mut page);
                budget = budget.saturating_sub(used);
                used = 0;
                if budget < room {
                    // Out of budget: this page says where to go on.
                    let next = sent.last().map(|last| last.addr);
                    self.send_member_message(
                        to,
                        &MemberMessage::List {
                            next,
                            members: sent,
                        },
                    );
                    return;
                }
                self.send_member_message(
                    to,
                    &MemberMessage::List {
                        next: None,
                        members: sent,
                    },
                );
            }
            used += len;
            page.push(id);
        }
        // Only when the copy was cut short (never with a sane packet size):
        // say where to go on.
        let next = if cut {
            page.last().map(|last| last.addr)
        } else {
            None
        };
        self.send_member_message(
            to,
            &MemberMessage::List {
                next,
                members: page,
            },
        );
    }

    fn send_member_message(&mut self, to: SocketAddr, msg: &MemberMessage) {
        match msg.encode() {
            Ok(body) => self.emit(to, msg.kind(), &body),
            Err(e) => tracing::warn!(error = %e, "could not encode a member sync message"),
        }
    }
}
