//! The limits every endpoint is checked against
//! ([`crate::backend::validate_endpoint`], called by every backend before it
//! writes, and [`crate::Endpoint::validate`]).
//!
//! Names (`service`, `id`, `address`, `cluster`, `node`, label keys) are
//! at most [`MAX_NAME_LEN`] bytes of any script, without control
//! characters, whitespace, or invisible format characters (Unicode
//! category Cf: zero-width spaces and joiners, the bidirectional overrides
//! and isolates U+202A–U+202E and U+2066–U+2069, the byte order mark), so
//! that two names that look alike are alike; see
//! [`crate::backend::forbidden_in_name`]. Errors quote at most
//! [`crate::backend::QUOTE_BYTES`] bytes of an offending value.
//!
//! They are chosen so that names fit a DNS name (253 bytes) and a whole
//! endpoint fits comfortably in an etcd value and a DynamoDB item.
//! Backends that store less say so in their [`crate::Capabilities`]
//! (`max_labels`, `max_encoded_len`; Cloud Map allows 30 attributes and
//! 5,000 characters per instance) and refuse more with `InvalidInput`.

use crate::model::Endpoint;

/// Longest `service`, `id`, `address`, `cluster` or `node`, in bytes.
pub const MAX_NAME_LEN: usize = 253;
/// Most labels on one endpoint.
pub const MAX_LABELS: usize = 64;
/// Longest label key, in bytes (at least 1).
pub const MAX_LABEL_KEY_LEN: usize = 128;
/// Longest label value, in bytes (may be empty).
pub const MAX_LABEL_VALUE_LEN: usize = 1024;
/// Largest endpoint: the sum of the lengths of every string in it
/// (names, address, label keys and values) plus 16 bytes for the fixed
/// fields.
pub const MAX_ENCODED_LEN: usize = 16 * 1024;

/// The size [`MAX_ENCODED_LEN`] is checked against.
pub fn encoded_len(e: &Endpoint) -> usize {
    let labels: usize = e.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
    e.service.len() + e.id.len() + e.address.len() + e.cluster.len() + e.node.len() + labels + 16
}
