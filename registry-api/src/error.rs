//! The one error type of the toolkit.
//!
//! Every backend maps its client's errors to [`Error`] in one place, choosing
//! the most precise [`ErrorKind`]; nothing is stringified into
//! [`ErrorKind::Internal`] when a better kind exists. Combinators decide what
//! to retry from [`Error::is_retryable`] alone, never from the backend.

use std::fmt;
use std::sync::Arc;

/// A cause carried inside an [`Error`]: shared so that an error can be cloned
/// and handed to several waiters (for example every op of a failed batch).
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `std::result::Result<T, waypost::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, independent of the backend.
///
/// Every kind carries a message naming what was involved (the field, key,
/// table or address) and may carry the client error that caused it
/// ([`Error::with_source`]). Build one with its constructor
/// ([`Error::invalid`], [`Error::not_found`], …).
///
/// ```
/// use waypost::{Error, ErrorKind};
/// let e = Error::unavailable("etcd at 127.0.0.1:2379 did not answer");
/// assert_eq!(e.kind(), ErrorKind::Unavailable);
/// assert!(e.is_retryable());
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The caller passed a value that can never be stored. `field` names the
    /// offending field (`service`, `labels["zone"]`, `ops[3].port`, …).
    /// Nothing was written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The field that was wrong, as a path into the input.
        field: String,
        /// What was wrong with it, including the limit it broke.
        reason: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// The thing named does not exist (a node unknown to a heartbeat, a
    /// table or namespace that is missing).
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for.
        what: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// A concurrent change won (a failed compare-and-swap, a transaction
    /// cancelled by a condition). Retrying may succeed.
    #[error("conflict: {what}")]
    Conflict {
        /// What conflicted.
        what: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// The backend could not be reached or did not answer in time.
    #[error("unavailable: {message}")]
    Unavailable {
        /// What was tried and where.
        message: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// The backend asked us to slow down.
    #[error("throttled: {message}")]
    Throttled {
        /// What was throttled.
        message: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// A local bound was reached (a full write queue, a slow subscriber cut
    /// off). Nothing already accepted was dropped.
    #[error("overloaded: {message}")]
    Overloaded {
        /// Which bound was reached.
        message: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// The caller is not allowed to do this, or could not be authenticated.
    #[error("unauthorized: {message}")]
    Unauthorized {
        /// What was refused.
        message: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
    /// A bug, a corrupt record, or an error with no better kind.
    #[error("internal: {message}")]
    Internal {
        /// What happened.
        message: String,
        /// The client's error, if any.
        #[source]
        source: Option<Cause>,
    },
}

/// The category of an [`Error`], for matching without caring about details.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// See [`Error::InvalidInput`].
    InvalidInput,
    /// See [`Error::NotFound`].
    NotFound,
    /// See [`Error::Conflict`].
    Conflict,
    /// See [`Error::Unavailable`].
    Unavailable,
    /// See [`Error::Throttled`].
    Throttled,
    /// See [`Error::Overloaded`].
    Overloaded,
    /// See [`Error::Unauthorized`].
    Unauthorized,
    /// See [`Error::Internal`].
    Internal,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::NotFound => "not found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Throttled => "throttled",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Internal => "internal",
        };
        f.write_str(s)
    }
}

impl Error {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput { .. } => ErrorKind::InvalidInput,
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::Conflict { .. } => ErrorKind::Conflict,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Throttled { .. } => ErrorKind::Throttled,
            Error::Overloaded { .. } => ErrorKind::Overloaded,
            Error::Unauthorized { .. } => ErrorKind::Unauthorized,
            Error::Internal { .. } => ErrorKind::Internal,
        }
    }

    /// Whether trying the same request again later may succeed: true for
    /// `Unavailable`, `Throttled`, `Conflict` and `Overloaded` (transient).
    /// The others are permanent: the same request fails the same way until
    /// something outside changes.
    ///
    /// `Conflict` is transient but not unboundedly so: a retry loop should
    /// give it a few attempts, then treat it as a permanent refusal of the
    /// request ([`Error::is_request_fault`]).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Unavailable
                | ErrorKind::Throttled
                | ErrorKind::Conflict
                | ErrorKind::Overloaded
        )
    }

    /// Whether the request itself is at fault (`InvalidInput`, `Conflict`):
    /// other requests to the same backend may well succeed. The other
    /// permanent kinds (`NotFound`, `Unauthorized`, `Internal`) met on a
    /// write mean the backend refuses writes as such (a read-only or
    /// corrupt file, a missing table, revoked permissions) until someone
    /// fixes it.
    ///
    /// ```
    /// use waypost::Error;
    /// assert!(Error::invalid("port", "0 is not a port").is_request_fault());
    /// assert!(!Error::internal("database disk image is malformed").is_request_fault());
    /// ```
    pub fn is_request_fault(&self) -> bool {
        matches!(self.kind(), ErrorKind::InvalidInput | ErrorKind::Conflict)
    }

    /// An [`Error::InvalidInput`] for `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field: field.into(),
            reason: reason.into(),
            source: None,
        }
    }

    /// An [`Error::NotFound`].
    pub fn not_found(what: impl Into<String>) -> Self {
        Error::NotFound {
            what: what.into(),
            source: None,
        }
    }

    /// An [`Error::Conflict`].
    pub fn conflict(what: impl Into<String>) -> Self {
        Error::Conflict {
            what: what.into(),
            source: None,
        }
    }

    /// An [`Error::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Throttled`].
    pub fn throttled(message: impl Into<String>) -> Self {
        Error::Throttled {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Overloaded`].
    pub fn overloaded(message: impl Into<String>) -> Self {
        Error::Overloaded {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Unauthorized`].
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Error::Unauthorized {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Error::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal {
            message: message.into(),
            source: None,
        }
    }

    /// Attach the client error that caused this one (any kind).
    pub fn with_source(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        let cause: Cause = Arc::new(cause);
        match &mut self {
            Error::InvalidInput { source, .. }
            | Error::NotFound { source, .. }
            | Error::Conflict { source, .. }
            | Error::Unavailable { source, .. }
            | Error::Throttled { source, .. }
            | Error::Overloaded { source, .. }
            | Error::Unauthorized { source, .. }
            | Error::Internal { source, .. } => *source = Some(cause),
        }
        self
    }

    /// Prefix `field` with `prefix` on an `InvalidInput` error (used to
    /// point into a batch: `ops[3].` + `port`). Other kinds are unchanged.
    pub fn in_field(self, prefix: &str) -> Self {
        match self {
            Error::InvalidInput {
                field,
                reason,
                source,
            } => Error::InvalidInput {
                field: format!("{prefix}{field}"),
                reason,
                source,
            },
            other => other,
        }
    }
}

/// How many bytes of an offending value an error quotes.
pub const QUOTE_BYTES: usize = 64;

/// A value as an error quotes it: in quotes, at most [`QUOTE_BYTES`] bytes
/// of it, and its length when it was cut, so that an error about a huge
/// value stays small.
///
/// ```
/// use waypost::error::quote;
/// assert_eq!(quote("zone"), "\"zone\"");
/// let q = quote(&"x".repeat(1_000_000));
/// assert!(q.len() < 100 && q.ends_with("(1000000 bytes)"), "{q}");
/// ```
pub fn quote(value: &str) -> String {
    if value.len() <= QUOTE_BYTES {
        return format!("{value:?}");
    }
    let mut end = QUOTE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &value[..end], value.len())
}

/// `value` cut to its first `max_chars` characters, with `…` when cut:
/// the bounded prefix an error message quotes of a value it names.
///
/// ```
/// use waypost::error::prefix;
/// assert_eq!(prefix("zone", 10), "zone");
/// assert_eq!(prefix("abcdef", 3), "abc…");
/// ```
pub fn prefix(value: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match value.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &value[..at]).into(),
        None => value.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_kinds() {
        assert!(Error::unavailable("x").is_retryable());
        assert!(Error::overloaded("x").is_retryable());
        assert!(!Error::invalid("service", "empty").is_retryable());
        assert!(!Error::internal("x").is_retryable());
    }

    #[test]
    fn message_names_field_and_source_is_kept() {
        let e = Error::invalid("labels[\"zone\"]", "longer than 1024 bytes").in_field("ops[2].");
        assert_eq!(
            e.to_string(),
            "invalid ops[2].labels[\"zone\"]: longer than 1024 bytes"
        );
        let io = std::io::Error::other("connection refused");
        let e = Error::unavailable("etcd 127.0.0.1:1").with_source(io);
        let src = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(src.as_deref(), Some("connection refused"));
        // Every kind keeps its cause.
        for e in [
            Error::invalid("f", "r"),
            Error::not_found("t"),
            Error::conflict("c"),
            Error::throttled("t"),
            Error::overloaded("o"),
            Error::unauthorized("u"),
            Error::internal("i"),
        ] {
            let e = e.with_source(std::io::Error::other("cause"));
            assert!(
                std::error::Error::source(&e).is_some(),
                "{e:?} lost its cause"
            );
        }
    }
}
