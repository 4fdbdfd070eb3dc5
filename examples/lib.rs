#![doc = include_str!("README.md")]

pub mod greeter;

/// The workspace README, so that its code compiles as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct WorkspaceReadme;

/// docs/combinators.md, so that its code compiles as doctests.
#[doc = include_str!("../docs/combinators.md")]
#[cfg(doctest)]
pub struct CombinatorsDoc;

/// The outcome of an example's `run` as its exit code: on an error, one
/// line on stderr — the error and each of its causes, separated by `: ` —
/// instead of the `Debug` dump `main` returning a `Result` prints.
///
/// ```
/// use std::process::ExitCode;
/// let failed: Result<(), Box<dyn std::error::Error>> = Err("no registry".into());
/// assert_eq!(examples::report(failed), ExitCode::FAILURE);
/// ```
pub fn report<E>(result: Result<(), E>) -> std::process::ExitCode
where
    E: std::ops::Deref,
    E::Target: std::error::Error,
{
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", one_line(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes on one line; a cause the message already quotes is
/// left out.
pub fn one_line<E: std::error::Error + ?Sized>(e: &E) -> String {
    let mut line = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_has_the_causes_without_repeats() {
        let e = waypost::Error::internal("cannot open the database").with_source(
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, "read-only\nfile"),
        );
        assert_eq!(
            super::one_line(&e),
            "internal: cannot open the database: read-only file"
        );
    }
}
