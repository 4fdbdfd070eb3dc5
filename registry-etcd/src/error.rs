//! The one place where etcd's errors become [`waypost::Error`]s.
//!
//! Every message names what was being done and on which key, endpoint or
//! node (`what`), so that a log line alone says what failed; keys and
//! values are quoted at most [`QUOTE_MAX`] characters long.
//!
//! | etcd / client | kind |
//! | --- | --- |
//! | no connection, a reset stream, `Unavailable` (no leader, leader changed, request timed out, stopping), `DeadlineExceeded`, `Cancelled`, `not leader` / `not capable` | `Unavailable` (transient) |
//! | `ResourceExhausted` "too many requests" | `Throttled` (transient) |
//! | a revision compacted or from the future (`OutOfRange`), `Aborted`, `AlreadyExists`, an auth store revision that changed under the request | `Conflict` (transient: retrying works) |
//! | `Unauthenticated`, `PermissionDenied`, a refused user or password, an invalid token, auth not enabled | `Unauthorized` |
//! | a lease that does not exist (`NotFound`) | `NotFound` |
//! | a request etcd can never accept (`InvalidArgument`: too many ops, request too large, duplicate key; a message over the gRPC size limit; a lease TTL over etcd's maximum) | `InvalidInput` naming what was sent |
//! | the NOSPACE alarm (`database space exceeded`): etcd refuses every write until an operator compacts, defragments and disarms | `Internal` |
//! | `DataLoss` (corrupt cluster), `Unimplemented`, `Internal`, `Unknown` from etcd, anything else | `Internal` |

use std::fmt::Display;

use etcd_client::Error as EtcdError;
use tonic::Code;
use waypost::Error;

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
            let text = source.message();
            match kind {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                    Error::unavailable(msg).with_source(source)
                }
                Code::FailedPrecondition
                    if text.contains("not leader") || text.contains("not capable") =>
                {
                    Error::unavailable(msg).with_source(source)
                }
                Code::ResourceExhausted if text.contains("database space exceeded") => {
                    Error::internal(format!(
                        "{msg}: etcd's NOSPACE alarm refuses every write until an operator \
                         compacts, defragments and disarms it"
                    ))
                    .with_source(source)
                }
                Code::ResourceExhausted if text.contains("larger than max") => {
                    Error::invalid(what, format!("too large for etcd: {}", short(text)))
                }
                Code::OutOfRange if text.contains("lease TTL") => Error::invalid(
                    "lease_ttl",
                    format!("{what}: etcd refused the lease TTL: {}", short(text)),
                ),
                Code::InvalidArgument if text.contains("revision of auth store is old") => {
                    Error::conflict(msg)
                }
                Code::ResourceExhausted => Error::throttled(msg).with_source(source),
                Code::Unauthenticated | Code::PermissionDenied => {
                    Error::unauthorized(msg).with_source(source)
                }
                Code::FailedPrecondition | Code::InvalidArgument
                    if about_auth(source.message()) =>
                {
                    Error::unauthorized(msg).with_source(source)
                }
                Code::NotFound => Error::not_found(msg),
                Code::OutOfRange | Code::Aborted | Code::AlreadyExists => Error::conflict(msg),
                Code::InvalidArgument => Error::invalid(what, short(text)),
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
        EtcdError::LeaseKeepAliveError(e) if e.contains("not found") => {
            Error::not_found(format!("{what}: {e}"))
        }
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

/// Longest stretch of a key or value an error message quotes.
pub(crate) const QUOTE_MAX: usize = 96;

/// `s` cut to at most [`QUOTE_MAX`] characters (`…` marks a cut), so an
/// error never carries a whole value.
pub(crate) fn short(s: &str) -> String {
    waypost::backend::prefix(s, QUOTE_MAX).into_owned()
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
    Error::internal(format!(
        "corrupt record at etcd key {:?}: {}",
        short(key),
        short(&reason.to_string())
    ))
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
    use waypost::ErrorKind;

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
            let e = map(err, "put /registry/services/api/a");
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains("/registry/services/api/a"), "{e}");
        }
    }

    #[test]
    fn transient_and_permanent_refusals_are_told_apart() {
        let cases = [
            // A follower that lost its leader answers this: retry elsewhere.
            (
                status(Code::FailedPrecondition, "etcdserver: not leader"),
                ErrorKind::Unavailable,
            ),
            (
                status(Code::Unavailable, "etcdserver: request timed out"),
                ErrorKind::Unavailable,
            ),
            (
                status(Code::DeadlineExceeded, "etcd did not answer within 2s"),
                ErrorKind::Unavailable,
            ),
            // The NOSPACE alarm stays until an operator acts.
            (
                status(
                    Code::ResourceExhausted,
                    "etcdserver: mvcc: database space exceeded",
                ),
                ErrorKind::Internal,
            ),
            (
                status(
                    Code::ResourceExhausted,
                    "grpc: received message larger than max (3000000 vs. 2097152)",
                ),
                ErrorKind::InvalidInput,
            ),
            (
                status(Code::InvalidArgument, "etcdserver: request is too large"),
                ErrorKind::InvalidInput,
            ),
            (
                status(Code::OutOfRange, "etcdserver: too large lease TTL"),
                ErrorKind::InvalidInput,
            ),
            (
                status(
                    Code::InvalidArgument,
                    "etcdserver: revision of auth store is old",
                ),
                ErrorKind::Conflict,
            ),
            (
                status(
                    Code::InvalidArgument,
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                ErrorKind::Unauthorized,
            ),
            (
                status(Code::DataLoss, "etcdserver: corrupt cluster"),
                ErrorKind::Internal,
            ),
        ];
        for (err, kind) in cases {
            let e = map(err, "put /registry/services/api/a");
            assert_eq!(e.kind(), kind, "{e}");
            assert_eq!(
                e.is_retryable(),
                matches!(
                    kind,
                    ErrorKind::Unavailable | ErrorKind::Throttled | ErrorKind::Conflict
                ),
                "{e}"
            );
        }
        let e = map(
            status(Code::OutOfRange, "etcdserver: too large lease TTL"),
            "grant a lease for node n",
        );
        assert!(
            matches!(&e, waypost::Error::InvalidInput { field, .. } if field == "lease_ttl"),
            "{e:?}"
        );
    }

    #[test]
    fn quotes_are_short() {
        let long = "x".repeat(10_000);
        let e = corrupt(&format!("/registry/services/s/{long}"), &long);
        assert!(e.to_string().len() < 2 * QUOTE_MAX + 100, "{e}");
        assert_eq!(short("abc"), "abc");
        assert_eq!(short(&long).chars().count(), QUOTE_MAX + 1);
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
