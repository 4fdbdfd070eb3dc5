//! Consul's maintenance mode, as draining: `PUT
//! /v1/agent/service/maintenance/<id>?enable=…&reason=…` for one agent
//! service, `PUT /v1/agent/maintenance?enable=…&reason=…` for every service
//! of the agent's node. In maintenance an endpoint is
//! [`Health::Draining`] (serving what it has, taking nothing new, on every
//! face), and Consul's readers see the critical check Consul shows for it
//! (`_service_maintenance:<id>`, `_node_maintenance`) with the reason as
//! its notes. Leaving maintenance sets the endpoint's health from its
//! checks again.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use waypost::backend::quote;
use waypost::{Endpoint, Error, Health, Op};

use super::agent::{agent_endpoints, by_id, state};
use super::check;
use super::consul_query;
use super::shapes::{NODE_LABEL, SERVICE_LABEL};
use crate::auth::Caller;
use crate::engine::registrar::Registrar;
use crate::faces::http::write::write;
use crate::faces::http::{json_response, ApiError};

/// The reason shown when none is given (Consul's words for it).
const NO_REASON: &str = "Maintenance mode is enabled, but no reason was provided.";

/// `e` with maintenance (`label`) set to `reason` or lifted; its health
/// draining while any maintenance holds, else from its checks.
fn with_maintenance(e: &Endpoint, label: &str, reason: Option<&str>) -> Endpoint {
    let mut e = e.clone();
    match reason {
        Some(r) => {
            let r = if r.is_empty() { NO_REASON } else { r };
            e.labels.insert(label.to_string(), r.to_string());
        }
        None => {
            e.labels.remove(label);
        }
    }
    e.health = if e.labels.contains_key(SERVICE_LABEL) || e.labels.contains_key(NODE_LABEL) {
        Health::Draining
    } else {
        let all: Vec<check::Check> = check::checks(&e).map(|(_, c)| c).collect();
        check::health_of(&all)
    };
    e
}

/// `enable` (required) and `reason` of a maintenance request.
fn read_query(registrar: &Registrar, raw: Option<&str>) -> Result<Option<String>, ApiError> {
    let q = consul_query(registrar, raw, &["enable", "reason"])?;
    match q.enable {
        Some(true) => Ok(Some(q.reason.unwrap_or_default())),
        Some(false) => Ok(None),
        None => Err(ApiError::BadQuery {
            param: "enable",
            reason: "missing: enable=true puts the service into maintenance, enable=false \
                     takes it out"
                .to_string(),
        }),
    }
}

/// `PUT /v1/agent/service/maintenance/<id>`.
pub(super) async fn service(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let reason = read_query(&registrar, raw.as_deref())?;
    let snap = state(&registrar)?;
    let e = by_id(&snap, &registrar, &caller, &id)?;
    caller.may_write(e)?;
    let updated = with_maintenance(e, SERVICE_LABEL, reason.as_deref());
    if updated == *e {
        return Ok(json_response(StatusCode::OK, &(), None));
    }
    write(&registrar, &caller, Op::Register(updated), None).await
}

/// `PUT /v1/agent/maintenance`: every service of the agent's node (the
/// caller's node when its certificate names one; otherwise the one node
/// the agent's services are on).
pub(super) async fn node(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let reason = read_query(&registrar, raw.as_deref())?;
    let snap = state(&registrar)?;
    let mine: Vec<&Endpoint> = agent_endpoints(&snap, &registrar, &caller).collect();
    let node = match caller.node() {
        Some(n) => n.to_string(),
        None => {
            let mut nodes: Vec<&str> = mine.iter().map(|e| e.node.as_str()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            match nodes.as_slice() {
                [] => return Ok(json_response(StatusCode::OK, &(), None)),
                [one] => (*one).to_string(),
                [a, b, ..] => {
                    return Err(Error::invalid(
                        "node",
                        format!(
                            "the agent's services are on several nodes ({} and {}, …): node \
                             maintenance needs the caller's node, from its client certificate; \
                             put services into maintenance one by one instead",
                            quote(a),
                            quote(b)
                        ),
                    )
                    .into())
                }
            }
        }
    };
    let mut last = None;
    for e in mine.into_iter().filter(|e| e.node == node) {
        caller.may_write(e)?;
        let updated = with_maintenance(e, NODE_LABEL, reason.as_deref());
        if updated != *e {
            last = Some(write(&registrar, &caller, Op::Register(updated), None).await?);
        }
    }
    Ok(last.unwrap_or_else(|| json_response(StatusCode::OK, &(), None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maintenance_drains_and_lifting_it_restores_health_from_the_checks() {
        let e = Endpoint::new("web", "a", "10.0.0.1", 80);
        let on = with_maintenance(&e, SERVICE_LABEL, Some("upgrade"));
        assert_eq!(on.health, Health::Draining);
        assert_eq!(on.labels[SERVICE_LABEL], "upgrade");
        let both = with_maintenance(&on, NODE_LABEL, Some(""));
        assert_eq!(both.labels[NODE_LABEL], NO_REASON);
        // Lifting one keeps the other.
        let node_only = with_maintenance(&both, SERVICE_LABEL, None);
        assert_eq!(node_only.health, Health::Draining);
        let off = with_maintenance(&node_only, NODE_LABEL, None);
        assert_eq!(off.health, Health::Healthy);
        assert!(!off.labels.contains_key(SERVICE_LABEL) && !off.labels.contains_key(NODE_LABEL));
    }
}
