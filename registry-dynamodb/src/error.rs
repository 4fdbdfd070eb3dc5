//! The one place where AWS SDK errors (DynamoDB and DynamoDB Streams)
//! become [`waypost::Error`]s.
//!
//! | SDK error | kind |
//! | --- | --- |
//! | a dispatch failure (connection refused, DNS, TLS), a timeout (connect, attempt or operation), an unreadable response, `InternalServerError`, `ServiceUnavailable`, `RequestTimeout`, any other HTTP 5xx | `Unavailable` (transient), naming the endpoint |
//! | `ProvisionedThroughputExceededException`, `ThrottlingException`, `RequestLimitExceeded`, `LimitExceededException`, HTTP 429 | `Throttled` (transient) |
//! | `ConditionalCheckFailedException`, `TransactionConflictException`, `TransactionInProgressException`, `TransactionCanceledException` with a conflict or a failed condition | `Conflict` (transient) |
//! | `TransactionCanceledException` with throttling reasons | `Throttled` |
//! | `TransactionCanceledException` with a `ValidationError` or `ItemCollectionSizeLimitExceeded` reason | `InvalidInput` naming the key of the item DynamoDB refused |
//! | `ValidationException` (e.g. an item over 400 KB) | `InvalidInput`: field `endpoint` naming the key for a one-item write, `service` for a `Query`, else `request` |
//! | `ResourceNotFoundException` | `NotFound`, naming the table (or its stream) |
//! | `UnrecognizedClientException`, `AccessDeniedException`, `InvalidSignatureException`, `MissingAuthenticationToken`, `ExpiredTokenException`, `InvalidClientTokenId`, `SignatureDoesNotMatch`, HTTP 401/403 | `Unauthorized` |
//! | `IdempotentParameterMismatchException` | `InvalidInput` naming `token` |
//! | a request that could not be built, anything else | `Internal`, with DynamoDB's message |
//!
//! Messages quote DynamoDB's text and keys at most [`QUOTE_MAX`] characters
//! long, so an error never carries a whole item.

use std::fmt::Debug;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use waypost::{EndpointKey, Error};

/// What was being done, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// The API call (`Query`, `TransactWriteItems`, …).
    pub op: &'static str,
    /// The table.
    pub table: &'a str,
    /// The endpoint requests go to.
    pub endpoint: &'a str,
    /// The item a one-item request was about.
    pub key: Option<&'a EndpointKey>,
}

/// Longest stretch of a key, a value or a server message an error quotes.
pub(crate) const QUOTE_MAX: usize = 96;

/// `s` cut to at most [`QUOTE_MAX`] characters (`…` marks a cut).
pub(crate) fn short(s: &str) -> String {
    waypost::backend::prefix(s, QUOTE_MAX).into_owned()
}

/// An endpoint key for a message: `service "s" id "i"`, each quoted short.
pub(crate) fn describe_key(key: &EndpointKey) -> String {
    format!("service {:?} id {:?}", short(&key.service), short(&key.id))
}

/// Error codes that mean "slow down".
const THROTTLING: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
    "LimitExceededException",
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
];

/// Error codes that mean "a concurrent change won".
const CONFLICT: &[&str] = &[
    "ConditionalCheckFailedException",
    "TransactionConflictException",
    "TransactionInProgressException",
    "ConditionalCheckFailed",
    "TransactionConflict",
];

/// Error codes that mean "who are you?".
const AUTH: &[&str] = &[
    "UnrecognizedClientException",
    "AccessDeniedException",
    "InvalidSignatureException",
    "MissingAuthenticationToken",
    "MissingAuthenticationTokenException",
    "ExpiredTokenException",
    "IncompleteSignatureException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
];

/// Error codes of a server that is there but not well.
const SERVER: &[&str] = &[
    "InternalServerError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// Cancellation reasons of a transaction that name an item DynamoDB will
/// never accept as it is.
const REFUSED_ITEM: &[&str] = &["ValidationError", "ItemCollectionSizeLimitExceeded"];

/// Map any SDK error of either client.
pub(crate) fn map_sdk<E>(err: SdkError<E>, ctx: Ctx<'_>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let Ctx {
        op,
        table,
        endpoint,
        ..
    } = ctx;
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            let detail = root_cause(&err);
            let what = match &err {
                _ if detail == waypost::backend::NO_AWS_CREDENTIALS => "was not called",
                SdkError::TimeoutError(_) => "timed out",
                SdkError::ResponseError(_) => "sent a response that could not be read",
                _ => "could not be reached",
            };
            Error::unavailable(format!(
                "DynamoDB at {endpoint} {what} ({op} on table {table}): {detail}"
            ))
            .with_source(err)
        }
        SdkError::ConstructionFailure(_) => {
            let detail = root_cause(&err);
            Error::internal(format!(
                "could not build the {op} request for table {table}: {detail}"
            ))
            .with_source(err)
        }
        _ => {
            let code = err.code().unwrap_or("").to_string();
            let message = short(err.message().unwrap_or(""));
            let status = err.raw_response().map(|r| r.status().as_u16());
            from_code(&code, &message, status, ctx, err)
        }
    }
}

/// Map a service error by its code (and the HTTP status when the code is
/// not one DynamoDB documents).
fn from_code(
    code: &str,
    message: &str,
    status: Option<u16>,
    ctx: Ctx<'_>,
    source: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    let Ctx {
        op,
        table,
        endpoint,
        key,
    } = ctx;
    if THROTTLING.contains(&code) || (code.is_empty() && status == Some(429)) {
        Error::throttled(format!(
            "{op} on table {table} was throttled ({code}): {message}"
        ))
        .with_source(source)
    } else if CONFLICT.contains(&code) {
        Error::conflict(format!("{op} on table {table}: {code}: {message}"))
    } else if code == "IdempotentParameterMismatchException" {
        Error::invalid(
            "token",
            format!("{op} on table {table}: the ClientRequestToken was used for other writes: {message}"),
        )
    } else if code == "ValidationException" {
        let (field, about) = match (key, op) {
            (Some(k), _) => ("endpoint", format!(" the item of {}", describe_key(k))),
            (None, "Query") => ("service", String::new()),
            (None, _) => ("request", String::new()),
        };
        Error::invalid(
            field,
            format!("DynamoDB refused{about} ({op} on table {table}): {message}"),
        )
    } else if code == "ResourceNotFoundException" {
        let what = if op.starts_with("Streams.") {
            format!("the stream of DynamoDB table {table} ({op}: {message})")
        } else {
            format!("DynamoDB table {table} ({op}: {message})")
        };
        Error::not_found(what)
    } else if AUTH.contains(&code) || matches!(status, Some(401 | 403)) && !SERVER.contains(&code) {
        Error::unauthorized(format!(
            "{op} on table {table} was refused ({code}): {message}"
        ))
        .with_source(source)
    } else if SERVER.contains(&code) || status.is_some_and(|s| s >= 500) {
        let code = if code.is_empty() {
            "no error code"
        } else {
            code
        };
        let status = status.map_or(String::new(), |s| format!("HTTP {s}, "));
        Error::unavailable(format!(
            "DynamoDB at {endpoint} failed ({op} on table {table}, {status}{code}): {message}"
        ))
        .with_source(source)
    } else {
        let code = if code.is_empty() {
            "no error code"
        } else {
            code
        };
        Error::internal(format!("{op} on table {table} failed ({code}): {message}"))
            .with_source(source)
    }
}

/// Map a failed `TransactWriteItems` whose actions are about `keys` (in
/// order), reading the cancellation reasons of a cancelled transaction: an
/// item DynamoDB refuses gives `InvalidInput` naming its key (so a caller
/// that splits the batch finds it), a conflict or failed condition
/// `Conflict`, throttling `Throttled`, anything else `Internal` listing
/// them.
pub(crate) fn map_transact(
    err: SdkError<TransactWriteItemsError>,
    ctx: Ctx<'_>,
    keys: &[EndpointKey],
) -> Error {
    let reasons: Vec<(usize, String, String)> = match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(e)) => e
            .cancellation_reasons()
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let code = r.code()?;
                (code != "None").then(|| (i, code.to_string(), short(r.message().unwrap_or(""))))
            })
            .collect(),
        _ => return map_sdk(err, ctx),
    };
    let listed = reasons
        .iter()
        .map(|(i, c, m)| {
            let item = keys
                .get(*i)
                .map_or_else(|| format!("action {i}"), describe_key);
            if m.is_empty() {
                format!("{item}: {c}")
            } else {
                format!("{item}: {c}: {m}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!("transaction cancelled: {listed}");
    if let Some((i, code, m)) = reasons
        .iter()
        .find(|(_, c, _)| REFUSED_ITEM.contains(&c.as_str()))
    {
        let item = keys
            .get(*i)
            .map_or_else(|| format!("action {i}"), describe_key);
        return Error::invalid(
            "endpoint",
            format!(
                "DynamoDB refused the item of {item} ({} on table {}, {code}): {m}",
                ctx.op, ctx.table
            ),
        );
    }
    let has = |set: &[&str]| reasons.iter().any(|(_, c, _)| set.contains(&c.as_str()));
    let code = if has(CONFLICT) {
        "TransactionConflict"
    } else if has(THROTTLING) {
        "ThrottlingError"
    } else {
        "TransactionCanceledException"
    };
    from_code(code, &message, None, ctx, err)
}

/// Whether a Streams error means the position is gone (trimmed after 24 h,
/// or an iterator older than 15 min): the reader must start over from a
/// fresh snapshot or a sequence number.
pub(crate) fn is_position_lost<E: ProvideErrorMetadata>(err: &SdkError<E>) -> bool {
    matches!(
        err.code(),
        Some("TrimmedDataAccessException") | Some("ExpiredIteratorException")
    )
}

/// The deepest cause of an AWS error on one line, or where to set
/// credentials when one is missing.
pub(crate) use waypost::backend::aws_root_cause as root_cause;

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::operation::query::QueryError;
    use aws_sdk_dynamodb::types::error::{
        ProvisionedThroughputExceededException, ResourceNotFoundException,
        TransactionCanceledException,
    };
    use aws_sdk_dynamodb::types::CancellationReason;
    use waypost::ErrorKind;

    const CTX: Ctx<'static> = Ctx {
        op: "Query",
        table: "tbl-x",
        endpoint: "http://127.0.0.1:1",
        key: None,
    };

    fn meta(code: &str) -> aws_sdk_dynamodb::error::ErrorMetadata {
        aws_sdk_dynamodb::error::ErrorMetadata::builder()
            .code(code)
            .build()
    }

    fn service_error<E>(e: E) -> SdkError<E> {
        let raw = aws_sdk_dynamodb::config::http::HttpResponse::new(
            400u16.try_into().expect("status"),
            String::new().into(),
        );
        SdkError::service_error(e, raw)
    }

    #[test]
    fn throttling_and_not_found() {
        let e = QueryError::ProvisionedThroughputExceededException(
            ProvisionedThroughputExceededException::builder()
                .message("slow down")
                .meta(meta("ProvisionedThroughputExceededException"))
                .build(),
        );
        let got = map_sdk(service_error(e), CTX);
        assert_eq!(got.kind(), ErrorKind::Throttled, "{got}");
        assert!(got.is_retryable());
        let e = QueryError::ResourceNotFoundException(
            ResourceNotFoundException::builder()
                .message("no")
                .meta(meta("ResourceNotFoundException"))
                .build(),
        );
        let got = map_sdk(service_error(e), CTX);
        assert_eq!(got.kind(), ErrorKind::NotFound);
        assert!(got.to_string().contains("tbl-x"), "{got}");
    }

    #[test]
    fn cancelled_transactions_by_reason() {
        let cancelled = |codes: &[&str]| {
            let mut b = TransactionCanceledException::builder().message("cancelled");
            for c in codes {
                b = b.cancellation_reasons(CancellationReason::builder().code(*c).build());
            }
            service_error(TransactWriteItemsError::TransactionCanceledException(
                b.build(),
            ))
        };
        let ctx = Ctx {
            op: "TransactWriteItems",
            ..CTX
        };
        let got = map_transact(cancelled(&["None", "TransactionConflict"]), ctx, &[]);
        assert_eq!(got.kind(), ErrorKind::Conflict, "{got}");
        let got = map_transact(cancelled(&["ThrottlingError", "None"]), ctx, &[]);
        assert_eq!(got.kind(), ErrorKind::Throttled, "{got}");
        let mismatch = TransactWriteItemsError::IdempotentParameterMismatchException(
            aws_sdk_dynamodb::types::error::IdempotentParameterMismatchException::builder()
                .message("token reused")
                .meta(meta("IdempotentParameterMismatchException"))
                .build(),
        );
        match map_transact(service_error(mismatch), ctx, &[]) {
            Error::InvalidInput { field, .. } => assert_eq!(field, "token"),
            other => panic!("expected InvalidInput naming token, got {other:?}"),
        }
        // An item DynamoDB refuses is named by its key.
        let keys = [EndpointKey::new("s", "a"), EndpointKey::new("s", "b")];
        let got = map_transact(cancelled(&["None", "ValidationError"]), ctx, &keys);
        match &got {
            Error::InvalidInput { field, reason, .. } => {
                assert_eq!(field, "endpoint");
                assert!(reason.contains("id \"b\""), "{got}");
                assert!(reason.contains("ValidationError"), "{got}");
            }
            other => panic!("expected InvalidInput naming the item, got {other:?}"),
        }
        let got = map_transact(cancelled(&["SomethingNew"]), ctx, &keys);
        assert_eq!(got.kind(), ErrorKind::Internal, "{got}");
        assert!(got.to_string().contains("SomethingNew"), "{got}");
    }

    fn raw(status: u16) -> aws_sdk_dynamodb::config::http::HttpResponse {
        aws_sdk_dynamodb::config::http::HttpResponse::new(
            status.try_into().expect("status"),
            String::new().into(),
        )
    }

    #[test]
    fn timeouts_and_server_failures_are_transient() {
        let timeout: SdkError<QueryError> =
            SdkError::timeout_error("operation timed out after 10s");
        let got = map_sdk(timeout, CTX);
        assert_eq!(got.kind(), ErrorKind::Unavailable, "{got}");
        assert!(got.is_retryable());
        assert!(got.to_string().contains("timed out"), "{got}");
        let ctx = Ctx {
            op: "TransactWriteItems",
            ..CTX
        };
        let timeout: SdkError<TransactWriteItemsError> =
            SdkError::timeout_error("operation timed out after 10s");
        assert_eq!(
            map_transact(timeout, ctx, &[]).kind(),
            ErrorKind::Unavailable
        );
        // A 500 without a code DynamoDB documents (an emulator's crash page).
        let e = QueryError::generic(aws_sdk_dynamodb::error::ErrorMetadata::builder().build());
        let got = map_sdk(SdkError::service_error(e, raw(500)), CTX);
        assert_eq!(got.kind(), ErrorKind::Unavailable, "{got}");
        let e = QueryError::generic(meta("RequestTimeout"));
        let got = map_sdk(SdkError::service_error(e, raw(400)), CTX);
        assert_eq!(got.kind(), ErrorKind::Unavailable, "{got}");
        let e = QueryError::generic(aws_sdk_dynamodb::error::ErrorMetadata::builder().build());
        let got = map_sdk(SdkError::service_error(e, raw(429)), CTX);
        assert_eq!(got.kind(), ErrorKind::Throttled, "{got}");
    }

    #[test]
    fn refusals_are_permanent_and_say_why() {
        for code in [
            "AccessDeniedException",
            "UnrecognizedClientException",
            "InvalidClientTokenId",
        ] {
            let e = QueryError::generic(meta(code));
            let got = map_sdk(service_error(e), CTX);
            assert_eq!(got.kind(), ErrorKind::Unauthorized, "{code}: {got}");
            assert!(!got.is_retryable());
        }
        let e = QueryError::generic(aws_sdk_dynamodb::error::ErrorMetadata::builder().build());
        let got = map_sdk(SdkError::service_error(e, raw(403)), CTX);
        assert_eq!(got.kind(), ErrorKind::Unauthorized, "{got}");
        // A validation failure of a one-item write names the item, and
        // quotes DynamoDB's message only in part.
        let key = EndpointKey::new("payments", "pod-a");
        let long = "v".repeat(5000);
        let e = aws_sdk_dynamodb::operation::put_item::PutItemError::generic(
            aws_sdk_dynamodb::error::ErrorMetadata::builder()
                .code("ValidationException")
                .message(format!(
                    "Item size has exceeded the maximum allowed size: {long}"
                ))
                .build(),
        );
        let ctx = Ctx {
            op: "PutItem",
            key: Some(&key),
            ..CTX
        };
        let got = map_sdk(service_error(e), ctx);
        match &got {
            Error::InvalidInput { field, reason, .. } => {
                assert_eq!(field, "endpoint");
                assert!(reason.contains("\"pod-a\""), "{got}");
                assert!(reason.len() < 400, "{} bytes: {got}", reason.len());
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
        // A condition that failed: a concurrent change won.
        let e = aws_sdk_dynamodb::operation::put_item::PutItemError::generic(meta(
            "ConditionalCheckFailedException",
        ));
        assert_eq!(map_sdk(service_error(e), ctx).kind(), ErrorKind::Conflict);
    }
}
