//! [`root_cause`]: an error chain told in one line.

/// The longest [`root_cause`] text, in characters.
pub const ROOT_CAUSE_CHARS: usize = 200;

/// The deepest cause of `err` on one line (whitespace collapsed), at most
/// [`ROOT_CAUSE_CHARS`] characters: what went wrong underneath a client
/// library's layers, without its internal structures. The whole chain
/// stays reachable through the error's `source()`.
///
/// ```
/// use waypost::backend::root_cause;
/// let io = std::io::Error::other("connection\n  refused");
/// let err = waypost::Error::unavailable("dial").with_source(io);
/// assert_eq!(root_cause(&err), "connection refused");
/// ```
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = err;
    while let Some(next) = deepest.source() {
        deepest = next;
    }
    deepest
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(ROOT_CAUSE_CHARS)
        .collect()
}

/// [`root_cause`], or `hint` when an error of `err`'s chain mentions
/// `word` (ASCII case ignored): for a cause the deepest error does not
/// name well, such as a missing credential several layers up.
///
/// ```
/// use waypost::backend::root_cause_or_hint;
/// let err = waypost::Error::unauthorized("no Credentials provider")
///     .with_source(std::io::Error::other("timed out"));
/// assert_eq!(root_cause_or_hint(&err, "credential", "set AWS_PROFILE"), "set AWS_PROFILE");
/// assert_eq!(root_cause_or_hint(&err, "password", "set a password"), "timed out");
/// ```
pub fn root_cause_or_hint(
    err: &(dyn std::error::Error + 'static),
    word: &str,
    hint: &str,
) -> String {
    let word = word.to_ascii_lowercase();
    let mut next = Some(err);
    while let Some(e) = next {
        if e.to_string().to_ascii_lowercase().contains(&word) {
            return hint.to_string();
        }
        next = e.source();
    }
    root_cause(err)
}

/// What [`aws_root_cause`] says of a missing AWS credential.
pub const NO_AWS_CREDENTIALS: &str = "no usable AWS credentials (set AWS_PROFILE, or \
     AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give the process a role; the error's causes \
     list each provider tried)";

/// [`root_cause`] of an AWS SDK error, or [`NO_AWS_CREDENTIALS`] when a
/// credential is missing: the one message of the AWS backends for it.
///
/// ```
/// use waypost::backend::{aws_root_cause, NO_AWS_CREDENTIALS};
/// let err = std::io::Error::other("no Credentials provider found");
/// assert_eq!(aws_root_cause(&err), NO_AWS_CREDENTIALS);
/// ```
pub fn aws_root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    root_cause_or_hint(err, "credential", NO_AWS_CREDENTIALS)
}
