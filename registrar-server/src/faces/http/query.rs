//! The query parameters the HTTP API understands. The registry's own
//! routes ignore parameters they do not know; Consul's routes refuse them
//! ([`Query::parse_consul`]), but for [`IGNORED`] and a `dc` naming the
//! registrar's own cluster.

use std::time::Duration;

use percent_encoding::percent_decode_str;

use super::ApiError;

/// Parameters Consul clients send that change nothing in an answer of
/// the registrar, accepted (with any value) and ignored on every Consul
/// route: the consistency modes (`stale`, `consistent`: every replica
/// answers from its own state), `cached` (every answer is the state's),
/// and `pretty` (answers are compact JSON either way).
pub(crate) const IGNORED: [&str; 4] = ["stale", "consistent", "cached", "pretty"];

/// A parsed query string.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Query {
    /// `index`: block until the version differs from it.
    pub(crate) index: Option<u64>,
    /// `wait`: the longest block (`5s`, `1m`).
    pub(crate) wait: Option<Duration>,
    /// `passing` (present, or `true`/`1`): healthy endpoints only.
    pub(crate) passing: bool,
    /// `tag` (repeatable): endpoints with every one of these tags only.
    pub(crate) tags: Vec<String>,
    /// `filter`: Consul's filter expression.
    pub(crate) filter: Option<String>,
    /// `replace-existing-checks` (Consul's service registration).
    pub(crate) replace_existing_checks: bool,
    /// `dc`: endpoints of this cluster only.
    pub(crate) dc: Option<String>,
    /// `status` (`GET /services`): `running` or `unhealthy`.
    pub(crate) status: Option<String>,
    /// `healthy` (present, or `true`/`1`): healthy endpoints only.
    pub(crate) healthy: bool,
    /// `cluster`: endpoints of this cluster only.
    pub(crate) cluster: Option<String>,
    /// `ack` (writes): `optimistic` or `durable`.
    pub(crate) ack: Option<String>,
    /// `note` (Consul's check reports): the check's output.
    pub(crate) note: Option<String>,
    /// `enable` (Consul's maintenance mode): on or off.
    pub(crate) enable: Option<bool>,
    /// `reason` (Consul's maintenance mode): why, shown with it.
    pub(crate) reason: Option<String>,
}

/// The first 64 characters of a value, to quote in an error.
pub(crate) fn bounded(v: &str) -> String {
    v.chars().take(64).collect()
}

/// A boolean as Go's `strconv.ParseBool` reads it (how Consul reads its
/// query parameters): `1 t T TRUE true True` or `0 f F FALSE false False`.
pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A flag's value: present without a value (or empty) is true, else
/// [`parse_bool`].
fn flag(param: &'static str, v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("") => Ok(true),
        Some(v) => parse_bool(v).ok_or_else(|| ApiError::BadQuery {
            param,
            reason: format!(
                "{:?} is not a boolean (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)",
                bounded(v)
            ),
        }),
    }
}

fn decode(s: &str) -> String {
    percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// The pairs of a query string, decoded (a parameter without `=` has no
/// value).
fn pairs(raw: Option<&str>) -> impl Iterator<Item = (String, Option<String>)> + '_ {
    raw.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (decode(k), Some(decode(v))),
            None => (decode(pair), None),
        })
}

impl Query {
    /// Parse `raw` (the part after `?`), ignoring parameters it does not
    /// know (the registry's own routes).
    pub(crate) fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut q = Query::default();
        for (k, v) in pairs(raw) {
            q.set(&k, v)?;
        }
        Ok(q)
    }

    /// Parse `raw` for a Consul route that implements the parameters
    /// `takes`: any other is refused, but for [`IGNORED`] and a `dc` that
    /// names `own_dc` (the registrar's cluster) on a route that does not
    /// take `dc` itself.
    pub(crate) fn parse_consul(
        raw: Option<&str>,
        takes: &[&str],
        own_dc: &str,
    ) -> Result<Self, ApiError> {
        let mut q = Query::default();
        for (k, v) in pairs(raw) {
            if takes.contains(&k.as_str()) {
                q.set(&k, v)?;
            } else if IGNORED.contains(&k.as_str()) {
                // Accepted: it changes nothing in the answer.
            } else if k == "dc" {
                let dc = v.unwrap_or_default();
                if dc != own_dc {
                    return Err(ApiError::BadQuery {
                        param: "dc",
                        reason: format!(
                            "{:?} is not this agent's datacenter, {own_dc:?}: the agent's routes answer for their own datacenter only",
                            bounded(&dc)
                        ),
                    });
                }
            } else {
                let mut all: Vec<&str> = takes.to_vec();
                all.extend(IGNORED);
                if !takes.contains(&"dc") {
                    all.push("dc");
                }
                return Err(ApiError::UnsupportedQuery {
                    param: bounded(&k),
                    takes: all.join(", "),
                });
            }
        }
        Ok(q)
    }

    /// Set parameter `k` (ignored when unknown).
    fn set(&mut self, k: &str, v: Option<String>) -> Result<(), ApiError> {
        match k {
            "index" => {
                let v = v.unwrap_or_default();
                self.index = Some(v.parse().map_err(|_| ApiError::BadQuery {
                    param: "index",
                    reason: format!("{:?} is not a whole number", bounded(&v)),
                })?);
            }
            "wait" => {
                let v = v.unwrap_or_default();
                self.wait =
                    Some(
                        humantime::parse_duration(&v).map_err(|e| ApiError::BadQuery {
                            param: "wait",
                            reason: format!(
                                "{:?} is not a duration such as 5s or 1m: {e}",
                                bounded(&v)
                            ),
                        })?,
                    );
            }
            "passing" => self.passing = flag("passing", v.as_deref())?,
            "healthy" => self.healthy = flag("healthy", v.as_deref())?,
            "replace-existing-checks" => {
                self.replace_existing_checks = flag("replace-existing-checks", v.as_deref())?
            }
            "cluster" => self.cluster = v,
            "ack" => self.ack = v,
            "note" => self.note = v,
            "enable" => self.enable = Some(flag("enable", v.as_deref())?),
            "reason" => self.reason = v,
            "tag" => self.tags.extend(v),
            "dc" => self.dc = v.filter(|d| !d.is_empty()),
            "status" => self.status = v,
            "filter" => self.filter = v.filter(|f| !f.trim().is_empty()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_consul_parameters() {
        let q = Query::parse(Some("index=42&wait=5s&passing&tag=v%201")).expect("parses");
        assert_eq!(q.index, Some(42));
        assert_eq!(q.wait, Some(Duration::from_secs(5)));
        assert!(q.passing);
        assert_eq!(q.tags, ["v 1"]);
        assert!(!Query::parse(Some("passing=false")).expect("parses").passing);
        let q = Query::parse(Some("healthy=true&cluster=east&ack=durable")).expect("parses");
        assert!(q.healthy);
        assert_eq!(q.cluster.as_deref(), Some("east"));
        assert_eq!(q.ack.as_deref(), Some("durable"));
        assert_eq!(Query::parse(None).expect("parses"), Query::default());
    }

    #[test]
    fn refuses_bad_values_naming_the_parameter() {
        for (raw, param) in [
            ("index=x", "index"),
            ("wait=soon", "wait"),
            ("passing=maybe", "passing"),
            ("healthy=yes", "healthy"),
            ("passing=on", "passing"),
        ] {
            match Query::parse(Some(raw)) {
                Err(ApiError::BadQuery { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{raw}: {other:?}"),
            }
        }
    }

    #[test]
    fn booleans_read_as_go_s_parse_bool() {
        for v in ["1", "t", "T", "TRUE", "true", "True", ""] {
            let q = Query::parse(Some(&format!("passing={v}"))).expect("parses");
            assert!(q.passing, "{v}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            let q = Query::parse(Some(&format!("passing={v}"))).expect("parses");
            assert!(!q.passing, "{v}");
        }
        assert_eq!(parse_bool("True"), Some(true));
        assert_eq!(parse_bool("yes"), None);
        assert_eq!(parse_bool("tRUE"), None);
    }

    #[test]
    fn consul_routes_refuse_what_they_do_not_take_naming_it() {
        let takes = ["index", "wait", "tag", "filter"];
        let q = Query::parse_consul(
            Some("tag=a&tag=b&stale&consistent=1&cached&pretty&dc=east&filter=x"),
            &takes,
            "east",
        )
        .expect("parses");
        assert_eq!(q.tags, ["a", "b"]);
        assert_eq!(q.filter.as_deref(), Some("x"));
        assert_eq!(q.dc, None);
        match Query::parse_consul(Some("near=_agent"), &takes, "east") {
            Err(e @ ApiError::UnsupportedQuery { .. }) => {
                assert_eq!(e.field(), Some("near"));
                assert!(e.to_string().contains("filter"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        match Query::parse_consul(Some("dc=west"), &takes, "east") {
            Err(e @ ApiError::BadQuery { .. }) => assert_eq!(e.field(), Some("dc")),
            other => panic!("{other:?}"),
        }
        // A route that takes `dc` filters by it.
        let q = Query::parse_consul(Some("dc=west"), &["dc"], "east").expect("parses");
        assert_eq!(q.dc.as_deref(), Some("west"));
    }
}
