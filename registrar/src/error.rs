//! The CLI's errors and how they are printed: one line with the root
//! cause by default, the whole chain with `-v`.

use std::error::Error as StdError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A failure its message describes in full (a bad flag combination,
    /// a listener that cannot bind).
    #[error("{0}")]
    Message(String),
    /// A call to the registrar or a backend that failed.
    #[error("{context}: {source}")]
    Registry {
        /// What was being done, and where.
        context: String,
        /// The registry's error.
        #[source]
        source: waypost::Error,
    },
}

impl CliError {
    /// `source` while doing `context`.
    pub fn registry(context: impl Into<String>, source: waypost::Error) -> Self {
        CliError::Registry {
            context: context.into(),
            source,
        }
    }
}

impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError::Message(message)
    }
}

/// Longest cause shown on the one-line form, in characters.
const CAUSE_CHARS: usize = 160;

/// `err` for a terminal: one line, with the deepest cause not already in
/// the message appended (shortened); with `verbose`, every cause of the
/// chain on a line of its own.
pub fn report(err: &(dyn StdError + 'static), verbose: bool) -> String {
    let head = one_line(&err.to_string());
    let mut causes = Vec::new();
    let mut root = None;
    let mut next = err.source();
    while let Some(cause) = next {
        let text = one_line(&cause.to_string());
        if !text.is_empty() && !head.contains(&text) && !causes.contains(&text) {
            causes.push(text.clone());
        }
        root = Some(text);
        next = cause.source();
    }
    if verbose {
        let mut out = head;
        for c in &causes {
            out.push_str("\n  caused by: ");
            out.push_str(c);
        }
        return out;
    }
    // The deepest cause is what went wrong underneath; a message that
    // quotes its start already says it.
    match root {
        Some(root) if !root.is_empty() && !head.contains(&shorten(&root, 60).replace('…', "")) => {
            format!("{head} (cause: {})", shorten(&root, CAUSE_CHARS))
        }
        _ => head,
    }
}

/// `text` on one line: runs of whitespace (newlines included) become one
/// space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// At most `max` characters, `…` marking a cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("socket\nclosed")]
    struct Root;

    #[test]
    fn one_line_by_default_and_the_chain_with_verbose() {
        let e = CliError::registry(
            "ls at http://127.0.0.1:1",
            waypost::Error::unavailable("registrar did not answer").with_source(Root),
        );
        let short = report(&e, false);
        assert_eq!(
            short,
            "ls at http://127.0.0.1:1: unavailable: registrar did not answer (cause: socket closed)"
        );
        let long = report(&e, true);
        assert_eq!(long.lines().count(), 2, "{long}");
        assert!(long.ends_with("caused by: socket closed"), "{long}");
        let long_cause = "x".repeat(1000);
        assert!(shorten(&long_cause, CAUSE_CHARS).chars().count() == CAUSE_CHARS + 1);
    }
}
