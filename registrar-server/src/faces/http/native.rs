//! The registry's own read routes: `GET /v1/services` and
//! `GET /v1/services/<service>`, endpoints in the registry's JSON shape
//! (the fields of [`waypost::Endpoint`]).

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use waypost::{Endpoint, Health};

use super::query::Query;
use super::{json_response, read_state, ApiError};
use crate::engine::registrar::Registrar;

/// One service of `GET /v1/services`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct ServiceCount<'a> {
    /// The service's name.
    pub(crate) service: &'a str,
    /// Its endpoints (of the cluster asked for, if any).
    pub(crate) endpoints: usize,
    /// How many of them are healthy.
    pub(crate) healthy: usize,
}

/// Count `endpoints` (in key order, so grouped by service) per service.
pub(crate) fn count<'a>(endpoints: impl Iterator<Item = &'a Endpoint>) -> Vec<ServiceCount<'a>> {
    let mut out: Vec<ServiceCount<'a>> = Vec::new();
    for e in endpoints {
        let healthy = usize::from(e.health == Health::Healthy);
        match out.last_mut() {
            Some(c) if c.service == e.service => {
                c.endpoints += 1;
                c.healthy += healthy;
            }
            _ => out.push(ServiceCount {
                service: &e.service,
                endpoints: 1,
                healthy,
            }),
        }
    }
    out
}

/// `GET /v1/services`: every service with its endpoint counts
/// (`?cluster=C`: of cluster `C` only), sorted by name; blocking with
/// `?index=&wait=`.
pub(super) async fn services(
    State(registrar): State<Arc<Registrar>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let counts = count(
        snap.iter()
            .filter(|e| q.cluster.as_ref().is_none_or(|c| &e.cluster == c)),
    );
    Ok(json_response(StatusCode::OK, &counts, Some(index)))
}

/// `GET /v1/services/<service>`: its endpoints (`?healthy=true`: healthy
/// ones only; `?cluster=C`: of cluster `C` only), `[]` for an unknown
/// service; blocking with `?index=&wait=`.
pub(super) async fn service(
    State(registrar): State<Arc<Registrar>>,
    Path(service): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let (snap, index) = read_state(&registrar, &q).await?;
    let endpoints: Vec<&Endpoint> = snap
        .service(&service)
        .filter(|e| !q.healthy || e.health == Health::Healthy)
        .filter(|e| q.cluster.as_ref().is_none_or(|c| &e.cluster == c))
        .collect();
    Ok(json_response(StatusCode::OK, &endpoints, Some(index)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::testing::ep;

    #[test]
    fn counts_group_by_service() {
        let eps = [
            ep("api", "1", 80),
            ep("api", "2", 80).with_health(Health::Unhealthy),
            ep("web", "1", 80),
        ];
        assert_eq!(
            count(eps.iter()),
            [
                ServiceCount {
                    service: "api",
                    endpoints: 2,
                    healthy: 1
                },
                ServiceCount {
                    service: "web",
                    endpoints: 1,
                    healthy: 1
                }
            ]
        );
        assert!(count([].iter()).is_empty());
    }
}
