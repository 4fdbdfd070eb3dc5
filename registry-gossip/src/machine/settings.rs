//! [`Settings`]: what the machine keeps from [`GossipConfig`], checked.

use std::time::Duration;

use crate::config::GossipConfig;
use crate::crdt::NodeId;
use crate::error;
use crate::wire;

/// Settings the machine keeps from [`GossipConfig`].
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// The shared authentication key, if datagrams are tagged.
    pub(super) key: Option<wire::FrameKey>,
    /// Largest datagram, frame included.
    pub(super) max_packet: usize,
    /// Largest SWIM body: the datagram minus the frame.
    pub(super) swim_max: usize,
    /// Period of anti-entropy rounds.
    pub(super) ae_interval: Duration,
    /// Most entry bytes one exchange pushes in each direction.
    pub(super) ae_budget: usize,
    /// How long a disseminated tombstone is kept.
    pub(super) ttl: Duration,
    /// Period of tombstone collection.
    pub(super) gc_every: Duration,
    /// Period of the check whether to announce to seeds again.
    pub(super) rejoin_every: Duration,
    /// Period of the membership sync (the probe period).
    pub(super) member_sync_every: Duration,
    /// Period of the membership sync while the view is changing (half
    /// the gossip interval, at most the probe period).
    pub(super) member_sync_fast: Duration,
    /// Largest encoded entry sent as a SWIM broadcast; bigger ones travel
    /// by anti-entropy only.
    pub(super) max_broadcast: usize,
    /// How far apart the nodes' wall clocks may be.
    pub(super) max_skew: Duration,
    /// Bytes the frame adds around every body (the replay header carries
    /// this node's name).
    overhead: usize,
}

impl Settings {
    /// Check `config` ([`GossipConfig::validate`]) for a node named `node`.
    /// Fails with `InvalidInput` when the configuration cannot work.
    pub(super) fn new(config: &GossipConfig, node: &NodeId) -> waypost::Result<Self> {
        config.validate()?;
        waypost::backend::check_name("node_name", node.as_str(), true)?;
        if node.as_str().len() > usize::from(u8::MAX) {
            return Err(error::config(
                "node_name",
                format!("{} bytes; at most 255", node.as_str().len()),
            ));
        }
        let overhead = wire::overhead(config.auth_key.is_some(), node.as_str().len());
        if config.max_packet_size.saturating_sub(overhead) < 512 {
            return Err(error::config(
                "max_packet_size",
                format!(
                    "{} bytes; must be at least {} with this node name",
                    config.max_packet_size,
                    512 + overhead
                ),
            ));
        }
        let swim_max = config.max_packet_size.saturating_sub(overhead);
        // Room for a SWIM header and a few membership updates (each
        // carrying an identity) before the broadcasts.
        let id_len = wire::max_identity_len(node);
        let max_broadcast = swim_max.saturating_sub(3 * id_len + 64).max(64);
        let ttl = config.tombstone_ttl;
        Ok(Self {
            key: config.auth_key.as_deref().map(wire::FrameKey::new),
            max_packet: config.max_packet_size,
            swim_max,
            ae_interval: config.anti_entropy_interval,
            ae_budget: config.anti_entropy_budget.max(config.max_packet_size),
            ttl,
            gc_every: (ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            rejoin_every: config.probe_period * 3,
            member_sync_every: config.probe_period,
            member_sync_fast: (config.gossip_interval / 2).min(config.probe_period),
            max_broadcast,
            max_skew: config.max_clock_skew,
            overhead,
        })
    }

    /// Bytes the frame adds around every body.
    pub(super) fn overhead(&self) -> usize {
        self.overhead
    }
}
