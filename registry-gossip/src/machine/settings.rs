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
    pub(super) key: Option<Vec<u8>>,
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
    /// Largest encoded entry sent as a SWIM broadcast; bigger ones travel
    /// by anti-entropy only.
    pub(super) max_broadcast: usize,
}

impl Settings {
    /// Check `config` for a node named `node`. Fails with `InvalidInput`
    /// when the configuration cannot work.
    pub(super) fn new(config: &GossipConfig, node: &NodeId) -> registry_api::Result<Self> {
        registry_api::backend::check_name("node_name", node.as_str(), true)?;
        if config.probe_rtt.is_zero() || config.probe_rtt >= config.probe_period {
            return Err(error::config(
                "probe_rtt",
                "must be above zero and below probe_period",
            ));
        }
        if config.suspect_to_down_after.is_zero() || config.gossip_interval.is_zero() {
            return Err(error::config(
                "suspect_to_down_after",
                "suspicion time and gossip interval must be above zero",
            ));
        }
        if config.anti_entropy_interval.is_zero() {
            return Err(error::config("anti_entropy_interval", "must be above zero"));
        }
        let overhead = wire::overhead(config.auth_key.is_some());
        let swim_max = config.max_packet_size.saturating_sub(overhead);
        if swim_max < 512 || config.max_packet_size > 65_000 {
            return Err(error::config(
                "max_packet_size",
                format!("{} bytes; must be 512 to 65000", config.max_packet_size),
            ));
        }
        // Room for a SWIM header and a few membership updates (each
        // carrying an identity) before the broadcasts.
        let id_len = wire::max_identity_len(node);
        let max_broadcast = swim_max.saturating_sub(3 * id_len + 64).max(64);
        let ttl = config.tombstone_ttl;
        Ok(Self {
            key: config.auth_key.clone(),
            max_packet: config.max_packet_size,
            swim_max,
            ae_interval: config.anti_entropy_interval,
            ae_budget: config.anti_entropy_budget.max(config.max_packet_size),
            ttl,
            gc_every: (ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            rejoin_every: config.probe_period * 3,
            max_broadcast,
        })
    }

    /// Bytes the frame adds around every body.
    pub(super) fn overhead(&self) -> usize {
        wire::overhead(self.key.is_some())
    }
}
