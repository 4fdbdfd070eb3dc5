//! The node registry's `Service` document (`GET /services`), built from
//! endpoints. Consul's documents are in `consul::shapes`.

use serde::Serialize;
use waypost::{Endpoint, Health};

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

/// The node registry's status for a health: `running`, `unhealthy` or
/// `draining`.
pub(crate) fn node_registry_status(h: Health) -> &'static str {
    match h {
        Health::Healthy => "running",
        Health::Unhealthy => "unhealthy",
        Health::Draining => "draining",
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
