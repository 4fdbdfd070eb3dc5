//! Consul's HTTP API, the part services and scrapers use: the agent's
//! service and check routes (writes through the registrar's write path),
//! the catalog and health reads with blocking queries on a per-service
//! index, and the status routes clients ping. The checks registered here
//! are run by [`runner`].

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
mod observed;
mod probe;
mod runner;
mod shapes;
mod view;

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
        .route("/v1/catalog/services", get(catalog_services))
        .route("/v1/catalog/service/{name}", get(catalog_service))
        .route("/v1/status/leader", get(leader))
        .route("/v1/status/peers", get(peers))
        .route("/v1/agent/service/register", put(agent::register))
        .route("/v1/agent/service/deregister/{id}", put(agent::deregister))
        .route("/v1/agent/self", get(agent::agent_self))
        .route("/v1/agent/services", get(agent::services))
        .route("/v1/agent/service/{id}", get(agent::service))
        .route("/v1/agent/checks", get(agent::checks))
        .route("/v1/agent/check/update/{id}", put(agent::update))
        .route("/v1/agent/check/{verb}/{id}", put(agent::pass_warn_fail))
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

/// The endpoints of `name` that the query's `dc` and `tag` keep.
fn selected<'a>(
    snap: &'a Snapshot,
    name: &'a str,
    q: &'a Query,
) -> impl Iterator<Item = &'a waypost::Endpoint> + 'a {
    snap.service(name)
        .filter(|e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc))
        .filter(|e| q.tag.as_ref().is_none_or(|t| shapes::tags(e).contains(t)))
}

async fn health_service(
    State(registrar): State<Arc<Registrar>>,
    Extension(consul): Extension<Consul>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_service(&registrar, &consul, &q, &name).await?;
    let entries: Vec<ServiceEntry> = selected(&snap, &name, &q)
        .filter(|e| !q.passing || shapes::passing(e))
        .map(ServiceEntry::from_endpoint)
        .collect();
    Ok(json_response(StatusCode::OK, &entries, Some(index)))
}

async fn health_checks(
    State(registrar): State<Arc<Registrar>>,
    Extension(consul): Extension<Consul>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_service(&registrar, &consul, &q, &name).await?;
    let checks: Vec<shapes::HealthCheck> = selected(&snap, &name, &q)
        .flat_map(shapes::health_checks)
        .collect();
    Ok(json_response(StatusCode::OK, &checks, Some(index)))
}

async fn catalog_service(
    State(registrar): State<Arc<Registrar>>,
    Extension(consul): Extension<Consul>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_service(&registrar, &consul, &q, &name).await?;
    let entries: Vec<CatalogService> = selected(&snap, &name, &q)
        .map(CatalogService::from_endpoint)
        .collect();
    Ok(json_response(StatusCode::OK, &entries, Some(index)))
}

/// `GET /v1/catalog/services`: a listing of the whole catalog, so its
/// index is the registry's.
async fn catalog_services(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let services = shapes::catalog(
        snap.iter()
            .filter(|e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc)),
    );
    Ok(json_response(StatusCode::OK, &services, Some(index)))
}

/// `GET /v1/status/leader`: the address answering (clients ping it; the
/// registrar has no leader: every replica serves).
async fn leader(local: Option<Extension<LocalAddr>>) -> Response {
    let addr = local
        .map(|Extension(LocalAddr(a))| a.to_string())
        .unwrap_or_default();
    json_response(StatusCode::OK, &addr, None)
}

/// `GET /v1/status/peers`: the address answering.
async fn peers(local: Option<Extension<LocalAddr>>) -> Response {
    let peers: Vec<String> = local
        .map(|Extension(LocalAddr(a))| a.to_string())
        .into_iter()
        .collect();
    json_response(StatusCode::OK, &peers, None)
}
