//! The one place where etcd's errors become [`registry_api::Error`]s.
//!
//! Every message names what was being done and on which key, endpoint or
//! node (`what`), so that a log line alone says what failed. The kind is the
//! most precise one: unreachable or leaderless etcd is `Unavailable`, a
//! refused login or permission is `Unauthorized`, "too many requests" is
//! `Throttled`, a missing lease is `NotFound`, a compacted revision is
//! `Conflict` (retrying at a newer revision works), a request etcd refuses
//! as malformed is `InvalidInput`.

use std::fmt::Display;

use etcd_client::Error as EtcdError;
use registry_api::Error;
use tonic::Code;

/// Map an etcd client error met while doing `what` to our error kinds.
pub(crate) fn map(err: EtcdError, what: impl Display) -> Error {
    let what = what.to_string();
    match err {
        EtcdError::GRpcStatus(status) => {
            let msg = format!("{what}: {} ({:?})", status.message(), status.code());
            let kind = if broken_connection(&status) {
                Code::Unavailable
            } else {
                status.code()
            };
            let source = status;
            match kind {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                    Error::unavailable(msg).with_source(source)
                }
                Code::ResourceExhausted => Error::Throttled {
                    message: msg,
                    source: None,
                }
                .with_source(source),
                Code::Unauthenticated | Code::PermissionDenied => Error::Unauthorized {
                    message: msg,
                    source: None,
                }
                .with_source(source),
                Code::FailedPrecondition | Code::InvalidArgument
                    if about_auth(source.message()) =>
                {
                    Error::Unauthorized {
                        message: msg,
                        source: None,
                    }
                    .with_source(source)
                }
                Code::NotFound => Error::NotFound { what: msg },
                Code::OutOfRange | Code::Aborted | Code::AlreadyExists => {
                    Error::Conflict { what: msg }
                }
                Code::InvalidArgument => Error::invalid(what, source.message().to_string()),
                Code::Ok
                | Code::Unknown
                | Code::FailedPrecondition
                | Code::Unimplemented
                | Code::Internal
                | Code::DataLoss => Error::internal(msg).with_source(source),
            }
        }
        EtcdError::TransportError(e) => {
            Error::unavailable(format!("{what}: cannot reach etcd: {e}")).with_source(e)
        }
        EtcdError::IoError(e) => Error::unavailable(format!("{what}: {e}")).with_source(e),
        EtcdError::WatchError(e) => Error::unavailable(format!("{what}: watch stream closed: {e}")),
        EtcdError::LeaseKeepAliveError(e) if e.contains("not found") => Error::NotFound {
            what: format!("{what}: {e}"),
        },
        EtcdError::LeaseKeepAliveError(e) => {
            Error::unavailable(format!("{what}: lease keep-alive failed: {e}"))
        }
        EtcdError::InvalidArgs(e) => Error::invalid("endpoints", format!("{what}: {e}")),
        EtcdError::InvalidUri(e) => Error::invalid("endpoints", format!("{what}: {e}")),
        EtcdError::EndpointError(e) => Error::invalid("endpoints", format!("{what}: {e}")),
        EtcdError::InvalidMetadataValue(e) => Error::invalid("user", format!("{what}: {e}")),
        EtcdError::Utf8Error(e) => {
            Error::internal(format!("{what}: etcd returned a key that is not UTF-8")).with_source(e)
        }
        e
        @ (EtcdError::ElectError(_) | EtcdError::EndpointsNotManaged | EtcdError::Internal(_)) => {
            Error::internal(format!("{what}: {e}")).with_source(e)
        }
    }
}

/// Whether etcd's message is about authentication (a wrong password is
/// `InvalidArgument`, an unknown user or bad token `FailedPrecondition`).
fn about_auth(message: &str) -> bool {
    [
        "authentication",
        "auth token",
        "user name",
        "invalid password",
        "not enabled",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// Whether a status was made on this side from a failed connection (a
/// reset or closed HTTP/2 stream, a broken socket) rather than sent by
/// etcd: tonic reports those as `Unknown` or `Internal` with the local
/// error as source, while etcd's own statuses carry none.
fn broken_connection(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::Unknown | Code::Internal)
        && (std::error::Error::source(status).is_some()
            || status.message().starts_with("h2 protocol error")
            || status
                .message()
                .contains("error reading a body from connection"))
}

/// Whether etcd answered that a lease does not exist (revoked, or expired
/// while etcd was down): the caller grants a new one.
pub(crate) fn is_lease_not_found(err: &EtcdError) -> bool {
    match err {
        EtcdError::GRpcStatus(s) => {
            s.code() == Code::NotFound && s.message().contains("lease not found")
        }
        EtcdError::LeaseKeepAliveError(e) => e.contains("not found"),
        _ => false,
    }
}

/// Whether etcd answered that the revision asked for is compacted.
pub(crate) fn is_compacted(err: &EtcdError) -> bool {
    matches!(err, EtcdError::GRpcStatus(s) if s.code() == Code::OutOfRange
        && s.message().contains("compacted"))
}

/// A stored value that cannot be decoded.
pub(crate) fn corrupt(key: &str, reason: impl Display) -> Error {
    Error::internal(format!("corrupt record at etcd key {key:?}: {reason}"))
}

/// A TLS file that cannot be read.
#[cfg(feature = "tls")]
pub(crate) fn tls_file(field: &str, path: &std::path::Path, err: std::io::Error) -> Error {
    Error::invalid(
        format!("tls.{field}"),
        format!("cannot read {}: {err}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use registry_api::ErrorKind;

    fn status(code: Code, msg: &str) -> EtcdError {
        EtcdError::GRpcStatus(tonic::Status::new(code, msg))
    }

    #[test]
    fn kinds_and_messages() {
        let cases = [
            (
                status(Code::Unavailable, "etcdserver: no leader"),
                ErrorKind::Unavailable,
            ),
            (
                status(Code::ResourceExhausted, "etcdserver: too many requests"),
                ErrorKind::Throttled,
            ),
            (
                status(Code::PermissionDenied, "etcdserver: permission denied"),
                ErrorKind::Unauthorized,
            ),
            (
                status(Code::FailedPrecondition, "etcdserver: invalid auth token"),
                ErrorKind::Unauthorized,
            ),
            (
                status(Code::NotFound, "etcdserver: requested lease not found"),
                ErrorKind::NotFound,
            ),
            (
                status(
                    Code::OutOfRange,
                    "etcdserver: mvcc: required revision has been compacted",
                ),
                ErrorKind::Conflict,
            ),
            (
                status(
                    Code::InvalidArgument,
                    "etcdserver: too many operations in txn request",
                ),
                ErrorKind::InvalidInput,
            ),
            (status(Code::Internal, "boom"), ErrorKind::Internal),
            (
                status(
                    Code::Unknown,
                    "h2 protocol error: error reading a body from connection",
                ),
                ErrorKind::Unavailable,
            ),
            (
                EtcdError::LeaseKeepAliveError("lease not found".into()),
                ErrorKind::NotFound,
            ),
            (
                EtcdError::WatchError("closed".into()),
                ErrorKind::Unavailable,
            ),
            (
                EtcdError::InvalidArgs("empty endpoints".into()),
                ErrorKind::InvalidInput,
            ),
        ];
        for (err, kind) in cases {
            let e = map(err, "put /aether/services/api/a");
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains("/aether/services/api/a"), "{e}");
        }
    }

    #[test]
    fn detects_lost_leases_and_compaction() {
        assert!(is_lease_not_found(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert!(is_lease_not_found(&EtcdError::LeaseKeepAliveError(
            "lease not found".into()
        )));
        assert!(!is_lease_not_found(&status(Code::Unavailable, "x")));
        assert!(is_compacted(&status(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )));
    }
}
