//! [`Stats`]: what a [`Machine`](super::Machine) did, counted; and the
//! same drops as `metrics` counters ([`describe_metrics`]).

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
    /// Datagrams dropped because their frame version is not the one this
    /// node speaks (version 1 without a key, 2 with one): an old-format or
    /// unkeyed node talking to a keyed one, or the other way round.
    pub version_mismatch: u64,
    /// Keyed datagrams dropped because their authenticated destination is
    /// not this node's address (sent to another node and replayed here).
    pub misdirected: u64,
    /// Keyed datagrams dropped as replays: their counter was seen before
    /// from that sender, or is older than its replay window.
    pub replays: u64,
    /// Keyed datagrams dropped because their counter is further behind
    /// this node's clock than `max_clock_skew` (stale or replayed later).
    pub stale: u64,
    /// Keyed datagrams dropped because their counter is further ahead of
    /// this node's clock than `max_clock_skew`.
    pub skewed: u64,
    /// Entries refused because their timestamp is further ahead of this
    /// node's clock than `max_clock_skew` (or is `u64::MAX`): not merged,
    /// and the clock did not move.
    pub entries_refused: u64,
    /// Answers not sent because they would have sent an address that is not
    /// a confirmed member more than twice the bytes it sent.
    pub answers_capped: u64,
    /// Errors foca reported while handling input (stale or unexpected
    /// messages; no state is lost).
    pub swim_errors: u64,
    /// Membership sync pulls answered with nothing, the two views being
    /// the same.
    pub member_syncs_equal: u64,
    /// Identities received in membership sync lists (known ones
    /// included).
    pub members_received: u64,
    /// Anti-entropy digests sent.
    pub digests_sent: u64,
    /// Entries received through anti-entropy that changed the replica.
    pub entries_repaired: u64,
    /// Tombstones garbage-collected.
    pub tombstones_collected: u64,
    /// Tombstones received after their TTL for keys this node no longer
    /// held (collected already), dropped instead of kept again.
    pub expired_tombstones_dropped: u64,
    /// Death tombstones this node wrote for dead members' entries.
    pub death_tombstones: u64,
    /// Entries re-asserted after this node was (wrongly) declared dead.
    pub reasserted: u64,
    /// Live entries found under this node's name that it does not own (left
    /// by an earlier run of the node) and retracted with a tombstone.
    pub retracted: u64,
}

/// Name of the counter of dropped datagrams, labelled `reason`
/// (`auth`, `malformed`, `version`, `misdirected`, `replay`, `stale`,
/// `skewed`).
pub const DROPPED_METRIC: &str = "registry_gossip_datagrams_dropped_total";
/// Name of the counter of entries refused for a timestamp too far ahead.
pub const REFUSED_METRIC: &str = "registry_gossip_entries_refused_total";
/// Name of the counter of answers withheld from unconfirmed addresses.
pub const CAPPED_METRIC: &str = "registry_gossip_answers_capped_total";

/// Describe this crate's metrics (help text) to the installed `metrics`
/// recorder. Optional; call once after installing one.
pub fn describe_metrics() {
    metrics::describe_counter!(
        DROPPED_METRIC,
        "Gossip datagrams dropped before use, by reason"
    );
    metrics::describe_counter!(
        REFUSED_METRIC,
        "Gossip entries refused because their timestamp is too far ahead"
    );
    metrics::describe_counter!(
        CAPPED_METRIC,
        "Gossip answers withheld from addresses that are not confirmed members"
    );
}

/// Count a dropped datagram under `reason`.
pub(super) fn dropped(reason: &'static str) {
    metrics::counter!(DROPPED_METRIC, "reason" => reason).increment(1);
}

/// Whether the `n`th event of a kind should be logged at `warn` rather than
/// `debug`: the 1st, 2nd, 4th, 8th…, so a flood logs a handful of lines.
pub(super) fn warn_now(n: u64) -> bool {
    n.is_power_of_two()
}
