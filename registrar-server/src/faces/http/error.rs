//! [`ApiError`]: why a request of the HTTP API failed, and how it is
//! rendered (`{"error": "…", "field": "…"}`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use waypost::backend::quote;
use waypost::{Error, ErrorKind};

/// Why a request of the HTTP API failed; rendered as
/// `{"error": "<message>", "field": "<field>"}` (`field` when one input
/// was at fault) with the status of [`ApiError::status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// A query parameter the route does not implement (refused rather
    /// than ignored, so that a client never reads an answer that ignored
    /// part of its question).
    #[error(
        "query parameter {}: not supported by this route (it takes {takes})",
        quote(param)
    )]
    UnsupportedQuery {
        /// The parameter's name, as sent (bounded).
        param: String,
        /// The parameters the route takes.
        takes: String,
    },
    /// The registrar is shutting down.
    #[error("the registrar is shutting down")]
    ShuttingDown,
    /// The request body could not be read (too large, not the declared
    /// encoding).
    #[error("the request body: {reason}")]
    BadBody {
        /// 413 for a body over the limit, else 400.
        status: StatusCode,
        /// What went wrong.
        reason: String,
    },
    /// The caller is not allowed: no or an untrusted client certificate
    /// (401), or a rule that does not allow the request (403).
    #[error("{message}")]
    Denied {
        /// 401 or 403.
        status: StatusCode,
        /// Why, as the gRPC port would say it.
        message: String,
    },
    /// The registry refused: invalid input (naming the field), an unknown
    /// node, a backend that is unavailable or a full write queue.
    #[error(transparent)]
    Registry(#[from] Error),
}

impl ApiError {
    /// The HTTP status: 400 for bad input, 401/403 for a refused caller,
    /// 404 for an unknown node, 409 for a conflict, 413 for a body over the
    /// limit, 429 when throttled, 503 while not ready, shutting down, or
    /// while the backend is unavailable or the write queue full, 500 for
    /// the rest.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotReady | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BadQuery { .. } | ApiError::UnsupportedQuery { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::BadBody { status, .. } | ApiError::Denied { status, .. } => *status,
            ApiError::Registry(e) => match e.kind() {
                ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
                ErrorKind::NotFound => StatusCode::NOT_FOUND,
                ErrorKind::Conflict => StatusCode::CONFLICT,
                ErrorKind::Throttled => StatusCode::TOO_MANY_REQUESTS,
                ErrorKind::Unavailable | ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::Unauthorized => StatusCode::FORBIDDEN,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// The input at fault, if one was: a query parameter, or a field of
    /// the endpoint (`port`, `labels["zone"]`, …).
    pub fn field(&self) -> Option<&str> {
        match self {
            ApiError::BadQuery { param, .. } => Some(param),
            ApiError::UnsupportedQuery { param, .. } => Some(param),
            ApiError::Registry(Error::InvalidInput { field, .. }) => Some(field),
            _ => None,
        }
    }
}

impl From<crate::auth::write::Refused> for ApiError {
    fn from(r: crate::auth::write::Refused) -> Self {
        match r {
            crate::auth::write::Refused::Caller(s) => s.into(),
            crate::auth::write::Refused::Write(e) => e.into(),
        }
    }
}

impl From<tonic::Status> for ApiError {
    /// A refusal of the caller (authentication or authorization), as the
    /// gRPC port would answer it.
    fn from(s: tonic::Status) -> Self {
        let status = match s.code() {
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
            tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
            tonic::Code::NotFound => StatusCode::NOT_FOUND,
            tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::Denied {
            status,
            message: s.message().to_string(),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.to_string(),
            field: self.field(),
        };
        super::json_response(self.status(), &body, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_fields_follow_the_error() {
        let bad = ApiError::from(Error::invalid("port", "0 is not 1 to 65535"));
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert_eq!(bad.field(), Some("port"));
        let unknown = ApiError::from(Error::not_found("node \"n9\""));
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
        assert_eq!(unknown.field(), None);
        let denied = ApiError::from(tonic::Status::permission_denied("no"));
        assert_eq!(denied.status(), StatusCode::FORBIDDEN);
        let anon = ApiError::from(tonic::Status::unauthenticated("no certificate"));
        assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(anon.to_string(), "no certificate");
    }
}
