//! Who is calling (the SPIFFE ID of the client certificate) and what it may
//! write.

use std::collections::BTreeSet;
use std::fmt;

use registry_registrar::tls::spiffe_id;
use tonic::{Request, Status};

/// The default SPIFFE ID of an agent: `{trust_domain}` and `{node}` are
/// replaced by the trust domain and the node name.
pub const DEFAULT_ID_PATTERN: &str = "spiffe://{trust_domain}/node/{node}";

/// Authorization of callers by their SPIFFE ID.
///
/// - Only IDs of `trust_domain` are accepted (`PERMISSION_DENIED`
///   otherwise).
/// - An ID matching `id_pattern` names a node; that caller may write (and
///   heartbeat) only endpoints of that node.
/// - IDs listed in `admin_ids` (operators) may write any endpoint.
/// - Any other ID of the trust domain may read (watch, list) only.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzConfig {
    /// The trust domain, e.g. `example.org` (without `spiffe://`).
    pub trust_domain: String,
    /// The pattern of agents' IDs; see [`DEFAULT_ID_PATTERN`].
    pub id_pattern: String,
    /// IDs that may write endpoints of any node.
    pub admin_ids: BTreeSet<String>,
}

impl AuthzConfig {
    /// Agents of `trust_domain` with the default ID pattern, no admins.
    pub fn new(trust_domain: impl Into<String>) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            id_pattern: DEFAULT_ID_PATTERN.to_string(),
            admin_ids: BTreeSet::new(),
        }
    }

    /// Set the ID pattern (must contain `{node}` once).
    pub fn with_id_pattern(mut self, pattern: impl Into<String>) -> Self {
        self.id_pattern = pattern.into();
        self
    }

    /// Allow `id` to write endpoints of any node.
    pub fn with_admin(mut self, id: impl Into<String>) -> Self {
        self.admin_ids.insert(id.into());
        self
    }
}

/// A checked [`AuthzConfig`].
#[derive(Debug, Clone)]
pub(crate) struct Authz {
    domain_prefix: String,
    before: String,
    after: String,
    admins: BTreeSet<String>,
}

impl Authz {
    pub(crate) fn new(cfg: &AuthzConfig) -> registry_api::Result<Self> {
        let td = cfg.trust_domain.trim_start_matches("spiffe://");
        if td.is_empty() || td.contains('/') {
            return Err(registry_api::Error::invalid(
                "trust_domain",
                format!("{:?} is not a trust domain name", cfg.trust_domain),
            ));
        }
        let pattern = cfg.id_pattern.replace("{trust_domain}", td);
        let mut parts = pattern.split("{node}");
        let (Some(before), Some(after), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(registry_api::Error::invalid(
                "id_pattern",
                format!("{:?} must contain {{node}} exactly once", cfg.id_pattern),
            ));
        };
        let domain_prefix = format!("spiffe://{td}/");
        if !before.starts_with(&domain_prefix) {
            return Err(registry_api::Error::invalid(
                "id_pattern",
                format!("{pattern:?} is not an ID of the trust domain {td}"),
            ));
        }
        Ok(Self {
            domain_prefix,
            before: before.to_string(),
            after: after.to_string(),
            admins: cfg.admin_ids.clone(),
        })
    }

    fn classify(&self, id: String) -> Result<Caller, Status> {
        if !id.starts_with(&self.domain_prefix) {
            return Err(Status::permission_denied(format!(
                "{id} is not of the allowed trust domain ({}…)",
                self.domain_prefix
            )));
        }
        if self.admins.contains(&id) {
            return Ok(Caller::Admin(id));
        }
        let node = id
            .strip_prefix(&self.before)
            .and_then(|rest| rest.strip_suffix(&self.after))
            .filter(|n| !n.is_empty() && !n.contains('/'))
            .map(str::to_string);
        Ok(match node {
            Some(node) => Caller::Node { id, node },
            None => Caller::Reader(id),
        })
    }
}

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Authorization is off (plaintext, or mTLS without a trust domain).
    Anyone,
    /// An operator: may write anything.
    Admin(String),
    /// The agent of `node`.
    Node { id: String, node: String },
    /// Another ID of the trust domain: reads only.
    Reader(String),
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Anyone => f.write_str("anyone"),
            Caller::Admin(id) | Caller::Reader(id) | Caller::Node { id, .. } => f.write_str(id),
        }
    }
}

impl Caller {
    /// May this caller write an endpoint of `node`?
    pub(crate) fn may_write(&self, node: &str) -> Result<(), Status> {
        match self {
            Caller::Anyone | Caller::Admin(_) => Ok(()),
            Caller::Node { node: own, .. } if own == node => Ok(()),
            Caller::Node { id, node: own } => Err(Status::permission_denied(format!(
                "{id} is the agent of node {own:?} and may not write endpoints of node {node:?}"
            ))),
            Caller::Reader(id) => Err(Status::permission_denied(format!(
                "{id} names no node and is not an admin: it may only read"
            ))),
        }
    }
}

/// How requests are authenticated.
#[derive(Debug, Clone, Default)]
pub(crate) struct Security {
    /// Connections are mTLS: a request without a client certificate is
    /// `UNAUTHENTICATED`.
    pub(crate) tls: bool,
    /// Authorization by SPIFFE ID (needs `tls`).
    pub(crate) authz: Option<Authz>,
}

impl Security {
    /// Identify the caller of `req`.
    pub(crate) fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if !self.tls {
            return Ok(Caller::Anyone);
        }
        let certs = req.peer_certs();
        let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
            return Err(Status::unauthenticated(
                "no client certificate: this registrar requires mTLS",
            ));
        };
        let Some(authz) = &self.authz else {
            return Ok(Caller::Anyone);
        };
        match spiffe_id(leaf) {
            Ok(Some(id)) => authz.classify(id),
            Ok(None) => Err(Status::permission_denied(
                "the client certificate carries no SPIFFE ID (URI SAN)",
            )),
            Err(e) => Err(Status::unauthenticated(format!("client certificate: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_are_classified_by_pattern_domain_and_admins() {
        let a =
            Authz::new(&AuthzConfig::new("example.org").with_admin("spiffe://example.org/ops/cli"))
                .unwrap();
        assert_eq!(
            a.classify("spiffe://example.org/node/n1".into()).unwrap(),
            Caller::Node {
                id: "spiffe://example.org/node/n1".into(),
                node: "n1".into()
            }
        );
        assert!(matches!(
            a.classify("spiffe://example.org/ops/cli".into()).unwrap(),
            Caller::Admin(_)
        ));
        assert!(matches!(
            a.classify("spiffe://example.org/node/a/b".into()).unwrap(),
            Caller::Reader(_)
        ));
        let e = a.classify("spiffe://evil.org/node/n1".into()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        // A look-alike domain is not the trust domain.
        assert!(a
            .classify("spiffe://example.org.evil/node/n1".into())
            .is_err());

        let custom = Authz::new(
            &AuthzConfig::new("td").with_id_pattern("spiffe://{trust_domain}/ns/x/sa/agent-{node}"),
        )
        .unwrap();
        assert!(matches!(
            custom.classify("spiffe://td/ns/x/sa/agent-n7".into()).unwrap(),
            Caller::Node { node, .. } if node == "n7"
        ));
        assert!(Authz::new(&AuthzConfig::new("td").with_id_pattern("spiffe://td/x")).is_err());
        assert!(
            Authz::new(&AuthzConfig::new("td").with_id_pattern("spiffe://other/{node}")).is_err()
        );
    }

    #[test]
    fn nodes_write_only_their_own() {
        let n1 = Caller::Node {
            id: "spiffe://td/node/n1".into(),
            node: "n1".into(),
        };
        assert!(n1.may_write("n1").is_ok());
        assert_eq!(
            n1.may_write("n2").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            n1.may_write("").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert!(Caller::Admin("x".into()).may_write("n2").is_ok());
        assert!(Caller::Reader("x".into()).may_write("n2").is_err());
    }
}
