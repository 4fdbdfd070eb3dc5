//! The query parameters the HTTP API understands.

use std::time::Duration;

use percent_encoding::percent_decode_str;

use super::ApiError;

/// A parsed query string; unknown parameters are ignored (as Consul does).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Query {
    /// `index`: block until the version differs from it.
    pub(crate) index: Option<u64>,
    /// `wait`: the longest block (`5s`, `1m`).
    pub(crate) wait: Option<Duration>,
    /// `passing` (present, or `true`/`1`): healthy endpoints only.
    pub(crate) passing: bool,
    /// `tag`: endpoints with this tag only.
    pub(crate) tag: Option<String>,
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
}

/// The first 64 characters of a value, to quote in an error.
pub(crate) fn bounded(v: &str) -> String {
    v.chars().take(64).collect()
}

/// A flag's value: present without a value, `true`/`1`, or `false`/`0`.
fn flag(param: &'static str, v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("") | Some("true") | Some("1") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some(other) => Err(ApiError::BadQuery {
            param,
            reason: format!("{:?} is not true or false", bounded(other)),
        }),
    }
}

fn decode(s: &str) -> String {
    percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

impl Query {
    /// Parse `raw` (the part after `?`).
    pub(crate) fn parse(raw: Option<&str>) -> Result<Self, ApiError> {
        let mut q = Query::default();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = match pair.split_once('=') {
                Some((k, v)) => (decode(k), Some(decode(v))),
                None => (decode(pair), None),
            };
            match k.as_str() {
                "index" => {
                    let v = v.unwrap_or_default();
                    q.index = Some(v.parse().map_err(|_| ApiError::BadQuery {
                        param: "index",
                        reason: format!("{:?} is not a whole number", bounded(&v)),
                    })?);
                }
                "wait" => {
                    let v = v.unwrap_or_default();
                    q.wait =
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
                "passing" => q.passing = flag("passing", v.as_deref())?,
                "healthy" => q.healthy = flag("healthy", v.as_deref())?,
                "cluster" => q.cluster = v,
                "ack" => q.ack = v,
                "note" => q.note = v,
                "tag" => q.tag = v,
                "dc" => q.dc = v,
                "status" => q.status = v,
                _ => {}
            }
        }
        Ok(q)
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
        assert_eq!(q.tag.as_deref(), Some("v 1"));
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
        ] {
            match Query::parse(Some(raw)) {
                Err(ApiError::BadQuery { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{raw}: {other:?}"),
            }
        }
    }
}
