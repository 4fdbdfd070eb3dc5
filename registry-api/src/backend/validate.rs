//! The one validation every backend calls before it writes, against the
//! limits in [`crate::limits`], and the rule for batches.

use crate::error::{Error, Result};
use crate::limits::*;
use crate::model::{Endpoint, Op};

/// Check an endpoint against every limit of [`crate::limits`].
///
/// Rules:
/// - `service`, `id`, `address`: 1 to [`MAX_NAME_LEN`] bytes, no control
///   characters and no whitespace.
/// - `cluster`, `node`: 0 to [`MAX_NAME_LEN`] bytes, same characters.
/// - `port`: 1 to 65535.
/// - at most [`MAX_LABELS`] labels; keys 1 to [`MAX_LABEL_KEY_LEN`] bytes
///   without control characters or whitespace; values up to
///   [`MAX_LABEL_VALUE_LEN`] bytes without control characters.
/// - the whole endpoint at most [`MAX_ENCODED_LEN`] bytes ([`encoded_len`]).
///
/// The error is [`Error::InvalidInput`] naming the field and the limit.
///
/// ```
/// use registry_api::backend::validate_endpoint;
/// use registry_api::{Endpoint, ErrorKind};
/// let bad = Endpoint::new("payments", "", "10.0.0.1", 80);
/// let err = validate_endpoint(&bad).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// assert!(err.to_string().contains("id"));
/// ```
pub fn validate_endpoint(e: &Endpoint) -> Result<(), Error> {
    check_name("service", &e.service, true)?;
    check_name("id", &e.id, true)?;
    check_name("address", &e.address, true)?;
    check_name("cluster", &e.cluster, false)?;
    check_name("node", &e.node, false)?;
    if e.port == 0 {
        return Err(Error::invalid("port", "must be between 1 and 65535, got 0"));
    }
    if e.labels.len() > MAX_LABELS {
        return Err(Error::invalid(
            "labels",
            format!(
                "{} labels, more than the limit of {MAX_LABELS}",
                e.labels.len()
            ),
        ));
    }
    for (k, v) in &e.labels {
        let field = || format!("labels[{k:?}]");
        if k.is_empty() {
            return Err(Error::invalid("labels", "a label key is empty"));
        }
        if k.len() > MAX_LABEL_KEY_LEN {
            return Err(Error::invalid(
                field(),
                format!(
                    "key is {} bytes, longer than the limit of {MAX_LABEL_KEY_LEN}",
                    k.len()
                ),
            ));
        }
        if let Some(c) = k.chars().find(|c| c.is_control() || c.is_whitespace()) {
            return Err(Error::invalid(
                field(),
                format!("key contains the forbidden character {c:?}"),
            ));
        }
        if v.len() > MAX_LABEL_VALUE_LEN {
            return Err(Error::invalid(
                field(),
                format!(
                    "value is {} bytes, longer than the limit of {MAX_LABEL_VALUE_LEN}",
                    v.len()
                ),
            ));
        }
        if let Some(c) = v.chars().find(|c| c.is_control()) {
            return Err(Error::invalid(
                field(),
                format!("value contains the control character {c:?}"),
            ));
        }
    }
    let len = encoded_len(e);
    if len > MAX_ENCODED_LEN {
        return Err(Error::invalid(
            "endpoint",
            format!("encoded size is {len} bytes, larger than the limit of {MAX_ENCODED_LEN}"),
        ));
    }
    Ok(())
}

/// Validate every op of a batch, naming the op's index in the error
/// (`ops[3].port`).
pub fn validate_ops(ops: &[Op]) -> Result<()> {
    for (i, op) in ops.iter().enumerate() {
        op.validate()
            .map_err(|e| e.in_field(&format!("ops[{i}].")))?;
    }
    Ok(())
}

/// The rule for batches every backend applies (see [`crate::Batch`]):
/// every op valid, and at most `max` of them; otherwise `InvalidInput`
/// naming the op or `ops`, and nothing is written.
///
/// ```
/// use registry_api::backend::check_batch;
/// use registry_api::{Endpoint, Op};
/// let ops = vec![Op::Register(Endpoint::new("s", "a", "h", 1)); 3];
/// assert!(check_batch(&ops, 3).is_ok());
/// assert!(check_batch(&ops, 2).unwrap_err().to_string().contains("at most 2"));
/// ```
pub fn check_batch(ops: &[Op], max: usize) -> Result<()> {
    if ops.len() > max {
        return Err(Error::invalid(
            "ops",
            format!(
                "a batch of {} ops; this backend takes at most {max} in one call \
                 (split it, or queue it with Coalescing)",
                ops.len()
            ),
        ));
    }
    validate_ops(ops)
}

/// Check one name field: length and characters (see [`validate_endpoint`]).
pub fn check_name(field: &str, value: &str, required: bool) -> Result<(), Error> {
    if required && value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes, longer than the limit of {MAX_NAME_LEN}",
                value.len()
            ),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::invalid(
            field,
            format!("contains the forbidden character {c:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn field_of(e: &Endpoint) -> String {
        match validate_endpoint(e) {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn each_rule_names_its_field() {
        let ok = Endpoint::new("s", "i", "127.0.0.1", 1);
        assert!(validate_endpoint(&ok).is_ok());
        let mut e = ok.clone();
        e.service = "a b".into();
        assert_eq!(field_of(&e), "service");
        let mut e = ok.clone();
        e.address = String::new();
        assert_eq!(field_of(&e), "address");
        let mut e = ok.clone();
        e.node = "n\u{7}".into();
        assert_eq!(field_of(&e), "node");
        let mut e = ok.clone();
        e.port = 0;
        assert_eq!(field_of(&e), "port");
        let e = ok.clone().with_label("zone", "a\nb");
        assert_eq!(field_of(&e), "labels[\"zone\"]");
        let e = ok.clone().with_label("", "x");
        assert_eq!(field_of(&e), "labels");
    }

    #[test]
    fn limits_are_inclusive() {
        let mut e = Endpoint::new("s".repeat(MAX_NAME_LEN), "i", "h", 1);
        assert!(validate_endpoint(&e).is_ok());
        e.service.push('s');
        let err = validate_endpoint(&e).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("253"), "{err}");
    }

    #[test]
    fn total_size_is_bounded() {
        let mut e = Endpoint::new("s", "i", "h", 1);
        for i in 0..MAX_LABELS {
            e.labels
                .insert(format!("k{i:03}"), "v".repeat(MAX_LABEL_VALUE_LEN));
        }
        assert_eq!(field_of(&e), "endpoint");
    }
}
