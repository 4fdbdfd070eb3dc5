//! The data model: endpoints, keys, versions, events and batch operations.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Identifies an endpoint: unique `id` within a `service`.
///
/// Keys order by service, then id, so all endpoints of one service are
/// adjacent in a [`Snapshot`](crate::Snapshot).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EndpointKey {
    /// The service name clients look up.
    pub service: String,
    /// Unique within the service (pod name, `ip:port`, instance id).
    pub id: String,
}

impl EndpointKey {
    /// A key from its two parts.
    pub fn new(service: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            service: service.into(),
            id: id.into(),
        }
    }
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.service, self.id)
    }
}

/// The transport an endpoint speaks.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Plain TCP (the default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// HTTP/1.1 or HTTP/2 without TLS.
    Http,
    /// HTTP over TLS.
    Https,
    /// gRPC.
    Grpc,
}

impl Protocol {
    /// The lowercase name used in encodings (`tcp`, `udp`, `http`, `https`, `grpc`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Http => "http",
            Protocol::Https => "https",
            Protocol::Grpc => "grpc",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "http" => Protocol::Http,
            "https" => Protocol::Https,
            "grpc" => Protocol::Grpc,
            _ => {
                return Err(Error::invalid(
                    "protocol",
                    format!("unknown protocol {s:?} (expected tcp, udp, http, https or grpc)"),
                ))
            }
        })
    }
}

/// Whether an endpoint should receive traffic.
///
/// Only [`Health::Healthy`] endpoints are given new work by any face or
/// client of this crate; see `docs/traffic.md` for what each face does
/// with the other two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Serving (the default).
    #[default]
    Healthy,
    /// Registered but not serving, e.g. its node stopped heartbeating.
    Unhealthy,
    /// Serving what it has, taking nothing new: the calls it has in
    /// flight finish, and no client sends it another (an endpoint on its
    /// way out, see [`crate::announce::AnnounceConfig::drain_for`]).
    Draining,
}

impl Health {
    /// `healthy`, `unhealthy` or `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
            Health::Draining => "draining",
        }
    }

    /// Whether an endpoint in this state is given new work: only
    /// [`Health::Healthy`] is.
    pub fn takes_new_work(self) -> bool {
        self == Health::Healthy
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Health {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "healthy" => Ok(Health::Healthy),
            "unhealthy" => Ok(Health::Unhealthy),
            "draining" => Ok(Health::Draining),
            _ => Err(Error::invalid(
                "health",
                format!(
                    "unknown health {} (expected healthy, unhealthy or draining)",
                    crate::error::quote(s)
                ),
            )),
        }
    }
}

/// The label (see [`crate::traffic`]) giving an endpoint's zone.
pub const ZONE_LABEL: &str = "zone";
/// The label (see [`crate::traffic`]) giving an endpoint's region.
pub const REGION_LABEL: &str = "region";
/// The label (see [`crate::traffic`]) giving an endpoint's weight.
pub const WEIGHT_LABEL: &str = "weight";
/// The largest weight: what a DNS SRV record can carry (16 bits).
pub const MAX_WEIGHT: u32 = 65_535;
/// One network endpoint of a service.
///
/// ```
/// use waypost::{Endpoint, Health, Protocol};
/// let ep = Endpoint::new("payments", "pod-a", "10.0.0.7", 8080)
///     .with_protocol(Protocol::Grpc)
///     .with_node("node-1")
///     .with_label("zone", "eu-west-1a");
/// assert_eq!(ep.key().to_string(), "payments/pod-a");
/// assert_eq!(ep.health, Health::Healthy);
/// ep.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// The name clients look up.
    pub service: String,
    /// Unique within the service.
    pub id: String,
    /// Host name or IP address.
    pub address: String,
    /// Port, 1 to 65535.
    pub port: u16,
    /// Transport.
    #[serde(default)]
    pub protocol: Protocol,
    /// Owning cluster, for cross-cluster sync (default `default`).
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// Owning node or agent, the unit of liveness; may be empty.
    #[serde(default)]
    pub node: String,
    /// Whether it should receive traffic.
    #[serde(default)]
    pub health: Health,
    /// Everything else (zone, weight, actor address, instance type).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn default_cluster() -> String {
    Endpoint::DEFAULT_CLUSTER.to_string()
}

impl Endpoint {
    /// The cluster an endpoint belongs to when none is set: `default`.
    pub const DEFAULT_CLUSTER: &'static str = "default";

    /// A healthy TCP endpoint in the default cluster, owned by no node.
    pub fn new(
        service: impl Into<String>,
        id: impl Into<String>,
        address: impl Into<String>,
        port: u16,
    ) -> Self {
        Self {
            service: service.into(),
            id: id.into(),
            address: address.into(),
            port,
            protocol: Protocol::default(),
            cluster: default_cluster(),
            node: String::new(),
            health: Health::Healthy,
            labels: BTreeMap::new(),
        }
    }

    /// This endpoint's key.
    pub fn key(&self) -> EndpointKey {
        EndpointKey::new(self.service.clone(), self.id.clone())
    }

    /// Whether this endpoint has `key`, without allocating.
    pub fn has_key(&self, key: &EndpointKey) -> bool {
        self.service == key.service && self.id == key.id
    }

    /// Set the protocol.
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Set the owning cluster.
    pub fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = cluster.into();
        self
    }

    /// Set the owning node.
    pub fn with_node(mut self, node: impl Into<String>) -> Self {
        self.node = node.into();
        self
    }

    /// Set the health.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// Set the weight: the [`WEIGHT_LABEL`] label, 1 to
    /// [`MAX_WEIGHT`] (validation refuses 0).
    pub fn with_weight(self, weight: u32) -> Self {
        self.with_label(WEIGHT_LABEL, weight.to_string())
    }

    /// Set the zone: the [`ZONE_LABEL`] label.
    pub fn with_zone(self, zone: impl Into<String>) -> Self {
        self.with_label(ZONE_LABEL, zone)
    }

    /// Set the region: the [`REGION_LABEL`] label.
    pub fn with_region(self, region: impl Into<String>) -> Self {
        self.with_label(REGION_LABEL, region)
    }

    /// The weight: the [`WEIGHT_LABEL`] label, 1 when it
    /// is absent (or, in an endpoint that was never validated, not a
    /// whole number from 1 to [`MAX_WEIGHT`]).
    pub fn weight(&self) -> u32 {
        self.labels
            .get(WEIGHT_LABEL)
            .and_then(|w| w.parse::<u32>().ok())
            .filter(|w| (1..=MAX_WEIGHT).contains(w))
            .unwrap_or(1)
    }

    /// The zone: the [`ZONE_LABEL`] label, if set and
    /// not empty.
    pub fn zone(&self) -> Option<&str> {
        self.labels
            .get(ZONE_LABEL)
            .map(String::as_str)
            .filter(|z| !z.is_empty())
    }

    /// The region: the [`REGION_LABEL`] label, if set and
    /// not empty.
    pub fn region(&self) -> Option<&str> {
        self.labels
            .get(REGION_LABEL)
            .map(String::as_str)
            .filter(|z| !z.is_empty())
    }

    /// Add or replace one label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// A position in a registry's change history. Versions only grow: a later
/// change never has a smaller version than an earlier one.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Version(pub u64);

impl Version {
    /// The version of an empty registry that has never changed.
    pub const ZERO: Version = Version(0);

    /// The version after this one.
    pub fn next(self) -> Version {
        Version(self.0.saturating_add(1))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One write in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Insert or replace the endpoint.
    Register(Endpoint),
    /// Remove the endpoint if it exists.
    Deregister(EndpointKey),
}

impl Op {
    /// The key this op writes.
    pub fn key(&self) -> EndpointKey {
        match self {
            Op::Register(e) => e.key(),
            Op::Deregister(k) => k.clone(),
        }
    }

    /// Validate the op (registrations only; any key may be deregistered).
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            Op::Register(e) => e.validate(),
            Op::Deregister(_) => Ok(()),
        }
    }

    /// The net effect of `ops` applied in order: one op per key, the last
    /// one, at the position of the key's first op (register then
    /// deregister is a deregister, deregister then register a register,
    /// two registers the later one).
    ///
    /// ```
    /// use waypost::{Endpoint, Op};
    /// let a = Endpoint::new("s", "a", "h", 1);
    /// let net = Op::net(vec![Op::Register(a.clone()), Op::Deregister(a.key())]);
    /// assert_eq!(net, vec![Op::Deregister(a.key())]);
    /// ```
    pub fn net(ops: Vec<Op>) -> Vec<Op> {
        let mut out: Vec<Op> = Vec::with_capacity(ops.len());
        let mut index: std::collections::HashMap<EndpointKey, usize> =
            std::collections::HashMap::with_capacity(ops.len());
        for op in ops {
            match index.get(&op.key()) {
                Some(&i) => out[i] = op,
                None => {
                    index.insert(op.key(), out.len());
                    out.push(op);
                }
            }
        }
        out
    }
}
