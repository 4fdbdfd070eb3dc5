//! The one place where Cloud Map and SDK errors become
//! [`waypost::Error`]s.
//!
//! | Cloud Map / SDK | kind |
//! | --- | --- |
//! | no connection, timeout, broken response, HTTP 5xx, `InternalFailure`, `ServiceUnavailable` | `Unavailable` |
//! | `RequestLimitExceeded`, `ThrottlingException`, `TooManyRequests*`, HTTP 429, failed operation `THROTTLED_REQUEST` | `Throttled` |
//! | `NamespaceNotFound`, `ServiceNotFound`, `InstanceNotFound`, `OperationNotFound`, `CustomHealthNotFound` | `NotFound` |
//! | `DuplicateRequest`, `ResourceInUse`, `*AlreadyExists`, `ConflictingDomainExists` | `Conflict` |
//! | `InvalidInput`, `ValidationException`, failed operation `INVALID_CHANGE_BATCH` | `InvalidInput` (field `endpoint`) |
//! | `ResourceLimitExceeded` (a quota such as 1,000 instances per service: this request cannot be accepted until instances go, others can) | `InvalidInput` (field `service`) |
//! | `AccessDenied*`, `UnrecognizedClient`, `InvalidSignature*`, `*Token*` expired or invalid, failed operation `ACCESS_DENIED` / `EXPIRED_TOKEN` | `Unauthorized` |
//! | failed operation `HOSTED_ZONE_NOT_FOUND` | `NotFound` |
//! | anything else (a request that could not be built, an answer without a field Cloud Map always sends) | `Internal` |
//!
//! Every message names the call, what it was about (namespace, service or
//! instance) and, for connection failures, the endpoint that did not answer;
//! Cloud Map's own message is quoted at most [`QUOTE_MAX`] characters long
//! (a validation message can echo a whole attribute value).

use aws_sdk_servicediscovery::config::http::HttpResponse;
use aws_sdk_servicediscovery::error::{ProvideErrorMetadata, SdkError};
use waypost::Error;

/// What a failed call was about, for the message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    /// The API call, e.g. `RegisterInstance`.
    pub op: &'a str,
    /// What it was about, e.g. `instance payments/pod-a`.
    pub target: &'a str,
    /// Where the API is, e.g. `http://127.0.0.1:5000`.
    pub endpoint: &'a str,
}

/// Map an SDK error of any operation.
pub(crate) fn from_sdk<E>(err: SdkError<E, HttpResponse>, call: Call<'_>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let Call {
        op,
        target,
        endpoint,
    } = call;
    let detail = root_cause(&err);
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            return Error::unavailable(format!(
                "Cloud Map at {endpoint} did not answer {op} for {target}: {detail}"
            ))
            .with_source(err);
        }
        SdkError::ConstructionFailure(_) => {
            return Error::internal(format!(
                "could not build the {op} request for {target}: {detail}"
            ))
            .with_source(err);
        }
        _ => {}
    }
    let code = err.code().unwrap_or("").to_string();
    let msg = short(err.message().unwrap_or(""));
    let status = http_status(&err);
    let what = format!("{op} for {target} failed with {code} {msg}")
        .trim_end()
        .to_string();
    by_code(&code, status, what, endpoint).with_source(err)
}

/// Longest stretch of a server message or value an error quotes.
pub(crate) const QUOTE_MAX: usize = 160;

/// `s` cut to at most [`QUOTE_MAX`] characters (`…` marks a cut).
pub(crate) fn short(s: &str) -> String {
    waypost::backend::prefix(s, QUOTE_MAX).into_owned()
}

fn http_status<E>(err: &SdkError<E, HttpResponse>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

/// The kind for a Cloud Map error code (and HTTP status when there is no
/// code Cloud Map documents).
fn by_code(code: &str, status: Option<u16>, what: String, endpoint: &str) -> Error {
    let lower = code.to_ascii_lowercase();
    match code {
        "NamespaceNotFound"
        | "ServiceNotFound"
        | "InstanceNotFound"
        | "OperationNotFound"
        | "CustomHealthNotFound" => Error::not_found(what),
        "DuplicateRequest" | "ResourceInUse" | "ConflictingDomainExists" => Error::conflict(what),
        c if c.ends_with("AlreadyExists") => Error::conflict(what),
        "InvalidInput" | "ValidationException" => {
            Error::invalid("endpoint", format!("Cloud Map refused it: {what}"))
        }
        "RequestLimitExceeded" | "ThrottlingException" | "Throttling" => Error::throttled(what),
        c if c.starts_with("TooManyRequests") => Error::throttled(what),
        "AccessDeniedException"
        | "AccessDenied"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "MissingAuthenticationToken"
        | "IncompleteSignature" => Error::unauthorized(what),
        _ if lower.contains("token")
            && (lower.contains("expired") || lower.contains("invalid")) =>
        {
            Error::unauthorized(what)
        }
        "InternalFailure" | "ServiceUnavailable" | "InternalServerError" => {
            Error::unavailable(format!("Cloud Map at {endpoint}: {what}"))
        }
        "ResourceLimitExceeded" => {
            Error::invalid("service", format!("a Cloud Map quota was reached: {what}"))
        }
        _ => match status {
            Some(429) => Error::throttled(what),
            Some(401 | 403) => Error::unauthorized(what),
            Some(s) if s >= 500 => {
                Error::unavailable(format!("Cloud Map at {endpoint} answered HTTP {s}: {what}"))
            }
            _ => Error::internal(what),
        },
    }
}

/// The error for a Cloud Map operation that ended with status `FAIL`.
pub(crate) fn from_failed_operation(
    operation_id: &str,
    code: Option<&str>,
    message: Option<&str>,
    target: &str,
) -> Error {
    let code = code.unwrap_or("UNKNOWN");
    let what = format!(
        "Cloud Map operation {operation_id} for {target} failed with {code}: {}",
        short(message.unwrap_or("no message"))
    );
    match code {
        "ACCESS_DENIED" | "EXPIRED_TOKEN" => Error::unauthorized(what),
        "THROTTLED_REQUEST" => Error::throttled(what),
        "INTERNAL_FAILURE" => Error::unavailable(what),
        "HOSTED_ZONE_NOT_FOUND" => Error::not_found(what),
        "INVALID_CHANGE_BATCH" => Error::invalid("endpoint", what),
        _ => Error::internal(what),
    }
}

/// The error for an operation still pending when the wait ran out.
pub(crate) fn operation_timeout(
    operation_id: &str,
    status: &str,
    target: &str,
    waited: std::time::Duration,
) -> Error {
    Error::unavailable(format!(
        "Cloud Map operation {operation_id} for {target} was still {status} after {waited:?}"
    ))
}

/// The error for an answer that lacks a field Cloud Map always sends.
pub(crate) fn missing(op: &str, field: &str, target: &str) -> Error {
    Error::internal(format!(
        "Cloud Map's {op} answer for {target} has no {field}"
    ))
}

/// The deepest cause of an AWS error on one line, or where to set
/// credentials when one is missing.
pub(crate) use waypost::backend::aws_root_cause as root_cause;

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::ErrorKind;

    #[test]
    fn codes_map_to_kinds() {
        let k = |code: &str, status| by_code(code, status, "x".into(), "http://h").kind();
        assert_eq!(k("ServiceNotFound", None), ErrorKind::NotFound);
        assert_eq!(k("NamespaceAlreadyExists", None), ErrorKind::Conflict);
        assert_eq!(k("DuplicateRequest", None), ErrorKind::Conflict);
        assert_eq!(k("RequestLimitExceeded", None), ErrorKind::Throttled);
        assert_eq!(k("InvalidInput", None), ErrorKind::InvalidInput);
        assert_eq!(k("ExpiredTokenException", None), ErrorKind::Unauthorized);
        assert_eq!(k("Whatever", Some(503)), ErrorKind::Unavailable);
        assert_eq!(k("Whatever", Some(429)), ErrorKind::Throttled);
        assert_eq!(k("ResourceLimitExceeded", None), ErrorKind::InvalidInput);
        assert_eq!(k("NamespaceNotFound", None), ErrorKind::NotFound);
        assert_eq!(k("AccessDeniedException", None), ErrorKind::Unauthorized);
        assert_eq!(k("Whatever", Some(403)), ErrorKind::Unauthorized);
        assert_eq!(k("InternalFailure", None), ErrorKind::Unavailable);
        assert_eq!(k("Whatever", Some(400)), ErrorKind::Internal);
        for code in ["ServiceNotFound", "InvalidInput", "ResourceLimitExceeded"] {
            assert!(
                !by_code(code, None, "x".into(), "h").is_retryable(),
                "{code}"
            );
        }
        for code in [
            "DuplicateRequest",
            "RequestLimitExceeded",
            "ServiceUnavailable",
        ] {
            assert!(
                by_code(code, None, "x".into(), "h").is_retryable(),
                "{code}"
            );
        }
    }

    #[test]
    fn failed_operations_surface_with_their_target() {
        let e = from_failed_operation(
            "op-1",
            Some("THROTTLED_REQUEST"),
            Some("slow"),
            "instance s/a",
        );
        assert_eq!(e.kind(), ErrorKind::Throttled);
        let e = from_failed_operation(
            "op-2",
            Some("CANNOT_CREATE_HOSTED_ZONE"),
            None,
            "instance s/a",
        );
        assert_eq!(e.kind(), ErrorKind::Internal);
        assert!(e.to_string().contains("op-2") && e.to_string().contains("instance s/a"));
        let e = from_failed_operation("op-3", Some("ACCESS_DENIED"), None, "instance s/a");
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        let e = from_failed_operation("op-4", Some("INVALID_CHANGE_BATCH"), None, "instance s/a");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = from_failed_operation("op-5", Some("HOSTED_ZONE_NOT_FOUND"), None, "ns");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        let long = "v".repeat(5000);
        let e = from_failed_operation("op-6", Some("X"), Some(&long), "instance s/a");
        assert!(e.to_string().len() < QUOTE_MAX + 200, "{e}");
    }
}
