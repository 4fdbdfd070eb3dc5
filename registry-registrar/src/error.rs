//! The one mapping between `waypost::Error` and gRPC statuses, both
//! directions: the registrar answers with [`status_from_error`], clients
//! read its answers with [`error_from_status`].

use tonic::{Code, Status};
use waypost::{Error, ErrorKind};

/// Our error as a gRPC status (server side).
pub fn status_from_error(e: &Error) -> Status {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::InvalidInput => Status::invalid_argument(msg),
        ErrorKind::NotFound => Status::not_found(msg),
        ErrorKind::Conflict => Status::aborted(msg),
        ErrorKind::Unavailable => Status::unavailable(msg),
        ErrorKind::Throttled | ErrorKind::Overloaded => Status::resource_exhausted(msg),
        ErrorKind::Unauthorized => Status::permission_denied(msg),
        _ => Status::internal(msg),
    }
}

/// The chain of causes below a status (why a connection failed), as
/// `": cause: cause"`, without repeats.
fn causes(s: &Status) -> String {
    let mut out = String::new();
    let mut seen = vec![s.message().to_string()];
    let mut next = std::error::Error::source(s);
    while let Some(e) = next {
        let text = e.to_string();
        if !seen.iter().any(|t| t.contains(&text)) {
            out.push_str(": ");
            out.push_str(&text);
            seen.push(text);
        }
        next = e.source();
    }
    out
}

/// A gRPC status as our error (client side); `addr` is the registrar's
/// address, named in connection errors.
pub fn error_from_status(s: &Status, addr: &str) -> Error {
    let msg = s.message().to_string();
    match s.code() {
        Code::InvalidArgument | Code::OutOfRange => {
            // The server's message is already "invalid <field>: <reason>".
            let body = msg.strip_prefix("invalid ").unwrap_or(&msg);
            match body.split_once(": ") {
                Some((field, reason)) => Error::invalid(field, reason),
                None => Error::invalid("request", msg),
            }
        }
        Code::NotFound => Error::not_found(msg),
        Code::Aborted | Code::AlreadyExists | Code::FailedPrecondition => Error::conflict(msg),
        Code::ResourceExhausted => Error::overloaded(format!("registrar {addr}: {msg}")),
        Code::PermissionDenied | Code::Unauthenticated => {
            Error::unauthorized(format!("registrar {addr}: {msg}"))
        }
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            Error::unavailable(format!("registrar {addr}: {msg}{}", causes(s)))
                .with_source(s.clone())
        }
        _ => Error::internal(format!("registrar {addr}: {msg}")).with_source(s.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_errors_map_both_ways() {
        let e = Error::invalid("endpoint.port", "0 is not a port");
        let s = status_from_error(&e);
        assert_eq!(s.code(), Code::InvalidArgument);
        let back = error_from_status(&s, "127.0.0.1:1");
        assert_eq!(back.to_string(), e.to_string());
        let s = Status::unavailable("connection refused");
        let back = error_from_status(&s, "127.0.0.1:9");
        assert_eq!(back.kind(), ErrorKind::Unavailable);
        assert!(back.to_string().contains("127.0.0.1:9"));
    }
}
