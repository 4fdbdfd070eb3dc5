//! The one validation every backend calls before it writes, against the
//! limits in [`crate::limits`], and the rule for batches. Backends reach
//! it through [`crate::backend`]; callers through [`Endpoint::validate`].

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

use crate::error::{quote, Error, Result};
use crate::limits::*;
use crate::model::{Endpoint, Op};

/// A character a name must not contain: control characters, whitespace,
/// and the invisible format characters (Unicode category Cf: zero-width
/// spaces and joiners, the bidirectional overrides and isolates
/// U+202A–U+202E and U+2066–U+2069, the byte order mark), which let two
/// names that look the same differ.
pub fn forbidden_in_name(c: char) -> bool {
    c.is_control() || c.is_whitespace() || c.general_category() == GeneralCategory::Format
}

fn describe(c: char) -> String {
    if c.general_category() == GeneralCategory::Format {
        format!(
            "the invisible or direction-changing character U+{:04X}",
            c as u32
        )
    } else {
        format!("the forbidden character {c:?} (U+{:04X})", c as u32)
    }
}

/// Check an endpoint against every limit of [`crate::limits`].
///
/// Rules:
/// - `service`, `id`, `address`: 1 to [`MAX_NAME_LEN`] bytes, no control
///   characters, no whitespace and no invisible format characters
///   ([`forbidden_in_name`]).
/// - `cluster`, `node`: 0 to [`MAX_NAME_LEN`] bytes, same characters.
/// - `port`: 1 to 65535.
/// - at most [`MAX_LABELS`] labels; keys 1 to [`MAX_LABEL_KEY_LEN`] bytes
///   with the same characters as names; values up to
///   [`MAX_LABEL_VALUE_LEN`] bytes without control characters.
/// - the traffic labels ([`crate::traffic::validate_labels`]): `weight` a
///   whole number from 1 to [`crate::traffic::MAX_WEIGHT`], `zone` and
///   `region` plain label values.
/// - the whole endpoint at most [`MAX_ENCODED_LEN`] bytes ([`encoded_len`]).
///
/// The error is [`Error::InvalidInput`] naming the field and the limit;
/// it quotes at most [`QUOTE_BYTES`](crate::error::QUOTE_BYTES) bytes of an offending value
/// ([`quote`]).
///
/// ```
/// use waypost::backend::validate_endpoint;
/// use waypost::{Endpoint, ErrorKind};
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
        let field = || format!("labels[{}]", quote(k));
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
        if let Some(c) = k.chars().find(|c| forbidden_in_name(*c)) {
            return Err(Error::invalid(
                field(),
                format!("key contains {}", describe(c)),
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
                format!("value contains the control character U+{:04X}", c as u32),
            ));
        }
    }
    crate::traffic::validate_labels(e)?;
    let len = encoded_len(e);
    if len > MAX_ENCODED_LEN {
        return Err(Error::invalid(
            "endpoint",
            format!("encoded size is {len} bytes, larger than the limit of {MAX_ENCODED_LEN}"),
        ));
    }
    Ok(())
}

impl Endpoint {
    /// Check every field against the limits in [`crate::limits`]; see
    /// [`crate::backend::validate_endpoint`].
    pub fn validate(&self) -> Result<(), Error> {
        validate_endpoint(self)
    }
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
/// use waypost::backend::check_batch;
/// use waypost::{Endpoint, Op};
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
                "{} is {} bytes, longer than the limit of {MAX_NAME_LEN}",
                quote(value),
                value.len()
            ),
        ));
    }
    if let Some(c) = value.chars().find(|c| forbidden_in_name(*c)) {
        return Err(Error::invalid(
            field,
            format!("{} contains {}", quote(value), describe(c)),
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
    fn invisible_and_bidi_characters_are_refused_by_name() {
        for c in [
            '\u{200B}', '\u{200D}', '\u{202E}', '\u{2066}', '\u{FEFF}', '\u{00AD}',
        ] {
            let e = Endpoint::new(format!("pay{c}ments"), "i", "h", 1);
            let err = validate_endpoint(&e).unwrap_err();
            assert_eq!(field_of(&e), "service");
            assert!(
                err.to_string().contains(&format!("U+{:04X}", c as u32)),
                "{err}"
            );
            let e = Endpoint::new("s", "i", "h", 1).with_label(format!("zo{c}ne"), "a");
            assert!(field_of(&e).starts_with("labels["), "{c:?}");
        }
        // Letters of every script are fine.
        assert!(validate_endpoint(&Endpoint::new("платежи", "ид", "h", 1)).is_ok());
    }

    #[test]
    fn errors_quote_a_bounded_prefix() {
        let huge = "k".repeat(1_000_000);
        let e = Endpoint::new("s", "i", "h", 1).with_label(huge.clone(), "v");
        let err = validate_endpoint(&e).unwrap_err().to_string();
        assert!(err.len() < 300, "{} bytes: {}", err.len(), &err[..200]);
        assert!(err.contains("(1000000 bytes)"), "{err}");
        let err = check_name("service", &huge, true).unwrap_err().to_string();
        assert!(err.len() < 300, "{} bytes", err.len());
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
