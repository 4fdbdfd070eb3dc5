//! Per-request metrics of the HTTP API: every answer counted by route,
//! method and status, with its latency, and the requests that stay open
//! (blocking queries while they wait, Server-Sent Events streams while
//! they last) as gauges.
//!
//! The route is the router's pattern (`/v1/services/{service}`), never the
//! path asked for, and methods beyond the API's own count as `other`, so
//! the labels stay few whatever clients send. A blocking query's latency
//! is mostly its wait, so `blocking` tells them apart.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::metrics::{names, Open};

/// The route label of a request that matched no route.
const UNMATCHED: &str = "unmatched";

/// Count and time one request (an axum middleware, around every route).
pub(crate) async fn meter(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED.to_string(), |p| p.as_str().to_string());
    let method = method_label(req.method());
    let blocking = is_blocking(req.uri().query());
    let open = blocking.then(|| Open::new(names::HTTP_BLOCKING_QUERIES, &route));
    let started = Instant::now();
    let resp = next.run(req).await;
    drop(open);
    let blocking = if blocking { "true" } else { "false" };
    metrics::histogram!(
        names::HTTP_REQUEST_DURATION_SECONDS,
        "route" => route.clone(), "method" => method, "blocking" => blocking
    )
    .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        names::HTTP_REQUESTS_TOTAL,
        "route" => route, "method" => method, "status" => resp.status().as_u16().to_string()
    )
    .increment(1);
    resp
}

/// The method as a label: the API's own, else `other`.
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        _ => "other",
    }
}

/// Whether a query string asks to block (`index=`, as Consul's blocking
/// queries do).
fn is_blocking(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("index=")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_queries_are_told_by_their_index() {
        assert!(is_blocking(Some("index=3&wait=5s")));
        assert!(is_blocking(Some("wait=5s&index=3")));
        assert!(!is_blocking(Some("wait=5s")));
        assert!(!is_blocking(Some("reindex=3")));
        assert!(!is_blocking(None));
        assert_eq!(method_label(&Method::PATCH), "other");
    }
}
