//! The four xDS resource types built from a snapshot of the registry: one
//! listener, route configuration, cluster and load assignment per service,
//! each named by the service's name (see `docs/registrar/xds.md`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source, socket_address, Address, AggregatedConfigSource, ApiVersion,
    ConfigSource, HealthStatus, Locality, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager, http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use envoy_types::util::pack_any;
use prost::Message;
use waypost::{Endpoint, Health, Snapshot};

/// The label giving an endpoint's load-balancing weight (the model's,
/// [`waypost::traffic::WEIGHT_LABEL`]).
pub const WEIGHT_LABEL: &str = waypost::traffic::WEIGHT_LABEL;
/// The label giving an endpoint's zone (its locality's `zone`).
pub const ZONE_LABEL: &str = waypost::traffic::ZONE_LABEL;
/// The label giving an endpoint's region (its locality's `region`).
pub const REGION_LABEL: &str = waypost::traffic::REGION_LABEL;
/// The largest weight ([`waypost::traffic::MAX_WEIGHT`]); validation
/// refuses larger ones.
pub const MAX_WEIGHT: u32 = waypost::traffic::MAX_WEIGHT;
/// The name of the router filter in every listener's connection manager.
const ROUTER_FILTER: &str = "envoy.filters.http.router";

/// One of the resource types the registrar serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// LDS: `envoy.config.listener.v3.Listener`.
    Listener,
    /// RDS: `envoy.config.route.v3.RouteConfiguration`.
    Route,
    /// CDS: `envoy.config.cluster.v3.Cluster`.
    Cluster,
    /// EDS: `envoy.config.endpoint.v3.ClusterLoadAssignment`.
    Endpoints,
}

impl Kind {
    /// All four, in the order a client asks for them.
    pub(crate) const ALL: [Kind; 4] = [Kind::Listener, Kind::Route, Kind::Cluster, Kind::Endpoints];

    /// The kind of `type_url`; `None` for a type the registrar does not
    /// serve.
    pub(crate) fn from_type_url(type_url: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.type_url() == type_url)
    }

    /// The type URL of the resources of this kind.
    pub(crate) fn type_url(self) -> &'static str {
        match self {
            Kind::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            Kind::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            Kind::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            Kind::Endpoints => "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        }
    }

    /// Its place in [`Kind::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// Whether a first request naming no resource means "all of them"
    /// (the xDS protocol's legacy wildcard: LDS and CDS only).
    pub(crate) fn empty_is_wildcard(self) -> bool {
        matches!(self, Kind::Listener | Kind::Cluster)
    }
}

/// One resource as sent, built and encoded once for every stream that
/// sends it: its name, a version derived from its encoding, and its
/// encodings as a field of each variant's response, which a stream's
/// response copies as they are ([`super::frame`]).
#[derive(Debug)]
pub(crate) struct Resource {
    /// Its name (the service's).
    pub(crate) name: String,
    /// A hash of the encoded resource, as 16 hex digits: equal versions,
    /// equal resources (also across restarts of the registrar).
    pub(crate) version: String,
    /// The resource as one element of `DiscoveryResponse.resources`: the
    /// field's key, length and the packed `Any`.
    pub(crate) sotw: Bytes,
    /// The resource as one element of `DeltaDiscoveryResponse.resources`
    /// (a `Resource` with its name, version and `Any`), encoded when a
    /// delta stream first sends it.
    delta: OnceLock<Bytes>,
    any: Any,
}

/// A built resource, shared by the streams that send it.
pub(crate) type Built = Arc<Resource>;

/// The field number of `resources` in both `DiscoveryResponse` and
/// `DeltaDiscoveryResponse`.
const RESOURCES_FIELD: u32 = 2;

impl Resource {
    fn new(name: &str, any: Any) -> Built {
        let version = format!("{:016x}", fnv1a(&any.encode_to_vec()));
        let mut sotw = Vec::with_capacity(any.encoded_len() + 8);
        prost::encoding::message::encode(RESOURCES_FIELD, &any, &mut sotw);
        Arc::new(Resource {
            name: name.to_string(),
            version,
            sotw: Bytes::from(sotw),
            delta: OnceLock::new(),
            any,
        })
    }

    /// The resource as one element of `DeltaDiscoveryResponse.resources`.
    pub(crate) fn delta(&self) -> Bytes {
        self.delta
            .get_or_init(|| {
                let r = envoy_types::pb::envoy::service::discovery::v3::Resource {
                    name: self.name.clone(),
                    version: self.version.clone(),
                    resource: Some(self.any.clone()),
                    ..Default::default()
                };
                let mut buf = Vec::with_capacity(r.encoded_len() + 8);
                prost::encoding::message::encode(RESOURCES_FIELD, &r, &mut buf);
                Bytes::from(buf)
            })
            .clone()
    }

    /// The packed resource.
    #[cfg(test)]
    pub(crate) fn any(&self) -> &Any {
        &self.any
    }
}

/// The services of `snap` (those with at least one endpoint, whatever its
/// health or cluster).
pub(crate) fn services(snap: &Snapshot) -> BTreeSet<String> {
    snap.services().map(str::to_string).collect()
}

/// Resources built once for every stream of one xDS server: a change to a
/// service rebuilds (and encodes and hashes) its load assignment once, not
/// once per subscribed client. Entries are kept per kind by name and
/// checked against the service's fingerprint
/// ([`Snapshot::fingerprint`]), so a stream at an older or newer snapshot
/// than the one that filled an entry never gets a resource of another
/// state. Only services that exist are kept, and entries of services that
/// went away are dropped once they outnumber the live ones.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    built: Mutex<[HashMap<String, (u128, Built)>; 4]>,
}

/// Entries of one kind kept before the cache looks for services that
/// went away.
const CACHE_SWEEP_AT: usize = 1024;

impl Cache {
    /// [`build`], from the cache when the service's endpoints are those it
    /// was built from.
    pub(crate) fn build(&self, kind: Kind, name: &str, snap: &Snapshot) -> Option<Built> {
        let Some(print) = snap.fingerprint(name) else {
            return build(kind, name, snap);
        };
        // Only a load assignment depends on the endpoints; the others on
        // the name (and the service's existence) alone.
        let print = if kind == Kind::Endpoints { print } else { 0 };
        if let Some((p, b)) = self.lock()[kind.index()].get(name) {
            if *p == print {
                return Some(Arc::clone(b));
            }
        }
        let built = build(kind, name, snap)?;
        let mut all = self.lock();
        let map = &mut all[kind.index()];
        if map.len() >= CACHE_SWEEP_AT && map.len() > 8 * snap.services().count() {
            map.retain(|n, _| snap.fingerprint(n).is_some());
        }
        map.insert(name.to_string(), (print, Arc::clone(&built)));
        Some(built)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [HashMap<String, (u128, Built)>; 4]> {
        self.built.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `service` has an endpoint in `snap`.
fn exists(snap: &Snapshot, service: &str) -> bool {
    snap.fingerprint(service).is_some()
}

/// The resource of `kind` named `name` in `snap`, or `None` when it does
/// not exist. Listeners, routes and clusters exist while their service
/// has an endpoint; a load assignment exists for any name (empty when the
/// service has no healthy endpoint), so that a client never keeps
/// endpoints of a service that went away.
pub(crate) fn build(kind: Kind, name: &str, snap: &Snapshot) -> Option<Built> {
    if kind != Kind::Endpoints && !exists(snap, name) {
        return None;
    }
    let any = match kind {
        Kind::Listener => pack_any(listener(name)),
        Kind::Route => pack_any(route_configuration(name)),
        Kind::Cluster => pack_any(eds_cluster(name)),
        Kind::Endpoints => pack_any(load_assignment(name, snap.service(name))),
    };
    Some(Resource::new(name, any))
}

/// FNV-1a, 64 bits: a stable hash for resource versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A config source that says "over the same ADS stream", xDS v3.
fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

/// An API listener (what proxyless gRPC resolves `xds:///<service>` to)
/// whose connection manager takes its routes from RDS.
fn listener(service: &str) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: service.to_string(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: service.to_string(),
        })),
        http_filters: vec![HttpFilter {
            name: ROUTER_FILTER.to_string(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: service.to_string(),
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(hcm)),
        }),
        ..Default::default()
    }
}

/// One virtual host for any authority, every path to the service's
/// cluster.
fn route_configuration(service: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: service.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: service.to_string(),
            domains: vec!["*".to_string()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix(String::new())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                        service.to_string(),
                    )),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An EDS cluster, its endpoints over ADS, round robin.
fn eds_cluster(service: &str) -> Cluster {
    Cluster {
        name: service.to_string(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: service.to_string(),
        }),
        lb_policy: cluster::LbPolicy::RoundRobin as i32,
        ..Default::default()
    }
}

/// Whether an endpoint goes into load assignments: healthy or draining,
/// with an IP address (xDS clients take no host names in EDS).
pub(crate) fn served(e: &Endpoint) -> bool {
    matches!(e.health, Health::Healthy | Health::Draining) && e.address.parse::<IpAddr>().is_ok()
}

/// The healthy and draining endpoints of a service, grouped by locality
/// (the `region` and `zone` labels), all at priority 0. Each carries its
/// weight ([`Endpoint::weight`]); a draining one has `health_status:
/// DRAINING` (clients finish their calls to it and start none). A
/// locality's weight is the sum of its healthy endpoints' weights, and is
/// left out when that is 0 (a locality holding only draining endpoints:
/// proxyless gRPC ignores localities without a weight, and Envoy refuses
/// a weight of 0).
fn load_assignment<'a>(
    service: &str,
    endpoints: impl Iterator<Item = &'a Endpoint>,
) -> ClusterLoadAssignment {
    let mut localities: BTreeMap<(String, String), Vec<LbEndpoint>> = BTreeMap::new();
    for e in endpoints.filter(|e| served(e)) {
        let label = |k: &str| e.labels.get(k).cloned().unwrap_or_default();
        let health_status = match e.health {
            Health::Draining => HealthStatus::Draining,
            _ => HealthStatus::Healthy,
        };
        let lb = LbEndpoint {
            health_status: health_status as i32,
            load_balancing_weight: Some(UInt32Value { value: e.weight() }),
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(EnvoyEndpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: e.address.clone(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                            e.port,
                        ))),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        localities
            .entry((label(REGION_LABEL), label(ZONE_LABEL)))
            .or_default()
            .push(lb);
    }
    ClusterLoadAssignment {
        cluster_name: service.to_string(),
        endpoints: localities
            .into_iter()
            .map(|((region, zone), lb_endpoints)| {
                let total = lb_endpoints
                    .iter()
                    .filter(|l| l.health_status == HealthStatus::Healthy as i32)
                    .filter_map(|l| l.load_balancing_weight.as_ref())
                    .fold(0u32, |acc, w| acc.saturating_add(w.value));
                LocalityLbEndpoints {
                    locality: Some(Locality {
                        region,
                        zone,
                        ..Default::default()
                    }),
                    lb_endpoints,
                    load_balancing_weight: (total > 0).then_some(UInt32Value { value: total }),
                    priority: 0,
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use waypost::testing::ep;
    use waypost::Version;

    fn snap() -> Snapshot {
        Snapshot::from_endpoints(
            Version(3),
            [
                ep("api", "a", 80)
                    .with_label("zone", "z1")
                    .with_label("region", "r")
                    .with_label("weight", "5"),
                ep("api", "b", 81).with_label("zone", "z2"),
                ep("api", "c", 82).with_health(Health::Unhealthy),
                ep("api", "d", 83).with_label("weight", "0"),
                ep("web", "w", 90),
            ],
        )
    }

    fn cla(s: &Snapshot, name: &str) -> ClusterLoadAssignment {
        let b = build(Kind::Endpoints, name, s).unwrap();
        ClusterLoadAssignment::decode(b.any().value.as_slice()).unwrap()
    }

    #[test]
    fn draining_endpoints_are_sent_as_draining_and_weigh_nothing_in_their_locality() {
        let s = Snapshot::from_endpoints(
            Version(4),
            [
                ep("api", "a", 80).with_zone("z1").with_weight(3),
                ep("api", "b", 81)
                    .with_zone("z1")
                    .with_weight(5)
                    .with_health(Health::Draining),
                ep("api", "c", 82)
                    .with_zone("z2")
                    .with_health(Health::Draining),
            ],
        );
        let c = cla(&s, "api");
        let mut seen = Vec::new();
        for l in &c.endpoints {
            let zone = l.locality.clone().unwrap().zone;
            let weight = l.load_balancing_weight.map(|w| w.value);
            for e in &l.lb_endpoints {
                seen.push((
                    zone.clone(),
                    weight,
                    e.health_status,
                    e.load_balancing_weight.unwrap().value,
                ));
            }
        }
        seen.sort();
        let (healthy, draining) = (HealthStatus::Healthy as i32, HealthStatus::Draining as i32);
        assert_eq!(
            seen,
            vec![
                ("z1".into(), Some(3), healthy, 3),
                ("z1".into(), Some(3), draining, 5),
                ("z2".into(), None, draining, 1),
            ]
        );
    }

    #[test]
    fn load_assignments_hold_healthy_endpoints_by_locality_with_weights() {
        let s = snap();
        let c = cla(&s, "api");
        assert_eq!(c.cluster_name, "api");
        let mut seen = Vec::new();
        for l in &c.endpoints {
            let loc = l.locality.clone().unwrap();
            let sum: u32 = l
                .lb_endpoints
                .iter()
                .map(|e| e.load_balancing_weight.unwrap().value)
                .sum();
            assert_eq!(l.load_balancing_weight.unwrap().value, sum);
            for e in &l.lb_endpoints {
                let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    panic!("no endpoint");
                };
                let Some(address::Address::SocketAddress(sa)) = ep.address.clone().unwrap().address
                else {
                    panic!("no socket address");
                };
                let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                    panic!("no port");
                };
                seen.push((
                    loc.region.clone(),
                    loc.zone.clone(),
                    port,
                    e.load_balancing_weight.unwrap().value,
                ));
            }
        }
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (String::new(), String::new(), 83, 1),
                (String::new(), "z2".into(), 81, 1),
                ("r".into(), "z1".into(), 80, 5),
            ]
        );
        // Any name has a load assignment; an unknown one is empty.
        assert!(cla(&s, "nope").endpoints.is_empty());
    }

    #[test]
    fn listeners_routes_and_clusters_exist_while_the_service_has_endpoints() {
        let s = snap();
        assert_eq!(services(&s), BTreeSet::from(["api".into(), "web".into()]));
        for kind in [Kind::Listener, Kind::Route, Kind::Cluster] {
            assert!(build(kind, "api", &s).is_some());
            assert!(build(kind, "nope", &s).is_none());
            assert_eq!(Kind::from_type_url(kind.type_url()), Some(kind));
        }
        let l = build(Kind::Listener, "api", &s).unwrap();
        let l = Listener::decode(l.any().value.as_slice()).unwrap();
        let hcm = l.api_listener.unwrap().api_listener.unwrap();
        let hcm = HttpConnectionManager::decode(hcm.value.as_slice()).unwrap();
        let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = hcm.route_specifier else {
            panic!("no RDS");
        };
        assert_eq!(rds.route_config_name, "api");
        assert_eq!(hcm.http_filters.len(), 1);
        // Versions follow content.
        let a = build(Kind::Endpoints, "api", &s).unwrap();
        let again = build(Kind::Endpoints, "api", &s.without(&ep("api", "c", 1).key())).unwrap();
        assert_eq!(
            a.version, again.version,
            "an unhealthy endpoint is not served"
        );
        let changed = build(Kind::Endpoints, "api", &s.without(&ep("api", "a", 1).key())).unwrap();
        assert_ne!(a.version, changed.version);
        assert_eq!(Kind::from_type_url("type.googleapis.com/x"), None);
    }

    #[test]
    fn the_cache_serves_each_snapshot_its_own_resources() {
        let cache = Cache::default();
        let old = snap();
        let new = old.with_endpoint(ep("api", "e", 84));
        let built = |s: &Snapshot| cache.build(Kind::Endpoints, "api", s).unwrap();
        let same = |a: &Built, b: &Built| a.version == b.version && a.sotw == b.sotw;
        let first = built(&old);
        assert!(same(&first, &build(Kind::Endpoints, "api", &old).unwrap()));
        assert!(Arc::ptr_eq(&built(&old), &first), "a hit");
        // The service changed: rebuilt; a stream still at the old snapshot
        // gets the old resource, not the newer one cached.
        let second = built(&new);
        assert_ne!(second.version, first.version);
        assert!(same(&second, &build(Kind::Endpoints, "api", &new).unwrap()));
        assert!(same(&built(&old), &first));
        // A change to another service leaves this one's entry valid.
        let other = new.with_endpoint(ep("web", "x", 91));
        assert!(same(&built(&other), &second));
        // Names without endpoints are not kept.
        assert!(cache.build(Kind::Endpoints, "none", &old).is_some());
        assert!(cache.build(Kind::Listener, "none", &old).is_none());
        assert!(cache.lock().iter().all(|m| !m.contains_key("none")));
    }

    #[test]
    fn type_urls_and_encoded_fields_are_the_messages_own() {
        use envoy_types::pb::envoy::service::discovery::v3::{
            DeltaDiscoveryResponse, DiscoveryResponse,
        };
        use prost::Name;
        assert_eq!(Kind::Listener.type_url(), Listener::type_url());
        assert_eq!(Kind::Route.type_url(), RouteConfiguration::type_url());
        assert_eq!(Kind::Cluster.type_url(), Cluster::type_url());
        assert_eq!(
            Kind::Endpoints.type_url(),
            ClusterLoadAssignment::type_url()
        );
        let b = build(Kind::Endpoints, "api", &snap()).unwrap();
        let sotw = DiscoveryResponse::decode(b.sotw.clone()).unwrap();
        assert_eq!(sotw.resources, vec![b.any().clone()]);
        let delta = DeltaDiscoveryResponse::decode(b.delta()).unwrap();
        assert_eq!(delta.resources.len(), 1);
        assert_eq!(delta.resources[0].name, "api");
        assert_eq!(delta.resources[0].version, b.version);
        assert_eq!(delta.resources[0].resource.as_ref(), Some(b.any()));
    }
}
