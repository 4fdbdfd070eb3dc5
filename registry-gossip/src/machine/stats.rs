//! [`Stats`]: what a [`Machine`](super::Machine) did, counted.

/// Counters of what the machine did, for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams handed to
    /// [`Machine::handle_datagram`](super::Machine::handle_datagram).
    pub datagrams_in: u64,
    /// Datagrams produced.
    pub datagrams_out: u64,
    /// Bytes produced.
    pub bytes_out: u64,
    /// Datagrams dropped because their authentication tag was missing or
    /// wrong.
    pub auth_failures: u64,
    /// Datagrams (or broadcast items) dropped because they did not decode.
    pub malformed: u64,
    /// Errors foca reported while handling input (stale or unexpected
    /// messages; no state is lost).
    pub swim_errors: u64,
    /// Anti-entropy digests sent.
    pub digests_sent: u64,
    /// Entries received through anti-entropy that changed the replica.
    pub entries_repaired: u64,
    /// Tombstones garbage-collected.
    pub tombstones_collected: u64,
    /// Death tombstones this node wrote for dead members' entries.
    pub death_tombstones: u64,
    /// Entries re-asserted after this node was (wrongly) declared dead.
    pub reasserted: u64,
    /// Live entries found under this node's name that it does not own (left
    /// by an earlier run of the node) and retracted with a tombstone.
    pub retracted: u64,
}
