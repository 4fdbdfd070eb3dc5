//! A deterministic simulator: [`Machine`]s over a simulated network, in
//! simulated time, every random choice drawn from seeds, so a run is
//! repeated exactly by running it again. No sockets, no sleeps: hundreds
//! of nodes run for minutes of simulated time in seconds.
//!
//! Available with the `sim` feature. A [`SimConfig`] says what every node
//! runs ([`GossipConfig`](crate::GossipConfig)), how datagrams travel ([`Delivery`]: a lossy,
//! duplicating, reordering [`Network`], or instant delivery), how far a
//! step moves the clock, the order the nodes' timers fire in
//! ([`TickOrder`]) and who each node is ([`Identity`]). A [`Sim`] then
//! adds nodes (each on the shared clock, or on one running ahead or
//! behind it: [`Sim::add_with_clock`], [`ClockSkew`]), kills and restarts
//! them, partitions them ([`Sim::set_group`]), writes through them,
//! injects hand-made datagrams and steps the clock until a condition
//! holds.
//!
//! ```
//! use std::time::Duration;
//! use waypost::{Endpoint, EndpointKey};
//! use waypost_gossip::sim::{Sim, SimConfig};
//! use waypost_gossip::GossipConfig;
//!
//! let mut sim = Sim::new(SimConfig::new(GossipConfig::new()).with_seed(1))?;
//! sim.boot(8, Duration::from_millis(200));
//! assert!(sim.run_until(Duration::from_secs(10), Sim::members_complete));
//! sim.register(3, Endpoint::new("payments", "pod-a", "10.1.0.7", 8080))?;
//! let key = EndpointKey::new("payments", "pod-a");
//! assert!(sim.run_until(Duration::from_secs(10), |s| s
//!     .alive()
//!     .all(|(_, m)| m.endpoint(&key).is_some())));
//! # Ok::<(), waypost::Error>(())
//! ```

mod config;
mod net;

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use waypost::{Endpoint, EndpointKey};

pub use self::config::{
    default_identity, ClockSkew, Delivery, Identity, Network, NodeStart, SimConfig, TickOrder,
};
pub use crate::crdt::micros;
use crate::crdt::NodeId;
use crate::error;
use crate::machine::Machine;
use crate::wire::Kind;

/// A datagram the simulated network delivered (see
/// [`SimConfig::with_record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// The sender's index.
    pub from: usize,
    /// The receiver's index.
    pub to: usize,
    /// The datagram, as sent.
    pub data: Vec<u8>,
}

impl Datagram {
    /// What the datagram carries, read from its frame head; `None` when it
    /// has no known kind.
    pub fn kind(&self) -> Option<Kind> {
        self.data.get(2).and_then(|&b| Kind::from_u8(b).ok())
    }
}

/// Simulated nodes, their network and their clock. See the module docs.
pub struct Sim {
    /// `None` once killed.
    nodes: Vec<Option<Machine>>,
    addrs: Vec<SocketAddr>,
    names: Vec<NodeId>,
    /// How many times each node was restarted.
    runs: Vec<u32>,
    /// How far each node's clock is from `now`.
    clocks: Vec<ClockSkew>,
    index: HashMap<SocketAddr, usize>,
    /// The group of each node; datagrams between groups are dropped.
    group: Vec<u8>,
    now: Duration,
    flight: BinaryHeap<std::cmp::Reverse<net::InFlight>>,
    /// `(deadline, node)` for [`TickOrder::ByDeadline`]; stale entries
    /// are skipped when popped.
    deadlines: BinaryHeap<std::cmp::Reverse<(Duration, usize)>>,
    seq: u64,
    rng: SmallRng,
    config: SimConfig,
    delivered: u64,
    handle_time: Duration,
    log: Vec<Datagram>,
    unaddressed: Vec<(SocketAddr, Vec<u8>)>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("alive", &self.alive().count())
            .field("in_flight", &self.flight.len())
            .field("delivered", &self.delivered)
            .finish()
    }
}

impl Sim {
    /// An empty simulation. Fails with `InvalidInput` when the gossip
    /// configuration cannot work, the step is zero or the network's
    /// probabilities or delays make no sense.
    pub fn new(config: SimConfig) -> waypost::Result<Sim> {
        config.gossip.validate()?;
        if config.step.is_zero() {
            return Err(error::config("step", "must be above zero"));
        }
        if let Delivery::Network(network) = &config.delivery {
            network
                .check()
                .map_err(|reason| error::config("network", reason))?;
        }
        Ok(Sim {
            nodes: Vec::new(),
            addrs: Vec::new(),
            names: Vec::new(),
            runs: Vec::new(),
            clocks: Vec::new(),
            index: HashMap::new(),
            group: Vec::new(),
            now: config.start,
            flight: BinaryHeap::new(),
            deadlines: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(config.seed),
            config,
            delivered: 0,
            handle_time: Duration::ZERO,
            log: Vec::new(),
            unaddressed: Vec::new(),
        })
    }

    // ------------------------------------------------------------ nodes

    /// Add a node (the next index, returned), in group 0; it joins
    /// through node `via`, if any.
    ///
    /// # Panics
    ///
    /// When the configuration refuses the node (a name too long for the
    /// replay header), or `via` is no node.
    pub fn add(&mut self, via: Option<usize>) -> usize {
        self.add_with_clock(via, ClockSkew::None)
    }

    /// Add a node as [`add`](Self::add) does, whose clock is `clock` off
    /// the simulation's for its whole life (restarts included): every
    /// call hands it the simulated time moved by that much, and its timers
    /// fire when its own clock reaches them.
    ///
    /// # Panics
    ///
    /// As [`add`](Self::add).
    pub fn add_with_clock(&mut self, via: Option<usize>, clock: ClockSkew) -> usize {
        let i = self.nodes.len();
        let id = self.identity(i, 0);
        let local = clock.local(self.now);
        let mut m = self.machine(i, id.addr, id.name.clone(), id.seed, local);
        if let Some(v) = via {
            m.join(self.addrs[v], local);
        }
        self.nodes.push(Some(m));
        self.addrs.push(id.addr);
        self.names.push(id.name);
        self.runs.push(0);
        self.clocks.push(clock);
        self.index.insert(id.addr, i);
        self.group.push(0);
        self.collect(i);
        i
    }

    /// Start `n` nodes as a cluster boots: the first at once, each other
    /// at a random moment within `spread` of it (drawn from
    /// [`Sim::rng`]), joining through the first; the clock steps until
    /// the last has started, and stops there.
    pub fn boot(&mut self, n: usize, spread: Duration) {
        if n == 0 {
            return;
        }
        let spread = micros(spread);
        let mut starts: Vec<Duration> = (1..n)
            .map(|_| match spread {
                0 => Duration::ZERO,
                s => Duration::from_micros(self.rng.random_range(0..s)),
            })
            .collect();
        starts.sort();
        let start = self.now;
        let first = self.add(None);
        for at in starts {
            while self.now < start + at {
                self.step();
            }
            self.add(Some(first));
        }
    }

    /// Replace node `i` by a fresh run under the same name and address
    /// (a restart faster than failure detection, or after a crash), with
    /// its seed from the identity function; it joins through `via`.
    pub fn restart(&mut self, i: usize, via: usize) {
        self.runs[i] += 1;
        let seed = self.identity(i, self.runs[i]).seed;
        let local = self.clock(i);
        let mut m = self.machine(i, self.addrs[i], self.names[i].clone(), seed, local);
        m.join(self.addrs[via], local);
        self.nodes[i] = Some(m);
        self.collect(i);
    }

    /// Stop node `i` at once, without a word (a crash). Datagrams to it are
    /// lost from then on.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    /// Put node `i` in `group`: datagrams between nodes of different
    /// groups are dropped when they arrive. Every node starts in group 0.
    pub fn set_group(&mut self, i: usize, group: u8) {
        self.group[i] = group;
    }

    /// Every node back in group 0: the partition heals.
    pub fn heal(&mut self) {
        self.group.iter_mut().for_each(|g| *g = 0);
    }

    fn identity(&self, index: usize, run: u32) -> Identity {
        (self.config.identities)(&NodeStart {
            sim_seed: self.config.seed,
            index,
            run,
            now: self.now,
        })
    }

    fn machine(
        &self,
        i: usize,
        addr: SocketAddr,
        name: NodeId,
        seed: u64,
        now: Duration,
    ) -> Machine {
        Machine::new(&self.config.gossip, addr, name, seed, now)
            .unwrap_or_else(|e| panic!("simulated node {i}: {e}"))
    }

    // ----------------------------------------------------------- inputs

    /// Run `f` on node `i` at the current time (by its clock), then hand
    /// what it sent to the network.
    ///
    /// # Panics
    ///
    /// When node `i` was killed.
    pub fn with_node<T>(&mut self, i: usize, f: impl FnOnce(&mut Machine, Duration) -> T) -> T {
        let now = self.clock(i);
        let out = f(self.node_mut(i), now);
        self.collect(i);
        out
    }

    /// Register `endpoint` on node `i` ([`Machine::register`]).
    pub fn register(&mut self, i: usize, endpoint: Endpoint) -> waypost::Result<()> {
        self.with_node(i, |m, now| m.register(endpoint, now))
    }

    /// Deregister `key` on node `i` ([`Machine::deregister`]).
    pub fn deregister(&mut self, i: usize, key: &EndpointKey) {
        self.with_node(i, |m, now| m.deregister(key, now));
    }

    /// Hand `data` to node `to` as if it came from `from`, after
    /// [`flush`](Self::flush)ing; returns what the node queued in answer,
    /// which does not go out.
    ///
    /// # Panics
    ///
    /// When node `to` was killed.
    pub fn inject(
        &mut self,
        to: usize,
        from: SocketAddr,
        data: &[u8],
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        self.flush();
        let now = self.clock(to);
        let m = self.node_mut(to);
        m.handle_datagram(from, data, now);
        let answers = m.take_outbox();
        self.note_deadline(to);
        answers
    }

    /// The network's random source: a scenario drawing from it (start
    /// times, whom to join through) stays repeatable under the seed.
    pub fn rng(&mut self) -> &mut SmallRng {
        &mut self.rng
    }

    // ------------------------------------------------------------ reads

    /// The simulated time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Node `i`'s clock: the simulated time, moved by its
    /// [`ClockSkew`].
    ///
    /// # Panics
    ///
    /// When node `i` was never added.
    pub fn clock(&self, i: usize) -> Duration {
        self.clocks[i].local(self.now)
    }

    /// How many nodes were added, killed ones included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node was added.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`, or `None` once killed.
    pub fn get(&self, i: usize) -> Option<&Machine> {
        self.nodes.get(i).and_then(Option::as_ref)
    }

    /// Node `i`.
    ///
    /// # Panics
    ///
    /// When node `i` was killed or never added.
    pub fn node(&self, i: usize) -> &Machine {
        self.get(i)
            .unwrap_or_else(|| panic!("simulated node {i} is not running"))
    }

    fn node_mut(&mut self, i: usize) -> &mut Machine {
        self.nodes
            .get_mut(i)
            .and_then(Option::as_mut)
            .unwrap_or_else(|| panic!("simulated node {i} is not running"))
    }

    /// The running nodes with their indices.
    pub fn alive(&self) -> impl Iterator<Item = (usize, &Machine)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|m| (i, m)))
    }

    /// The address node `i` listens at.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.addrs[i]
    }

    /// The live endpoints node `i` holds, by key.
    pub fn registry_of(&self, i: usize) -> BTreeMap<EndpointKey, Endpoint> {
        registry(self.node(i))
    }

    /// Whether every running node lists every other as a member.
    pub fn members_complete(&self) -> bool {
        let n = self.alive().count();
        self.alive().all(|(_, m)| m.num_members() == n - 1)
    }

    /// Whether every running node holds the same live endpoints.
    pub fn converged(&self) -> bool {
        let mut states = self.alive().map(|(_, m)| registry(m));
        let Some(first) = states.next() else {
            return true;
        };
        states.all(|s| s == first)
    }

    /// Whether every running node holds exactly `want`.
    pub fn all_hold(&self, want: &BTreeMap<EndpointKey, Endpoint>) -> bool {
        self.alive().all(|(_, m)| registry(m) == *want)
    }

    /// Bytes the running nodes sent, summed ([`Stats::bytes_out`]).
    ///
    /// [`Stats::bytes_out`]: crate::Stats::bytes_out
    pub fn bytes_out(&self) -> u64 {
        self.alive().map(|(_, m)| m.stats().bytes_out).sum()
    }

    /// Datagrams the network handed to a node.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Wall time spent inside [`Machine::handle_datagram`] for the
    /// datagrams the network delivered.
    pub fn handle_time(&self) -> Duration {
        self.handle_time
    }

    /// Every datagram delivered, in order, when recording
    /// ([`SimConfig::with_record`]).
    pub fn log(&self) -> &[Datagram] {
        &self.log
    }

    /// Datagrams sent to addresses that are no node, with their
    /// destination, when recording.
    pub fn unaddressed(&self) -> &[(SocketAddr, Vec<u8>)] {
        &self.unaddressed
    }
}

fn registry(m: &Machine) -> BTreeMap<EndpointKey, Endpoint> {
    m.endpoints().into_iter().map(|e| (e.key(), e)).collect()
}
