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
use std::time::Duration;

use rand::rngs::SmallRng;

use super::membership::Membership;
use super::send::Outbox;
use super::settings::Settings;
use super::stats::Stats;
use crate::wire::{GossipId, MemberMessage};

/// How many periodic membership syncs after joining go to the member
/// joined through (its view is the widest while a cluster forms).
const JOIN_PEER_SYNCS: u8 = 2;

/// The state of the periodic sync: when the view last changed (it sets
/// the pace) and the member joined through.
pub(super) struct MemberSync {
    /// When this node's view of the membership last changed.
    view_changed_at: Duration,
    /// The member this node joined through, and how many more periodic
    /// syncs go to it before they go to random members.
    join_peer: Option<(SocketAddr, u8)>,
}

impl MemberSync {
    /// A node whose view changes as of `now` (it is about to join).
    pub(super) fn new(now: Duration) -> Self {
        Self {
            view_changed_at: now,
            join_peer: None,
        }
    }

    /// This node's view of the membership changed at `now`.
    pub(super) fn view_changed(&mut self, now: Duration) {
        self.view_changed_at = now;
    }

    /// The first member came up at `peer`: pull its whole view (only its
    /// view is wanted: ours is a subset), and send it the next periodic
    /// syncs.
    pub(super) fn joined(
        &mut self,
        peer: SocketAddr,
        membership: &mut Membership,
        outbox: &mut Outbox,
        now: Duration,
    ) {
        send_pull(membership, outbox, now, peer, None, true);
        self.join_peer = Some((peer, JOIN_PEER_SYNCS));
    }

    /// While the view is changing the sync runs every half gossip
    /// interval; once it has been stable for a probe period, every probe
    /// period.
    pub(super) fn period(&self, settings: &Settings, now: Duration) -> Duration {
        if now.saturating_sub(self.view_changed_at) < settings.member_sync_every {
            settings.member_sync_fast
        } else {
            settings.member_sync_every
        }
    }

    /// The periodic sync: offer a member our view's digest. The first
    /// few after joining go to the member joined through (while a cluster
    /// forms, every joiner announced itself there), then to a random
    /// member.
    pub(super) fn round(
        &mut self,
        membership: &mut Membership,
        rng: &mut SmallRng,
        outbox: &mut Outbox,
        now: Duration,
    ) {
        if let Some((addr, left)) = self.join_peer.take() {
            if left > 0 && membership.is_member_addr(&addr) {
                self.join_peer = Some((addr, left - 1));
                send_pull(membership, outbox, now, addr, None, false);
                return;
            }
        }
        if let Some(peer) = membership.random_member(rng) {
            send_pull(membership, outbox, now, peer, None, false);
        }
    }
}

/// Ask `to` for its view (after `after`, for a page in progress).
fn send_pull(
    membership: &mut Membership,
    outbox: &mut Outbox,
    now: Duration,
    to: SocketAddr,
    after: Option<SocketAddr>,
    back: bool,
) {
    let (count, digest) = membership.view_digest();
    send_message(
        outbox,
        now,
        to,
        &MemberMessage::Pull {
            after,
            count,
            digest,
            back,
        },
    );
}

/// A member sync message `msg` from `from`: answer a pull, learn from a
/// list.
pub(super) fn handle(
    membership: &mut Membership,
    outbox: &mut Outbox,
    settings: &Settings,
    stats: &mut Stats,
    now: Duration,
    from: SocketAddr,
    msg: MemberMessage,
) {
    match msg {
        MemberMessage::Pull {
            after,
            count,
            digest,
            back,
        } => {
            if after.is_none() {
                if (count, digest) == membership.view_digest() {
                    stats.member_syncs_equal += 1;
                    return;
                }
                if !back {
                    send_pull(membership, outbox, now, from, None, true);
                }
            }
            send_pages(membership, outbox, settings, now, from, after);
        }
        MemberMessage::List { next, members } => {
            stats.members_received += members.len() as u64;
            if let Err(e) = membership.learn(members) {
                stats.swim_errors += 1;
                tracing::debug!(%from, error = %e, "could not apply a member list");
            }
            if next.is_some() {
                send_pull(membership, outbox, now, from, next, true);
            }
        }
    }
}

/// Answer a pull from `to`: our view after `after`, in datagrams, up
/// to the budget; when the budget cuts it, the last datagram names its
/// last address, where the next pull continues.
fn send_pages(
    membership: &mut Membership,
    outbox: &mut Outbox,
    settings: &Settings,
    now: Duration,
    to: SocketAddr,
    after: Option<SocketAddr>,
) {
    let room = settings
        .max_packet
        .saturating_sub(settings.overhead() + MemberMessage::list_head_max());
    let mut budget = settings.ae_budget;
    // The pages below stop within `budget + room` bytes: copy a little
    // more than that of the view (so a cut answer still names where to
    // go on), not all of it.
    let (mut copied, mut cut) = (0usize, false);
    let enough = budget.saturating_add(2 * room);
    let view = membership.view_after(after, |id| {
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
                send_message(
                    outbox,
                    now,
                    to,
                    &MemberMessage::List {
                        next,
                        members: sent,
                    },
                );
                return;
            }
            send_message(
                outbox,
                now,
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
    send_message(
        outbox,
        now,
        to,
        &MemberMessage::List {
            next,
            members: page,
        },
    );
}

/// Frame `msg` for `to` and queue it.
fn send_message(outbox: &mut Outbox, now: Duration, to: SocketAddr, msg: &MemberMessage) {
    match msg.encode() {
        Ok(body) => outbox.emit(to, msg.kind(), &body, now),
        Err(e) => tracing::warn!(error = %e, "could not encode a member sync message"),
    }
}
