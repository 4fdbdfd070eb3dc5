//! [`Status`]: a Consul check's state.

use serde::{Deserialize, Serialize};

/// A check's state, as Consul names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// Healthy.
    Passing,
    /// Serving, but something is off: still healthy for the registry.
    Warning,
    /// Not serving: the endpoint is unhealthy.
    Critical,
}

impl Status {
    /// `passing`, `warning` or `critical`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Passing => "passing",
            Status::Warning => "warning",
            Status::Critical => "critical",
        }
    }

    /// A status from Consul's name for it.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "passing" => Some(Status::Passing),
            "warning" => Some(Status::Warning),
            "critical" => Some(Status::Critical),
            _ => None,
        }
    }
}
