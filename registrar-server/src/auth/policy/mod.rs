//! Authorization policies: which SPIFFE IDs may read, and which endpoints
//! each may write ([`Policy`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use globset::{Glob, GlobBuilder, GlobMatcher};
use ipnet::IpNet;
use serde::Deserialize;
use tonic::Status;
use waypost::backend::quote;
use waypost::{Endpoint, Error, Result};

/// A checked authorization policy: which SPIFFE IDs may read, and which
/// endpoints each may write.
///
/// A policy is a list of rules tried in order; the first rule one of whose
/// `ids` matches the caller's SPIFFE ID decides. A caller no rule matches
/// may do nothing. The file form (`registrar serve --authz-policy FILE`) is
/// TOML:
///
/// ```toml
/// # Operators: anything.
/// [[rule]]
/// name = "operators"
/// ids = ["spiffe://example.org/ns/ops/sa/*"]
/// read = true
/// write = { services = ["*"], clusters = ["*"], nodes = ["*"] }
///
/// # Agents: endpoints of their own node in this registrar's cluster, at
/// # pod addresses.
/// [[rule]]
/// name = "agents"
/// ids = ["spiffe://example.org/node/{node}"]
/// read = true
/// write = { addresses = ["10.0.0.0/8", "fd00::/8"] }
///
/// # The payments team's deployer: only the payments services.
/// [[rule]]
/// name = "payments"
/// ids = ["spiffe://example.org/ns/payments/sa/deployer"]
/// write = { services = ["payments", "payments-*"], nodes = ["*"] }
/// ```
///
/// - `ids`: SPIFFE IDs of the trust domain, as globs (`*` stops at `/`,
///   `**` does not), or with `{node}` once: it matches one non-empty path
///   segment, the caller's node. `{trust_domain}` is replaced.
/// - `read`: may watch and list (default `false`).
/// - `write`: may register, deregister and heartbeat endpoints whose
///   `service`, `cluster` and `node` match one glob of each list and whose
///   `address`, when `addresses` is given, is an IP address in one of
///   those CIDRs (a host name is then refused). Defaults: `services =
///   ["*"]`, `clusters = ["{cluster}"]` (this registrar's cluster),
///   `nodes = ["{node}"]` (the caller's own node), no address limit. No
///   `write`: no writes.
///
/// Every refusal is `PERMISSION_DENIED` naming the rule and what it allows.
///
/// ```
/// use waypost_registrar_server::Policy;
/// let text = r#"
/// [[rule]]
/// name = "ops"
/// ids = ["spiffe://example.org/ops/*"]
/// read = true
/// "#;
/// let policy = Policy::parse(text, "example.org", "cluster-a")?;
/// assert_eq!(policy.rule_names().collect::<Vec<_>>(), ["ops"]);
/// let bad = Policy::parse("[[rule]]\nname = \"x\"\nids = [\"spiffe://evil.org/x\"]\n", "example.org", "a");
/// assert!(bad.unwrap_err().to_string().contains("not of the trust domain"));
/// # Ok::<(), waypost::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Policy {
    rules: Vec<Arc<Rule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default, rename = "rule")]
    rules: Vec<RuleFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: String,
    ids: Vec<String>,
    #[serde(default)]
    read: bool,
    write: Option<WriteFile>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WriteFile {
    services: Option<Vec<String>>,
    clusters: Option<Vec<String>>,
    nodes: Option<Vec<String>>,
    addresses: Option<Vec<String>>,
}

/// One rule: who it matches and what they may do.
#[derive(Debug)]
pub(crate) struct Rule {
    name: String,
    ids: Vec<IdPattern>,
    read: bool,
    write: Option<Scope>,
}

#[derive(Debug)]
enum IdPattern {
    Glob(GlobMatcher),
    /// `before{node}after`.
    Node {
        before: String,
        after: String,
    },
}

/// What a rule lets its callers write.
#[derive(Debug)]
struct Scope {
    services: Names,
    clusters: Names,
    nodes: Names,
    addresses: Option<Vec<IpNet>>,
}

/// Glob patterns of names, as written (for messages) and compiled.
#[derive(Debug)]
struct Names {
    text: Vec<String>,
    patterns: Vec<NamePattern>,
}

#[derive(Debug)]
enum NamePattern {
    Glob(GlobMatcher),
    /// `{node}`: the caller's own node.
    OwnNode,
}

impl Policy {
    /// Read and check the policy file at `path`, for a registrar of trust
    /// domain `trust_domain` in cluster `cluster`.
    pub fn load(path: &Path, trust_domain: &str, cluster: &str) -> Result<Policy> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(
                "authz_policy",
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        Self::parse(&text, trust_domain, cluster)
            .map_err(|e| Error::invalid("authz_policy", format!("{}: {e}", path.display())))
    }

    /// Check the policy `text` (TOML, see [`Policy`]).
    pub fn parse(text: &str, trust_domain: &str, cluster: &str) -> Result<Policy> {
        let file: PolicyFile = toml::from_str(text)
            .map_err(|e| Error::invalid("authz_policy", e.to_string().trim_end().to_string()))?;
        if file.rules.is_empty() {
            return Err(Error::invalid(
                "authz_policy",
                "no [[rule]]: nobody could do anything",
            ));
        }
        let td = trust_domain_name(trust_domain)?;
        let mut rules = Vec::with_capacity(file.rules.len());
        for r in file.rules {
            if rules.iter().any(|x: &Arc<Rule>| x.name == r.name) {
                return Err(Error::invalid(
                    "authz_policy",
                    format!("two rules are named {}", quote(&r.name)),
                ));
            }
            rules.push(Arc::new(Rule::compile(r, td, cluster)?));
        }
        Ok(Policy { rules })
    }

    /// The policy without a file: `admins` may read and write anything;
    /// an ID matching `id_pattern` names a node, which may read and write
    /// endpoints of its own node in `cluster`; any other ID of the trust
    /// domain may read.
    pub(crate) fn builtin(
        trust_domain: &str,
        id_pattern: &str,
        admins: impl IntoIterator<Item = String>,
        cluster: &str,
    ) -> Result<Policy> {
        let td = trust_domain_name(trust_domain)?;
        let any = || Some(vec!["*".to_string()]);
        let admins: Vec<String> = admins.into_iter().map(|a| glob_escape(&a)).collect();
        let mut files = Vec::new();
        if !admins.is_empty() {
            files.push(RuleFile {
                name: "admin".into(),
                ids: admins,
                read: true,
                write: Some(WriteFile {
                    services: any(),
                    clusters: any(),
                    nodes: any(),
                    addresses: None,
                }),
            });
        }
        files.push(RuleFile {
            name: "node".into(),
            ids: vec![id_pattern.to_string()],
            read: true,
            write: Some(WriteFile::default()),
        });
        files.push(RuleFile {
            name: "trust-domain".into(),
            ids: vec![format!("spiffe://{td}/**")],
            read: true,
            write: None,
        });
        let rules = files
            .into_iter()
            .map(|r| Rule::compile(r, td, cluster).map(Arc::new))
            .collect::<Result<_>>()?;
        Ok(Policy { rules })
    }

    /// The first rule matching `id`, with the node `{node}` captured.
    pub(crate) fn find(&self, id: &str) -> Option<(Arc<Rule>, Option<String>)> {
        self.rules
            .iter()
            .find_map(|r| r.matches(id).map(|node| (Arc::clone(r), node)))
    }

    /// The names of the rules, in order.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.name.as_str())
    }
}

/// `example.org` of `example.org` or `spiffe://example.org`.
pub(crate) fn trust_domain_name(td: &str) -> Result<&str> {
    let name = td.trim_start_matches("spiffe://");
    if name.is_empty() || name.contains('/') {
        return Err(Error::invalid(
            "trust_domain",
            format!("{} is not a trust domain name", quote(td)),
        ));
    }
    Ok(name)
}

fn glob_escape(s: &str) -> String {
    globset::escape(s)
}

fn glob(rule: &str, field: &str, text: &str, separator: bool) -> Result<GlobMatcher> {
    GlobBuilder::new(text)
        .literal_separator(separator)
        .backslash_escape(true)
        .build()
        .map(|g: Glob| g.compile_matcher())
        .map_err(|e| {
            Error::invalid(
                "authz_policy",
                format!("rule {}: {field} {}: {e}", quote(rule), quote(text)),
            )
        })
}

impl Rule {
    fn compile(r: RuleFile, td: &str, cluster: &str) -> Result<Rule> {
        let name = r.name;
        let bad =
            |msg: String| Error::invalid("authz_policy", format!("rule {}: {msg}", quote(&name)));
        if r.ids.is_empty() {
            return Err(bad("`ids` is empty: the rule would match nobody".into()));
        }
        let prefix = format!("spiffe://{td}/");
        let mut ids = Vec::with_capacity(r.ids.len());
        let mut captures = true;
        for raw in &r.ids {
            let text = raw.replace("{trust_domain}", td);
            if !text.starts_with(&prefix) {
                return Err(bad(format!(
                    "ID {} is not of the trust domain {td}",
                    quote(raw)
                )));
            }
            let mut parts = text.split("{node}");
            ids.push(match (parts.next(), parts.next(), parts.next()) {
                (Some(_), None, _) => {
                    captures = false;
                    IdPattern::Glob(glob(&name, "ID", &text, true)?)
                }
                (Some(before), Some(after), None) => IdPattern::Node {
                    before: before.to_string(),
                    after: after.to_string(),
                },
                _ => return Err(bad(format!("ID {} has {{node}} twice", quote(raw)))),
            });
        }
        let write = match r.write {
            None => None,
            Some(w) => {
                let names = |field: &str, given: Option<Vec<String>>, default: &str| {
                    let text = given.unwrap_or_else(|| vec![default.to_string()]);
                    let mut patterns = Vec::with_capacity(text.len());
                    for t in &text {
                        patterns.push(match t.as_str() {
                            "{node}" if field == "nodes" => {
                                if !captures {
                                    return Err(bad(
                                        "`nodes` allows {node} but not every ID of the rule has \
                                         {node}; list the nodes its callers may write \
                                         (`nodes = [\"*\"]` for any)"
                                            .to_string(),
                                    ));
                                }
                                NamePattern::OwnNode
                            }
                            "{cluster}" if field == "clusters" => {
                                NamePattern::Glob(glob(&name, field, &glob_escape(cluster), false)?)
                            }
                            _ => NamePattern::Glob(glob(&name, field, t, false)?),
                        });
                    }
                    if text.is_empty() {
                        return Err(bad(format!("`{field}` is empty: give \"*\" for any")));
                    }
                    Ok(Names { text, patterns })
                };
                let addresses = match w.addresses {
                    None => None,
                    Some(list) => Some(
                        list.iter()
                            .map(|a| {
                                a.parse::<IpNet>()
                                    .map_err(|e| bad(format!("address range {}: {e}", quote(a))))
                            })
                            .collect::<Result<Vec<_>>>()?,
                    ),
                };
                Some(Scope {
                    services: names("services", w.services, "*")?,
                    clusters: names("clusters", w.clusters, "{cluster}")?,
                    nodes: names("nodes", w.nodes, "{node}")?,
                    addresses,
                })
            }
        };
        Ok(Rule {
            name,
            ids,
            read: r.read,
            write,
        })
    }

    /// `Some(node)` when `id` matches (`node` captured by `{node}`).
    fn matches(&self, id: &str) -> Option<Option<String>> {
        self.ids.iter().find_map(|p| match p {
            IdPattern::Glob(g) => g.is_match(id).then_some(None),
            IdPattern::Node { before, after } => id
                .strip_prefix(before.as_str())
                .and_then(|rest| rest.strip_suffix(after.as_str()))
                .filter(|n| !n.is_empty() && !n.contains('/'))
                .map(|n| Some(n.to_string())),
        })
    }

    /// The rule's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// May its callers watch and list?
    pub(crate) fn may_read(&self) -> bool {
        self.read
    }

    /// Refuse a write of `ep` by `id` (of `node`) unless the rule allows
    /// it; the message names the rule, the field and what is allowed.
    pub(crate) fn check_write(
        &self,
        id: &str,
        node: Option<&str>,
        ep: &Endpoint,
    ) -> std::result::Result<(), Status> {
        let scope = self.scope(id)?;
        scope
            .services
            .check(self, id, node, "service", &ep.service)?;
        scope
            .clusters
            .check(self, id, node, "cluster", &ep.cluster)?;
        scope.nodes.check(self, id, node, "node", &ep.node)?;
        if let Some(nets) = &scope.addresses {
            let ok = ep
                .address
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| nets.iter().any(|n| n.contains(&ip)));
            if !ok {
                let list: Vec<String> = nets.iter().map(ToString::to_string).collect();
                return Err(self.denied(
                    id,
                    format!(
                        "address {} is not an IP address in {}",
                        quote(&ep.address),
                        list.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuse a heartbeat of `target` by `id` (of `node`) unless the rule
    /// lets it write endpoints of that node.
    pub(crate) fn check_heartbeat(
        &self,
        id: &str,
        node: Option<&str>,
        target: &str,
    ) -> std::result::Result<(), Status> {
        self.scope(id)?.nodes.check(self, id, node, "node", target)
    }

    fn scope(&self, id: &str) -> std::result::Result<&Scope, Status> {
        self.write
            .as_ref()
            .ok_or_else(|| self.denied(id, "it allows no writes (reads only)".into()))
    }

    pub(crate) fn denied(&self, id: &str, why: String) -> Status {
        Status::permission_denied(format!("{id}: rule {}: {why}", quote(&self.name)))
    }
}

impl Names {
    fn check(
        &self,
        rule: &Rule,
        id: &str,
        node: Option<&str>,
        field: &str,
        value: &str,
    ) -> std::result::Result<(), Status> {
        let ok = self.patterns.iter().any(|p| match p {
            NamePattern::Glob(g) => g.is_match(value),
            NamePattern::OwnNode => node == Some(value),
        });
        if ok {
            return Ok(());
        }
        let allowed: Vec<String> = self
            .text
            .iter()
            .map(|t| match (t.as_str(), node) {
                ("{node}", Some(n)) => format!("{{node}} = {}", quote(n)),
                _ => quote(t),
            })
            .collect();
        Err(rule.denied(
            id,
            format!(
                "{field} {} is not allowed (allowed: {})",
                quote(value),
                allowed.join(", ")
            ),
        ))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
