//! The body of Consul's `PUT /v1/agent/service/register`, read as
//! Consul's agent reads it: field names in any case, with or without
//! underscores (`Name`, `name`, `DeregisterCriticalServiceAfter`,
//! `deregister_critical_service_after`), durations as Go writes them
//! (`"10s"`, `"1m30s"`, or nanoseconds). Errors name the field by Consul's
//! name (`Port`, `Checks[1].Interval`).
//!
//! The fields are looked up by their folded names rather than deserialized
//! with serde: only the service's and the checks' own field names fold
//! (the keys of `Meta` and `Header` are the caller's, kept as given), and
//! each error names the field as Consul does and says what it must be.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};
use waypost::backend::quote;
use waypost::Error;

use super::check::{Check, Probe, Status};
use super::damping::Damping;

/// Consul's default check timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest interval the registrar runs a check at (as Consul's agent).
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The fields of a check that ask for a kind of check the registrar does
/// not run, and that kind.
const UNSUPPORTED_CHECK: [(&str, &str); 11] = [
    ("Args", "script checks"),
    ("ScriptArgs", "script checks"),
    ("Script", "script checks"),
    ("DockerContainerID", "Docker checks"),
    ("H2PING", "HTTP/2 ping checks"),
    ("UDP", "UDP checks"),
    ("OSService", "OS service checks"),
    ("AliasService", "alias checks"),
    ("AliasNode", "alias checks"),
    ("Body", "HTTP checks with a request body"),
    ("GRPCUseTLS", "gRPC checks over TLS"),
];

/// A JSON object whose fields are looked up as Consul does.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    /// Where it is in the body (`""`, `Check.`, `Checks[1].`).
    at: String,
}

fn fold(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The reason given for a value of the wrong type: `must be {what}, got …`.
fn must_be(what: &str, got: &Value) -> String {
    format!("must be {what}, got {}", quote(&got.to_string()))
}

impl<'a> Obj<'a> {
    fn new(v: &'a Value, at: String) -> Result<Self, Error> {
        match v {
            Value::Object(map) => Ok(Self { map, at }),
            _ => {
                let field = match at.trim_end_matches('.') {
                    "" => "body",
                    f => f,
                };
                Err(Error::invalid(field, "must be a JSON object"))
            }
        }
    }

    fn field(&self, name: &str) -> String {
        format!("{}{name}", self.at)
    }

    /// The value of `name`, `null` counting as absent.
    fn get(&self, name: &str) -> Option<&'a Value> {
        let want = fold(name);
        self.map
            .iter()
            .find(|(k, _)| fold(k) == want)
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<Option<String>, Error> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Error::invalid(self.field(name), must_be("a string", other))),
        }
    }

    /// A string that is not empty (an empty one counting as absent).
    fn text(&self, name: &str) -> Result<Option<String>, Error> {
        Ok(self.string(name)?.filter(|s| !s.is_empty()))
    }

    /// A list, refused as not a list of `what` when it is something else.
    fn list(&self, name: &str, what: &str) -> Result<&'a [Value], Error> {
        match self.get(name) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(Error::invalid(
                self.field(name),
                must_be(&format!("a list of {what}"), other),
            )),
        }
    }

    fn duration(&self, name: &str) -> Result<Option<Duration>, Error> {
        let bad = |v: &str| {
            Error::invalid(
                self.field(name),
                format!("{} is not a duration such as 10s, 1m30s or 500ms", quote(v)),
            )
        };
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => humantime::parse_duration(s).map(Some).map_err(|_| bad(s)),
            // Go's time.Duration in JSON: nanoseconds.
            Some(Value::Number(n)) => n
                .as_u64()
                .map(|ns| Some(Duration::from_nanos(ns)))
                .ok_or_else(|| bad(&n.to_string())),
            Some(other) => Err(bad(&other.to_string())),
        }
    }

    /// A count: a whole number from 0 to 2^32 - 1.
    fn count(&self, name: &str) -> Result<Option<u32>, Error> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| Error::invalid(self.field(name), must_be("a whole number", v)))
    }

    /// Refuse `name` when it is present and not empty: a feature the
    /// registrar does not have, named rather than ignored.
    fn unsupported(&self, name: &str, why: &str) -> Result<(), Error> {
        let present = match self.get(name) {
            None => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Bool(b)) => *b,
            Some(_) => true,
        };
        if present {
            return Err(Error::invalid(self.field(name), why.to_string()));
        }
        Ok(())
    }
}

/// A service as the agent API registers it.
#[derive(Debug, PartialEq)]
pub(crate) struct Registration {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) tags: Vec<String>,
    pub(crate) address: Option<String>,
    pub(crate) port: u16,
    pub(crate) meta: BTreeMap<String, String>,
    /// `Weights.Passing`, when given.
    pub(crate) weight: Option<u32>,
    /// Each check with its id.
    pub(crate) checks: Vec<(String, Check)>,
}

/// `body` as JSON.
fn json(body: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(body).map_err(|e| Error::invalid("body", format!("not JSON: {e}")))
}

/// Parse the JSON `body` of a registration.
pub(crate) fn registration(body: &[u8], now_ms: u64) -> Result<Registration, Error> {
    let value = json(body)?;
    let o = Obj::new(&value, String::new())?;
    let name = o
        .text("Name")?
        .ok_or_else(|| Error::invalid("Name", "required: the service's name"))?;
    let id = o.text("ID")?.unwrap_or_else(|| name.clone());
    let tags = tags(&o)?;
    let address = o.text("Address")?;
    let port = port(&o)?;
    let meta = meta(&o)?;
    let weight = weights(&o)?;
    plain_service(&o)?;
    let checks = checks(&o, &name, &id, now_ms)?;
    Ok(Registration {
        name,
        id,
        tags,
        address,
        port,
        meta,
        weight,
        checks,
    })
}

/// The largest `Weights.Passing` taken (the registry's `weight` label
/// holds 1 to this).
pub(crate) const MAX_WEIGHT: u32 = 65_535;

/// `Weights`: `Passing` is kept (1 to [`MAX_WEIGHT`]); `Warning` must be
/// a whole number, and is not kept (Consul's answers show 1).
fn weights(o: &Obj<'_>) -> Result<Option<u32>, Error> {
    let Some(w) = o.get("Weights") else {
        return Ok(None);
    };
    let w = Obj::new(w, "Weights.".to_string())?;
    w.count("Warning")?;
    let Some(passing) = w.count("Passing")? else {
        return Ok(None);
    };
    if !(1..=MAX_WEIGHT).contains(&passing) {
        return Err(Error::invalid(
            "Weights.Passing",
            format!("{passing} is not a weight from 1 to {MAX_WEIGHT}"),
        ));
    }
    Ok(Some(passing))
}

/// `Tags`: strings without commas.
fn tags(o: &Obj<'_>) -> Result<Vec<String>, Error> {
    let tag = |(i, t): (usize, &Value)| match t {
        Value::String(s) if s.contains(',') => Err(Error::invalid(
            format!("Tags[{i}]"),
            format!(
                "{} contains a comma, which separates tags in the registry's `tags` label",
                quote(s)
            ),
        )),
        Value::String(s) => Ok(s.clone()),
        other => Err(Error::invalid(
            format!("Tags[{i}]"),
            must_be("a string", other),
        )),
    };
    o.list("Tags", "strings")?
        .iter()
        .enumerate()
        .map(tag)
        .collect()
}

/// `Port` (0 when absent).
fn port(o: &Obj<'_>) -> Result<u16, Error> {
    let Some(v) = o.get("Port") else {
        return Ok(0);
    };
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| Error::invalid("Port", must_be("a number from 1 to 65535", v)))
}

/// `Meta`: an object of strings, its keys as given.
fn meta(o: &Obj<'_>) -> Result<BTreeMap<String, String>, Error> {
    let Some(m) = o.get("Meta") else {
        return Ok(BTreeMap::new());
    };
    let Value::Object(m) = m else {
        return Err(Error::invalid("Meta", must_be("an object of strings", m)));
    };
    m.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(Error::invalid(
                format!("Meta[{}]", quote(k)),
                must_be("a string", v),
            )),
        })
        .collect()
}

/// Refuse what makes a service more than a plain one: a `Kind` other than
/// `typical`, a proxy, Connect, a socket.
fn plain_service(o: &Obj<'_>) -> Result<(), Error> {
    if let Some(kind) = o.text("Kind")?.filter(|k| k != "typical") {
        return Err(Error::invalid(
            "Kind",
            format!(
                "{}: the registrar registers plain services only",
                quote(&kind)
            ),
        ));
    }
    for (name, why) in [
        (
            "Proxy",
            "Connect proxies are not supported by the registrar",
        ),
        ("Connect", "Connect is not supported by the registrar"),
        (
            "SocketPath",
            "the registry holds address and port, not sockets",
        ),
    ] {
        o.unsupported(name, why)?;
    }
    Ok(())
}

/// `Check` and `Checks` of service `service` (its ID `id`), each with its
/// check ID: given, or `service:<id>` (numbered from 1 when there are
/// several).
fn checks(
    o: &Obj<'_>,
    service: &str,
    id: &str,
    now_ms: u64,
) -> Result<Vec<(String, Check)>, Error> {
    let one = o.get("Check").map(|c| ("Check.".to_string(), c));
    let many = o.list("Checks", "checks")?.iter().enumerate();
    let defs: Vec<(String, &Value)> = one
        .into_iter()
        .chain(many.map(|(i, c)| (format!("Checks[{i}]."), c)))
        .collect();
    let numbered = defs.len() > 1;
    let mut checks: Vec<(String, Check)> = Vec::new();
    for (n, (at, def)) in defs.into_iter().enumerate() {
        let c = Obj::new(def, at)?;
        let default_id = if numbered {
            format!("service:{id}:{}", n + 1)
        } else {
            format!("service:{id}")
        };
        let check_id = c
            .string("CheckID")?
            .or(c.string("ID")?)
            .filter(|i| !i.is_empty())
            .unwrap_or(default_id);
        if checks.iter().any(|(other, _)| *other == check_id) {
            return Err(Error::invalid(
                c.field("CheckID"),
                format!("{} is given to two checks", quote(&check_id)),
            ));
        }
        checks.push((check_id, check(&c, service, now_ms)?));
    }
    Ok(checks)
}

/// One check definition of service `service`.
fn check(c: &Obj<'_>, service: &str, now_ms: u64) -> Result<Check, Error> {
    for (name, what) in UNSUPPORTED_CHECK {
        c.unsupported(name, &format!("the registrar does not run {what}"))?;
    }
    let probe = probe(c)?;
    let status = match c.text("Status")? {
        None => Status::Critical,
        Some(s) => Status::parse(&s).ok_or_else(|| not_a_status(c.field("Status"), &s))?,
    };
    let damping = damping(c, &probe)?;
    let mut check = Check {
        name: c
            .text("Name")?
            .unwrap_or_else(|| format!("Service '{service}' check")),
        probe,
        deregister_after_ms: c.duration("DeregisterCriticalServiceAfter")?.map(ms),
        status,
        output: String::new(),
        since_ms: now_ms,
        expires_ms: None,
        reports: 0,
        damping,
    };
    check.expires_ms = check.deadline_from(now_ms);
    Ok(check)
}

/// `SuccessBeforePassing`, `FailuresBeforeWarning` and
/// `FailuresBeforeCritical`: for the checks the registrar runs (a TTL
/// check's reports apply as they come).
fn damping(c: &Obj<'_>, probe: &Probe) -> Result<Damping, Error> {
    let success = c.count("SuccessBeforePassing")?;
    let warning = c.count("FailuresBeforeWarning")?;
    let critical = c.count("FailuresBeforeCritical")?;
    if let Probe::Ttl { .. } = probe {
        for (name, n) in [
            ("SuccessBeforePassing", success),
            ("FailuresBeforeWarning", warning),
            ("FailuresBeforeCritical", critical),
        ] {
            if n.is_some_and(|n| n > 1) {
                return Err(Error::invalid(
                    c.field(name),
                    "applies to HTTP, TCP and gRPC checks, which the registrar runs; a TTL check takes each report as it comes",
                ));
            }
        }
    }
    let critical_n = critical.unwrap_or(0);
    Damping::new(success.unwrap_or(0), warning, critical_n).ok_or_else(|| {
        Error::invalid(
            c.field("FailuresBeforeWarning"),
            format!(
                "{} is more than FailuresBeforeCritical ({critical_n}): a check turns warning before it turns critical",
                warning.unwrap_or(0)
            ),
        )
    })
}

/// What a check runs: exactly one of `TTL`, `HTTP`, `TCP` and `GRPC`.
fn probe(c: &Obj<'_>) -> Result<Probe, Error> {
    let mut probes = Vec::new();
    if let Some(ttl) = c.duration("TTL")? {
        if ttl.is_zero() {
            return Err(Error::invalid(c.field("TTL"), "must be longer than zero"));
        }
        probes.push(Probe::Ttl { ttl_ms: ms(ttl) });
    }
    if let Some(url) = c.text("HTTP")? {
        probes.push(http(c, url)?);
    }
    if let Some(target) = c.text("TCP")? {
        probes.push(Probe::Tcp {
            target,
            interval_ms: interval(c)?,
            timeout_ms: timeout(c)?,
        });
    }
    if let Some(target) = c.text("GRPC")? {
        probes.push(Probe::Grpc {
            target,
            interval_ms: interval(c)?,
            timeout_ms: timeout(c)?,
        });
    }
    match (probes.pop(), probes.is_empty()) {
        (Some(probe), true) => Ok(probe),
        (None, _) => Err(Error::invalid(
            c.field("TTL"),
            "a check needs one of TTL, HTTP, TCP or GRPC",
        )),
        (Some(_), false) => Err(Error::invalid(
            c.field("TTL"),
            "a check takes only one of TTL, HTTP, TCP or GRPC",
        )),
    }
}

/// An HTTP check of `url`, with its `Method`, `Header`, `Interval` and
/// `Timeout`.
fn http(c: &Obj<'_>, url: String) -> Result<Probe, Error> {
    if !url.starts_with("http://") {
        return Err(Error::invalid(
            c.field("HTTP"),
            format!(
                "{}: the registrar runs plain http:// checks only",
                quote(&url)
            ),
        ));
    }
    let method = c.text("Method")?.unwrap_or_else(|| "GET".into());
    if axum::http::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(Error::invalid(
            c.field("Method"),
            format!("{} is not an HTTP method", quote(&method)),
        ));
    }
    Ok(Probe::Http {
        url,
        method,
        header: header(c)?,
        interval_ms: interval(c)?,
        timeout_ms: timeout(c)?,
    })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A check's `Interval`, required, and at least [`MIN_INTERVAL`].
fn interval(c: &Obj<'_>) -> Result<u64, Error> {
    let d = c
        .duration("Interval")?
        .ok_or_else(|| Error::invalid(c.field("Interval"), "required for this check"))?;
    if d < MIN_INTERVAL {
        return Err(Error::invalid(
            c.field("Interval"),
            format!("{d:?} is shorter than the least interval, {MIN_INTERVAL:?}"),
        ));
    }
    Ok(ms(d))
}

/// A check's `Timeout` ([`DEFAULT_TIMEOUT`] when absent).
fn timeout(c: &Obj<'_>) -> Result<u64, Error> {
    Ok(ms(c.duration("Timeout")?.unwrap_or(DEFAULT_TIMEOUT)))
}

/// An HTTP check's `Header`: `{"Name": ["value", …]}`.
fn header(c: &Obj<'_>) -> Result<BTreeMap<String, Vec<String>>, Error> {
    let mut out = BTreeMap::new();
    let Some(h) = c.get("Header") else {
        return Ok(out);
    };
    let bad = || {
        Error::invalid(
            c.field("Header"),
            "must be an object of lists of strings, such as {\"X-Probe\": [\"1\"]}",
        )
    };
    let Value::Object(m) = h else {
        return Err(bad());
    };
    for (k, v) in m {
        let Value::Array(items) = v else {
            return Err(bad());
        };
        let values = items
            .iter()
            .map(|i| i.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert(k.clone(), values);
    }
    Ok(out)
}

/// `status` is not one of a check's.
fn not_a_status(field: String, status: &str) -> Error {
    Error::invalid(
        field,
        format!("{} is not passing, warning or critical", quote(status)),
    )
}

/// A check registered apart from its service
/// (`PUT /v1/agent/check/register`).
#[derive(Debug, PartialEq)]
pub(crate) struct CheckRegistration {
    /// `ServiceID`: the service the check belongs to.
    pub(crate) service_id: String,
    /// `CheckID` (or `ID`), defaulting to `Name`.
    pub(crate) check_id: String,
    /// The check.
    pub(crate) check: Check,
}

/// Parse the JSON `body` of `PUT /v1/agent/check/register`.
pub(crate) fn check_registration(body: &[u8], now_ms: u64) -> Result<CheckRegistration, Error> {
    let value = json(body)?;
    let o = Obj::new(&value, String::new())?;
    let name = o
        .text("Name")?
        .ok_or_else(|| Error::invalid("Name", "required: the check's name"))?;
    let service_id = o.text("ServiceID")?.ok_or_else(|| {
        Error::invalid(
            "ServiceID",
            "required: the registrar keeps a check with the service it belongs to (node checks are not kept)",
        )
    })?;
    let check_id = o
        .text("CheckID")?
        .or(o.text("ID")?)
        .unwrap_or_else(|| name.clone());
    let check = check(&o, &service_id, now_ms)?;
    Ok(CheckRegistration {
        service_id,
        check_id,
        check,
    })
}

/// The body of `PUT /v1/agent/check/update/<id>`: `Status` and `Output`.
pub(crate) fn update(body: &[u8]) -> Result<(Status, String), Error> {
    let value = json(body)?;
    let o = Obj::new(&value, String::new())?;
    let status = o
        .string("Status")?
        .ok_or_else(|| Error::invalid("Status", "required: passing, warning or critical"))?;
    let status = Status::parse(&status).ok_or_else(|| not_a_status("Status".into(), &status))?;
    Ok((status, o.string("Output")?.unwrap_or_default()))
}

#[cfg(test)]
mod tests;
