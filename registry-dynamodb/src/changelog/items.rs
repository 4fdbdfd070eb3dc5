//! The change log's items: where each key's changes are logged (its head),
//! how heads and entries are written as transaction actions, and what a
//! head's items read back mean.

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use waypost::{EndpointKey, Error, Op, Result};

use crate::client::Client;
use crate::layout::{self, Change, Item, LOG_PARTITION};
use crate::transact::build_err;

/// The sort key of a head item (after every entry's).
pub(crate) const HEAD_ID: &str = "~head";
const VERSION: &str = "v";
const HEADS: &str = "heads";
const LAST: &str = "last";
const AT: &str = "at";
const PUT: &str = "put";
const DEL: &str = "del";

/// Largest entry written, in bytes as DynamoDB counts them (the item
/// limit is 400 KB).
pub(crate) const ENTRY_BUDGET: usize = 350 * 1024;

/// The partition of head `head`'s items: [`LOG_PARTITION`] for head 0
/// (the only one of a one-head log), `LOG_PARTITION/<head>` for the others.
pub(crate) fn log_partition(head: u32) -> String {
    if head == 0 {
        LOG_PARTITION.to_string()
    } else {
        format!("{LOG_PARTITION}/{head}")
    }
}

/// The head that logs `key`'s changes in a log of `heads` heads:
/// FNV-1a (64 bits) of the service, one `0xFF` byte and the id, modulo
/// `heads`. Every change of a key goes to the same head, so each key's
/// history is in one head's order.
///
/// ```
/// use waypost::EndpointKey;
/// use waypost_dynamodb::changelog_head_of;
/// let key = EndpointKey::new("api", "a");
/// assert_eq!(changelog_head_of(&key, 1), 0);
/// assert_eq!(changelog_head_of(&key, 8), changelog_head_of(&key, 8));
/// assert!(changelog_head_of(&key, 8) < 8);
/// ```
pub fn changelog_head_of(key: &EndpointKey, heads: u32) -> u32 {
    if heads <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = key
        .service
        .as_bytes()
        .iter()
        .chain(&[0xff])
        .chain(key.id.as_bytes());
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(heads)) as u32
}

/// The sort key of entry `version`.
pub(crate) fn entry_id(version: u64) -> String {
    format!("v{version:020}")
}

/// The version of an entry's sort key.
pub(crate) fn parse_entry_id(id: &str) -> Option<u64> {
    id.strip_prefix('v')?.parse().ok()
}

/// A value's size as DynamoDB counts it (numbers at most 21 bytes; 3
/// bytes per map or list plus 1 per element), rounded up a little where
/// DynamoDB's rule is not public.
pub(crate) fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| 1 + k.len() + value_size(v))
                .sum::<usize>()
        }
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        _ => 32,
    }
}

/// One version read from a head's log.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub version: u64,
    /// The last version of the batch this entry belongs to.
    pub last: u64,
    /// The batch's stamp (0 in a one-head log, which needs none).
    pub at: u64,
    pub changes: Vec<Change>,
}

/// What one `Query` of a head's log found.
#[derive(Debug, Default)]
pub(crate) struct LogPage {
    /// Entries after the asked version, in version order.
    pub entries: Vec<Entry>,
    /// The head (`None`: no head item, the head was never written).
    pub head: Option<u64>,
    /// Items read (entries and the head).
    pub items: usize,
}

/// One part of a batch's log: the puts and deletes of one entry.
pub(crate) type Part = (Vec<AttributeValue>, Vec<AttributeValue>);

/// The log of `ops` (all routed to one head): puts and deletes, packed
/// into entries of at most [`ENTRY_BUDGET`] bytes.
pub(crate) fn pack<'a>(client: &Client, ops: impl IntoIterator<Item = &'a Op>) -> Vec<Part> {
    let ttl = client.ttl_write();
    let mut parts = vec![(Vec::new(), Vec::new())];
    let mut size = 0usize;
    for op in ops {
        let (value, is_put) = match op {
            Op::Register(e) => (AttributeValue::M(layout::encode(e, ttl)), true),
            Op::Deregister(k) => (AttributeValue::M(layout::key_item(k)), false),
        };
        let n = value_size(&value) + 1;
        if size + n > ENTRY_BUDGET && size > 0 {
            parts.push((Vec::new(), Vec::new()));
            size = 0;
        }
        size += n;
        if let Some(last) = parts.last_mut() {
            if is_put {
                last.0.push(value);
            } else {
                last.1.push(value);
            }
        }
    }
    parts
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The key of head `head`'s item.
pub(crate) fn head_key(head: u32) -> Item {
    layout::key_item(&EndpointKey::new(log_partition(head), HEAD_ID))
}

/// The update of head `head` from `from` to `to`, on condition that it
/// still holds `from` and was written with as many heads as this
/// registry's log has (a one-head log's items have no `heads`).
pub(crate) fn head_update(
    client: &Client,
    head: u32,
    from: u64,
    to: u64,
) -> Result<TransactWriteItem> {
    let heads = client.log_heads();
    let mut u = Update::builder()
        .table_name(&client.cfg.table)
        .set_key(Some(head_key(head)))
        .expression_attribute_names("#v", VERSION)
        .expression_attribute_names("#k", HEADS)
        .expression_attribute_values(":to", n(to));
    let version = if from == 0 {
        "attribute_not_exists(#v)"
    } else {
        u = u.expression_attribute_values(":from", n(from));
        "#v = :from"
    };
    let condition = if heads == 1 {
        u = u.update_expression("SET #v = :to");
        format!("{version} AND attribute_not_exists(#k)")
    } else {
        u = u
            .update_expression("SET #v = :to, #k = :k")
            .expression_attribute_values(":k", n(u64::from(heads)));
        if from == 0 {
            version.to_string()
        } else {
            format!("{version} AND #k = :k")
        }
    };
    u = u.condition_expression(condition);
    Ok(TransactWriteItem::builder()
        .update(u.build().map_err(build_err)?)
        .build())
}

/// The put of head `head`'s entry `version`, on condition that it is
/// not there yet.
pub(crate) fn entry_put(
    client: &Client,
    head: u32,
    version: u64,
    last: u64,
    part: &Part,
    expires: u64,
    at: Option<u64>,
) -> Result<TransactWriteItem> {
    let mut item = layout::key_item(&EndpointKey::new(log_partition(head), entry_id(version)));
    item.insert(LAST.into(), n(last));
    item.insert(PUT.into(), AttributeValue::L(part.0.clone()));
    item.insert(DEL.into(), AttributeValue::L(part.1.clone()));
    if let Some(at) = at {
        item.insert(AT.into(), n(at));
    }
    if let Some(attr) = &client.cfg.ttl_attribute {
        item.insert(attr.clone(), n(expires));
    }
    let put = Put::builder()
        .table_name(&client.cfg.table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(#id)")
        .expression_attribute_names("#id", layout::ID)
        .build()
        .map_err(build_err)?;
    Ok(TransactWriteItem::builder().put(put).build())
}

/// An entry item as changes (an expired or corrupt put reads as the
/// removal of its key, as the table's reads treat such items).
pub(crate) fn decode_entry(client: &Client, id: &str, item: &Item, now: u64) -> Option<Entry> {
    let version = parse_entry_id(id)?;
    let last = match item.get(LAST) {
        Some(AttributeValue::N(v)) => v.parse().ok()?,
        _ => version,
    };
    let list = |name: &str| match item.get(name) {
        Some(AttributeValue::L(l)) => l.as_slice(),
        _ => &[],
    };
    let mut changes = Vec::new();
    for v in list(DEL) {
        if let Some(key) = v.as_m().ok().and_then(layout::decode_key) {
            changes.push(Change::Remove(key));
        }
    }
    for v in list(PUT) {
        let Ok(m) = v.as_m() else { continue };
        match client.endpoint_of(m, now) {
            Some(e) => changes.push(Change::Put(e)),
            None => changes.extend(layout::decode_key(m).map(Change::Remove)),
        }
    }
    let at = match item.get(AT) {
        Some(AttributeValue::N(v)) => v.parse().unwrap_or(0),
        _ => 0,
    };
    Some(Entry {
        version,
        last,
        at,
        changes,
    })
}

/// The version of head `head`'s item, checking that it was written
/// with as many heads as this registry's log has.
pub(crate) fn head_version(client: &Client, head: u32, item: &Item) -> Result<u64> {
    let heads = match item.get(HEADS) {
        Some(AttributeValue::N(k)) => k.parse::<u32>().unwrap_or(0),
        _ => 1,
    };
    if heads != client.log_heads() {
        return Err(Error::invalid(
            "changelog_heads",
            format!(
                "the change log of DynamoDB table {} was written with {heads} head(s) (head {head} \
                 says so), and this registry is set to {}: every writer and reader of a table \
                 must use the same number",
                client.cfg.table,
                client.log_heads()
            ),
        ));
    }
    Ok(match item.get(VERSION) {
        Some(AttributeValue::N(v)) => v.parse().unwrap_or(0),
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_sort_by_version_and_before_the_head() {
        let ids = [entry_id(9), entry_id(10), entry_id(u64::MAX - 1)];
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        assert!(ids.iter().all(|i| i.as_str() < HEAD_ID));
        assert_eq!(parse_entry_id(&entry_id(42)), Some(42));
        assert_eq!(parse_entry_id(HEAD_ID), None);
    }

    #[test]
    fn sizes_follow_dynamodb_rules() {
        assert_eq!(value_size(&AttributeValue::S("xyz".into())), 3);
        assert_eq!(value_size(&AttributeValue::N("12345".into())), 4);
        let l = AttributeValue::L(vec![AttributeValue::S("a".into())]);
        assert_eq!(value_size(&l), 3 + 1 + 1);
    }

    #[test]
    fn keys_spread_over_the_heads_and_stay_on_theirs() {
        let keys: Vec<EndpointKey> = (0..4000)
            .map(|i| EndpointKey::new(format!("svc-{}", i % 40), format!("ep-{i}")))
            .collect();
        for heads in [2u32, 8, 64] {
            let mut counts = vec![0usize; heads as usize];
            for k in &keys {
                let h = changelog_head_of(k, heads);
                assert_eq!(h, changelog_head_of(k, heads));
                counts[h as usize] += 1;
            }
            let even = keys.len() / heads as usize;
            assert!(
                counts.iter().all(|c| *c > even / 2 && *c < even * 2),
                "{heads} heads: {counts:?}"
            );
        }
        // The documented function: FNV-1a of "a", 0xFF, "b".
        let mut h: u64 = 0xcbf29ce484222325;
        for b in [b'a', 0xff, b'b'] {
            h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
        assert_eq!(
            changelog_head_of(&EndpointKey::new("a", "b"), 7),
            (h % 7) as u32
        );
        assert_eq!(log_partition(0), LOG_PARTITION);
        assert_eq!(log_partition(3), format!("{LOG_PARTITION}/3"));
    }
}
