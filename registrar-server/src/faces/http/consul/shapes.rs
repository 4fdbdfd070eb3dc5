//! Consul's JSON documents (a subset of their fields), built from
//! endpoints.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use waypost::{Endpoint, Health};

use super::body::MAX_WEIGHT;
use super::check::{self, Check, Status};

/// The registry's well-known label for an endpoint's load-balancing
/// weight: Consul's `Weights.Passing`.
pub(crate) const WEIGHT_LABEL: &str = "weight";

/// The label whose value (comma-separated) becomes Consul's `Tags`.
pub(crate) const TAGS_LABEL: &str = "tags";

/// The check id an endpoint without checks of its own carries.
pub(crate) const HEALTH_CHECK_ID: &str = "registrar:health";

/// The `tags` label split on commas, trimmed, empty parts dropped.
pub(crate) fn tags(e: &Endpoint) -> Vec<String> {
    e.labels
        .get(TAGS_LABEL)
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The node an endpoint is shown under: its node, or its service when it
/// has none (Consul always names one).
pub(crate) fn node_name(e: &Endpoint) -> &str {
    if e.node.is_empty() {
        &e.service
    } else {
        &e.node
    }
}

/// Consul's `Meta`: every label but the checks' own.
fn meta(e: &Endpoint) -> BTreeMap<String, String> {
    e.labels
        .iter()
        .filter(|(k, _)| !check::is_check_label(k) && !is_maintenance_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Consul's `Weights`: `Passing` from the endpoint's `weight` label (1
/// without one, or when it is not a whole number from 1 to
/// [`MAX_WEIGHT`]), `Warning` 1.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Weights {
    passing: u32,
    warning: u32,
}

impl Weights {
    /// The weights of `e`.
    pub(crate) fn of(e: &Endpoint) -> Self {
        let passing = e
            .labels
            .get(WEIGHT_LABEL)
            .and_then(|w| w.trim().parse::<u32>().ok())
            .filter(|w| (1..=MAX_WEIGHT).contains(w))
            .unwrap_or(1);
        Self {
            passing,
            warning: 1,
        }
    }
}

/// One entry of `GET /v1/health/service/<name>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ServiceEntry {
    node: ConsulNode,
    service: ConsulService,
    checks: Vec<HealthCheck>,
}

/// Consul's `Node`: the endpoint's node (its address the endpoint's: the
/// registry keeps no node addresses); its cluster as the datacenter.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ConsulNode {
    /// Consul's node UUID: the registry has none.
    #[serde(rename = "ID")]
    id: String,
    node: String,
    address: String,
    datacenter: String,
    tagged_addresses: BTreeMap<String, String>,
    meta: BTreeMap<String, String>,
}

impl ConsulNode {
    /// The node `e` is shown under.
    pub(crate) fn from_endpoint(e: &Endpoint) -> Self {
        Self {
            id: String::new(),
            node: node_name(e).to_string(),
            address: e.address.clone(),
            datacenter: e.cluster.clone(),
            tagged_addresses: BTreeMap::new(),
            meta: BTreeMap::new(),
        }
    }
}

/// Consul's `Service` (also what `/v1/agent/services` lists).
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ConsulService {
    #[serde(rename = "ID")]
    id: String,
    service: String,
    tags: Vec<String>,
    address: String,
    port: u16,
    meta: BTreeMap<String, String>,
    weights: Weights,
    enable_tag_override: bool,
    datacenter: String,
}

impl ConsulService {
    pub(crate) fn from_endpoint(e: &Endpoint) -> Self {
        Self {
            id: e.id.clone(),
            service: e.service.clone(),
            tags: tags(e),
            address: e.address.clone(),
            port: e.port,
            meta: meta(e),
            weights: Weights::of(e),
            enable_tag_override: false,
            datacenter: e.cluster.clone(),
        }
    }
}

/// One Consul health check.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct HealthCheck {
    node: String,
    #[serde(rename = "CheckID")]
    check_id: String,
    name: String,
    status: &'static str,
    notes: String,
    output: String,
    #[serde(rename = "ServiceID")]
    service_id: String,
    service_name: String,
    service_tags: Vec<String>,
    #[serde(rename = "Type")]
    kind: &'static str,
}

/// Consul's check status for a health: `passing`, or `critical` for an
/// unhealthy or draining endpoint (Consul readers send nothing new to a
/// critical instance, as to one in maintenance).
pub(crate) fn health_status(h: Health) -> &'static str {
    match h {
        Health::Healthy => "passing",
        Health::Unhealthy | Health::Draining => "critical",
    }
}

/// The checks of `e` as Consul shows them: its own (registered through
/// the agent API), plus `registrar:health`, critical, when the endpoint is
/// unhealthy for another reason (its node went silent) or draining (its
/// notes say so); an endpoint without checks of its own has only
/// `registrar:health`.
pub(crate) fn health_checks(e: &Endpoint) -> Vec<HealthCheck> {
    let mut out = own_checks(e);
    out.extend(maintenance_checks(e));
    let any_critical = out.iter().any(|c| c.status == Status::Critical.as_str());
    if out.is_empty() || (e.health != Health::Healthy && !any_critical) {
        let notes = if e.health == Health::Draining {
            "draining: serving what it has, taking nothing new"
        } else {
            ""
        };
        out.push(HealthCheck {
            node: node_name(e).to_string(),
            check_id: HEALTH_CHECK_ID.to_string(),
            name: "registrar endpoint health".to_string(),
            status: health_status(e.health),
            notes: notes.to_string(),
            output: String::new(),
            service_id: e.id.clone(),
            service_name: e.service.clone(),
            service_tags: tags(e),
            kind: "",
        });
    }
    out
}

/// The label holding a service's maintenance reason.
pub(crate) const SERVICE_LABEL: &str = "consul.maintenance";
/// The label holding its node's maintenance reason.
pub(crate) const NODE_LABEL: &str = "consul.node-maintenance";
/// Consul's check ID prefix for a service in maintenance.
pub(crate) const SERVICE_CHECK: &str = "_service_maintenance:";
/// Consul's check ID for a node in maintenance.
pub(crate) const NODE_CHECK: &str = "_node_maintenance";
/// Whether a label key is one of maintenance mode's ([`super::maintenance`]).
pub(crate) fn is_maintenance_label(key: &str) -> bool {
    key == SERVICE_LABEL || key == NODE_LABEL
}

/// The critical checks Consul shows for a service, or its node, in
/// maintenance, with the reason as notes.
fn maintenance_checks(e: &Endpoint) -> Vec<HealthCheck> {
    let mut out = Vec::new();
    for (label, id, name, service) in [
        (
            SERVICE_LABEL,
            format!("{SERVICE_CHECK}{}", e.id),
            "Service Maintenance Mode",
            true,
        ),
        (
            NODE_LABEL,
            NODE_CHECK.to_string(),
            "Node Maintenance Mode",
            false,
        ),
    ] {
        if let Some(reason) = e.labels.get(label) {
            out.push(HealthCheck {
                node: node_name(e).to_string(),
                check_id: id,
                name: name.to_string(),
                status: "critical",
                notes: reason.clone(),
                output: String::new(),
                service_id: if service { e.id.clone() } else { String::new() },
                service_name: if service {
                    e.service.clone()
                } else {
                    String::new()
                },
                service_tags: if service { tags(e) } else { Vec::new() },
                kind: "maintenance",
            });
        }
    }
    out
}

/// The checks registered with `e` through the agent API.
pub(crate) fn own_checks(e: &Endpoint) -> Vec<HealthCheck> {
    check::checks(e)
        .map(|(id, c): (&str, Check)| HealthCheck {
            node: node_name(e).to_string(),
            check_id: id.to_string(),
            name: c.name,
            status: c.status.as_str(),
            notes: String::new(),
            output: c.output,
            service_id: e.id.clone(),
            service_name: e.service.clone(),
            service_tags: tags(e),
            kind: c.probe.type_name(),
        })
        .collect()
}

impl HealthCheck {
    /// Its `CheckID`.
    pub(crate) fn check_id(&self) -> &str {
        &self.check_id
    }

    /// Its `Status`.
    pub(crate) fn status(&self) -> &str {
        self.status
    }
}

/// Whether every check of `e` passes (Consul's `?passing`: a warning does
/// not).
pub(crate) fn passing(e: &Endpoint) -> bool {
    e.health == Health::Healthy && check::checks(e).all(|(_, c)| c.status == Status::Passing)
}

impl ServiceEntry {
    pub(crate) fn from_endpoint(e: &Endpoint) -> Self {
        Self {
            node: ConsulNode::from_endpoint(e),
            service: ConsulService::from_endpoint(e),
            checks: health_checks(e),
        }
    }
}

/// One entry of `GET /v1/catalog/service/<name>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct CatalogService {
    node: String,
    address: String,
    datacenter: String,
    tagged_addresses: BTreeMap<String, String>,
    node_meta: BTreeMap<String, String>,
    #[serde(rename = "ServiceID")]
    service_id: String,
    service_name: String,
    service_tags: Vec<String>,
    service_address: String,
    service_port: u16,
    service_meta: BTreeMap<String, String>,
    service_weights: Weights,
    service_enable_tag_override: bool,
}

impl CatalogService {
    pub(crate) fn from_endpoint(e: &Endpoint) -> Self {
        Self {
            node: node_name(e).to_string(),
            address: e.address.clone(),
            datacenter: e.cluster.clone(),
            tagged_addresses: BTreeMap::new(),
            node_meta: BTreeMap::new(),
            service_id: e.id.clone(),
            service_name: e.service.clone(),
            service_tags: tags(e),
            service_address: e.address.clone(),
            service_port: e.port,
            service_meta: meta(e),
            service_weights: Weights::of(e),
            service_enable_tag_override: false,
        }
    }
}

/// `GET /v1/catalog/services`: every service with the union of its
/// endpoints' tags (sorted).
pub(crate) fn catalog<'a>(
    endpoints: impl Iterator<Item = &'a Endpoint>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in endpoints {
        out.entry(e.service.clone()).or_default().extend(tags(e));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faces::http::consul::check::Probe;

    #[test]
    fn tags_come_from_the_tags_label() {
        let e = Endpoint::new("web", "a", "10.0.0.1", 80).with_label("tags", "v1, primary,,");
        assert_eq!(tags(&e), vec!["v1".to_string(), "primary".to_string()]);
        assert!(tags(&Endpoint::new("web", "b", "10.0.0.2", 80)).is_empty());
    }

    #[test]
    fn weights_passing_is_the_weight_label_when_it_is_a_weight() {
        let weight = |w: &str| {
            let e = Endpoint::new("web", "a", "10.0.0.1", 80).with_label("weight", w);
            serde_json::to_value(ConsulService::from_endpoint(&e)).expect("serializes")["Weights"]
                .clone()
        };
        assert_eq!(weight("7"), serde_json::json!({"Passing": 7, "Warning": 1}));
        assert_eq!(weight("65535")["Passing"], 65535);
        for bad in ["0", "65536", "x", "-1"] {
            assert_eq!(weight(bad)["Passing"], 1, "{bad}");
        }
    }

    #[test]
    fn consul_entry_has_consul_field_names() {
        let e = Endpoint::new("web", "a", "10.0.0.1", 80)
            .with_node("n1")
            .with_health(Health::Unhealthy);
        let v = serde_json::to_value(ServiceEntry::from_endpoint(&e)).expect("serializes");
        assert_eq!(v["Service"]["ID"], "a");
        assert_eq!(v["Service"]["Port"], 80);
        assert_eq!(v["Node"]["Node"], "n1");
        assert_eq!(v["Checks"][0]["Status"], "critical");
        assert_eq!(v["Checks"][0]["CheckID"], "registrar:health");
    }

    #[test]
    fn a_draining_endpoint_is_critical_and_not_passing_for_consul_readers() {
        let e = Endpoint::new("web", "a", "10.0.0.1", 80).with_health(Health::Draining);
        let v = serde_json::to_value(ServiceEntry::from_endpoint(&e)).expect("serializes");
        assert_eq!(v["Checks"][0]["CheckID"], "registrar:health");
        assert_eq!(v["Checks"][0]["Status"], "critical");
        assert!(v["Checks"][0]["Notes"]
            .as_str()
            .is_some_and(|n| n.starts_with("draining")));
        assert!(!passing(&e));
        // A passing check of its own does not make it passing either, and
        // the registrar's critical check is shown beside it.
        let mut e = e;
        let ok = Check {
            name: "ttl".into(),
            probe: Probe::Ttl { ttl_ms: 1000 },
            deregister_after_ms: None,
            status: Status::Passing,
            output: String::new(),
            since_ms: 1,
            expires_ms: None,
            reports: 0,
            damping: Default::default(),
        };
        check::put(&mut e, "service:a", &ok);
        assert_eq!(
            e.health,
            Health::Draining,
            "a passing check keeps it draining"
        );
        assert!(!passing(&e));
        let checks = health_checks(&e);
        assert!(checks
            .iter()
            .any(|c| c.check_id() == HEALTH_CHECK_ID && c.status == "critical"));
    }

    #[test]
    fn an_endpoint_s_own_checks_replace_the_registrar_s_and_stay_out_of_meta() {
        let mut e = Endpoint::new("web", "a", "10.0.0.1", 80).with_label("zone", "z1");
        let warn = Check {
            name: "ttl".into(),
            probe: Probe::Ttl { ttl_ms: 1000 },
            deregister_after_ms: None,
            status: Status::Warning,
            output: "slow".into(),
            since_ms: 1,
            expires_ms: None,
            reports: 0,
            damping: Default::default(),
        };
        check::put(&mut e, "service:a", &warn);
        let v = serde_json::to_value(ServiceEntry::from_endpoint(&e)).expect("serializes");
        assert_eq!(v["Checks"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["Checks"][0]["CheckID"], "service:a");
        assert_eq!(v["Checks"][0]["Status"], "warning");
        assert_eq!(v["Checks"][0]["Type"], "ttl");
        assert_eq!(v["Service"]["Meta"], serde_json::json!({"zone": "z1"}));
        // A warning is healthy for the registry, but not `?passing`.
        assert_eq!(e.health, Health::Healthy);
        assert!(!passing(&e));
    }
}
