//! The HTTP API's writes: `PUT`/`DELETE /v1/services/<service>/<id>` and
//! `POST /v1/nodes/<node>/heartbeat`, validated, authorized and
//! acknowledged exactly as the gRPC port's `RegisterEndpoint`,
//! `UnregisterEndpoint` and `Heartbeat`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use waypost::{Endpoint, EndpointKey, Error, Health, Op, Protocol};
use waypost_registrar_client::Token;

use super::query::{bounded, Query};
use super::{json_response, ApiError};
use crate::auth::{authorized_write, Caller};
use crate::engine::config::Ack;
use crate::engine::config::{parse_ack, ACK_METADATA};
use crate::engine::registrar::Registrar;

/// The body of `PUT /v1/services/<service>/<id>`: an endpoint without its
/// key (the path names it; `service` and `id` may be repeated, and must
/// then agree). Unknown fields are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointBody {
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    id: Option<String>,
    address: String,
    port: u16,
    #[serde(default)]
    protocol: Protocol,
    /// The registrar's own cluster when left out.
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    node: String,
    #[serde(default)]
    health: Health,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

impl EndpointBody {
    /// Parse `body` (JSON) for the endpoint at `service`/`id`; errors name
    /// the field (`port`, `labels.zone`, …).
    pub(crate) fn parse(
        body: &[u8],
        service: String,
        id: String,
        own_cluster: &str,
    ) -> Result<Endpoint, Error> {
        let de = &mut serde_json::Deserializer::from_slice(body);
        let b: EndpointBody = serde_path_to_error::deserialize(de).map_err(|e| {
            // `.` (the document itself) or `?` (where the JSON broke off).
            let path = e.path().to_string();
            let reason = e.into_inner().to_string();
            let field = match missing_field(&reason) {
                // serde reports a missing field at the object that lacks it.
                Some(name) if path == "." => name.to_string(),
                Some(name) => format!("{path}.{name}"),
                None if path == "." || path.starts_with('?') => "body".to_string(),
                None => path,
            };
            Error::invalid(field, reason)
        })?;
        for (field, given, path) in [("service", &b.service, &service), ("id", &b.id, &id)] {
            if let Some(given) = given.as_ref().filter(|g| *g != path) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{:?} differs from the path's {:?}",
                        bounded(given),
                        bounded(path)
                    ),
                ));
            }
        }
        Ok(Endpoint {
            service,
            id,
            address: b.address,
            port: b.port,
            protocol: b.protocol,
            cluster: b.cluster.unwrap_or_else(|| own_cluster.to_string()),
            node: b.node,
            health: b.health,
            labels: b.labels,
        })
    }
}

/// The field serde's "missing field `x`" names.
fn missing_field(reason: &str) -> Option<&str> {
    let rest = reason.strip_prefix("missing field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

/// What a write answers: the version it was acknowledged at, the token
/// an agent resumes from (as gRPC's `version`).
#[derive(Debug, Serialize)]
struct Written {
    version: String,
}

/// The acknowledgement the request asks for: `?ack=`, else the
/// `x-registrar-ack` header, else the registrar's default.
fn ack(q: &Query, headers: &HeaderMap) -> Result<Option<Ack>, Error> {
    if let Some(a) = &q.ack {
        return parse_ack("ack", a).map(Some);
    }
    match headers.get(ACK_METADATA) {
        None => Ok(None),
        Some(v) => {
            let text = v
                .to_str()
                .map_err(|_| Error::invalid(ACK_METADATA, "not ASCII: optimistic or durable"))?;
            parse_ack(ACK_METADATA, text).map(Some)
        }
    }
}

pub(super) fn body_error(r: BytesRejection) -> ApiError {
    ApiError::BadBody {
        status: r.status(),
        reason: r.body_text(),
    }
}

fn written(token: Token) -> Response {
    let body = Written {
        version: token.to_string(),
    };
    json_response(StatusCode::OK, &body, Some(token.version.0))
}

/// Write `op` for `caller` after authorizing it (see
/// [`authorized_write`]), answering the version as JSON.
pub(super) async fn write(
    registrar: &Arc<Registrar>,
    caller: &Caller,
    op: Op,
    ack: Option<Ack>,
) -> Result<Response, ApiError> {
    let token = authorized_write(registrar, caller, op, ack).await?;
    Ok(written(token))
}

/// `PUT /v1/services/<service>/<id>`: register (or replace) the endpoint
/// the JSON body describes.
pub(super) async fn put_endpoint(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Path((service, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let ack = ack(&q, &headers)?;
    let body = body.map_err(body_error)?;
    let endpoint = EndpointBody::parse(&body, service, id, &registrar.config().cluster_name)?;
    write(&registrar, &caller, Op::Register(endpoint), ack).await
}

/// `DELETE /v1/services/<service>/<id>`: remove the endpoint (a no-op
/// answered the same when it is not there).
pub(super) async fn delete_endpoint(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Path((service, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref())?;
    let ack = ack(&q, &headers)?;
    let key = EndpointKey::new(service, id);
    write(&registrar, &caller, Op::Deregister(key), ack).await
}

/// `POST /v1/nodes/<node>/heartbeat`: the node is alive; `404` when the
/// registry holds no endpoint of it (the agent should register again).
pub(super) async fn heartbeat(
    State(registrar): State<Arc<Registrar>>,
    Extension(caller): Extension<Caller>,
    Path(node): Path<String>,
) -> Result<Response, ApiError> {
    let span = tracing::info_span!("heartbeat", node = %node, %caller);
    async {
        caller.may_heartbeat(&node)?;
        registrar.heartbeat(&node).await?;
        tracing::trace!("heartbeat through the HTTP API");
        #[derive(Serialize)]
        struct Beat<'a> {
            node: &'a str,
        }
        Ok(json_response(StatusCode::OK, &Beat { node: &node }, None))
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(body: &str) -> Result<Endpoint, Error> {
        EndpointBody::parse(body.as_bytes(), "web".into(), "a".into(), "east")
    }

    fn field(body: &str) -> String {
        match parse(body).unwrap_err() {
            Error::InvalidInput { field, .. } => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn a_body_becomes_the_endpoint_of_the_path() {
        let e = parse(r#"{"address":"10.0.0.1","port":8080,"labels":{"zone":"z1"}}"#).unwrap();
        assert_eq!(e.key(), EndpointKey::new("web", "a"));
        assert_eq!(e.cluster, "east");
        assert_eq!(e.health, Health::Healthy);
        assert_eq!(e.labels["zone"], "z1");
        let e = parse(
            r#"{"service":"web","id":"a","address":"h","port":1,"cluster":"west",
                "health":"unhealthy","protocol":"udp","node":"n1"}"#,
        )
        .unwrap();
        assert_eq!((e.cluster.as_str(), e.node.as_str()), ("west", "n1"));
        assert_eq!(e.health, Health::Unhealthy);
        assert_eq!(e.protocol, Protocol::Udp);
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field(r#"{"address":"h","port":70000}"#), "port");
        assert_eq!(field(r#"{"address":"h","port":"80"}"#), "port");
        assert_eq!(field(r#"{"address":"h"}"#), "port");
        assert_eq!(field(r#"{"port":1}"#), "address");
        assert_eq!(
            field(r#"{"address":"h","port":1,"colour":"red"}"#),
            "colour"
        );
        assert_eq!(field(r#"{"address":"h","port":1,"health":"ok"}"#), "health");
        assert_eq!(
            field(r#"{"address":"h","port":1,"labels":{"z":1}}"#),
            "labels.z"
        );
        assert_eq!(field(r#"{"address":"h","port":1,"id":"b"}"#), "id");
        assert_eq!(field("not json"), "body");
        assert_eq!(field("{not json"), "body");
        let e = parse(r#"{"address":"h","port":1,"colour":"red"}"#).unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let e = parse(r#"{"address":"h"}"#).unwrap_err();
        assert!(e.to_string().contains("port"), "{e}");
    }
}
