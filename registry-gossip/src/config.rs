//! [`GossipConfig`]: everything a node needs, with documented defaults.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::{error, wire};

/// Longest default node name, `gossip-` and an IPv6 socket address with a
/// scope id.
const DEFAULT_NAME_MAX: usize = 7 + 64;

/// Smallest `max_clock_skew`: replay counters and timestamps are in
/// microseconds, and a real network needs some slack.
const MIN_CLOCK_SKEW: Duration = Duration::from_millis(1);

/// Configuration of one gossip node. Build with [`GossipConfig::new`] and
/// the `with_*` methods; every field has a default that suits a LAN.
#[non_exhaustive]
#[derive(Clone)]
pub struct GossipConfig {
    /// UDP address to bind (default `127.0.0.1:0`: loopback, any port).
    pub bind: SocketAddr,
    /// Addresses of nodes to join through (default none: start alone).
    pub seeds: Vec<SocketAddr>,
    /// This node's name, the writer of its entries and the unit of
    /// liveness (default `gossip-<bound address>`).
    pub node_name: Option<String>,
    /// SWIM probe period (default 1 s); also the period of the
    /// membership sync (a node offers a random member its view's digest).
    pub probe_period: Duration,
    /// How long to wait for a direct probe answer (default 300 ms; must be
    /// below `probe_period`).
    pub probe_rtt: Duration,
    /// How long a suspect stays suspect before it is declared down
    /// (default 3 s).
    pub suspect_to_down_after: Duration,
    /// How often updates are also gossiped outside the probe cycle
    /// (default 200 ms).
    pub gossip_interval: Duration,
    /// Largest SWIM datagram, authentication tag included (default 1400
    /// bytes). Membership updates go first; registry entries fill what is
    /// left.
    pub max_packet_size: usize,
    /// How often anti-entropy exchanges digests with a random member
    /// (default 30 s).
    pub anti_entropy_interval: Duration,
    /// Most bytes of entries one anti-entropy exchange pushes in each
    /// direction (default 64 KiB). A difference larger than that is
    /// caught up over several exchanges. Also the most bytes of members
    /// a membership sync answer sends before the puller asks for more.
    pub anti_entropy_budget: usize,
    /// How long a tombstone is kept after it was fully disseminated
    /// (default 1 hour).
    pub tombstone_ttl: Duration,
    /// Shared key: when set, every datagram carries an HMAC-SHA256 tag over
    /// its body, its sender, its destination and a per-sender counter;
    /// datagrams without a valid tag are dropped and counted, and so are
    /// replays (see the crate docs, "Security").
    pub auth_key: Option<Vec<u8>>,
    /// How far apart the nodes' wall clocks may be (default 60 s; `fast()`
    /// 2 s). Two things are measured against it: an entry whose timestamp
    /// is further ahead of this node's wall clock is refused until this
    /// node's clock is within the skew of it (so one bad timestamp cannot
    /// drag every node's clock forward; anti-entropy brings it then), and
    /// with a key a datagram whose counter (a wall-clock time in
    /// microseconds) is further from this node's clock when it arrives,
    /// either way, is dropped (`skewed` ahead, `stale` behind; the time in
    /// transit counts). Must be at least 1 ms and below half of
    /// `tombstone_ttl`, so that a datagram sent before a tombstone was
    /// written is stale everywhere before the tombstone can be collected.
    pub max_clock_skew: Duration,
    /// Seed of the node's random choices (default: from the clock). Fix it
    /// for reproducible runs.
    pub rng_seed: Option<u64>,
    /// Events buffered per watch subscriber (default 1024).
    pub watch_buffer: usize,
    /// Changes kept for resuming watches (default 4096).
    pub watch_history: usize,
    /// Largest batch [`waypost::Batch::apply`] takes (default 1000).
    pub max_batch: usize,
}

impl Default for GossipConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            seeds: Vec::new(),
            node_name: None,
            probe_period: Duration::from_secs(1),
            probe_rtt: Duration::from_millis(300),
            suspect_to_down_after: Duration::from_secs(3),
            gossip_interval: Duration::from_millis(200),
            max_packet_size: 1400,
            anti_entropy_interval: Duration::from_secs(30),
            anti_entropy_budget: 64 * 1024,
            tombstone_ttl: Duration::from_secs(3600),
            auth_key: None,
            max_clock_skew: Duration::from_secs(60),
            rng_seed: None,
            watch_buffer: waypost::backend::Hub::DEFAULT_BUFFER,
            watch_history: 4096,
            max_batch: 1000,
        }
    }
}

impl GossipConfig {
    /// The defaults: bind `127.0.0.1:0`, no seeds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fast timings for tests on loopback: 100 ms probes, down after
    /// 300 ms of suspicion, anti-entropy every second, tombstones kept 5 s,
    /// clocks at most 2 s apart.
    pub fn fast() -> Self {
        Self {
            probe_period: Duration::from_millis(100),
            probe_rtt: Duration::from_millis(30),
            suspect_to_down_after: Duration::from_millis(300),
            gossip_interval: Duration::from_millis(50),
            anti_entropy_interval: Duration::from_secs(1),
            tombstone_ttl: Duration::from_secs(5),
            max_clock_skew: Duration::from_secs(2),
            ..Self::default()
        }
    }

    /// Check that the configuration can work. Fails with `InvalidInput`
    /// naming the first field that cannot, and why. [`GossipRegistry::start`]
    /// (and [`Machine::new`]) call it; the node name, which may come from the
    /// bound address, is checked there.
    ///
    /// [`GossipRegistry::start`]: crate::GossipRegistry::start
    /// [`Machine::new`]: crate::Machine::new
    pub fn validate(&self) -> waypost::Result<()> {
        if self.probe_rtt.is_zero() || self.probe_rtt >= self.probe_period {
            return Err(error::config(
                "probe_rtt",
                "must be above zero and below probe_period",
            ));
        }
        if self.suspect_to_down_after.is_zero() || self.gossip_interval.is_zero() {
            return Err(error::config(
                "suspect_to_down_after",
                "suspicion time and gossip interval must be above zero",
            ));
        }
        if self.anti_entropy_interval.is_zero() {
            return Err(error::config("anti_entropy_interval", "must be above zero"));
        }
        // The frame's replay header carries the node's name; before the
        // node is named (it may be named after its address), assume the
        // longest default name.
        let name_len = self
            .node_name
            .as_ref()
            .map_or(DEFAULT_NAME_MAX, String::len);
        let overhead = wire::overhead(self.auth_key.is_some(), name_len);
        if self.max_packet_size.saturating_sub(overhead) < 512 || self.max_packet_size > 65_000 {
            return Err(error::config(
                "max_packet_size",
                format!(
                    "{} bytes; must be {} to 65000",
                    self.max_packet_size,
                    512 + overhead
                ),
            ));
        }
        if self.max_clock_skew < MIN_CLOCK_SKEW || self.max_clock_skew * 2 >= self.tombstone_ttl {
            return Err(error::config(
                "max_clock_skew",
                format!(
                    "{:?}; must be at least {MIN_CLOCK_SKEW:?} and below half of tombstone_ttl ({:?})",
                    self.max_clock_skew, self.tombstone_ttl
                ),
            ));
        }
        Ok(())
    }

    /// Set the address to bind.
    pub fn with_bind(mut self, bind: SocketAddr) -> Self {
        self.bind = bind;
        self
    }
    /// Set the nodes to join through.
    pub fn with_seeds(mut self, seeds: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.seeds = seeds.into_iter().collect();
        self
    }
    /// Set this node's name.
    pub fn with_node_name(mut self, name: impl Into<String>) -> Self {
        self.node_name = Some(name.into());
        self
    }
    /// Set the shared authentication key.
    pub fn with_auth_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.auth_key = Some(key.into());
        self
    }
    /// Set the anti-entropy period.
    pub fn with_anti_entropy_interval(mut self, every: Duration) -> Self {
        self.anti_entropy_interval = every;
        self
    }
    /// Set the per-exchange anti-entropy budget in bytes.
    pub fn with_anti_entropy_budget(mut self, bytes: usize) -> Self {
        self.anti_entropy_budget = bytes;
        self
    }
    /// Set the tombstone TTL.
    pub fn with_tombstone_ttl(mut self, ttl: Duration) -> Self {
        self.tombstone_ttl = ttl;
        self
    }
    /// Set the SWIM probe period, direct-probe timeout and suspicion time.
    pub fn with_swim_timings(
        mut self,
        probe_period: Duration,
        probe_rtt: Duration,
        suspect_to_down_after: Duration,
    ) -> Self {
        self.probe_period = probe_period;
        self.probe_rtt = probe_rtt;
        self.suspect_to_down_after = suspect_to_down_after;
        self
    }
    /// Set the seed of the node's random choices.
    pub fn with_rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = Some(seed);
        self
    }
    /// Set the number of changes kept for resuming watches.
    pub fn with_watch_history(mut self, changes: usize) -> Self {
        self.watch_history = changes;
        self
    }
    /// Set how far apart the nodes' wall clocks may be.
    pub fn with_max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_clock_skew = skew;
        self
    }
    /// Set the largest SWIM datagram.
    pub fn with_max_packet_size(mut self, bytes: usize) -> Self {
        self.max_packet_size = bytes;
        self
    }
}

impl fmt::Debug for GossipConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GossipConfig")
            .field("bind", &self.bind)
            .field("seeds", &self.seeds)
            .field("node_name", &self.node_name)
            .field("probe_period", &self.probe_period)
            .field("probe_rtt", &self.probe_rtt)
            .field("suspect_to_down_after", &self.suspect_to_down_after)
            .field("gossip_interval", &self.gossip_interval)
            .field("max_packet_size", &self.max_packet_size)
            .field("anti_entropy_interval", &self.anti_entropy_interval)
            .field("anti_entropy_budget", &self.anti_entropy_budget)
            .field("tombstone_ttl", &self.tombstone_ttl)
            .field("auth_key", &self.auth_key.as_ref().map(|_| "<hidden>"))
            .field("max_clock_skew", &self.max_clock_skew)
            .field("rng_seed", &self.rng_seed)
            .field("watch_buffer", &self.watch_buffer)
            .field("watch_history", &self.watch_history)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}
