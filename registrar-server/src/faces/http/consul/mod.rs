//! Consul's HTTP API, the part services, scrapers and field tools use:
//! the agent's service and check routes (writes through the registrar's
//! write path), the catalog and health reads with blocking queries (on a
//! per-service index where the read is of one service) and `?filter=`
//! ([`filter`]), and the status routes clients ping. Every route refuses
//! the query parameters it does not implement ([`Query::parse_consul`]).
//! The checks registered here are run by [`runner`], damped as
//! [`damping`] says.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, put};
use axum::{Extension, Router};
use waypost::Snapshot;

use super::query::Query;
use super::{json_response, read_blocking, read_state, ApiError};
use crate::engine::registrar::Registrar;

mod agent;
mod body;
pub(crate) mod check;
mod damping;
mod filter;
mod maintenance;
mod observed;
mod probe;
mod reads;
mod runner;
mod shapes;
mod status;
mod view;

use filter::{Filter, Selectors, CATALOG_SERVICE, CHECKS, HEALTH_SERVICE};
use observed::Observations;
use shapes::{CatalogService, ServiceEntry};
use view::ConsulView;

/// The caller's IP address (the default `Address` of a registration).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerIp(pub(crate) IpAddr);

/// The address the HTTP API listens on (`/v1/status/leader`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalAddr(pub(crate) SocketAddr);

/// What the Consul routes share: the per-service view of the state, and
/// what this replica observed of each check (shared with the runner).
#[derive(Debug, Clone)]
pub(crate) struct Consul {
    view: Arc<ConsulView>,
    observations: Arc<Observations>,
}

impl Consul {
    /// The view of `registrar`'s state, and the check runner, which stops
    /// when the registrar closes.
    pub(crate) fn start(registrar: &Arc<Registrar>) -> Self {
        let view = ConsulView::attach(registrar);
        let observations = Arc::new(Observations::default());
        let runner = tokio::spawn(runner::run(
            Arc::clone(registrar),
            Arc::clone(&view),
            Arc::clone(&observations),
        ));
        // It returns only when the registrar closes: a panic must not leave
        // a registrar that looks healthy with no checks running.
        let status = Arc::clone(registrar.status());
        tokio::spawn(async move {
            if let Err(e) = runner.await {
                if e.is_panic() {
                    status.fail(format!("the Consul check runner panicked: {e}"));
                }
            }
        });
        Self { view, observations }
    }
}

/// Consul's routes (they need the [`Consul`] extension).
pub(crate) fn routes() -> Router<Arc<Registrar>> {
    Router::new()
        .route("/v1/health/service/{name}", get(health_service))
        .route("/v1/health/checks/{name}", get(health_checks))
        .route("/v1/health/node/{node}", get(reads::health_node))
        .route("/v1/health/state/{state}", get(reads::health_state))
        .route("/v1/catalog/services", get(catalog_services))
        .route("/v1/catalog/service/{name}", get(catalog_service))
        .route("/v1/catalog/nodes", get(reads::nodes))
        .route("/v1/catalog/node/{node}", get(reads::node))
        .route("/v1/catalog/datacenters", get(reads::datacenters))
        .route("/v1/status/leader", get(leader))
        .route("/v1/status/peers", get(peers))
        .route("/v1/agent/service/register", put(agent::register))
        .route(
            "/v1/agent/service/maintenance/{id}",
            put(maintenance::service),
        )
        .route("/v1/agent/maintenance", put(maintenance::node))
        .route("/v1/agent/service/deregister/{id}", put(agent::deregister))
        .route("/v1/agent/self", get(agent::agent_self))
        .route("/v1/agent/services", get(agent::services))
        .route("/v1/agent/service/{id}", get(agent::service))
        .route("/v1/agent/checks", get(agent::checks))
        .route("/v1/agent/check/register", put(agent::register_check))
        .route(
            "/v1/agent/check/deregister/{id}",
            put(agent::deregister_check),
        )
        .route("/v1/agent/check/update/{id}", put(agent::update))
        .route("/v1/agent/check/{verb}/{id}", put(agent::pass_warn_fail))
}

/// The parameters the reads of a list take (beside [`IGNORED`](super::query::IGNORED)).
pub(crate) const READ: &[&str] = &["index", "wait", "dc", "filter"];
/// The parameters of `GET /v1/catalog/service/<name>`.
const READ_TAGGED: &[&str] = &["index", "wait", "dc", "filter", "tag"];
/// The parameters of `GET /v1/health/service/<name>`.
const READ_HEALTH: &[&str] = &["index", "wait", "dc", "filter", "tag", "passing"];

/// The query of a Consul route that implements the parameters `takes`
/// ([`Query::parse_consul`], the registrar's cluster as the agent's
/// datacenter).
pub(crate) fn consul_query(
    registrar: &Registrar,
    raw: Option<&str>,
    takes: &[&str],
) -> Result<Query, ApiError> {
    Query::parse_consul(raw, takes, &registrar.config().cluster_name)
}

/// The query's `?filter=`, read for a route that takes `selectors`.
pub(crate) fn filter_of(q: &Query, selectors: Selectors) -> Result<Option<Filter>, ApiError> {
    q.filter
        .as_deref()
        .map(|f| Filter::parse(f, selectors))
        .transpose()
        .map_err(|e| ApiError::BadQuery {
            param: "filter",
            reason: e.to_string(),
        })
}

/// Block as the query asks on `service`'s own index, then the state and
/// that index, read together.
async fn read_service(
    registrar: &Registrar,
    consul: &Consul,
    q: &Query,
    service: &str,
) -> Result<(Arc<Snapshot>, u64), ApiError> {
    read_blocking(registrar, q, |_| consul.view.index(service)).await
}

/// The endpoints of `name` that the query's `dc` and `tag`s keep.
fn selected<'a>(
    snap: &'a Snapshot,
    name: &'a str,
    q: &'a Query,
) -> impl Iterator<Item = &'a waypost::Endpoint> + 'a {
    snap.service(name)
        .filter(|e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc))
        .filter(|e| {
            let tags = shapes::tags(e);
            q.tags.iter().all(|t| tags.contains(t))
        })
}

async fn health_service(
    State(registrar): State<Arc<Registrar>>,
    Extension(consul): Extension<Consul>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ_HEALTH)?;
    let f = filter_of(&q, HEALTH_SERVICE)?;
    let (snap, index) = read_service(&registrar, &consul, &q, &name).await?;
    let entries: Vec<ServiceEntry> = selected(&snap, &name, &q)
        .filter(|e| !q.passing || shapes::passing(e))
        .map(ServiceEntry::from_endpoint)
        .collect();
    let entries = filter::keep(f.as_ref(), entries);
    Ok(json_response(StatusCode::OK, &entries, Some(index)))
}

async fn health_checks(
    State(registrar): State<Arc<Registrar>>,
    Extension(consul): Extension<Consul>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ)?;
    let f = filter_of(&q, CHECKS)?;
    let (snap, index) = read_service(&registrar, &consul, &q, &name).await?;
    let checks: Vec<shapes::HealthCheck> = selected(&snap, &name, &q)
        .flat_map(shapes::health_checks)
        .collect();
    let checks = filter::keep(f.as_ref(), checks);
    Ok(json_response(StatusCode::OK, &checks, Some(index)))
}

async fn catalog_service(
    State(registrar): State<Arc<Registrar>>,
    Extension(consul): Extension<Consul>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ_TAGGED)?;
    let f = filter_of(&q, CATALOG_SERVICE)?;
    let (snap, index) = read_service(&registrar, &consul, &q, &name).await?;
    let entries: Vec<CatalogService> = selected(&snap, &name, &q)
        .map(CatalogService::from_endpoint)
        .collect();
    let entries = filter::keep(f.as_ref(), entries);
    Ok(json_response(StatusCode::OK, &entries, Some(index)))
}

/// `GET /v1/catalog/services`: a listing of the whole catalog, so its
/// index is the registry's; `?filter=` keeps the instances it matches (as
/// `/v1/catalog/service/<name>` shows them) before their tags are
/// gathered.
async fn catalog_services(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = consul_query(&registrar, raw.as_deref(), READ)?;
    let f = filter_of(&q, CATALOG_SERVICE)?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let services = shapes::catalog(
        snap.iter()
            .filter(|e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc))
            .filter(|e| {
                f.as_ref()
                    .is_none_or(|f| filter::passes(f, &CatalogService::from_endpoint(e)))
            }),
    );
    Ok(json_response(StatusCode::OK, &services, Some(index)))
}

/// `GET /v1/status/leader`: the address answering (clients ping it; the
/// registrar has no leader: every replica serves).
async fn leader(
    State(registrar): State<Arc<Registrar>>,
    local: Option<Extension<LocalAddr>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let addr = local
        .map(|Extension(LocalAddr(a))| a.to_string())
        .unwrap_or_default();
    Ok(json_response(StatusCode::OK, &addr, None))
}

/// `GET /v1/status/peers`: the address answering.
async fn peers(
    State(registrar): State<Arc<Registrar>>,
    local: Option<Extension<LocalAddr>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    consul_query(&registrar, raw.as_deref(), &[])?;
    let peers: Vec<String> = local
        .map(|Extension(LocalAddr(a))| a.to_string())
        .into_iter()
        .collect();
    Ok(json_response(StatusCode::OK, &peers, None))
}
