//! The read-only HTTP/JSON API (feature `http-api`): a Consul-compatible
//! subset with blocking queries, and the SQLite document's
//! `GET /services`. Everything is answered from the registrar's state
//! ([`Registrar::state`]), never from the backend.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use registry_api::{Health, Snapshot};
use serde::Serialize;

use crate::Registrar;

mod json;
mod query;

use json::{SeedService, ServiceEntry};
use query::Query;

/// The header carrying the registrar's version (Consul's name for it).
pub const INDEX_HEADER: &str = "X-Consul-Index";
/// How long a blocking query waits without `wait` (as Consul: 5 minutes).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5 * 60);
/// The longest `wait` honoured; longer ones are cut to it (as Consul).
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 60);

/// Why a request of the HTTP API failed; rendered as
/// `{"error": "<message>"}` with the status of [`ApiError::status`].
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The registrar has not loaded its first snapshot yet.
    #[error("the registrar has not loaded the registry yet")]
    NotReady,
    /// A query parameter has a value the API cannot use.
    #[error("query parameter {param}: {reason}")]
    BadQuery {
        /// The parameter's name.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The registrar is shutting down.
    #[error("the registrar is shutting down")]
    ShuttingDown,
}

impl ApiError {
    /// The HTTP status: 503 while not ready or shutting down, 400 for a
    /// bad query.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotReady | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BadQuery { .. } => StatusCode::BAD_REQUEST,
        }
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.to_string(),
        };
        json_response(self.status(), &body, None)
    }
}

/// The routes of the HTTP API over `registrar`'s state:
///
/// - `GET /v1/health/service/{name}`: Consul's health endpoint (`?passing`,
///   `?tag=`, `?dc=`, blocking with `?index=&wait=`);
/// - `GET /v1/catalog/services`: service → tags (blocking too);
/// - `GET /services`: the SQLite document's list (`?status=running`).
///
/// Every answer carries the state's version in [`INDEX_HEADER`].
pub fn http_api_router(registrar: Arc<Registrar>) -> Router {
    Router::new()
        .route("/v1/health/service/{name}", get(health_service))
        .route("/v1/catalog/services", get(catalog_services))
        .route("/services", get(seed_services))
        .with_state(registrar)
}

/// Serve [`http_api_router`] on `listener` until the registrar closes.
pub(crate) async fn serve(
    registrar: Arc<Registrar>,
    listener: tokio::net::TcpListener,
) -> std::io::Result<()> {
    let closing = registrar.closing();
    axum::serve(listener, http_api_router(registrar))
        .with_graceful_shutdown(closing)
        .await
}

fn json_response<T: Serialize>(status: StatusCode, body: &T, index: Option<u64>) -> Response {
    let mut resp = match serde_json::to_vec(body) {
        Ok(bytes) => (status, bytes).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{{\"error\":\"cannot encode the answer: {e}\"}}"),
        )
            .into_response(),
    };
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(i) = index {
        headers.insert(INDEX_HEADER, HeaderValue::from(i));
    }
    resp
}

/// Block as the query asks, then the state and its version (shared, not
/// copied: a request costs what it reads, whatever the registry's size).
async fn read_state(registrar: &Registrar, q: &Query) -> Result<(Arc<Snapshot>, u64), ApiError> {
    let store = registrar.state().store();
    if !store.is_ready() {
        return Err(ApiError::NotReady);
    }
    if let Some(index) = q.index {
        // Returns at once when the version differs from `index`: it passed
        // it, or went backwards (a restarted registrar numbers from 1).
        let wait = q.wait.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT);
        tokio::select! {
            _ = store.wait_until(|s| s.version().0 != index, wait) => {}
            () = registrar.closing() => return Err(ApiError::ShuttingDown),
        }
    }
    let snap = store.snapshot().ok_or(ApiError::NotReady)?;
    let version = snap.version().0;
    Ok((snap, version))
}

async fn health_service(
    State(registrar): State<Arc<Registrar>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let entries: Vec<ServiceEntry> = snap
        .service(&name)
        .filter(|e| !q.passing || e.health == Health::Healthy)
        .filter(|e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc))
        .filter(|e| q.tag.as_ref().is_none_or(|t| json::tags(e).contains(t)))
        .map(ServiceEntry::from_endpoint)
        .collect();
    Ok(json_response(StatusCode::OK, &entries, Some(index)))
}

async fn catalog_services(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let services = json::catalog(
        snap.iter()
            .filter(|e| q.dc.as_ref().is_none_or(|dc| &e.cluster == dc)),
    );
    Ok(json_response(StatusCode::OK, &services, Some(index)))
}

async fn seed_services(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let services: Vec<SeedService> = snap
        .iter()
        .filter(|e| {
            q.status
                .as_deref()
                .is_none_or(|s| json::seed_status(e.health) == s)
        })
        .map(SeedService::from_endpoint)
        .collect();
    Ok(json_response(StatusCode::OK, &services, Some(index)))
}
