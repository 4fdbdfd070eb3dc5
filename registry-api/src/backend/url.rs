//! [`BackendUrl`]: one string that names a backend and where it is, such
//! as `sqlite:registry.db`, `etcd://10.0.0.1:2379,10.0.0.2:2379/registry`
//! or `dynamodb://registry?region=eu-west-1`. Each backend crate parses its
//! own kind of URL with it (`FromStr` on its config), so that the rules are
//! the same everywhere:
//!
//! - `SCHEME:REST[?NAME=VALUE&…]`; `REST` is either opaque (a path) or
//!   `//AUTHORITY[/PATH]`, the authority being `[USER[:PASSWORD]@]HOST:PORT`
//!   and, where a backend takes several, `HOST:PORT,HOST:PORT`;
//! - names and values are percent-decoded; a parameter given twice, a
//!   parameter the backend does not take, or a value that does not parse is
//!   an [`Error::InvalidInput`] naming the parameter and quoting a bounded
//!   prefix of the value;
//! - a password in the authority, and parameters that hold secrets, are
//!   never shown by `Display` or `Debug` (`***` instead).
//!
//! ```
//! use std::time::Duration;
//! use waypost::backend::BackendUrl;
//!
//! let mut url = BackendUrl::parse("etcd://a:2379,b:2379/registry?lease_ttl=10s").unwrap();
//! assert_eq!(url.scheme(), "etcd");
//! assert_eq!(url.hosts().unwrap(), vec!["a:2379", "b:2379"]);
//! assert_eq!(url.path(), "/registry");
//! assert_eq!(url.take_duration("lease_ttl").unwrap(), Some(Duration::from_secs(10)));
//! url.finish().unwrap();
//!
//! let mut url = BackendUrl::parse("etcd://a:2379?leese_ttl=10s").unwrap();
//! url.take_duration("lease_ttl").unwrap();
//! let err = url.finish().unwrap_err();
//! assert!(err.to_string().contains("leese_ttl"), "{err}");
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::error::quote;
use crate::error::{Error, Result};
use crate::liveness::LivenessConfig;

/// The field errors about a URL name.
const FIELD: &str = "registry URL";

/// Parameter names whose values are secrets.
const SECRET_PARAMS: &[&str] = &[
    "password",
    "secret",
    "secret_access_key",
    "session_token",
    "token",
    "key",
    "auth_key",
];

/// A parsed backend URL; see the module documentation.
#[derive(Clone)]
pub struct BackendUrl {
    scheme: String,
    rest: String,
    params: Vec<(String, String)>,
    taken: Vec<bool>,
    asked: Vec<&'static str>,
}

fn decode(part: &str, what: &str) -> Result<String> {
    percent_decode_str(part)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| {
            Error::invalid(
                FIELD,
                format!("{what} {}: not UTF-8 once percent-decoded", quote(part)),
            )
        })
}

impl BackendUrl {
    /// Parse `url`, checking its scheme and its query's form (not what the
    /// backend makes of it).
    pub fn parse(url: &str) -> Result<Self> {
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(Error::invalid(
                FIELD,
                format!(
                    "{} has no scheme: expected SCHEME:…, such as sqlite:registry.db or \
                     etcd://127.0.0.1:2379/registry",
                    quote(url)
                ),
            ));
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
        if scheme.is_empty() || !scheme.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(Error::invalid(
                FIELD,
                format!("{}: the scheme must start with a letter", quote(url)),
            ));
        }
        if !scheme.chars().all(valid) {
            return Err(Error::invalid(
                FIELD,
                format!("scheme {}: only letters, digits, +, - and .", quote(scheme)),
            ));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let mut params: Vec<(String, String)> = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(name, "parameter")?;
            let value = decode(&value.replace('+', " "), &format!("parameter {name:?}"))?;
            if params.iter().any(|(n, _)| *n == name) {
                return Err(Error::invalid(
                    FIELD,
                    format!("parameter {} is given twice", quote(&name)),
                ));
            }
            params.push((name, value));
        }
        Ok(Self {
            scheme: scheme.to_ascii_lowercase(),
            rest: rest.to_string(),
            taken: vec![false; params.len()],
            params,
            asked: Vec::new(),
        })
    }

    /// The scheme, in lower case (`sqlite`, `etcd`, …).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// An error unless the scheme is `scheme`: for a backend's parser.
    pub fn expect_scheme(&self, scheme: &str, form: &str) -> Result<()> {
        if self.scheme == scheme {
            return Ok(());
        }
        Err(Error::invalid(
            FIELD,
            format!(
                "scheme {} is not {scheme}: expected {form}",
                quote(&self.scheme)
            ),
        ))
    }

    /// Everything between the scheme and the query, percent-decoded: the
    /// path of `sqlite:PATH` (a leading `//` is dropped, so
    /// `sqlite:///var/lib/registry.db` is `/var/lib/registry.db`).
    pub fn opaque(&self) -> Result<String> {
        decode(self.rest.strip_prefix("//").unwrap_or(&self.rest), "path")
    }

    fn split_authority(&self) -> (Option<&str>, &str) {
        match self.rest.strip_prefix("//") {
            Some(r) => match r.find('/') {
                Some(i) => (Some(&r[..i]), &r[i..]),
                None => (Some(r), ""),
            },
            None => (None, self.rest.as_str()),
        }
    }

    /// The authority without its user and password (`HOST:PORT`,
    /// `HOST:PORT,HOST:PORT`, a table's name, …); `None` without `//`.
    pub fn authority(&self) -> Option<&str> {
        let (auth, _) = self.split_authority();
        auth.map(|a| a.rsplit_once('@').map_or(a, |(_, host)| host))
    }

    /// The authority as a plain name (a table, a namespace), with no path
    /// after it; an error naming `form` (what the URL should look like)
    /// otherwise.
    pub fn name(&self, form: &str) -> Result<String> {
        match self.authority() {
            Some(name) if !name.is_empty() && self.path().is_empty() => decode(name, "name"),
            _ => Err(Error::invalid(FIELD, format!("{self}: expected {form}"))),
        }
    }

    /// Take two parameters that go together (an access key and its
    /// secret): both, or neither; one alone is an error naming both.
    pub fn take_pair(
        &mut self,
        first: &'static str,
        second: &'static str,
    ) -> Result<Option<(String, String)>> {
        match (self.take(first), self.take(second)) {
            (None, None) => Ok(None),
            (Some(a), Some(b)) => Ok(Some((a, b))),
            _ => Err(Error::invalid(
                FIELD,
                format!("{self}: {first} and {second} go together"),
            )),
        }
    }

    /// The authority's user and password, percent-decoded.
    pub fn userinfo(&self) -> Result<Option<(String, Option<String>)>> {
        let Some((info, _)) = self.split_authority().0.and_then(|a| a.rsplit_once('@')) else {
            return Ok(None);
        };
        let (user, password) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        Ok(Some((
            decode(user, "user")?,
            password.map(|p| decode(p, "password")).transpose()?,
        )))
    }

    /// The authority's `HOST:PORT` parts (separated by `,`), each checked
    /// to have a host and a port number.
    pub fn hosts(&self) -> Result<Vec<&str>> {
        let Some(auth) = self.authority().filter(|a| !a.is_empty()) else {
            return Err(Error::invalid(
                FIELD,
                format!("{self}: no HOST:PORT after {}://", self.scheme),
            ));
        };
        auth.split(',')
            .map(|h| {
                let port = h
                    .rsplit_once(':')
                    .map(|(host, port)| (host, port.parse::<u16>()));
                match port {
                    Some((host, Ok(_))) if !host.is_empty() => Ok(h),
                    _ => Err(Error::invalid(
                        FIELD,
                        format!("host {}: expected HOST:PORT", quote(h)),
                    )),
                }
            })
            .collect()
    }

    /// The path after the authority (with its leading `/`; empty when
    /// there is none), percent-decoded; without an authority, the whole
    /// opaque part.
    pub fn path(&self) -> String {
        let (_, path) = self.split_authority();
        percent_decode_str(path).decode_utf8_lossy().into_owned()
    }

    /// Whether the URL gives parameter `name` (without taking it).
    pub fn has(&self, name: &str) -> bool {
        self.params.iter().any(|(n, _)| n == name)
    }

    /// Take parameter `name` (so that [`BackendUrl::finish`] knows it was
    /// read).
    pub fn take(&mut self, name: &'static str) -> Option<String> {
        self.asked.push(name);
        let i = self.params.iter().position(|(n, _)| n == name)?;
        self.taken[i] = true;
        Some(self.params[i].1.clone())
    }

    /// Take parameter `name` and parse it; `expected` says what a value
    /// looks like, for the error.
    pub fn take_parsed<T: FromStr>(
        &mut self,
        name: &'static str,
        expected: &str,
    ) -> Result<Option<T>> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                Error::invalid(
                    FIELD,
                    format!("parameter {name}: {} is not {expected}", quote(&v)),
                )
            }),
        }
    }

    /// Take parameter `name` as a duration (`500ms`, `10s`, `5m`).
    pub fn take_duration(&mut self, name: &'static str) -> Result<Option<Duration>> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => humantime::parse_duration(&v).map(Some).map_err(|e| {
                Error::invalid(
                    FIELD,
                    format!(
                        "parameter {name}: {} is not a duration such as 500ms or 10s ({e})",
                        quote(&v)
                    ),
                )
            }),
        }
    }

    /// Take parameter `name` as a boolean (`true`, `false`, `1`, `0`).
    pub fn take_bool(&mut self, name: &'static str) -> Result<Option<bool>> {
        match self.take(name).as_deref() {
            None => Ok(None),
            Some("true" | "1") => Ok(Some(true)),
            Some("false" | "0") => Ok(Some(false)),
            Some(v) => Err(Error::invalid(
                FIELD,
                format!("parameter {name}: {} is not true or false", quote(v)),
            )),
        }
    }

    /// Take the liveness parameters `suspect_after`, `remove_after` and
    /// `sweep_interval` into `cfg` (checked).
    pub fn take_liveness(&mut self, mut cfg: LivenessConfig) -> Result<LivenessConfig> {
        if let Some(d) = self.take_duration("suspect_after")? {
            cfg.suspect_after = d;
        }
        if let Some(d) = self.take_duration("remove_after")? {
            cfg.remove_after = d;
        }
        if let Some(d) = self.take_duration("sweep_interval")? {
            cfg.sweep_interval = d;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// An error naming every parameter nobody took, and the ones the
    /// backend takes; `Ok` when every parameter was read.
    pub fn finish(self) -> Result<()> {
        let unknown: Vec<&str> = self
            .params
            .iter()
            .zip(&self.taken)
            .filter(|(_, taken)| !**taken)
            .map(|((n, _), _)| n.as_str())
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let mut known = self.asked.clone();
        known.sort_unstable();
        known.dedup();
        let names: Vec<String> = unknown.iter().map(|n| quote(n)).collect();
        Err(Error::invalid(
            FIELD,
            format!(
                "{}: unknown parameter {} (this backend takes: {})",
                self,
                names.join(", "),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
        ))
    }
}

impl fmt::Display for BackendUrl {
    /// The URL with secrets replaced by `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.scheme)?;
        let (auth, path) = self.split_authority();
        match auth {
            Some(a) => {
                f.write_str("//")?;
                match a.rsplit_once('@') {
                    Some((info, host)) => match info.split_once(':') {
                        Some((user, _)) => write!(f, "{user}:***@{host}")?,
                        None => write!(f, "{info}@{host}")?,
                    },
                    None => f.write_str(a)?,
                }
                f.write_str(path)?;
            }
            None => f.write_str(path)?,
        }
        for (i, (name, value)) in self.params.iter().enumerate() {
            f.write_str(if i == 0 { "?" } else { "&" })?;
            if SECRET_PARAMS.contains(&name.as_str()) {
                write!(f, "{name}=***")?;
            } else {
                write!(f, "{name}={value}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackendUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_each_form() {
        let u = BackendUrl::parse("sqlite:/var/lib/my%20registry.db").unwrap();
        assert_eq!(
            (u.scheme(), u.opaque().unwrap()),
            ("sqlite", "/var/lib/my registry.db".into())
        );
        let u = BackendUrl::parse("SQLite:///abs.db").unwrap();
        assert_eq!(
            (u.scheme(), u.opaque().unwrap()),
            ("sqlite", "/abs.db".into())
        );
        let u = BackendUrl::parse(
            "dynamodb://registry?region=eu-west-1&endpoint=http://127.0.0.1:5000",
        )
        .unwrap();
        assert_eq!(u.authority(), Some("registry"));
        assert_eq!(u.path(), "");
        let u = BackendUrl::parse("etcd://root:p%40ss@a:1,b:2/pre%2Ffix").unwrap();
        assert_eq!(u.hosts().unwrap(), vec!["a:1", "b:2"]);
        assert_eq!(
            u.userinfo().unwrap(),
            Some(("root".into(), Some("p@ss".into())))
        );
        assert_eq!(u.path(), "/pre/fix");
        let u = BackendUrl::parse("dynamodb://my%2Dtable").unwrap();
        assert_eq!(u.name("dynamodb://TABLE").unwrap(), "my-table");
        let u = BackendUrl::parse("memory:").unwrap();
        assert_eq!((u.scheme(), u.opaque().unwrap()), ("memory", String::new()));
    }

    #[test]
    fn bad_forms_name_what_is_wrong() {
        let msg = |s: &str| BackendUrl::parse(s).unwrap_err().to_string();
        assert!(
            msg("registry.db").contains("no scheme"),
            "{}",
            msg("registry.db")
        );
        assert!(msg("1x:y").contains("start with a letter"));
        assert!(msg("sq_lite:x").contains("\"sq_lite\""));
        assert!(msg("etcd://a:1?x=1&x=2").contains("given twice"));
        let err = BackendUrl::parse("etcd://a:port")
            .unwrap()
            .hosts()
            .unwrap_err();
        assert!(err.to_string().contains("\"a:port\""), "{err}");
        let err = BackendUrl::parse("etcd:///p").unwrap().hosts().unwrap_err();
        assert!(err.to_string().contains("no HOST:PORT"), "{err}");
        let mut u = BackendUrl::parse("x:y?t=forever&b=yes&n=-1").unwrap();
        let e = u.take_duration("t").unwrap_err().to_string();
        assert!(
            e.contains("parameter t") && e.contains("\"forever\""),
            "{e}"
        );
        let e = u.take_bool("b").unwrap_err().to_string();
        assert!(e.contains("parameter b") && e.contains("\"yes\""), "{e}");
        let e = u
            .take_parsed::<u32>("n", "a count")
            .unwrap_err()
            .to_string();
        assert!(e.contains("parameter n") && e.contains("a count"), "{e}");
        assert!(BackendUrl::parse("x:y")
            .unwrap()
            .expect_scheme("sqlite", "sqlite:PATH")
            .is_err());
    }

    #[test]
    fn unknown_parameters_are_refused_naming_the_known_ones() {
        let mut u = BackendUrl::parse("sqlite:r.db?suspect_after=10s&sweep=1s").unwrap();
        let live = u.take_liveness(LivenessConfig::default()).unwrap();
        assert_eq!(live.suspect_after, Duration::from_secs(10));
        let e = u.finish().unwrap_err().to_string();
        assert!(e.contains("\"sweep\""), "{e}");
        assert!(
            e.contains("remove_after, suspect_after, sweep_interval"),
            "{e}"
        );
    }

    #[test]
    fn secrets_are_never_shown() {
        let u =
            BackendUrl::parse("etcd://root:hunter2@a:1/p?secret_access_key=abc&region=x").unwrap();
        for shown in [u.to_string(), format!("{u:?}")] {
            assert!(
                !shown.contains("hunter2") && !shown.contains("abc"),
                "{shown}"
            );
            assert!(
                shown.contains("root:***@a:1/p") && shown.contains("region=x"),
                "{shown}"
            );
        }
        let mut u = BackendUrl::parse("gossip://127.0.0.1:7946?key=s3cret&bogus=1").unwrap();
        u.take("key");
        let e = u.finish().unwrap_err().to_string();
        assert!(!e.contains("s3cret") && e.contains("key=***"), "{e}");
    }
}
