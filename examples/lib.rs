#![doc = include_str!("README.md")]

pub mod greeter;

/// The workspace README, so that its code compiles as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct WorkspaceReadme;
