//! Consul's agent API: services registered with their checks, checks
//! reported by the services. The registrar is the agent of every node of
//! its cluster; writes are validated, authorized and acknowledged as the
//! registry's own `PUT /v1/services/<service>/<id>`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use waypost::backend::quote;
use waypost::{Endpoint, EndpointKey, Error, Op, Snapshot};

use super::body::{self, Registration};
use super::check::{self, Check, Probe, Status};
use super::filter::{self, CHECKS, SERVICES};
use super::shapes::{self, ConsulService, HealthCheck, TAGS_LABEL, WEIGHT_LABEL};
use super::{consul_query, filter_of, Consul, PeerIp};
use crate::auth::Caller;
use crate::engine::registrar::Registrar;
use crate::faces::http::write::{body_error, write};
use crate::faces::http::{json_response, ApiError};

/// The endpoints that are `caller`'s agent services: those of the
/// registrar's cluster, and of the caller's node when its identity names
/// one.
pub(super) fn agent_endpoints<'a>(
    snap: &'a Snapshot,
    registrar: &'a Registrar,
    caller: &'a Caller,
) -> impl Iterator<Item = &'a Endpoint> + 'a {
    let cluster = registrar.config().cluster_name.as_str();
    let node = caller.node();
    snap.iter()
        .filter(move |e| e.cluster == cluster && node.is_none_or(|n| e.node == n))
}

pub(super) fn state(registrar: &Registrar) -> Result<Arc<Snapshot>, ApiError> {
    registrar
        .state()
        .store()
        .snapshot()
        .ok_or(ApiError::NotReady)
}

/// The one agent service with this id (Consul's agent keys services by id).
pub(super) fn by_id<'a>(
    snap: &'a Snapshot,
    registrar: &'a Registrar,
    caller: &'a Caller,
    id: &str,
) -> Result<&'a Endpoint, ApiError> {
    let mut found = agent_endpoints(snap, registrar, caller).filter(|e| e.id == id);
    let first = found
        .next()
        .ok_or_else(|| Error::not_found(format!("service ID {}", quote(id))))?;
    if let Some(other) = found.next() {
        return Err(Error::conflict(format!(
            "service ID {} is held by services {} and {}: deregister one through PUT /v1/services/<service>/<id>",
            quote(id),
            quote(&first.service),
            quote(&other.service)
        ))
        .into());
    }
    Ok(first)
}

/// An error of the registry's validation, named by the agent API's field.
fn consul_field(e: Error) -> Error {
    match e {
        Error::InvalidInput { field, reason, .. } => {
            let field = match field.as_str() {
                "service" => "Name".to_string(),
                "id" => "ID".to_string(),
                "address" => "Address".to_string(),
                "port" => "Port".to_string(),
                f => match f.strip_prefix("labels") {
                    Some(rest) => format!("Meta{rest}"),
                    None => f.to_string(),
                },
            };
            Error::invalid(field, reason)
        }
        other => other,
    }
}

/// Check `c` registered again where `old` was: it counts one more report
/// (so that every replica starts its TTL again); with the same
/// definition, it keeps `old`'s state, and the counts of its damping when
/// the thresholds are the same.
fn carry_over(old: Check, c: &mut Check) {
    c.reports = old.reports.wrapping_add(1);
    if old.probe == c.probe {
        c.status = old.status;
        c.output = old.output;
        c.since_ms = old.since_ms;
        if old.damping.thresholds() == c.damping {
            c.damping = old.damping;
        }
    }
}

/// The endpoint a registration describes. A check registered again with
/// the same definition keeps the state it had (and the counts of its
/// damping, with the same thresholds); registered again at all,
/// it counts one more report, so that every replica starts its TTL again.
fn endpoint(
    reg: Registration,
    cluster: &str,
    node: &str,
    address: String,
    current: Option<&Endpoint>,
) -> Result<Endpoint, Error> {
    let mut e = Endpoint::new(reg.name, reg.id, address, reg.port)
        .with_cluster(cluster)
        .with_node(node);
    for (k, v) in reg.meta {
        if k == TAGS_LABEL || check::is_check_label(&k) {
            return Err(Error::invalid(
                format!("Meta[{}]", quote(&k)),
                "this key is the registrar's own (the service's Tags, or its checks)",
            ));
        }
        e.labels.insert(k, v);
    }
    if !reg.tags.is_empty() {
        e.labels.insert(TAGS_LABEL.to_string(), reg.tags.join(","));
    }
    if let Some(w) = reg.weight {
        let w = w.to_string();
        if let Some(given) = e.labels.get(WEIGHT_LABEL).filter(|g| **g != w) {
            return Err(Error::invalid(
                format!("Meta[{}]", quote(WEIGHT_LABEL)),
                format!(
                    "{} differs from Weights.Passing ({w}), which the registrar keeps as this label",
                    quote(given)
                ),
            ));
        }
        e.labels.insert(WEIGHT_LABEL.to_string(), w);
    }
    for (id, mut c) in reg.checks {
        if let Some(old) = current.and_then(|cur| check::check(cur, &id)) {
            carry_over(old, &mut c);
        }
        check::put(&mut e, &id, &c);
    }
    waypost::backend::validate_endpoint(&e).map_err(consul_field)?;
    Ok(e)
}

/// `PUT /v1/agent/service/register`: register (or replace) a service and
/// its checks. `Address` defaults to the caller's address.
pub(super) async fn register(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Extension(consul): Extension<Consul>,
    peer: Option<Extension<PeerIp>>,
    RawQuery(raw): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // A registration always carries all of the service's checks: what
    // `replace-existing-checks` asks for is what happens.
    consul_query(&registrar, raw.as_deref(), &["replace-existing-checks"])?;
    let body = body.map_err(body_error)?;
    let reg = body::registration(&body, check::now_ms())?;
    let address = match (&reg.address, peer) {
        (Some(a), _) => a.clone(),
        (None, Some(Extension(PeerIp(ip)))) => ip.to_string(),
        (None, None) => {
            return Err(Error::invalid(
                "Address",
                "required here: the registrar does not see the caller's address",
            )
            .into())
        }
    };
    let snap = state(&registrar)?;
    let node = caller.node().unwrap_or_default().to_string();
    let key = EndpointKey::new(reg.name.clone(), reg.id.clone());
    if let Some(other) = agent_endpoints(&snap, &registrar, &caller)
        .find(|e| e.id == reg.id && e.service != reg.name && e.node == node)
    {
        return Err(Error::conflict(format!(
            "service ID {} is already service {}'s: deregister it first",
            quote(&reg.id),
            quote(&other.service)
        ))
        .into());
    }
    for (id, _) in &reg.checks {
        if let Some(holder) = consul.view.check_owner(id).filter(|k| *k != key) {
            return Err(Error::conflict(format!(
                "check ID {} is already a check of {}/{}",
                quote(id),
                quote(&holder.service),
                quote(&holder.id)
            ))
            .into());
        }
    }
    let cluster = registrar.config().cluster_name.clone();
    let e = endpoint(reg, &cluster, &node, address, snap.get(&key))?;
    write(&registrar, &caller, Op::Register(e), None).await
}

/// `PUT /v1/agent/service/deregister/<id>`.
pub(super) async fn deregister(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let snap = state(&registrar)?;
    let e = by_id(&snap, &registrar, &caller, &id)?;
    write(&registrar, &caller, Op::Deregister(e.key()), None).await
}

/// `GET /v1/agent/services`: `{"<id>": {…}, …}` (`?filter=`).
pub(super) async fn services(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), &["filter"])?;
    let f = filter_of(&q, SERVICES)?;
    let snap = state(&registrar)?;
    let mut out: BTreeMap<&str, ConsulService> = BTreeMap::new();
    for e in agent_endpoints(&snap, &registrar, &caller) {
        if out.contains_key(e.id.as_str()) {
            continue;
        }
        let s = ConsulService::from_endpoint(e);
        if f.as_ref().is_none_or(|f| filter::passes(f, &s)) {
            out.insert(e.id.as_str(), s);
        }
    }
    Ok(json_response(StatusCode::OK, &out, None))
}

/// `GET /v1/agent/self`: the part of it clients read. Prometheus' and
/// VictoriaMetrics' Consul discovery take the datacenter from
/// `Config.Datacenter`: the registrar's cluster.
pub(super) async fn agent_self(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let cluster = registrar.config().cluster_name.as_str();
    let node = caller.node().unwrap_or("registrar");
    let body = serde_json::json!({
        "Config": {
            "Datacenter": cluster,
            "NodeName": node,
            "Server": false,
            "Version": env!("CARGO_PKG_VERSION"),
        },
        "Member": {"Name": node, "Tags": {"dc": cluster}},
    });
    Ok(json_response(StatusCode::OK, &body, None))
}

/// `GET /v1/agent/service/<id>`.
pub(super) async fn service(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let snap = state(&registrar)?;
    let e = by_id(&snap, &registrar, &caller, &id)?;
    Ok(json_response(
        StatusCode::OK,
        &ConsulService::from_endpoint(e),
        None,
    ))
}

/// `GET /v1/agent/checks`: `{"<check id>": {…}, …}`, the checks
/// registered through the agent API (`?filter=`).
pub(super) async fn checks(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), &["filter"])?;
    let f = filter_of(&q, CHECKS)?;
    let snap = state(&registrar)?;
    let out: BTreeMap<String, HealthCheck> = agent_endpoints(&snap, &registrar, &caller)
        .flat_map(shapes::own_checks)
        .filter(|c| f.as_ref().is_none_or(|f| filter::passes(f, c)))
        .map(|c| (c.check_id().to_string(), c))
        .collect();
    Ok(json_response(StatusCode::OK, &out, None))
}

/// `PUT /v1/agent/check/{pass,warn,fail}/<id>` (`?note=`).
pub(super) async fn pass_warn_fail(
    registrar: State<Arc<Registrar>>,
    caller: Extension<Caller>,
    consul: Extension<Consul>,
    Path((verb, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let status = match verb.as_str() {
        "pass" => Status::Passing,
        "warn" => Status::Warning,
        "fail" => Status::Critical,
        other => {
            return Err(Error::not_found(format!(
                "route /v1/agent/check/{}/…: pass, warn, fail or update",
                quote(other)
            ))
            .into())
        }
    };
    let note = consul_query(&registrar.0, raw.as_deref(), &["note"])?
        .note
        .unwrap_or_default();
    report(registrar, caller, consul, id, status, note).await
}

/// `PUT /v1/agent/check/update/<id>`: `{"Status": "…", "Output": "…"}`.
pub(super) async fn update(
    registrar: State<Arc<Registrar>>,
    caller: Extension<Caller>,
    consul: Extension<Consul>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    consul_query(&registrar.0, raw.as_deref(), &[])?;
    let body = body.map_err(body_error)?;
    let (status, output) = body::update(&body)?;
    report(registrar, caller, consul, id, status, output).await
}

/// A service reports its TTL check `id`: the report is recorded when it
/// changes the state, or when the last change this replica saw of the
/// check is old enough on its own clock
/// ([`Observed::report_writes`](super::observed::Observed::report_writes));
/// any replica takes the report.
async fn report(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Extension(consul): Extension<Consul>,
    id: String,
    status: Status,
    output: String,
) -> Result<Response, ApiError> {
    let unknown = || Error::not_found(format!("check ID {}", quote(&id)));
    let key = consul.view.check_owner(&id).ok_or_else(unknown)?;
    let snap = state(&registrar)?;
    let e = snap.get(&key).ok_or_else(unknown)?;
    let c = check::check(e, &id).ok_or_else(unknown)?;
    let Probe::Ttl { .. } = c.probe else {
        return Err(Error::invalid(
            "CheckID",
            format!(
                "check {} is a {} check, which the registrar runs; only TTL checks take reports",
                quote(&id),
                c.probe.type_name()
            ),
        )
        .into());
    };
    caller.may_write(e)?;
    let now = tokio::time::Instant::now();
    match consul
        .observations
        .report(e, &id, status, &output, now, check::now_ms())
    {
        Some(updated) => write(&registrar, &caller, Op::Register(updated), None).await,
        None => Ok(json_response(StatusCode::OK, &(), None)),
    }
}

/// `PUT /v1/agent/check/register`: a check of the agent service
/// `ServiceID`, registered apart from the service (or registered again:
/// with the same definition, it keeps its state).
pub(super) async fn register_check(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Extension(consul): Extension<Consul>,
    RawQuery(raw): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let body = body.map_err(body_error)?;
    let reg = body::check_registration(&body, check::now_ms())?;
    let snap = state(&registrar)?;
    let e = by_id(&snap, &registrar, &caller, &reg.service_id)?;
    if let Some(holder) = consul
        .view
        .check_owner(&reg.check_id)
        .filter(|k| *k != e.key())
    {
        return Err(Error::conflict(format!(
            "check ID {} is already a check of {}/{}",
            quote(&reg.check_id),
            quote(&holder.service),
            quote(&holder.id)
        ))
        .into());
    }
    let mut c = reg.check;
    if let Some(old) = check::check(e, &reg.check_id) {
        carry_over(old, &mut c);
    }
    let mut updated = e.clone();
    check::put(&mut updated, &reg.check_id, &c);
    waypost::backend::validate_endpoint(&updated).map_err(consul_field)?;
    write(&registrar, &caller, Op::Register(updated), None).await
}

/// `PUT /v1/agent/check/deregister/<check id>`: the check is removed from
/// its service (the service stays).
pub(super) async fn deregister_check(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Extension(consul): Extension<Consul>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let unknown = || Error::not_found(format!("check ID {}", quote(&id)));
    let key = consul.view.check_owner(&id).ok_or_else(unknown)?;
    let snap = state(&registrar)?;
    let e = snap.get(&key).ok_or_else(unknown)?;
    let updated = check::without(e, &id).ok_or_else(unknown)?;
    write(&registrar, &caller, Op::Register(updated), None).await
}
