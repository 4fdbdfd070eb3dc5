//! `serve`'s backend: `--registry URL`, or the per-backend flags
//! (`--registry-backend`, `--sqlite-path`, `--etcd-endpoints`, …), which
//! are mapped to the same URL, so that the registrar opens its backend as
//! every program using the toolkit does ([`waypost_registrar_server::open_backend`]).

use std::fmt::Write as _;

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS, NON_ALPHANUMERIC};

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use crate::values::count_in;

/// The backends `--registry-backend` names in this build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// In memory: lost on exit (tests, development).
    Memory,
    /// One SQLite file (`--sqlite-path`).
    #[cfg(feature = "sqlite")]
    Sqlite,
    /// etcd (`--etcd-endpoints`, `--etcd-prefix`).
    #[cfg(feature = "etcd")]
    Etcd,
    /// DynamoDB (`--dynamodb-table`, `--dynamodb-sync`, …).
    #[cfg(feature = "dynamodb")]
    Dynamodb,
    /// AWS Cloud Map (`--cloudmap-namespace`).
    #[cfg(feature = "cloudmap")]
    Cloudmap,
}

impl BackendKind {
    /// Every kind this build includes, in the order `--help` lists them.
    pub const ALL: &'static [BackendKind] = &[
        BackendKind::Memory,
        #[cfg(feature = "sqlite")]
        BackendKind::Sqlite,
        #[cfg(feature = "etcd")]
        BackendKind::Etcd,
        #[cfg(feature = "dynamodb")]
        BackendKind::Dynamodb,
        #[cfg(feature = "cloudmap")]
        BackendKind::Cloudmap,
    ];

    /// Its `--registry-backend` value (also its URL scheme).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            #[cfg(feature = "sqlite")]
            BackendKind::Sqlite => "sqlite",
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => "etcd",
            #[cfg(feature = "dynamodb")]
            BackendKind::Dynamodb => "dynamodb",
            #[cfg(feature = "cloudmap")]
            BackendKind::Cloudmap => "cloudmap",
        }
    }

    /// The product's name, for `--help`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "in-memory",
            #[cfg(feature = "sqlite")]
            BackendKind::Sqlite => "SQLite",
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => "etcd",
            #[cfg(feature = "dynamodb")]
            BackendKind::Dynamodb => "DynamoDB",
            #[cfg(feature = "cloudmap")]
            BackendKind::Cloudmap => "AWS Cloud Map",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a backend of this build"))
    }
}

/// How the registrar follows a DynamoDB table (`--dynamodb-sync`; the
/// URL's `watch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DynamoDbSync {
    /// The table's stream when it has one, else a scan every
    /// `--sync-interval`.
    #[default]
    Auto,
    /// The change log in the table: one Query per `--sync-interval`.
    Changelog,
    /// A scan of the whole table every `--sync-interval`.
    Scan,
}

impl DynamoDbSync {
    /// Every mode, in the order `--help` lists them.
    pub const ALL: &'static [DynamoDbSync] = &[
        DynamoDbSync::Auto,
        DynamoDbSync::Changelog,
        DynamoDbSync::Scan,
    ];

    /// Its `--dynamodb-sync` value (also the URL's `watch`).
    pub fn as_str(self) -> &'static str {
        match self {
            DynamoDbSync::Auto => "auto",
            DynamoDbSync::Changelog => "changelog",
            DynamoDbSync::Scan => "scan",
        }
    }
}

impl std::str::FromStr for DynamoDbSync {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not auto, changelog or scan"))
    }
}

/// `serve`'s flags that name the backend: `--registry URL`, or the
/// per-backend flags.
#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// The backend holding the registry, as one URL: `sqlite:PATH`,
    /// `etcd://HOST:PORT[,HOST:PORT]/PREFIX`, `dynamodb://TABLE?region=…`,
    /// `cloudmap://NAMESPACE?region=…` or `memory:` (keeps nothing), with
    /// the backend's settings as parameters (`?suspect_after=10s`, …)
    /// [default: sqlite:registry.db]. The per-backend flags below describe
    /// the same URL.
    #[arg(long)]
    pub registry: Option<String>,
    /// The backend, when --registry is not given [default: sqlite, or the
    /// backend whose own flags are given].
    #[arg(long, value_parser = backend_kind())]
    pub registry_backend: Option<BackendKind>,
    /// The SQLite file (`--registry-backend=sqlite`) [default:
    /// registry.db].
    #[arg(long)]
    pub sqlite_path: Option<PathBuf>,
    /// etcd endpoints, comma-separated (`--registry-backend=etcd`)
    /// [default: http://127.0.0.1:2379].
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// Key prefix in etcd [default: /registry].
    #[arg(long)]
    pub etcd_prefix: Option<String>,
    /// The DynamoDB table (`--registry-backend=dynamodb`) [default:
    /// registry].
    #[arg(long)]
    pub dynamodb_table: Option<String>,
    /// Create the DynamoDB table (on-demand, with a stream) if it is missing.
    #[arg(long)]
    pub dynamodb_create_table: bool,
    /// How the DynamoDB table is followed: `auto` (its stream when it has
    /// one, at most two readers per shard; else a scan every
    /// --sync-interval), `changelog` (a change log in the table, one Query
    /// per --sync-interval; for many replicas; every registrar writing the
    /// table must use it) or `scan` (a full scan every --sync-interval).
    /// [default: auto]
    #[arg(long, value_parser = dynamodb_sync())]
    pub dynamodb_sync: Option<DynamoDbSync>,
    /// Heads of the DynamoDB change log (`--dynamodb-sync=changelog`), 1 to
    /// 64: tens of registrars writing one table need several (each key is
    /// logged on one head; readers send one Query per head). Every
    /// registrar on the table must use the same number. [default: 1]
    #[arg(long, value_parser = count_in(1, 64))]
    pub dynamodb_changelog_heads: Option<usize>,
    /// The Cloud Map namespace (`--registry-backend=cloudmap`); created as an
    /// HTTP namespace if missing [default: registry].
    #[arg(long)]
    pub cloudmap_namespace: Option<String>,
    /// AWS region for DynamoDB and Cloud Map (default: the AWS chain's).
    #[arg(long, env = "AWS_REGION")]
    pub aws_region: Option<String>,
    /// AWS endpoint URL for DynamoDB and Cloud Map (an emulator, a VPC endpoint).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub aws_endpoint_url: Option<String>,
}

/// `--registry-backend`: the backends this build includes, each listed in
/// `--help` with its product's name.
fn backend_kind() -> impl TypedValueParser<Value = BackendKind> {
    let names = BackendKind::ALL
        .iter()
        .map(|k| PossibleValue::new(k.as_str()).help(k.name()));
    PossibleValuesParser::new(names).try_map(|s| s.parse::<BackendKind>())
}

/// `--dynamodb-sync`: `auto`, `changelog` or `scan`.
fn dynamodb_sync() -> impl TypedValueParser<Value = DynamoDbSync> {
    let names = DynamoDbSync::ALL.iter().map(|m| m.as_str());
    PossibleValuesParser::new(names).try_map(|s| s.parse::<DynamoDbSync>())
}

/// The product a URL's scheme names, for messages: `SQLite`, `etcd`,
/// `DynamoDB`, `AWS Cloud Map`, `in-memory`; the scheme itself for one
/// this build does not know.
pub fn product_name(scheme: &str) -> &str {
    match scheme {
        "memory" => "in-memory",
        "sqlite" => "SQLite",
        "etcd" | "etcds" => "etcd",
        "dynamodb" => "DynamoDB",
        "cloudmap" => "AWS Cloud Map",
        "" => "registry",
        other => other,
    }
}

/// What a path keeps of itself in `sqlite:PATH`: everything but controls,
/// `%`, `?` and `#`.
const PATH_ESCAPED: &AsciiSet = &CONTROLS.add(b'%').add(b'?').add(b'#').add(b' ');
/// What a table's or namespace's name keeps of itself as a URL's
/// authority: everything but what would end or split it.
const NAME_ESCAPED: &AsciiSet = &PATH_ESCAPED.add(b'/').add(b'@').add(b':').add(b',');

/// `url` with `name=value` added to its query (`value` percent-encoded).
fn push_param(url: &mut String, name: &str, value: &str) {
    let sep = if url.contains('?') { '&' } else { '?' };
    let value = utf8_percent_encode(value, NON_ALPHANUMERIC);
    let _ = write!(url, "{sep}{name}={value}");
}

/// Whether `url`'s query gives `name`.
fn has_param(url: &str, name: &str) -> bool {
    url.split_once('?').is_some_and(|(_, q)| {
        q.split('&')
            .any(|p| p.split_once('=').map_or(p, |(n, _)| n) == name)
    })
}

impl BackendArgs {
    /// The backend's URL: `--registry`, or the one the per-backend flags
    /// describe. `--aws-region` and `--aws-endpoint-url` (and their
    /// environment variables) fill in a DynamoDB or Cloud Map URL's
    /// `region` and `endpoint` when it gives none. A backend named twice
    /// (by `--registry` and a backend's flag, or by two backends' flags)
    /// is an error naming both.
    pub fn registry_url(&self) -> Result<String, String> {
        let mut url = match &self.registry {
            Some(url) => {
                if let Some(kind) = self.registry_backend {
                    return Err(format!(
                        "--registry and --registry-backend={} both name the backend: drop one",
                        kind.as_str()
                    ));
                }
                if let Some((flag, kind)) = self.backend_flags_given().first() {
                    return Err(format!(
                        "--registry names the backend, and {flag} is a flag of the {kind} \
                         backend: give its setting as a parameter of the URL instead"
                    ));
                }
                url.clone()
            }
            None => self.url_of_flags()?,
        };
        if url.starts_with("dynamodb:") || url.starts_with("cloudmap:") {
            if let (Some(region), false) = (&self.aws_region, has_param(&url, "region")) {
                push_param(&mut url, "region", region);
            }
            if let (Some(endpoint), false) = (&self.aws_endpoint_url, has_param(&url, "endpoint")) {
                push_param(&mut url, "endpoint", endpoint);
            }
        }
        Ok(url)
    }

    /// The URL the per-backend flags describe.
    fn url_of_flags(&self) -> Result<String, String> {
        let kind = self.backend_kind()?;
        Ok(match kind {
            BackendKind::Memory => "memory:".to_string(),
            #[cfg(feature = "sqlite")]
            BackendKind::Sqlite => {
                let path = self
                    .sqlite_path
                    .as_deref()
                    .unwrap_or(std::path::Path::new("registry.db"));
                let path = path
                    .to_str()
                    .ok_or_else(|| format!("--sqlite-path {}: not UTF-8", path.display()))?;
                format!("sqlite:{}", utf8_percent_encode(path, PATH_ESCAPED))
            }
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => self.etcd_url()?,
            #[cfg(feature = "dynamodb")]
            BackendKind::Dynamodb => {
                let table = self.dynamodb_table.as_deref().unwrap_or("registry");
                let mut url = format!("dynamodb://{}", utf8_percent_encode(table, NAME_ESCAPED));
                if let Some(sync) = self.dynamodb_sync {
                    push_param(&mut url, "watch", sync.as_str());
                }
                if let Some(heads) = self.dynamodb_changelog_heads {
                    push_param(&mut url, "heads", &heads.to_string());
                }
                if self.dynamodb_create_table {
                    push_param(&mut url, "create_table", "true");
                }
                url
            }
            #[cfg(feature = "cloudmap")]
            BackendKind::Cloudmap => {
                let ns = self.cloudmap_namespace.as_deref().unwrap_or("registry");
                format!("cloudmap://{}", utf8_percent_encode(ns, NAME_ESCAPED))
            }
        })
    }

    /// `etcd://` (or `etcds://` when every endpoint is `https://`) with the
    /// endpoints' `HOST:PORT` and the prefix.
    #[cfg(feature = "etcd")]
    fn etcd_url(&self) -> Result<String, String> {
        let default = ["http://127.0.0.1:2379".to_string()];
        let endpoints = self.etcd_endpoints.as_deref().unwrap_or(&default);
        let mut tls = None;
        let mut hosts = Vec::new();
        for e in endpoints {
            let (secure, host) = match e.split_once("://") {
                Some(("https", h)) => (true, h),
                Some(("http", h)) => (false, h),
                Some(_) => {
                    return Err(format!(
                        "--etcd-endpoints {e:?}: expected http://HOST:PORT or https://HOST:PORT"
                    ))
                }
                None => (false, e.as_str()),
            };
            if tls.is_some_and(|t| t != secure) {
                return Err(
                    "--etcd-endpoints mixes http:// and https://: use one for all".to_string(),
                );
            }
            tls = Some(secure);
            hosts.push(host.trim_end_matches('/'));
        }
        let scheme = if tls == Some(true) { "etcds" } else { "etcd" };
        let prefix = self.etcd_prefix.as_deref().unwrap_or("/registry");
        let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
        Ok(format!(
            "{scheme}://{}/{}",
            hosts.join(","),
            utf8_percent_encode(prefix, PATH_ESCAPED)
        ))
    }

    /// The backend: `--registry-backend`, else the one whose own flags are
    /// given, else SQLite. A backend's flag given beside another backend
    /// (selected, or named by its own flags) is an error naming both
    /// flags: it would otherwise be ignored.
    pub fn backend_kind(&self) -> Result<BackendKind, String> {
        let given = self.backend_flags_given();
        if let Some(kind) = self.registry_backend {
            if let Some((flag, other)) = given.iter().find(|(_, k)| *k != kind.as_str()) {
                return Err(format!(
                    "{flag} is a flag of the {other} backend, but --registry-backend={} \
                     was given: drop one of them",
                    kind.as_str()
                ));
            }
            return Ok(kind);
        }
        let Some((flag, name)) = given.first() else {
            return Ok(default_backend());
        };
        if let Some((other_flag, other)) = given.iter().find(|(_, k)| k != name) {
            return Err(format!(
                "{flag} selects the {name} backend and {other_flag} the {other} backend: \
                 give --registry-backend and only that backend's flags"
            ));
        }
        name.parse::<BackendKind>().map_err(|_| {
            format!(
                "{flag} selects the {name} backend, which this build does not include \
                 (cargo feature `{name}`)"
            )
        })
    }

    /// The backend flags given, each with its backend's `--registry-backend`
    /// value.
    pub(crate) fn backend_flags_given(&self) -> Vec<(&'static str, &'static str)> {
        let flags = [
            ("--sqlite-path", "sqlite", self.sqlite_path.is_some()),
            ("--etcd-endpoints", "etcd", self.etcd_endpoints.is_some()),
            ("--etcd-prefix", "etcd", self.etcd_prefix.is_some()),
            (
                "--dynamodb-table",
                "dynamodb",
                self.dynamodb_table.is_some(),
            ),
            (
                "--dynamodb-create-table",
                "dynamodb",
                self.dynamodb_create_table,
            ),
            ("--dynamodb-sync", "dynamodb", self.dynamodb_sync.is_some()),
            (
                "--dynamodb-changelog-heads",
                "dynamodb",
                self.dynamodb_changelog_heads.is_some(),
            ),
            (
                "--cloudmap-namespace",
                "cloudmap",
                self.cloudmap_namespace.is_some(),
            ),
        ];
        flags
            .into_iter()
            .filter(|(_, _, given)| *given)
            .map(|(flag, kind, _)| (flag, kind))
            .collect()
    }
}

/// The backend when no flag names one: SQLite, which keeps what it
/// acknowledged; in-memory only in a build without it.
fn default_backend() -> BackendKind {
    #[cfg(feature = "sqlite")]
    return BackendKind::Sqlite;
    #[cfg(not(feature = "sqlite"))]
    return BackendKind::Memory;
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::BackendArgs;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        backend: BackendArgs,
    }

    fn url(args: &[&str]) -> Result<String, String> {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(args);
        Serve::try_parse_from(argv)
            .expect("flags parse")
            .backend
            .registry_url()
    }

    #[test]
    fn the_flags_map_to_the_url() {
        assert_eq!(url(&[]).unwrap(), "sqlite:registry.db");
        assert_eq!(
            url(&["--sqlite-path", "/var/lib/my registry.db"]).unwrap(),
            "sqlite:/var/lib/my%20registry.db"
        );
        assert_eq!(url(&["--registry-backend", "memory"]).unwrap(), "memory:");
        assert_eq!(
            url(&["--registry", "sqlite:/data/r.db?suspect_after=10s"]).unwrap(),
            "sqlite:/data/r.db?suspect_after=10s"
        );
    }

    #[cfg(all(feature = "etcd", feature = "dynamodb"))]
    #[test]
    fn backends_with_servers() {
        assert_eq!(
            url(&[
                "--etcd-endpoints",
                "http://a:2379,http://b:2379",
                "--etcd-prefix",
                "/apps"
            ])
            .unwrap(),
            "etcd://a:2379,b:2379/apps"
        );
        assert_eq!(
            url(&["--etcd-endpoints", "https://a:2379"]).unwrap(),
            "etcds://a:2379/registry"
        );
        assert!(url(&["--etcd-endpoints", "https://a:1,http://b:2"])
            .unwrap_err()
            .contains("mixes"));
        assert_eq!(
            url(&[
                "--dynamodb-table",
                "my-reg",
                "--dynamodb-sync",
                "changelog",
                "--dynamodb-changelog-heads",
                "8",
                "--dynamodb-create-table",
                "--aws-region",
                "us-east-1",
                "--aws-endpoint-url",
                "http://127.0.0.1:5000",
            ])
            .unwrap(),
            "dynamodb://my-reg?watch=changelog&heads=8&create_table=true\
             &region=us%2Deast%2D1&endpoint=http%3A%2F%2F127%2E0%2E0%2E1%3A5000"
        );
        // The URL's own region wins over --aws-region.
        assert_eq!(
            url(&[
                "--registry",
                "dynamodb://t?region=eu-west-1",
                "--aws-region",
                "us-east-1"
            ])
            .unwrap(),
            "dynamodb://t?region=eu-west-1"
        );
    }

    #[test]
    fn a_backend_named_twice_is_refused_naming_both() {
        let e = url(&["--registry", "memory:", "--registry-backend", "memory"]).unwrap_err();
        assert!(
            e.contains("--registry and --registry-backend=memory"),
            "{e}"
        );
        let e = url(&["--registry", "memory:", "--sqlite-path", "x.db"]).unwrap_err();
        assert!(e.contains("--sqlite-path"), "{e}");
    }
}
