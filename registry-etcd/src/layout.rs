//! Where endpoints live in etcd and how they are encoded.
//!
//! Keys are `<prefix>/services/<service>/<id>`, where `service` and `id` are
//! escaped so that each is exactly one path segment: `%` becomes `%25` and
//! `/` becomes `%2F`; nothing else changes (validation already forbids
//! whitespace and control characters). Listing a service reads the prefix
//! `<prefix>/services/<escaped service>/`, so `foo` never sees `foo_other`
//! nor `foo/bar` (stored as `foo%2Fbar`).
//!
//! Values are JSON objects: `{"v":1, ...}` where `v` is the encoding
//! version and the other fields are those of [`Endpoint`] (`service`, `id`,
//! `address`, `port`, `protocol`, `cluster`, `node`, `health`, `labels`).
//! A reader refuses a version it does not know rather than guess.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use waypost::{Endpoint, EndpointKey, Error};

use crate::error;

/// The encoding version written in every value.
pub const ENCODING_VERSION: u32 = 1;

/// Key builder and parser for one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// `<prefix>/services/`
    root: String,
}

impl Layout {
    /// The layout under `prefix` (without trailing `/`).
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            root: format!("{prefix}/services/"),
        }
    }

    /// `<prefix>/services/`: every endpoint's key starts with it.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// `<prefix>/services/<service>/`: the keys of one service.
    pub(crate) fn service_prefix(&self, service: &str) -> String {
        format!("{}{}/", self.root, escape(service))
    }

    /// The key of an endpoint.
    pub(crate) fn key(&self, key: &EndpointKey) -> String {
        format!("{}{}/{}", self.root, escape(&key.service), escape(&key.id))
    }

    /// The endpoint key a stored key names; `None` for a key that is not
    /// ours (wrong prefix, wrong number of segments, bad escape).
    pub(crate) fn parse(&self, key: &[u8]) -> Option<EndpointKey> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.root)?;
        let (service, id) = rest.split_once('/')?;
        if id.contains('/') || service.is_empty() || id.is_empty() {
            return None;
        }
        Some(EndpointKey::new(unescape(service)?, unescape(id)?))
    }
}

/// Escape one key segment: `%` → `%25`, `/` → `%2F`.
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(['%', '/']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Undo [`escape`]; `None` for an escape we never write.
pub(crate) fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        match code {
            "25" => out.push('%'),
            "2F" => out.push('/'),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The end of the range holding every key that starts with `prefix`.
pub(crate) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only 0xff bytes (never for our prefixes): to the end of the keyspace.
    vec![0]
}

#[derive(Serialize)]
struct RecordRef<'a> {
    v: u32,
    #[serde(flatten)]
    endpoint: &'a Endpoint,
}

#[derive(Deserialize)]
struct Probe {
    v: u32,
}

#[derive(Deserialize)]
struct Record {
    #[serde(flatten)]
    endpoint: Endpoint,
}

/// Encode an endpoint as a value.
pub(crate) fn encode(endpoint: &Endpoint) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(&RecordRef {
        v: ENCODING_VERSION,
        endpoint,
    })
    .map_err(|e| Error::internal(format!("cannot encode endpoint {}: {e}", endpoint.key())))
}

/// Decode the value stored at `key`, checking that it names the same
/// endpoint as the key.
pub(crate) fn decode(layout: &Layout, key: &[u8], value: &[u8]) -> Result<Endpoint, Error> {
    let key_str = String::from_utf8_lossy(key);
    let probe: Probe = serde_json::from_slice(value).map_err(|e| error::corrupt(&key_str, e))?;
    if probe.v != ENCODING_VERSION {
        return Err(error::corrupt(
            &key_str,
            format!(
                "encoding version {} is not supported (this build reads {ENCODING_VERSION})",
                probe.v
            ),
        ));
    }
    let record: Record = serde_json::from_slice(value).map_err(|e| error::corrupt(&key_str, e))?;
    match layout.parse(key) {
        Some(k) if record.endpoint.has_key(&k) => Ok(record.endpoint),
        _ => Err(error::corrupt(
            &key_str,
            format!(
                "value is endpoint {}, not the one the key names",
                record.endpoint.key()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::{Health, Protocol};

    #[test]
    fn escaping_round_trips_and_isolates_services() {
        for s in ["plain", "a/b", "%", "%2F", "50%/x/", "ü/%25"] {
            assert_eq!(unescape(&escape(s)).as_deref(), Some(s), "{s}");
            assert!(!escape(s).contains('/'), "{s}");
        }
        let l = Layout::new("/registry");
        let foo = l.service_prefix("foo");
        for other in ["foo_other", "foo/bar", "fo", "foo-"] {
            let k = l.key(&EndpointKey::new(other, "x"));
            assert!(!k.starts_with(&foo), "{k} is under {foo}");
        }
        let k = EndpointKey::new("foo/bar", "id/with%slash");
        assert_eq!(l.key(&k), "/registry/services/foo%2Fbar/id%2Fwith%25slash");
        assert_eq!(l.parse(l.key(&k).as_bytes()), Some(k));
        assert_eq!(l.parse(b"/registry/services/a/b/c"), None);
        assert_eq!(l.parse(b"/other/services/a/b"), None);
        assert_eq!(l.parse(b"/registry/services/a%zz/b"), None);
    }

    #[test]
    fn range_end_is_the_next_prefix() {
        assert_eq!(range_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(range_end(&[b'a', 0xff]), b"b".to_vec());
    }

    #[test]
    fn values_are_versioned_json() {
        let l = Layout::new("/p");
        let ep = Endpoint::new("api", "a/1", "10.0.0.1", 80)
            .with_protocol(Protocol::Grpc)
            .with_node("n1")
            .with_health(Health::Unhealthy)
            .with_label("rack", "eu \"1\"");
        let v = encode(&ep).expect("encode");
        let json: serde_json::Value = serde_json::from_slice(&v).expect("json");
        assert_eq!(json["v"], 1);
        assert_eq!(json["service"], "api");
        let key = l.key(&ep.key());
        assert_eq!(decode(&l, key.as_bytes(), &v).expect("decode"), ep);

        let future = br#"{"v":2,"service":"api","id":"a/1"}"#;
        let err = decode(&l, key.as_bytes(), future).expect_err("v2");
        assert!(err.to_string().contains("version 2"), "{err}");
        let wrong = l.key(&EndpointKey::new("api", "other"));
        assert!(decode(&l, wrong.as_bytes(), &v).is_err());
        assert!(decode(&l, key.as_bytes(), b"not json").is_err());
    }
}
