//! The JSON documents of the HTTP API, built from endpoints: Consul's
//! shapes (a subset) and the node registry's `Service`.

use std::collections::{BTreeMap, BTreeSet};

use registry_api::{Endpoint, Health};
use serde::Serialize;

/// The label whose value (comma-separated) becomes Consul's `Tags`.
pub(crate) const TAGS_LABEL: &str = "tags";

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

/// One entry of `GET /v1/health/service/<name>`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ServiceEntry {
    pub(crate) node: ConsulNode,
    pub(crate) service: ConsulService,
    pub(crate) checks: Vec<ConsulCheck>,
}

/// Consul's `Node`: the endpoint's node; its cluster as the datacenter.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ConsulNode {
    pub(crate) node: String,
    pub(crate) address: String,
    pub(crate) datacenter: String,
}

/// Consul's `Service`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ConsulService {
    #[serde(rename = "ID")]
    pub(crate) id: String,
    pub(crate) service: String,
    pub(crate) tags: Vec<String>,
    pub(crate) address: String,
    pub(crate) port: u16,
    pub(crate) meta: BTreeMap<String, String>,
    pub(crate) datacenter: String,
}

/// One Consul check: the endpoint's health.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ConsulCheck {
    pub(crate) node: String,
    #[serde(rename = "CheckID")]
    pub(crate) check_id: &'static str,
    pub(crate) name: &'static str,
    pub(crate) status: &'static str,
    #[serde(rename = "ServiceID")]
    pub(crate) service_id: String,
    pub(crate) service_name: String,
}

/// The check id every entry carries.
pub(crate) const CHECK_ID: &str = "registrar:health";

/// Consul's check status for a health: `passing` or `critical`.
pub(crate) fn check_status(h: Health) -> &'static str {
    match h {
        Health::Healthy => "passing",
        Health::Unhealthy => "critical",
    }
}

impl ServiceEntry {
    pub(crate) fn from_endpoint(e: &Endpoint) -> Self {
        let node = node_name(e).to_string();
        Self {
            node: ConsulNode {
                node: node.clone(),
                address: e.address.clone(),
                datacenter: e.cluster.clone(),
            },
            service: ConsulService {
                id: e.id.clone(),
                service: e.service.clone(),
                tags: tags(e),
                address: e.address.clone(),
                port: e.port,
                meta: e.labels.clone(),
                datacenter: e.cluster.clone(),
            },
            checks: vec![ConsulCheck {
                node,
                check_id: CHECK_ID,
                name: "registrar endpoint health",
                status: check_status(e.health),
                service_id: e.id.clone(),
                service_name: e.service.clone(),
            }],
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

/// The node registry's `Service` (`GET /services`), with the endpoint's
/// service name and address added (its load balancer needs them; the
/// node registry looked the address up from the node).
#[derive(Debug, Serialize)]
pub(crate) struct NodeRegistryService {
    pub(crate) id: String,
    pub(crate) instance_id: String,
    pub(crate) node_id: String,
    pub(crate) port: u16,
    pub(crate) pid: u32,
    pub(crate) status: &'static str,
    pub(crate) deploy_url: String,
    pub(crate) created_at: Option<String>,
    pub(crate) service: String,
    pub(crate) address: String,
}

/// The node registry's status for a health: `running` or `unhealthy`.
pub(crate) fn node_registry_status(h: Health) -> &'static str {
    match h {
        Health::Healthy => "running",
        Health::Unhealthy => "unhealthy",
    }
}

impl NodeRegistryService {
    pub(crate) fn from_endpoint(e: &Endpoint) -> Self {
        let label = |k: &str| e.labels.get(k).cloned().unwrap_or_default();
        Self {
            id: e.id.clone(),
            instance_id: label("instance_id"),
            node_id: e.node.clone(),
            port: e.port,
            pid: e
                .labels
                .get("pid")
                .and_then(|p| p.parse().ok())
                .unwrap_or(0),
            status: node_registry_status(e.health),
            deploy_url: label("deploy_url"),
            created_at: e.labels.get("created_at").cloned(),
            service: e.service.clone(),
            address: e.address.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_come_from_the_tags_label() {
        let e = Endpoint::new("web", "a", "10.0.0.1", 80).with_label("tags", "v1, primary,,");
        assert_eq!(tags(&e), vec!["v1".to_string(), "primary".to_string()]);
        assert!(tags(&Endpoint::new("web", "b", "10.0.0.2", 80)).is_empty());
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
    }
}
