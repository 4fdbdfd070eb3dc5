//! Who is calling (the SPIFFE ID of the client certificate) and what it may
//! do: the rule of the authorization [`Policy`] that matches it.

pub(crate) mod policy;
pub(crate) mod write;

pub(crate) use write::authorized_write;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use tonic::{Request, Status};
use waypost::{Endpoint, Error};
use waypost_registrar_client::tls::spiffe_id;

use crate::auth::policy::{trust_domain_name, Policy, Rule};

/// The default SPIFFE ID of an agent: `{trust_domain}` and `{node}` are
/// replaced by the trust domain and the node name.
pub const DEFAULT_ID_PATTERN: &str = "spiffe://{trust_domain}/node/{node}";

/// Authorization of callers by their SPIFFE ID.
///
/// - Only IDs of `trust_domain` are accepted (`PERMISSION_DENIED`
///   otherwise).
/// - With a policy file ([`AuthzConfig::with_policy_file`]), its rules
///   decide; see [`Policy`].
/// - Without one: an ID matching `id_pattern` names a node; that caller
///   may write (and heartbeat) only endpoints of that node in the
///   registrar's own cluster. IDs listed in `admin_ids` (operators) may
///   write any endpoint. Any ID of the trust domain may read (watch,
///   list).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthzConfig {
    /// The trust domain, e.g. `example.org` (without `spiffe://`).
    pub trust_domain: String,
    /// The pattern of agents' IDs; see [`DEFAULT_ID_PATTERN`].
    pub id_pattern: String,
    /// IDs that may write endpoints of any node.
    pub admin_ids: BTreeSet<String>,
    /// A policy file (TOML) that replaces `id_pattern` and `admin_ids`.
    pub policy_file: Option<PathBuf>,
}

impl AuthzConfig {
    /// Agents of `trust_domain` with the default ID pattern, no admins.
    pub fn new(trust_domain: impl Into<String>) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            id_pattern: DEFAULT_ID_PATTERN.to_string(),
            admin_ids: BTreeSet::new(),
            policy_file: None,
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

    /// Authorize by the rules of the policy file at `path` (see
    /// [`Policy`]) instead of the ID pattern and admins.
    pub fn with_policy_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy_file = Some(path.into());
        self
    }
}

/// A checked [`AuthzConfig`].
#[derive(Debug, Clone)]
pub(crate) struct Authz {
    domain_prefix: String,
    policy: Policy,
}

impl Authz {
    /// Check `cfg` for a registrar of cluster `cluster` (what `{cluster}`
    /// stands for); reads the policy file.
    pub(crate) fn new(cfg: &AuthzConfig, cluster: &str) -> waypost::Result<Self> {
        let td = trust_domain_name(&cfg.trust_domain)?;
        let policy = match &cfg.policy_file {
            Some(path) => {
                if cfg.id_pattern != DEFAULT_ID_PATTERN || !cfg.admin_ids.is_empty() {
                    return Err(Error::invalid(
                        "authz_policy",
                        "a policy file replaces the ID pattern and the admin IDs: \
                         write them as rules of the file",
                    ));
                }
                Policy::load(path, td, cluster)?
            }
            None => {
                if cfg.id_pattern.matches("{node}").count() != 1 {
                    return Err(Error::invalid(
                        "id_pattern",
                        format!("{:?} must contain {{node}} exactly once", cfg.id_pattern),
                    ));
                }
                Policy::builtin(td, &cfg.id_pattern, cfg.admin_ids.clone(), cluster)
                    .map_err(|e| Error::invalid("id_pattern", e.to_string()))?
            }
        };
        Ok(Self {
            domain_prefix: format!("spiffe://{td}/"),
            policy,
        })
    }

    fn classify(&self, id: String) -> Result<Caller, Status> {
        if !id.starts_with(&self.domain_prefix) {
            return Err(Status::permission_denied(format!(
                "{id} is not of the allowed trust domain ({}…)",
                self.domain_prefix
            )));
        }
        match self.policy.find(&id) {
            Some((rule, node)) => Ok(Caller::Id { id, node, rule }),
            None => Err(Status::permission_denied(format!(
                "{id}: no rule of the authorization policy matches this ID"
            ))),
        }
    }
}

/// The caller of one request.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// Authorization is off (plaintext, or mTLS allowing any certificate).
    Anyone,
    /// A SPIFFE ID, the rule that matched it and the node it names.
    Id {
        id: String,
        node: Option<String>,
        rule: Arc<Rule>,
    },
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Anyone => f.write_str("anyone"),
            Caller::Id { id, rule, .. } => write!(f, "{id} (rule {rule})"),
        }
    }
}

impl Caller {
    /// Is authorization off for this caller?
    pub(crate) fn is_anyone(&self) -> bool {
        matches!(self, Caller::Anyone)
    }

    /// The node this caller's identity names, if any.
    #[cfg(feature = "http-api")]
    pub(crate) fn node(&self) -> Option<&str> {
        match self {
            Caller::Anyone => None,
            Caller::Id { node, .. } => node.as_deref(),
        }
    }

    /// May this caller watch and list?
    pub(crate) fn may_read(&self) -> Result<(), Status> {
        match self {
            Caller::Anyone => Ok(()),
            Caller::Id { rule, .. } if rule.may_read() => Ok(()),
            Caller::Id { id, rule, .. } => Err(rule.denied(id, "it allows no reads".into())),
        }
    }

    /// May this caller write (register, or remove) `ep`?
    pub(crate) fn may_write(&self, ep: &Endpoint) -> Result<(), Status> {
        match self {
            Caller::Anyone => Ok(()),
            Caller::Id { id, node, rule } => rule.check_write(id, node.as_deref(), ep),
        }
    }

    /// May this caller heartbeat for `node`?
    pub(crate) fn may_heartbeat(&self, target: &str) -> Result<(), Status> {
        match self {
            Caller::Anyone => Ok(()),
            Caller::Id { id, node, rule } => rule.check_heartbeat(id, node.as_deref(), target),
        }
    }
}

/// How requests are authenticated.
#[derive(Debug, Clone, Default)]
pub(crate) struct Security {
    /// Connections are mTLS: a request without a client certificate is
    /// `UNAUTHENTICATED`.
    pub(crate) tls: bool,
    /// Authorization by SPIFFE ID (needs `tls`); `None` with `tls`: any
    /// certificate of the CA may do anything.
    pub(crate) authz: Option<Authz>,
}

impl Security {
    /// Identify the caller of `req`: the one [`Security::authenticate`]
    /// found, or found now.
    pub(crate) fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if let Some(c) = req.extensions().get::<Caller>() {
            return Ok(c.clone());
        }
        self.identify(req)
    }

    /// Identify the caller from the request's headers and connection alone,
    /// before its message is read (a tonic interceptor): an unauthenticated
    /// or unauthorized peer costs no more than its headers.
    pub(crate) fn authenticate(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let caller = self.identify(&req)?;
        req.extensions_mut().insert(caller);
        Ok(req)
    }

    fn identify<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if !self.tls {
            return Ok(Caller::Anyone);
        }
        let certs = req.peer_certs();
        self.identify_leaf(certs.as_ref().and_then(|c| c.first()))
    }

    /// Identify the caller of a connection that presented `leaf` (its
    /// client certificate, if any): what the gRPC port and the HTTP API
    /// both decide by.
    pub(crate) fn identify_leaf(
        &self,
        leaf: Option<&CertificateDer<'_>>,
    ) -> Result<Caller, Status> {
        if !self.tls {
            return Ok(Caller::Anyone);
        }
        let Some(leaf) = leaf else {
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

/// The interceptor that identifies every caller from its connection and
/// headers before a request message is decoded; a refused caller costs no
/// more than its headers.
#[derive(Debug, Clone)]
pub(crate) struct Authenticate(pub(crate) Arc<Security>);

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.0.authenticate(req)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use waypost::testing::ep;

    fn builtin() -> Authz {
        Authz::new(
            &AuthzConfig::new("example.org").with_admin("spiffe://example.org/ops/cli"),
            "east",
        )
        .unwrap()
    }

    fn rule_of(c: &Caller) -> &str {
        match c {
            Caller::Id { rule, .. } => rule.name(),
            Caller::Anyone => "anyone",
        }
    }

    #[test]
    fn ids_are_classified_by_pattern_domain_and_admins() {
        let a = builtin();
        let n1 = a.classify("spiffe://example.org/node/n1".into()).unwrap();
        assert_eq!(rule_of(&n1), "node");
        assert!(matches!(&n1, Caller::Id { node: Some(n), .. } if n == "n1"));
        let ops = a.classify("spiffe://example.org/ops/cli".into()).unwrap();
        assert_eq!(rule_of(&ops), "admin");
        let deep = a.classify("spiffe://example.org/node/a/b".into()).unwrap();
        assert_eq!(rule_of(&deep), "trust-domain");
        let e = a.classify("spiffe://evil.org/node/n1".into()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        // A look-alike domain is not the trust domain.
        assert!(a
            .classify("spiffe://example.org.evil/node/n1".into())
            .is_err());

        let custom = Authz::new(
            &AuthzConfig::new("td").with_id_pattern("spiffe://{trust_domain}/ns/x/sa/agent-{node}"),
            "east",
        )
        .unwrap();
        assert!(matches!(
            custom.classify("spiffe://td/ns/x/sa/agent-n7".into()).unwrap(),
            Caller::Id { node: Some(node), .. } if node == "n7"
        ));
        let no_node = Authz::new(
            &AuthzConfig::new("td").with_id_pattern("spiffe://td/x"),
            "e",
        );
        assert!(no_node.unwrap_err().to_string().contains("id_pattern"));
        assert!(Authz::new(
            &AuthzConfig::new("td").with_id_pattern("spiffe://other/{node}"),
            "e"
        )
        .is_err());
        let both = AuthzConfig::new("td")
            .with_admin("spiffe://td/ops")
            .with_policy_file("/nonexistent");
        let e = Authz::new(&both, "e").unwrap_err().to_string();
        assert!(e.contains("replaces"), "{e}");
    }

    #[test]
    fn nodes_write_only_their_own_node_in_their_own_cluster() {
        let a = builtin();
        let n1 = a.classify("spiffe://example.org/node/n1".into()).unwrap();
        let own = ep("api", "1", 80).with_node("n1").with_cluster("east");
        n1.may_write(&own).unwrap();
        n1.may_heartbeat("n1").unwrap();
        n1.may_read().unwrap();
        let other_node = own.clone().with_node("n2");
        let e = n1.may_write(&other_node).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("rule \"node\""), "{}", e.message());
        assert!(e.message().contains("node \"n2\""), "{}", e.message());
        assert!(n1.may_write(&own.clone().with_node("")).is_err());
        let e = n1.may_write(&own.clone().with_cluster("west")).unwrap_err();
        assert!(e.message().contains("cluster \"west\""), "{}", e.message());
        assert!(n1.may_heartbeat("n2").is_err());

        let ops = a.classify("spiffe://example.org/ops/cli".into()).unwrap();
        ops.may_write(&other_node.with_cluster("west")).unwrap();
        let reader = a.classify("spiffe://example.org/ci/job".into()).unwrap();
        reader.may_read().unwrap();
        let e = reader.may_write(&own).unwrap_err();
        assert!(e.message().contains("reads only"), "{}", e.message());
        assert!(Caller::Anyone.may_write(&own).is_ok());
    }
}
