//! The catalog and health reads field tools call beside the per-service
//! ones: the datacenters, the nodes, one node's services and checks, and
//! every check in a state. Nodes are derived from endpoints as everywhere
//! in Consul's routes ([`shapes::node_name`]); a node is named within its
//! datacenter (the endpoint's cluster). Each answer carries the registry's
//! version in `X-Consul-Index` and blocks on it with `?index=&wait=`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use waypost::backend::quote;
use waypost::{Endpoint, Error, Snapshot};

use super::filter::{self, CHECKS, NODES, SERVICES};
use super::shapes::{self, ConsulNode, ConsulService, HealthCheck};
use super::{consul_query, filter_of, READ};
use crate::engine::registrar::Registrar;
use crate::faces::http::query::Query;
use crate::faces::http::{json_response, read_state, ApiError};

/// The endpoints of the datacenter the query names (all without `dc`).
fn in_dc<'a>(snap: &'a Snapshot, q: &'a Query) -> impl Iterator<Item = &'a Endpoint> + 'a {
    snap.iter()
        .filter(move |e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc))
}

/// The endpoints shown under node `node`: of the datacenter the query
/// names, or else of the registrar's own cluster when the node is there,
/// or else of the first datacenter that has it.
fn on_node<'a>(snap: &'a Snapshot, q: &'a Query, own: &str, node: &str) -> Vec<&'a Endpoint> {
    let all: Vec<&Endpoint> = in_dc(snap, q)
        .filter(|e| shapes::node_name(e) == node)
        .collect();
    let dc = all
        .iter()
        .find(|e| e.cluster == own)
        .or(all.first())
        .map(|e| e.cluster.clone());
    all.into_iter()
        .filter(|e| Some(&e.cluster) == dc.as_ref())
        .collect()
}

/// `GET /v1/catalog/datacenters`: the registrar's cluster first, then
/// every other cluster the registry holds endpoints of (sorted), as
/// Consul lists the local datacenter first.
pub(super) async fn datacenters(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), &[])?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let own = registrar.config().cluster_name.clone();
    let mut others: Vec<&str> = snap
        .iter()
        .map(|e| e.cluster.as_str())
        .filter(|c| *c != own)
        .collect();
    others.sort_unstable();
    others.dedup();
    let mut all = vec![own.as_str()];
    all.extend(others);
    Ok(json_response(StatusCode::OK, &all, Some(index)))
}

/// `GET /v1/catalog/nodes`: every node, sorted by datacenter and name.
pub(super) async fn nodes(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ)?;
    let f = filter_of(&q, NODES)?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let mut nodes: BTreeMap<(&str, &str), ConsulNode> = BTreeMap::new();
    for e in in_dc(&snap, &q) {
        nodes
            .entry((e.cluster.as_str(), shapes::node_name(e)))
            .or_insert_with(|| ConsulNode::from_endpoint(e));
    }
    let nodes = filter::keep(f.as_ref(), nodes.into_values().collect());
    Ok(json_response(StatusCode::OK, &nodes, Some(index)))
}

/// `GET /v1/catalog/node/<node>`'s answer.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct NodeServices {
    node: ConsulNode,
    services: BTreeMap<String, ConsulService>,
}

/// `GET /v1/catalog/node/<node>`: the node and its services by ID;
/// `null` for a node the registry does not have (as Consul answers).
pub(super) async fn node(
    State(registrar): State<Arc<Registrar>>,
    Path(node): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ)?;
    let f = filter_of(&q, SERVICES)?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let own = &registrar.config().cluster_name;
    let on = on_node(&snap, &q, own, &node);
    let Some(first) = on.first() else {
        return Ok(json_response(StatusCode::OK, &(), Some(index)));
    };
    let mut services = BTreeMap::new();
    for e in &on {
        let s = ConsulService::from_endpoint(e);
        if f.as_ref().is_none_or(|f| filter::passes(f, &s)) {
            services.entry(e.id.clone()).or_insert(s);
        }
    }
    let answer = NodeServices {
        node: ConsulNode::from_endpoint(first),
        services,
    };
    Ok(json_response(StatusCode::OK, &answer, Some(index)))
}

/// `GET /v1/health/node/<node>`: the checks of the node's services
/// (`[]` for a node the registry does not have).
pub(super) async fn health_node(
    State(registrar): State<Arc<Registrar>>,
    Path(node): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ)?;
    let f = filter_of(&q, CHECKS)?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let own = &registrar.config().cluster_name;
    let checks: Vec<HealthCheck> = on_node(&snap, &q, own, &node)
        .into_iter()
        .flat_map(shapes::health_checks)
        .collect();
    let checks = filter::keep(f.as_ref(), checks);
    Ok(json_response(StatusCode::OK, &checks, Some(index)))
}

/// `GET /v1/health/state/<state>`: every check in `state` (`passing`,
/// `warning`, `critical`), or every check (`any`).
pub(super) async fn health_state(
    State(registrar): State<Arc<Registrar>>,
    Path(state): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    if !matches!(state.as_str(), "any" | "passing" | "warning" | "critical") {
        return Err(Error::invalid(
            "state",
            format!("{} is not any, passing, warning or critical", quote(&state)),
        )
        .into());
    }
    let q = consul_query(&registrar, raw.as_deref(), READ)?;
    let f = filter_of(&q, CHECKS)?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let checks: Vec<HealthCheck> = in_dc(&snap, &q)
        .flat_map(shapes::health_checks)
        .filter(|c| state == "any" || c.status() == state)
        .collect();
    let checks = filter::keep(f.as_ref(), checks);
    Ok(json_response(StatusCode::OK, &checks, Some(index)))
}
