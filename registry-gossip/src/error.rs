//! The one place where this crate's failures become [`waypost::Error`].

use std::net::SocketAddr;

use waypost::Error;

/// A configuration value that cannot work.
pub(crate) fn config(field: &str, reason: impl Into<String>) -> Error {
    Error::invalid(field, reason)
}

/// Binding or inspecting the UDP socket failed.
pub(crate) fn socket(addr: SocketAddr, err: std::io::Error) -> Error {
    let message = format!("gossip socket {addr}: {err}");
    match err.kind() {
        std::io::ErrorKind::PermissionDenied => Error::Unauthorized {
            message,
            source: None,
        }
        .with_source(err),
        std::io::ErrorKind::InvalidInput => Error::invalid("bind", message),
        _ => Error::unavailable(message).with_source(err),
    }
}

/// A heartbeat named a node that is neither this one nor a live member.
pub(crate) fn unknown_node(node: &str) -> Error {
    Error::not_found(format!("gossip node {node:?} is not a live member"))
}

/// A batch larger than the configured maximum.
pub(crate) fn batch_too_large(len: usize, max: usize) -> Error {
    Error::invalid("ops", format!("{len} ops, more than max_batch {max}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::ErrorKind;

    #[test]
    fn socket_errors_map_to_precise_kinds() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 1));
        let in_use = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        assert_eq!(socket(addr, in_use).kind(), ErrorKind::Unavailable);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(socket(addr, denied).kind(), ErrorKind::Unauthorized);
        assert_eq!(unknown_node("x").kind(), ErrorKind::NotFound);
        assert_eq!(batch_too_large(3, 2).kind(), ErrorKind::InvalidInput);
    }
}
