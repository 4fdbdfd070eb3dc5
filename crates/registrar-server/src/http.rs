//! The health port: `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::Registrar;

#[derive(Clone)]
struct HttpState {
    registrar: Arc<Registrar>,
    metrics: Option<PrometheusHandle>,
}

/// Routes of the health port: `/healthz` answers while the process runs,
/// `/readyz` once the first snapshot of the backend is in, `/metrics` the
/// Prometheus text format when a handle is given.
pub fn health_router(registrar: Arc<Registrar>, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(render))
        .with_state(HttpState { registrar, metrics })
}

async fn ready(State(st): State<HttpState>) -> (StatusCode, String) {
    if st.registrar.is_ready() {
        (
            StatusCode::OK,
            format!("ready at {}\n", st.registrar.token()),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first snapshot of the backend\n".to_string(),
        )
    }
}

async fn render(State(st): State<HttpState>) -> (StatusCode, String) {
    match &st.metrics {
        Some(h) => {
            st.registrar.publish_gauges();
            // The registrar's own cache of the backend is the same
            // `CachedRegistry` as an agent's: this sets its age gauge.
            let _ = st.registrar.state().cache_age();
            (StatusCode::OK, h.render())
        }
        None => (
            StatusCode::NOT_FOUND,
            "metrics are not enabled\n".to_string(),
        ),
    }
}
