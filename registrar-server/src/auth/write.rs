//! The one path every write of a face takes: authorize the caller
//! against the new endpoint and the stored one, write, and log the outcome
//! inside a span naming the node, key and caller. The gRPC port's
//! `RegisterEndpoint` and `UnregisterEndpoint`, the HTTP API and Consul's
//! agent API all call [`authorized_write`].

use std::sync::Arc;

use tonic::Status;
use tracing::Instrument;
use waypost::{Endpoint, EndpointKey, Error, Op};
use waypost_registrar_client::{status_from_error, Token};

use super::Caller;
use crate::engine::config::Ack;
use crate::engine::registrar::Registrar;

/// Why a write was not acknowledged.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The caller may not make it (as the gRPC port answers it).
    Caller(Status),
    /// The registrar refused or failed it.
    Write(Error),
}

impl From<Refused> for Status {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Caller(s) => s,
            Refused::Write(e) => status_from_error(&e),
        }
    }
}

/// Write `op` for `caller`, acknowledged as `ack` asks, once the caller
/// may. Answers the token the write was acknowledged at.
pub(crate) async fn authorized_write(
    registrar: &Arc<Registrar>,
    caller: &Caller,
    op: Op,
    ack: Option<Ack>,
) -> Result<Token, Refused> {
    let key = op.key();
    // The span's node: the new endpoint's, or (a removal names none) the
    // stored one's, if any.
    let (what, done, node) = match &op {
        Op::Register(e) => ("register", "endpoint registered", e.node.clone()),
        Op::Deregister(_) => (
            "deregister",
            "endpoint deregistered",
            node_of(registrar, &key),
        ),
    };
    let span = write_span(what, &node, &key, caller);
    async {
        let new = match &op {
            Op::Register(e) => Some(e),
            Op::Deregister(_) => None,
        };
        authorize_write(registrar, caller, &key, new)
            .await
            .map_err(Refused::Caller)?;
        let token = registrar.write(op, ack).await.map_err(|e| {
            tracing::debug!(error = %e, "write refused");
            Refused::Write(e)
        })?;
        tracing::debug!(version = %token, "{done}");
        Ok(token)
    }
    .instrument(span)
    .await
}

/// The node of the endpoint stored at `key`, or empty.
fn node_of(registrar: &Registrar, key: &EndpointKey) -> String {
    registrar
        .state()
        .store()
        .snapshot()
        .and_then(|s| s.get(key).map(|e| e.node.clone()))
        .unwrap_or_default()
}

/// Refuse a write of `key` (to become `new`, or removed) unless `caller`
/// may write both `new` and the endpoint `registrar` stores now.
async fn authorize_write(
    registrar: &Registrar,
    caller: &Caller,
    key: &EndpointKey,
    new: Option<&Endpoint>,
) -> Result<(), Status> {
    if caller.is_anyone() {
        return Ok(());
    }
    if let Some(ep) = new {
        caller.may_write(ep)?;
    }
    let current = registrar
        .current(key)
        .await
        .map_err(|e| status_from_error(&e))?;
    if let Some(current) = current {
        if Some(&current) != new {
            caller.may_write(&current)?;
        }
    }
    Ok(())
}

/// The span of one write: every log line inside it (refusals, backend
/// errors, the debug line of the outcome) carries the node, the service
/// and the key of the request, and the caller.
fn write_span(op: &'static str, node: &str, key: &EndpointKey, caller: &Caller) -> tracing::Span {
    tracing::info_span!(
        "write",
        op,
        node = %node,
        service = %key.service,
        key = %key,
        %caller
    )
}
