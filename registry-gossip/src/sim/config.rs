//! [`SimConfig`]: everything a simulation is made of, its network
//! ([`Network`], [`Delivery`]), the order nodes' timers fire in
//! ([`TickOrder`]) and who each node is ([`Identity`]).

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::GossipConfig;
use crate::crdt::NodeId;

/// How a [`Sim`](super::Sim) is set up. Every knob has a default;
/// `with_*` changes one.
///
/// ```
/// use std::time::Duration;
/// use waypost_gossip::sim::{Network, Sim, SimConfig};
/// use waypost_gossip::GossipConfig;
///
/// let lossy = Network::default()
///     .with_loss(0.2)
///     .with_duplication(0.1)
///     .with_delay(Duration::ZERO, Duration::from_millis(40));
/// let mut sim = Sim::new(SimConfig::new(GossipConfig::fast()).with_seed(7).with_network(lossy))?;
/// let a = sim.add(None);
/// sim.add(Some(a));
/// assert!(sim.run_until(Duration::from_secs(30), Sim::members_complete));
/// # Ok::<(), waypost::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub(super) gossip: GossipConfig,
    pub(super) seed: u64,
    pub(super) start: Duration,
    pub(super) step: Duration,
    pub(super) delivery: Delivery,
    pub(super) tick_order: TickOrder,
    pub(super) identities: fn(&NodeStart) -> Identity,
    pub(super) check_every: u32,
    pub(super) record: bool,
}

impl SimConfig {
    /// Every node runs `gossip`. The defaults: seed 0, the clock starting
    /// at zero and moving in steps of 5 ms, a lossless [`Network`] with 1–5
    /// ms of delay, [`TickOrder::ByDeadline`], [`default_identity`],
    /// conditions checked every step, no recording.
    pub fn new(gossip: GossipConfig) -> Self {
        SimConfig {
            gossip,
            seed: 0,
            start: Duration::ZERO,
            step: Duration::from_millis(5),
            delivery: Delivery::Network(Network::default()),
            tick_order: TickOrder::ByDeadline,
            identities: default_identity,
            check_every: 1,
            record: false,
        }
    }

    /// The configuration every node runs.
    pub fn gossip(&self) -> &GossipConfig {
        &self.gossip
    }

    /// Seed the network's randomness (delays, losses, duplicates, and what
    /// a scenario draws through [`Sim::rng`](super::Sim::rng)); the
    /// identity function sees it too, to seed the nodes. The same seed and
    /// the same calls give the same run.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Start the clock at `start` instead of zero (e.g. a real UNIX time,
    /// so that counters and timestamps have their real size).
    pub fn with_start(mut self, start: Duration) -> Self {
        self.start = start;
        self
    }

    /// How far [`Sim::step`](super::Sim::step) moves the clock.
    pub fn with_step(mut self, step: Duration) -> Self {
        self.step = step;
        self
    }

    /// How datagrams travel.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Datagrams travel over `network` (short for
    /// [`with_delivery`](Self::with_delivery) with
    /// [`Delivery::Network`]).
    pub fn with_network(self, network: Network) -> Self {
        self.with_delivery(Delivery::Network(network))
    }

    /// The order in which the nodes due in a step are ticked.
    pub fn with_tick_order(mut self, order: TickOrder) -> Self {
        self.tick_order = order;
        self
    }

    /// Who each node is: its address, name and seed.
    pub fn with_identities(mut self, identities: fn(&NodeStart) -> Identity) -> Self {
        self.identities = identities;
        self
    }

    /// [`Sim::run_until`](super::Sim::run_until) checks its condition
    /// every `steps` steps (at least 1) rather than every step: checking
    /// hundreds of nodes at each step costs more than the step.
    pub fn with_check_every(mut self, steps: u32) -> Self {
        self.check_every = steps.max(1);
        self
    }

    /// Keep every datagram delivered ([`Sim::log`](super::Sim::log)) and
    /// every datagram sent to an address that is no node
    /// ([`Sim::unaddressed`](super::Sim::unaddressed)).
    pub fn with_record(mut self, record: bool) -> Self {
        self.record = record;
        self
    }
}

/// How datagrams travel between nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delivery {
    /// Each datagram is queued with a random delay when it is sent and
    /// handed over at the first step at or after its time; a datagram
    /// delayed by zero sent while datagrams are handed over arrives in the
    /// same step.
    Network(Network),
    /// No delay and no loss: [`Sim::flush`](super::Sim::flush) hands over
    /// every queued datagram at once, in passes over the nodes in index
    /// order, until none is left; a step fires the nodes' timers, then
    /// flushes. Nothing is random, so each step is the same on every run.
    Instant,
}

/// A lossy, duplicating, reordering network. Every datagram to a node is
/// lost with probability `loss`; one that is not is duplicated with
/// probability `duplication`; each copy is delayed by a whole number of
/// milliseconds drawn uniformly from the delay range, so datagrams overtake
/// each other. A probability of zero draws nothing from the seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Network {
    loss: f64,
    duplication: f64,
    min_delay_ms: u64,
    max_delay_ms: u64,
}

impl Default for Network {
    /// Lossless, no duplicates, 1–5 ms of delay.
    fn default() -> Self {
        Network {
            loss: 0.0,
            duplication: 0.0,
            min_delay_ms: 1,
            max_delay_ms: 5,
        }
    }
}

impl Network {
    /// Lose each datagram with probability `loss` (0 to 1).
    pub fn with_loss(mut self, loss: f64) -> Self {
        self.loss = loss;
        self
    }

    /// Deliver each datagram not lost twice with probability `duplication`
    /// (0 to 1).
    pub fn with_duplication(mut self, duplication: f64) -> Self {
        self.duplication = duplication;
        self
    }

    /// Delay each datagram by `min` to `max`, in whole milliseconds.
    pub fn with_delay(mut self, min: Duration, max: Duration) -> Self {
        self.min_delay_ms = whole_ms(min);
        self.max_delay_ms = whole_ms(max);
        self
    }

    /// The probability that a datagram is lost.
    pub fn loss(&self) -> f64 {
        self.loss
    }

    /// The probability that a datagram is duplicated.
    pub fn duplication(&self) -> f64 {
        self.duplication
    }

    /// The shortest and the longest delay.
    pub fn delay(&self) -> (Duration, Duration) {
        (
            Duration::from_millis(self.min_delay_ms),
            Duration::from_millis(self.max_delay_ms),
        )
    }

    /// The delay range in milliseconds.
    pub(super) fn delay_ms(&self) -> std::ops::RangeInclusive<u64> {
        self.min_delay_ms..=self.max_delay_ms
    }

    /// Why this network cannot be simulated, if it cannot.
    pub(super) fn check(&self) -> Result<(), String> {
        let probability = |p: f64| (0.0..=1.0).contains(&p);
        if !probability(self.loss) {
            return Err(format!("loss {} is not a probability", self.loss));
        }
        if !probability(self.duplication) {
            return Err(format!(
                "duplication {} is not a probability",
                self.duplication
            ));
        }
        if self.min_delay_ms > self.max_delay_ms {
            return Err(format!(
                "the shortest delay ({} ms) is longer than the longest ({} ms)",
                self.min_delay_ms, self.max_delay_ms
            ));
        }
        Ok(())
    }
}

fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The order in which the nodes whose timers are due are ticked in a step.
/// Ticking hands datagrams to the network, which draws their fate from the
/// seed in that order: the same seed gives a different (equally
/// deterministic) run under the other order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickOrder {
    /// Earliest deadline first (ties by index), from a heap of deadlines:
    /// a step costs what is due in it, which suits thousands of nodes.
    ByDeadline,
    /// By index, every node being checked at every step.
    ByIndex,
}

/// How far a node's clock is from the simulation's (see
/// [`Sim::add_with_clock`](super::Sim::add_with_clock)): the node is
/// handed the simulated time moved by this much in every call, so its
/// writes are stamped, its datagrams counted and what it receives judged
/// by its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClockSkew {
    /// The node's clock is the simulation's.
    #[default]
    None,
    /// The node's clock runs this far ahead of the simulation's.
    Ahead(Duration),
    /// The node's clock runs this far behind the simulation's (not below
    /// zero).
    Behind(Duration),
}

impl ClockSkew {
    /// The node's clock when the simulation's reads `now`.
    pub fn local(self, now: Duration) -> Duration {
        match self {
            ClockSkew::None => now,
            ClockSkew::Ahead(d) => now.saturating_add(d),
            ClockSkew::Behind(d) => now.saturating_sub(d),
        }
    }

    /// The simulated time at which the node's clock reads `local`.
    pub fn global(self, local: Duration) -> Duration {
        match self {
            ClockSkew::None => local,
            ClockSkew::Ahead(d) => local.saturating_sub(d),
            ClockSkew::Behind(d) => local.saturating_add(d),
        }
    }
}

/// What an identity is chosen from: which node, which run of it, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStart {
    /// The simulation's seed ([`SimConfig::with_seed`]).
    pub sim_seed: u64,
    /// The node's index, from 0 in the order nodes are added.
    pub index: usize,
    /// 0 when the node is added, then 1, 2, … at each
    /// [`Sim::restart`](super::Sim::restart).
    pub run: u32,
    /// The simulated time the node starts at.
    pub now: Duration,
}

/// Who a node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The address it listens at. A restart keeps the first run's.
    pub addr: SocketAddr,
    /// Its name. A restart keeps the first run's.
    pub name: NodeId,
    /// The seed of its own randomness.
    pub seed: u64,
}

/// The default identities: node `i` listens at `10.0.(i / 256).(i % 256)`,
/// port 7000, is named `n` and `i` in four digits (`n0042`), and is seeded
/// from the simulation's seed, its index and its run.
pub fn default_identity(start: &NodeStart) -> Identity {
    let i = start.index;
    Identity {
        addr: SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 7000)),
        name: NodeId::new(format!("n{i:04}")),
        seed: start
            .sim_seed
            .wrapping_mul(0x9e37_79b9)
            .wrapping_add(0xb0b0 + i as u64)
            .wrapping_add(u64::from(start.run) << 32),
    }
}
