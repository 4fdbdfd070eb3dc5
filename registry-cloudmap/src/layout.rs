//! How an [`Endpoint`] becomes a Cloud Map instance and back: service
//! names, instance ids and attributes, with Cloud Map's own limits.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use sha2::{Digest, Sha256};
use waypost::{Endpoint, Error, Health, Protocol, Result};

/// Custom attributes Cloud Map allows on one instance.
pub const MAX_CUSTOM_ATTRIBUTES: usize = 30;
/// Custom attributes this backend may use for the endpoint's own fields
/// (`registry.host`, `registry.id`, `registry.cluster`, `registry.node`,
/// `registry.protocol`, `registry.health`).
pub const RESERVED_ATTRIBUTES: usize = 6;
/// Most labels one endpoint may carry in Cloud Map: the custom attributes
/// left after the reserved ones.
pub const MAX_LABELS: usize = MAX_CUSTOM_ATTRIBUTES - RESERVED_ATTRIBUTES;
/// Longest attribute key Cloud Map takes.
pub const MAX_ATTRIBUTE_KEY_LEN: usize = 255;
/// Longest attribute value Cloud Map takes.
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 1024;
/// Largest sum of the lengths of all keys and values of one instance's
/// attributes.
pub const MAX_ATTRIBUTES_LEN: usize = 5000;
/// Largest endpoint this backend stores, as measured by
/// [`waypost::limits::encoded_len`] (its `Capabilities::max_encoded_len`):
/// Cloud Map's [`MAX_ATTRIBUTES_LEN`] less what the attribute names and the
/// fixed fields add to an endpoint of printable ASCII (at most 277
/// characters with [`MAX_LABELS`] labels), so that every such endpoint up
/// to this size fits. Escaped characters take three, so an endpoint with
/// many of them can still exceed [`MAX_ATTRIBUTES_LEN`] below this size;
/// it is refused too, naming `endpoint`.
pub const MAX_ENCODED_LEN: usize = 4_700;
/// Longest Cloud Map instance id.
pub const MAX_INSTANCE_ID_LEN: usize = 64;
/// Longest Cloud Map service name.
pub const MAX_SERVICE_NAME_LEN: usize = 127;
/// Prefix of the Cloud Map names this backend derives by hashing; a name of
/// ours that starts with it is always hashed, so the mapping stays one to
/// one.
pub const HASHED_PREFIX: &str = "x--";

/// Standard attribute: the IPv4 address.
pub const ATTR_IPV4: &str = "AWS_INSTANCE_IPV4";
/// Standard attribute: the IPv6 address.
pub const ATTR_IPV6: &str = "AWS_INSTANCE_IPV6";
/// Standard attribute: the port.
pub const ATTR_PORT: &str = "AWS_INSTANCE_PORT";
/// Standard attribute read (never written) as the address of instances
/// registered by others.
pub const ATTR_CNAME: &str = "AWS_INSTANCE_CNAME";
/// The address when it is a host name rather than an IP address.
pub const ATTR_HOST: &str = "registry.host";
/// The endpoint id when the instance id is derived from it by hashing.
pub const ATTR_ID: &str = "registry.id";
/// The owning cluster.
pub const ATTR_CLUSTER: &str = "registry.cluster";
/// The owning node (absent when empty).
pub const ATTR_NODE: &str = "registry.node";
/// The protocol.
pub const ATTR_PROTOCOL: &str = "registry.protocol";
/// The health.
pub const ATTR_HEALTH: &str = "registry.health";
/// Prefix of label attributes: `label.<key>`.
pub const LABEL_PREFIX: &str = "label.";

/// Bytes escaped in attribute keys and values: control characters, space,
/// `%` and (always, by the encoder) everything outside ASCII. What is left
/// is the printable ASCII Cloud Map accepts.
const ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%');

/// Escape `s` for a Cloud Map attribute: percent-encoding of control
/// characters, space, `%` and everything outside ASCII; the empty string
/// becomes a lone `%` (Cloud Map values must not be empty, and an escaped
/// value never ends in a lone `%` otherwise).
pub fn escape(s: &str) -> String {
    if s.is_empty() {
        return "%".to_string();
    }
    utf8_percent_encode(s, ESCAPED).to_string()
}

/// Undo [`escape`]; `None` when the result is not UTF-8.
pub fn unescape(s: &str) -> Option<String> {
    if s == "%" {
        return Some(String::new());
    }
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

fn hashed(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
    format!("{HASHED_PREFIX}{hex}")
}

fn fits_service_name(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_SERVICE_NAME_LEN || s.starts_with(HASHED_PREFIX) {
        return false;
    }
    s.split('.').all(|label| {
        let b = label.as_bytes();
        let inner_ok =
            |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-';
        match b {
            [] => false,
            [c] => c.is_ascii_lowercase() || c.is_ascii_digit(),
            [first, .., last] => {
                b.len() <= 63 && b.iter().all(inner_ok) && *first != b'-' && *last != b'-'
            }
        }
    })
}

/// The Cloud Map service name of our service `service`: the name itself
/// when it is a valid Cloud Map service name (dot-separated labels of
/// 1 to 63 characters from `a-z 0-9 _ -`, not starting or ending with `-`,
/// at most 127 characters; upper case is avoided because DNS names ignore
/// case) that does not start with [`HASHED_PREFIX`]; otherwise
/// [`HASHED_PREFIX`] plus 40 hex digits of its SHA-256, with the name kept in
/// the service's description.
pub fn service_name(service: &str) -> String {
    if fits_service_name(service) {
        service.to_string()
    } else {
        hashed(service)
    }
}

/// Our service name for a Cloud Map service, or `None` when the service is
/// not one we can map back (a hashed name whose description does not hash
/// to it).
pub fn service_from_cloud_map(name: &str, description: Option<&str>) -> Option<String> {
    if !name.starts_with(HASHED_PREFIX) {
        return Some(name.to_string());
    }
    let original = description?;
    (hashed(original) == name).then(|| original.to_string())
}

/// Prefix of the reserved Cloud Map services that hold the nodes'
/// liveness records (one instance per node, see "Liveness" in the crate
/// docs). It starts with [`HASHED_PREFIX`] but is not followed by 40 hex
/// digits, so no service of ours maps to it ([`service_name`] hashes every
/// name that starts with [`HASHED_PREFIX`]); reads, snapshots and watches
/// of endpoints skip these services.
pub const NODE_SERVICE_PREFIX: &str = "x--registry-nodes-";
/// How many reserved services the node records are spread over (by a hash
/// of the node's name): Cloud Map allows at most 1,000 instances per
/// service, a quota that cannot be raised, so 16 services hold up to
/// about 14,000 nodes (the fullest of them reaches 1,000 first).
pub const NODE_SHARDS: usize = 16;
/// Attribute of a node record: the wall time of the node's last recorded
/// heartbeat, in milliseconds since the Unix epoch, by the clock of the
/// process that recorded it (the node itself is in [`ATTR_NODE`]).
pub const ATTR_BEAT: &str = "registry.beat";
/// Attribute of a node record: how many heartbeats were recorded, one more
/// at each (absent in records of a release that did not count them: 0).
/// Liveness is judged by its changes, on each sweeper's own clock.
pub const ATTR_BEATS: &str = "registry.beats";
/// Attribute of a node record: the keys liveness marked unhealthy, as
/// `service/id` pairs separated by `,`; continued in `registry.marked.1`,
/// `registry.marked.2`, … when one value cannot hold them.
pub const ATTR_MARKED: &str = "registry.marked";

/// The reserved Cloud Map service that holds `node`'s liveness record.
pub fn node_service(node: &str) -> String {
    let digest = Sha256::digest(node.as_bytes());
    format!(
        "{NODE_SERVICE_PREFIX}{:02}",
        usize::from(digest[0]) % NODE_SHARDS
    )
}

/// Every reserved service a node record may be in.
pub fn node_services() -> impl Iterator<Item = String> {
    (0..NODE_SHARDS).map(|k| format!("{NODE_SERVICE_PREFIX}{k:02}"))
}

/// Whether the Cloud Map service `name` is reserved for node records
/// (and so never read as a service of endpoints).
pub fn is_node_service(name: &str) -> bool {
    name.starts_with(NODE_SERVICE_PREFIX)
}

fn fits_instance_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_INSTANCE_ID_LEN
        && !id.starts_with(HASHED_PREFIX)
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_/:.@-".contains(&c))
}

/// The Cloud Map instance id of our endpoint id: the id itself when it
/// fits Cloud Map's rule (1 to 64 characters from `0-9 a-z A-Z _ / : . @ -`)
/// and does not start with [`HASHED_PREFIX`]; otherwise [`HASHED_PREFIX`]
/// plus 40 hex digits of its SHA-256, with the id kept in [`ATTR_ID`].
pub fn instance_id(id: &str) -> String {
    if fits_instance_id(id) {
        id.to_string()
    } else {
        hashed(id)
    }
}

/// The attributes of `ep`'s instance, checked against Cloud Map's limits.
/// `ep` must already have passed [`Endpoint::validate`].
pub fn encode(ep: &Endpoint) -> Result<HashMap<String, String>> {
    if ep.labels.len() > MAX_LABELS {
        return Err(Error::invalid(
            "labels",
            format!(
                "{} labels, more than the limit of {MAX_LABELS} in Cloud Map ({MAX_CUSTOM_ATTRIBUTES} \
                 custom attributes per instance, {RESERVED_ATTRIBUTES} kept for the endpoint's own fields)",
                ep.labels.len()
            ),
        ));
    }
    let len = waypost::limits::encoded_len(ep);
    if len > MAX_ENCODED_LEN {
        return Err(Error::invalid(
            "endpoint",
            format!(
                "encoded size is {len} bytes, larger than the limit of {MAX_ENCODED_LEN} in \
                 Cloud Map ({MAX_ATTRIBUTES_LEN} characters of attributes per instance)"
            ),
        ));
    }
    let mut attrs = HashMap::new();
    if ep.address.parse::<Ipv4Addr>().is_ok() {
        attrs.insert(ATTR_IPV4.to_string(), ep.address.clone());
    } else if ep.address.parse::<Ipv6Addr>().is_ok() {
        attrs.insert(ATTR_IPV6.to_string(), ep.address.clone());
    } else {
        attrs.insert(ATTR_HOST.to_string(), escape(&ep.address));
    }
    attrs.insert(ATTR_PORT.to_string(), ep.port.to_string());
    if instance_id(&ep.id) != ep.id {
        attrs.insert(ATTR_ID.to_string(), escape(&ep.id));
    }
    attrs.insert(ATTR_CLUSTER.to_string(), escape(&ep.cluster));
    if !ep.node.is_empty() {
        attrs.insert(ATTR_NODE.to_string(), escape(&ep.node));
    }
    attrs.insert(ATTR_PROTOCOL.to_string(), ep.protocol.as_str().to_string());
    attrs.insert(ATTR_HEALTH.to_string(), ep.health.as_str().to_string());
    for (k, v) in &ep.labels {
        let field = || format!("labels[{k:?}]");
        let key = format!("{LABEL_PREFIX}{}", escape(k));
        if key.len() > MAX_ATTRIBUTE_KEY_LEN {
            return Err(Error::invalid(
                field(),
                format!(
                    "key becomes the Cloud Map attribute name {key:?} of {} characters, more than \
                     the limit of {MAX_ATTRIBUTE_KEY_LEN}",
                    key.len()
                ),
            ));
        }
        let value = escape(v);
        if value.len() > MAX_ATTRIBUTE_VALUE_LEN {
            return Err(Error::invalid(
                field(),
                format!(
                    "value takes {} characters once escaped for Cloud Map, more than the limit of \
                     {MAX_ATTRIBUTE_VALUE_LEN}",
                    value.len()
                ),
            ));
        }
        attrs.insert(key, value);
    }
    let total: usize = attrs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ATTRIBUTES_LEN {
        return Err(Error::invalid(
            "endpoint",
            format!(
                "its Cloud Map attributes take {total} characters (keys and values), more than the \
                 limit of {MAX_ATTRIBUTES_LEN}"
            ),
        ));
    }
    Ok(attrs)
}

/// The endpoint of service `service` stored as instance `instance_id` with
/// `attrs`; `Err` says why the instance can't be read as an endpoint.
pub fn decode(
    service: &str,
    instance_id: &str,
    attrs: &HashMap<String, String>,
) -> std::result::Result<Endpoint, String> {
    let text = |key: &str| -> std::result::Result<Option<String>, String> {
        match attrs.get(key) {
            None => Ok(None),
            Some(v) => unescape(v)
                .map(Some)
                .ok_or_else(|| format!("attribute {key} = {v:?} is not escaped UTF-8")),
        }
    };
    let id = text(ATTR_ID)?.unwrap_or_else(|| instance_id.to_string());
    let address = match (attrs.get(ATTR_IPV4), attrs.get(ATTR_IPV6)) {
        (Some(v4), _) => v4.clone(),
        (None, Some(v6)) => v6.clone(),
        (None, None) => match text(ATTR_HOST)? {
            Some(h) => h,
            None => attrs.get(ATTR_CNAME).cloned().ok_or(
                "no address attribute (AWS_INSTANCE_IPV4, AWS_INSTANCE_IPV6, registry.host)",
            )?,
        },
    };
    let port = attrs
        .get(ATTR_PORT)
        .ok_or("no AWS_INSTANCE_PORT attribute")?
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or("AWS_INSTANCE_PORT is not a port between 1 and 65535")?;
    let mut ep = Endpoint::new(service, id, address, port);
    if let Some(p) = attrs.get(ATTR_PROTOCOL) {
        ep.protocol = p.parse::<Protocol>().map_err(|e| e.to_string())?;
    }
    if let Some(h) = attrs.get(ATTR_HEALTH) {
        ep.health = h.parse::<Health>().map_err(|e| e.to_string())?;
    }
    ep.cluster = text(ATTR_CLUSTER)?.unwrap_or_else(|| Endpoint::DEFAULT_CLUSTER.to_string());
    ep.node = text(ATTR_NODE)?.unwrap_or_default();
    for k in attrs.keys() {
        if let Some(raw) = k.strip_prefix(LABEL_PREFIX) {
            let key = unescape(raw)
                .ok_or_else(|| format!("label attribute {k:?} is not escaped UTF-8"))?;
            let value = text(k)?.unwrap_or_default();
            ep.labels.insert(key, value);
        }
    }
    Ok(ep)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn escape_roundtrips_and_stays_printable_ascii() {
        for s in [
            "",
            "%",
            "plain",
            "ünï ✓ \"quoted\" / slash",
            " lead",
            "trail ",
            "a%20b",
        ] {
            let e = escape(s);
            assert!(!e.is_empty());
            assert!(e.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{e:?}");
            assert_eq!(unescape(&e).as_deref(), Some(s), "{s:?} -> {e:?}");
        }
        assert_eq!(escape("eu-west-1a"), "eu-west-1a");
    }

    #[test]
    fn names_map_verbatim_or_hashed() {
        assert_eq!(service_name("payments"), "payments");
        assert_eq!(service_name("api.v2_x"), "api.v2_x");
        for odd in [
            "foo/bar",
            "foo-",
            "Payments",
            "x--abc",
            &"s".repeat(128),
            "a..b",
        ] {
            let n = service_name(odd);
            assert!(
                n.starts_with(HASHED_PREFIX) && n.len() == 43,
                "{odd} -> {n}"
            );
            assert_eq!(service_from_cloud_map(&n, Some(odd)).as_deref(), Some(odd));
            assert_eq!(service_from_cloud_map(&n, Some("other")), None);
        }
        assert_ne!(service_name("foo/bar"), service_name("foo_bar"));
        assert_eq!(instance_id("pod-a:8080@x/y"), "pod-a:8080@x/y");
        assert!(instance_id("has%percent").starts_with(HASHED_PREFIX));
        assert!(instance_id(&"i".repeat(65)).starts_with(HASHED_PREFIX));
    }

    #[test]
    fn node_services_are_reserved() {
        let all: Vec<String> = node_services().collect();
        assert_eq!(all.len(), NODE_SHARDS);
        for node in ["node-1", "ünï", &"n".repeat(253)] {
            let s = node_service(node);
            assert!(all.contains(&s) && is_node_service(&s), "{s}");
            // No service of ours maps to it, and it is not read as one.
            assert_eq!(service_from_cloud_map(&s, None), None);
            assert_eq!(service_from_cloud_map(&s, Some(&s)), None);
            assert!(fits_cloud_map_name(&s), "{s}");
        }
        for name in all
            .iter()
            .map(String::as_str)
            .chain(["x--registry-nodes-03", "x--registry-nodes-"])
        {
            assert_ne!(service_name(name), name);
            assert!(!is_node_service(&service_name(name)));
        }
    }

    /// Cloud Map's rule for service names (labels of 1 to 63 characters
    /// from `a-z A-Z 0-9 _ -`, not starting or ending with `-`).
    fn fits_cloud_map_name(s: &str) -> bool {
        s.len() <= MAX_SERVICE_NAME_LEN
            && s.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && b.len() <= 63
                    && b.iter()
                        .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
                    && b[0] != b'-'
                    && b[b.len() - 1] != b'-'
            })
    }

    #[test]
    fn endpoint_roundtrips_through_attributes() {
        let full = Endpoint::new("svc", "i".repeat(200), "::1", 65535)
            .with_protocol(Protocol::Grpc)
            .with_cluster("")
            .with_node("node 7")
            .with_health(Health::Unhealthy)
            .with_label("zone", "eu-west-1a")
            .with_label("ünï", "")
            .with_label("q", "\"quoted\" / ✓");
        let attrs = encode(&full).unwrap_or_default();
        assert_eq!(attrs.get(ATTR_IPV6).map(String::as_str), Some("::1"));
        let back = decode("svc", &instance_id(&full.id), &attrs);
        assert_eq!(back, Ok(full));
        let host = Endpoint::new("svc", "a", "db.internal", 5432);
        let attrs = encode(&host).unwrap_or_default();
        assert_eq!(
            attrs.get(ATTR_HOST).map(String::as_str),
            Some("db.internal")
        );
        assert_eq!(attrs.get(ATTR_PORT).map(String::as_str), Some("5432"));
        assert_eq!(decode("svc", "a", &attrs), Ok(host));
    }

    #[test]
    fn limits_name_the_field() {
        let mut e = Endpoint::new("s", "i", "10.0.0.1", 1);
        for i in 0..=MAX_LABELS {
            e.labels.insert(format!("k{i}"), "v".into());
        }
        match encode(&e) {
            Err(Error::InvalidInput { field, reason, .. }) => {
                assert_eq!(field, "labels");
                assert!(reason.contains("24") && reason.contains("30"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let e = Endpoint::new("s", "i", "10.0.0.1", 1).with_label("z", "ü".repeat(200));
        assert!(
            matches!(encode(&e), Err(Error::InvalidInput { field, .. }) if field == "labels[\"z\"]")
        );
        let mut e = Endpoint::new("s", "i", "10.0.0.1", 1);
        for i in 0..5 {
            e.labels.insert(format!("k{i}"), "v".repeat(1000));
        }
        assert!(
            matches!(encode(&e), Err(Error::InvalidInput { field, .. }) if field == "endpoint")
        );
    }

    #[test]
    fn foreign_instances_decode_or_say_why() {
        let mut attrs = HashMap::new();
        attrs.insert(ATTR_IPV4.to_string(), "192.0.2.44".to_string());
        assert!(decode("s", "i", &attrs).unwrap_err().contains("PORT"));
        attrs.insert(ATTR_PORT.to_string(), "80".to_string());
        let ep = decode("s", "i", &attrs).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ep, Endpoint::new("s", "i", "192.0.2.44", 80));
    }
}
