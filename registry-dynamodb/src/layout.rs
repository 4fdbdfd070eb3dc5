//! How an endpoint is stored: one item per endpoint, in plain attributes
//! that any AWS tool can read and write (see the crate README for the
//! table), a DynamoDB Streams image read back as such an item, and what a
//! change read back (from the stream or the change log) means.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodbstreams::types::AttributeValue as StreamValue;
use waypost::{Endpoint, EndpointKey, Error, Health, Protocol};

/// A change read back from the table's stream or its change log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change {
    Put(Endpoint),
    Remove(EndpointKey),
}

/// Partition key: the service name.
pub(crate) const SERVICE: &str = "service";
/// Sort key: the endpoint id.
pub(crate) const ID: &str = "id";
const ADDRESS: &str = "address";
const PORT: &str = "port";
const PROTOCOL: &str = "protocol";
const CLUSTER: &str = "cluster";
const NODE: &str = "node";
const HEALTH: &str = "health";
const LABELS: &str = "labels";

/// The partition of the change log's items (see `changelog/mod.rs`; head
/// `h` ≥ 1 of a log of several is in `LOG_PARTITION/h`). It holds a space,
/// which no valid service name does, so no endpoint can ever share it;
/// reads and the stream watch skip it.
pub(crate) const LOG_PARTITION: &str = "~registry changelog";

/// The partition of the nodes' liveness records (see `nodes.rs`); like
/// [`LOG_PARTITION`] it holds a space, so no endpoint can share it.
pub(crate) const NODE_PARTITION: &str = "~registry nodes";

/// Whether `item` is one of the registry's own bookkeeping items (the
/// change log, the nodes' records), not an endpoint.
pub(crate) fn is_internal(item: &Item) -> bool {
    matches!(item.get(SERVICE), Some(AttributeValue::S(s)) if s.starts_with(LOG_PARTITION) || s == NODE_PARTITION)
}

/// An item as the SDK holds it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The primary key of `key`.
pub(crate) fn key_item(key: &EndpointKey) -> Item {
    HashMap::from([
        (SERVICE.to_string(), AttributeValue::S(key.service.clone())),
        (ID.to_string(), AttributeValue::S(key.id.clone())),
    ])
}

/// The item of an already validated endpoint; with a TTL attribute set to
/// `now + ttl` when both are given.
pub(crate) fn encode(e: &Endpoint, ttl: Option<(&str, Duration)>) -> Item {
    let s = |v: &str| AttributeValue::S(v.to_string());
    let labels = e
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), s(v)))
        .collect::<HashMap<_, _>>();
    let mut item = HashMap::from([
        (SERVICE.to_string(), s(&e.service)),
        (ID.to_string(), s(&e.id)),
        (ADDRESS.to_string(), s(&e.address)),
        (PORT.to_string(), AttributeValue::N(e.port.to_string())),
        (PROTOCOL.to_string(), s(e.protocol.as_str())),
        (CLUSTER.to_string(), s(&e.cluster)),
        (NODE.to_string(), s(&e.node)),
        (HEALTH.to_string(), s(e.health.as_str())),
        (LABELS.to_string(), AttributeValue::M(labels)),
    ]);
    if let Some((attr, ttl)) = ttl {
        let at = now_secs().saturating_add(ttl.as_secs().max(1));
        item.insert(attr.to_string(), AttributeValue::N(at.to_string()));
    }
    item
}

fn corrupt(key: &str, what: String) -> Error {
    Error::internal(format!("corrupt item {key}: {what}"))
}

fn string(item: &Item, name: &str, key: &str, default: Option<&str>) -> Result<String, Error> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v.clone()),
        None | Some(AttributeValue::Null(_)) => match default {
            Some(d) => Ok(d.to_string()),
            None => Err(corrupt(key, format!("attribute {name} is missing"))),
        },
        Some(other) => Err(corrupt(
            key,
            format!("attribute {name} is not a string: {other:?}"),
        )),
    }
}

/// The key of an item, if it has one.
pub(crate) fn decode_key(item: &Item) -> Option<EndpointKey> {
    if is_internal(item) {
        return None;
    }
    match (item.get(SERVICE), item.get(ID)) {
        (Some(AttributeValue::S(s)), Some(AttributeValue::S(i))) => {
            Some(EndpointKey::new(s.clone(), i.clone()))
        }
        _ => None,
    }
}

/// Whether the item's TTL attribute lies in the past.
pub(crate) fn expired(item: &Item, ttl_attribute: Option<&str>, now: u64) -> bool {
    let Some(attr) = ttl_attribute else {
        return false;
    };
    match item.get(attr) {
        // DynamoDB ignores TTL values that are not numbers; so do we.
        Some(AttributeValue::N(n)) => n.parse::<f64>().map(|at| at < now as f64).unwrap_or(false),
        _ => false,
    }
}

/// The endpoint an item holds. Attributes other tools may leave out have
/// defaults (protocol `tcp`, cluster `default`, node empty, `healthy`, no
/// labels); the result is validated like any write, so a hand-written item
/// that breaks a limit is reported, not passed on.
pub(crate) fn decode(item: &Item) -> Result<Endpoint, Error> {
    let key = decode_key(item)
        .map(|k| k.to_string())
        .ok_or_else(|| corrupt("<no key>", "missing service or id".into()))?;
    let port = match item.get(PORT) {
        Some(AttributeValue::N(n)) => n
            .parse::<u16>()
            .map_err(|_| corrupt(&key, format!("port {n:?} is not a port number")))?,
        Some(AttributeValue::S(n)) => n
            .parse::<u16>()
            .map_err(|_| corrupt(&key, format!("port {n:?} is not a port number")))?,
        other => return Err(corrupt(&key, format!("port is {other:?}"))),
    };
    let protocol: Protocol = string(item, PROTOCOL, &key, Some("tcp"))?
        .parse()
        .map_err(|e: Error| corrupt(&key, e.to_string()))?;
    let health: Health = string(item, HEALTH, &key, Some("healthy"))?
        .parse()
        .map_err(|e: Error| corrupt(&key, e.to_string()))?;
    let labels = match item.get(LABELS) {
        None | Some(AttributeValue::Null(_)) => BTreeMap::new(),
        Some(AttributeValue::M(m)) => m
            .iter()
            .map(|(k, v)| match v {
                AttributeValue::S(v) => Ok((k.clone(), v.clone())),
                other => Err(corrupt(
                    &key,
                    format!("label {k:?} is not a string: {other:?}"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(corrupt(&key, format!("labels is not a map: {other:?}"))),
    };
    let e = Endpoint {
        service: string(item, SERVICE, &key, None)?,
        id: string(item, ID, &key, None)?,
        address: string(item, ADDRESS, &key, None)?,
        port,
        protocol,
        cluster: string(
            item,
            CLUSTER,
            &key,
            Some(waypost::Endpoint::DEFAULT_CLUSTER),
        )?,
        node: string(item, NODE, &key, Some(""))?,
        health,
        labels,
    };
    e.validate().map_err(|err| corrupt(&key, err.to_string()))?;
    Ok(e)
}

/// A Streams image as a DynamoDB item (the two SDKs have their own types).
pub(crate) fn from_stream_image(image: &HashMap<String, StreamValue>) -> Item {
    image.iter().map(|(k, v)| (k.clone(), value(v))).collect()
}

fn value(v: &StreamValue) -> AttributeValue {
    match v {
        StreamValue::S(s) => AttributeValue::S(s.clone()),
        StreamValue::N(n) => AttributeValue::N(n.clone()),
        StreamValue::Bool(b) => AttributeValue::Bool(*b),
        StreamValue::Null(n) => AttributeValue::Null(*n),
        StreamValue::B(b) => AttributeValue::B(b.clone()),
        StreamValue::Ss(v) => AttributeValue::Ss(v.clone()),
        StreamValue::Ns(v) => AttributeValue::Ns(v.clone()),
        StreamValue::Bs(v) => AttributeValue::Bs(v.clone()),
        StreamValue::L(v) => AttributeValue::L(v.iter().map(value).collect()),
        StreamValue::M(m) => AttributeValue::M(from_stream_image(m)),
        _ => AttributeValue::Null(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_defaults() {
        let e = Endpoint::new("svc", "a", "10.0.0.1", 80)
            .with_protocol(Protocol::Grpc)
            .with_cluster("")
            .with_node("n1")
            .with_health(Health::Unhealthy)
            .with_label("zone", "")
            .with_label("k", "ü v");
        let item = encode(&e, Some(("expires_at", Duration::from_secs(60))));
        assert_eq!(decode(&item).expect("decode"), e);
        assert!(!expired(&item, Some("expires_at"), now_secs()));
        assert!(expired(&item, Some("expires_at"), now_secs() + 120));

        // A minimal item written by another tool.
        let item: Item = HashMap::from([
            ("service".into(), AttributeValue::S("svc".into())),
            ("id".into(), AttributeValue::S("b".into())),
            ("address".into(), AttributeValue::S("h".into())),
            ("port".into(), AttributeValue::N("8080".into())),
        ]);
        assert_eq!(
            decode(&item).expect("decode"),
            Endpoint::new("svc", "b", "h", 8080)
        );
    }

    #[test]
    fn corrupt_items_are_reported() {
        let mut item = encode(&Endpoint::new("svc", "a", "h", 1), None);
        item.insert("port".into(), AttributeValue::N("70000".into()));
        let err = decode(&item).expect_err("port out of range");
        assert!(err.to_string().contains("svc/a"), "{err}");
    }

    #[test]
    fn stream_images_convert_to_items() {
        let image = HashMap::from([
            ("service".to_string(), StreamValue::S("s".into())),
            ("id".to_string(), StreamValue::S("a".into())),
            ("address".to_string(), StreamValue::S("h".into())),
            ("port".to_string(), StreamValue::N("80".into())),
            (
                "labels".to_string(),
                StreamValue::M(HashMap::from([(
                    "k".to_string(),
                    StreamValue::S("v".into()),
                )])),
            ),
        ]);
        let e = decode(&from_stream_image(&image)).expect("decode");
        assert_eq!(e, Endpoint::new("s", "a", "h", 80).with_label("k", "v"));
    }
}
