//! The HTTP/JSON API (feature `http-api`): the registry's own routes
//! (services, endpoints, an SSE watch, writes and heartbeats), a
//! Consul-compatible read subset with blocking queries, and the node
//! registry's `GET /services`. Reads are answered from the registrar's
//! state ([`Registrar::state`]), never from the backend; writes go through
//! [`Registrar::write`] as the gRPC port's do.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Router};
use serde::Serialize;
use waypost::Snapshot;

use crate::auth::{Caller, Security};
use crate::engine::registrar::Registrar;

pub(crate) mod consul;
mod error;
mod json;
mod metered;
mod native;
pub(crate) mod peer;
mod query;
mod watch;
mod write;

use consul::Consul;
pub use error::ApiError;
use json::NodeRegistryService;
use query::Query;
pub use watch::LAST_EVENT_ID;

/// The header carrying the registrar's version (Consul's name for it).
pub const INDEX_HEADER: &str = "X-Consul-Index";
/// How long a blocking query waits without `wait` (as Consul: 5 minutes).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5 * 60);
/// The longest `wait` honoured; longer ones are cut to it (as Consul).
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 60);

/// The routes of the HTTP API over `registrar`'s state, for anyone
/// (no authentication: serve it on loopback, or behind your own):
///
/// - `GET /v1/services`: every service with its endpoint counts;
/// - `GET /v1/services/{service}`: its endpoints (`?healthy=true`,
///   `?cluster=`);
/// - `GET /v1/watch`: Server-Sent Events, a snapshot then each change
///   (resumed with `Last-Event-ID`);
/// - `PUT`/`DELETE /v1/services/{service}/{id}`: register (JSON body) or
///   remove an endpoint, acknowledged as `?ack=` says;
/// - `POST /v1/nodes/{node}/heartbeat`: `404` for a node the registry
///   does not know;
/// - Consul's agent API (`PUT /v1/agent/service/register` with checks,
///   `/v1/agent/check/pass/{id}`, …), health and catalog reads
///   (`/v1/health/service/{name}`, `/v1/catalog/service/{name}`, …) and
///   `/v1/status/leader`;
/// - `GET /services`: the node registry's list (`?status=running`).
///
/// Every read can block with `?index=&wait=`; every answer carries the
/// state's version in [`INDEX_HEADER`] (a query on one service, its own
/// modify index). The registrar binary serves these routes with the gRPC
/// port's mTLS and authorization when it has TLS.
///
/// This also starts the runner of the checks registered through Consul's
/// agent API (it stops when the registrar closes), so call it inside a
/// Tokio runtime.
pub fn http_api_router(registrar: Arc<Registrar>) -> Router {
    routes(&registrar)
        .layer(Extension(Caller::Anyone))
        .with_state(registrar)
}

/// The largest request body read (an endpoint's JSON): 64 KiB, as the gRPC
/// port's request limit.
pub const MAX_BODY_BYTES: usize = crate::engine::config::DEFAULT_MAX_REQUEST_BYTES;

fn routes(registrar: &Arc<Registrar>) -> Router<Arc<Registrar>> {
    Router::new()
        .route("/v1/services", get(native::services))
        .route("/v1/services/{service}", get(native::service))
        .route(
            "/v1/services/{service}/{id}",
            put(write::put_endpoint).delete(write::delete_endpoint),
        )
        .route("/v1/nodes/{node}/heartbeat", post(write::heartbeat))
        .route("/v1/watch", get(watch::watch))
        .route("/services", get(node_registry_services))
        .merge(consul::routes())
        .layer(Extension(Consul::start(registrar)))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(metered::meter))
}

/// Where the HTTP API takes its connections from.
pub(crate) enum HttpListener {
    /// Plaintext: every caller is anyone.
    Plain(tokio::net::TcpListener),
    /// mTLS: callers are identified by their certificate.
    Tls(peer::TlsListener),
}

/// Serve the HTTP API on `listener` until the registrar closes, callers
/// authenticated and authorized by `security`.
pub(crate) async fn serve(
    registrar: Arc<Registrar>,
    listener: HttpListener,
    security: Arc<Security>,
) -> std::io::Result<()> {
    let closing = registrar.closing();
    let local = match &listener {
        HttpListener::Plain(l) => l.local_addr().ok(),
        HttpListener::Tls(l) => Some(l.local()),
    };
    let mut router = routes(&registrar);
    if let Some(addr) = local {
        router = router.layer(Extension(consul::LocalAddr(addr)));
    }
    let router = router
        .layer(axum::middleware::from_fn_with_state(
            security,
            peer::authenticate,
        ))
        .with_state(registrar);
    let service = router.into_make_service_with_connect_info::<peer::Peer>();
    match listener {
        HttpListener::Plain(l) => {
            axum::serve(l, service)
                .with_graceful_shutdown(closing)
                .await
        }
        HttpListener::Tls(l) => {
            axum::serve(l, service)
                .with_graceful_shutdown(closing)
                .await
        }
    }
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
    read_blocking(registrar, q, |s| s.version().0).await
}

/// Block as the query asks (`?index=` and `?wait=`) until `index` of the
/// state differs from the one given, then the state and its index, read
/// together. Returns at once when the index differs: it passed the one
/// given, or went back (the client read another replica, or a registrar
/// since restarted, which numbers anew).
async fn read_blocking(
    registrar: &Registrar,
    q: &Query,
    index: impl Fn(&Snapshot) -> u64,
) -> Result<(Arc<Snapshot>, u64), ApiError> {
    let store = registrar.state().store();
    if !store.is_ready() {
        return Err(ApiError::NotReady);
    }
    if let Some(given) = q.index {
        let wait = q.wait.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT);
        tokio::select! {
            _ = store.wait_until(|s| index(s) != given, wait) => {}
            () = registrar.closing() => return Err(ApiError::ShuttingDown),
        }
    }
    // An index kept beside the state changes under the store's lock: read
    // both under it.
    store
        .with_state(|s| s.map(|s| (Arc::clone(s), index(s))))
        .ok_or(ApiError::NotReady)
}

async fn node_registry_services(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let services: Vec<NodeRegistryService> = snap
        .iter()
        .filter(|e| {
            q.status
                .as_deref()
                .is_none_or(|s| json::node_registry_status(e.health) == s)
        })
        .map(NodeRegistryService::from_endpoint)
        .collect();
    Ok(json_response(StatusCode::OK, &services, Some(index)))
}
