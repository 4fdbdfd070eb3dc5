//! The health port: `/healthz`, `/readyz`, `/metrics`, and the dashboard
//! at `/ui` when enabled.

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::engine::registrar::{Registrar, Slot};
use crate::engine::status::{Readiness, Status};

#[derive(Clone)]
struct HttpState {
    status: Arc<Status>,
    registrar: Slot,
    metrics: Option<PrometheusHandle>,
}

/// Routes of the health port for `registrar`: `/healthz` answers while the
/// process runs, `/readyz` says whether the registrar is ready and why not
/// (see [`Status`]), `/metrics` the Prometheus text format when a handle is
/// given.
pub fn health_router(registrar: Arc<Registrar>, metrics: Option<PrometheusHandle>) -> Router {
    let status = Arc::clone(registrar.status());
    router(status, Arc::new(OnceLock::from(registrar)), metrics, None)
}

pub(crate) fn router(
    status: Arc<Status>,
    registrar: Slot,
    metrics: Option<PrometheusHandle>,
    ui: Option<crate::faces::ui::Ui>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(render))
        .with_state(HttpState {
            status,
            registrar,
            metrics,
        })
        .merge(ui.map(crate::faces::ui::router).unwrap_or_default())
}

async fn ready(State(st): State<HttpState>) -> (StatusCode, String) {
    let at = st
        .registrar
        .get()
        .map(|r| format!(" at {}", r.token()))
        .unwrap_or_default();
    match st.status.readiness() {
        Readiness::Ready(text) => (StatusCode::OK, format!("{text}{at}\n")),
        Readiness::NotReady(text) => (StatusCode::SERVICE_UNAVAILABLE, format!("{text}\n")),
    }
}

async fn render(State(st): State<HttpState>) -> (StatusCode, String) {
    match &st.metrics {
        Some(h) => {
            match st.registrar.get() {
                Some(r) => {
                    r.publish_gauges();
                    r.state().store().record_metrics();
                }
                None => st.status.publish_gauges(),
            }
            (StatusCode::OK, h.render())
        }
        None => (
            StatusCode::NOT_FOUND,
            "metrics are not enabled\n".to_string(),
        ),
    }
}
