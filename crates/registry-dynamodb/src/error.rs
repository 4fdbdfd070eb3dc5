//! The one place where AWS SDK errors (DynamoDB and DynamoDB Streams)
//! become [`registry_api::Error`]s.
//!
//! | SDK error | kind |
//! | --- | --- |
//! | `ProvisionedThroughputExceededException`, `ThrottlingException`, `RequestLimitExceeded`, `LimitExceededException` | `Throttled` |
//! | `ConditionalCheckFailedException`, `TransactionConflictException`, `TransactionInProgressException`, `TransactionCanceledException` with a conflict or a failed condition | `Conflict` |
//! | `TransactionCanceledException` with throttling reasons | `Throttled` |
//! | `ResourceNotFoundException` | `NotFound`, naming the table (or its stream) |
//! | a dispatch failure (connection refused, DNS, TLS), a timeout, an unreadable response, `InternalServerError`, `ServiceUnavailable` | `Unavailable`, naming the endpoint |
//! | `UnrecognizedClientException`, `AccessDeniedException`, `InvalidSignatureException`, `MissingAuthenticationToken`, `ExpiredTokenException` | `Unauthorized` |
//! | `IdempotentParameterMismatchException` | `InvalidInput` naming `token` |
//! | `ValidationException` and anything else | `Internal`, with DynamoDB's message |
//!
//! Every write is validated before it is sent, so a `ValidationException`
//! means a request this crate built was wrong: a bug, not the caller's input.

use std::fmt::Debug;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use registry_api::Error;

/// What was being done, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// The API call (`Query`, `TransactWriteItems`, …).
    pub op: &'static str,
    /// The table.
    pub table: &'a str,
    /// The endpoint requests go to.
    pub endpoint: &'a str,
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
];

/// Error codes of a server that is there but not well.
const SERVER: &[&str] = &[
    "InternalServerError",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
];

/// Map any SDK error of either client.
pub(crate) fn map_sdk<E>(err: SdkError<E>, ctx: Ctx<'_>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let Ctx {
        op,
        table,
        endpoint,
    } = ctx;
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            let what = match &err {
                SdkError::TimeoutError(_) => "timed out",
                SdkError::ResponseError(_) => "sent a response that could not be read",
                _ => "could not be reached",
            };
            let detail = aws_sdk_dynamodb::error::DisplayErrorContext(&err).to_string();
            Error::unavailable(format!(
                "DynamoDB at {endpoint} {what} ({op} on table {table}): {detail}"
            ))
            .with_source(err)
        }
        SdkError::ConstructionFailure(_) => {
            let detail = aws_sdk_dynamodb::error::DisplayErrorContext(&err).to_string();
            Error::internal(format!(
                "could not build the {op} request for table {table}: {detail}"
            ))
            .with_source(err)
        }
        _ => {
            let code = err.code().unwrap_or("").to_string();
            let message = err.message().unwrap_or("").to_string();
            from_code(&code, &message, ctx, err)
        }
    }
}

/// Map a service error by its code.
fn from_code(
    code: &str,
    message: &str,
    ctx: Ctx<'_>,
    source: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    let Ctx {
        op,
        table,
        endpoint,
    } = ctx;
    if THROTTLING.contains(&code) {
        Error::Throttled {
            message: format!("{op} on table {table} was throttled ({code}): {message}"),
            source: None,
        }
        .with_source(source)
    } else if CONFLICT.contains(&code) {
        Error::Conflict {
            what: format!("{op} on table {table}: {code}: {message}"),
        }
    } else if code == "IdempotentParameterMismatchException" {
        Error::invalid(
            "token",
            format!("{op} on table {table}: the ClientRequestToken was used for other writes: {message}"),
        )
    } else if code == "ResourceNotFoundException" {
        let what = if op.starts_with("Streams.") {
            format!("the stream of DynamoDB table {table} ({op}: {message})")
        } else {
            format!("DynamoDB table {table} ({op}: {message})")
        };
        Error::NotFound { what }
    } else if AUTH.contains(&code) {
        Error::Unauthorized {
            message: format!("{op} on table {table} was refused ({code}): {message}"),
            source: None,
        }
        .with_source(source)
    } else if SERVER.contains(&code) {
        Error::unavailable(format!(
            "DynamoDB at {endpoint} failed ({op} on table {table}, {code}): {message}"
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

/// Map a failed `TransactWriteItems`, reading the cancellation reasons of a
/// cancelled transaction: a conflict or failed condition gives `Conflict`,
/// throttling gives `Throttled`, anything else `Internal` listing them.
pub(crate) fn map_transact(err: SdkError<TransactWriteItemsError>, ctx: Ctx<'_>) -> Error {
    let reasons: Vec<(String, String)> = match err.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(e)) => e
            .cancellation_reasons()
            .iter()
            .filter_map(|r| {
                let code = r.code()?;
                (code != "None").then(|| (code.to_string(), r.message().unwrap_or("").to_string()))
            })
            .collect(),
        _ => return map_sdk(err, ctx),
    };
    let listed = reasons
        .iter()
        .map(|(c, m)| {
            if m.is_empty() {
                c.clone()
            } else {
                format!("{c}: {m}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!("transaction cancelled: {listed}");
    let has = |set: &[&str]| reasons.iter().any(|(c, _)| set.contains(&c.as_str()));
    let code = if has(CONFLICT) {
        "TransactionConflict"
    } else if has(THROTTLING) {
        "ThrottlingError"
    } else {
        "TransactionCanceledException"
    };
    from_code(code, &message, ctx, err)
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

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::operation::query::QueryError;
    use aws_sdk_dynamodb::types::error::{
        ProvisionedThroughputExceededException, ResourceNotFoundException,
        TransactionCanceledException,
    };
    use aws_sdk_dynamodb::types::CancellationReason;
    use registry_api::ErrorKind;

    const CTX: Ctx<'static> = Ctx {
        op: "Query",
        table: "tbl-x",
        endpoint: "http://127.0.0.1:1",
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
        let got = map_transact(cancelled(&["None", "TransactionConflict"]), ctx);
        assert_eq!(got.kind(), ErrorKind::Conflict, "{got}");
        let got = map_transact(cancelled(&["ThrottlingError", "None"]), ctx);
        assert_eq!(got.kind(), ErrorKind::Throttled, "{got}");
        let mismatch = TransactWriteItemsError::IdempotentParameterMismatchException(
            aws_sdk_dynamodb::types::error::IdempotentParameterMismatchException::builder()
                .message("token reused")
                .meta(meta("IdempotentParameterMismatchException"))
                .build(),
        );
        match map_transact(service_error(mismatch), ctx) {
            Error::InvalidInput { field, .. } => assert_eq!(field, "token"),
            other => panic!("expected InvalidInput naming token, got {other:?}"),
        }
        let got = map_transact(cancelled(&["ValidationError"]), ctx);
        assert_eq!(got.kind(), ErrorKind::Internal, "{got}");
        assert!(got.to_string().contains("ValidationError"), "{got}");
    }
}
