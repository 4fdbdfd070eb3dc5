//! How a node's liveness record is written as a Cloud Map instance: one
//! instance per node in a reserved service ([`layout::node_service`]),
//! its instance id derived from the node's name ([`layout::instance_id`]),
//! with three kinds of attribute:
//!
//! - [`ATTR_NODE`]: the node's name, escaped ([`layout::escape`]); reads
//!   of one record ask `DiscoverInstances` for this value;
//! - [`ATTR_BEAT`]: the wall time of the node's last recorded heartbeat,
//!   in milliseconds since the Unix epoch (for people);
//! - [`ATTR_BEATS`]: how many heartbeats were recorded (absent: none
//!   counted); liveness is judged by its changes;
//! - [`ATTR_MARKED`], then `registry.marked.1`, `registry.marked.2`, …:
//!   the keys liveness marked unhealthy, as `service/id` pairs separated by
//!   `,` (each part percent-escaped like [`layout::escape`], and `,` and
//!   `/` too), at most 1,024 characters per attribute.
//!
//! Cloud Map's limits (30 custom attributes, 1,024 characters per value,
//! 5,000 characters of keys and values in all) bound the marked keys of
//! one record to about 4,900 characters: with service and id names of 20
//! characters, some 110 keys. [`encode`] keeps the keys that fit and says
//! how many it left out.

use std::collections::HashMap;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use waypost::backend::NodeRecord;
use waypost::EndpointKey;

use crate::layout::{
    self, ATTR_BEAT, ATTR_BEATS, ATTR_MARKED, ATTR_NODE, MAX_ATTRIBUTES_LEN,
    MAX_ATTRIBUTE_VALUE_LEN, MAX_CUSTOM_ATTRIBUTES,
};

/// Bytes escaped in each part of a marked key: those [`layout::escape`]
/// escapes, and the two separators.
const KEY_ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b',').add(b'/');

fn escape_part(s: &str) -> String {
    utf8_percent_encode(s, KEY_ESCAPED).to_string()
}

fn unescape_part(s: &str) -> Option<String> {
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// The attribute holding the `i`-th part of the marked keys.
fn marked_attribute(i: usize) -> String {
    if i == 0 {
        ATTR_MARKED.to_string()
    } else {
        format!("{ATTR_MARKED}.{i}")
    }
}

/// A record ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Encoded {
    /// The instance's attributes.
    pub(crate) attrs: HashMap<String, String>,
    /// The marked keys the attributes hold, in the order given.
    pub(crate) kept: Vec<EndpointKey>,
    /// How many marked keys did not fit.
    pub(crate) left_out: usize,
}

/// The attributes of `node`'s record with `beats` heartbeats counted, the
/// last at `beat_ms`, and the marked keys of `marked` that fit Cloud Map's
/// limits (taken in order; one that does not fit is left out, and later,
/// shorter ones may still fit).
pub(crate) fn encode(node: &str, beats: u64, beat_ms: u64, marked: &[EndpointKey]) -> Encoded {
    let mut attrs = HashMap::new();
    attrs.insert(ATTR_NODE.to_string(), layout::escape(node));
    attrs.insert(ATTR_BEAT.to_string(), beat_ms.to_string());
    if beats > 0 {
        attrs.insert(ATTR_BEATS.to_string(), beats.to_string());
    }
    let mut used: usize = attrs.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut parts: Vec<String> = Vec::new();
    let mut kept = Vec::new();
    let mut left_out = 0;
    for key in marked {
        let entry = format!("{}/{}", escape_part(&key.service), escape_part(&key.id));
        if let Some(part) = parts.last_mut() {
            let grown = used + 1 + entry.len();
            if part.len() + 1 + entry.len() <= MAX_ATTRIBUTE_VALUE_LEN
                && grown <= MAX_ATTRIBUTES_LEN
            {
                part.push(',');
                part.push_str(&entry);
                used = grown;
                kept.push(key.clone());
                continue;
            }
        }
        let grown = used + marked_attribute(parts.len()).len() + entry.len();
        if entry.len() <= MAX_ATTRIBUTE_VALUE_LEN
            && attrs.len() + parts.len() < MAX_CUSTOM_ATTRIBUTES
            && grown <= MAX_ATTRIBUTES_LEN
        {
            parts.push(entry);
            used = grown;
            kept.push(key.clone());
        } else {
            left_out += 1;
        }
    }
    for (i, part) in parts.into_iter().enumerate() {
        attrs.insert(marked_attribute(i), part);
    }
    Encoded {
        attrs,
        kept,
        left_out,
    }
}

/// The record an instance's attributes hold; `None` when they are not a
/// record (no node or no heartbeat, or a count that is not a number).
/// Marked keys that cannot be read are skipped.
pub(crate) fn decode(attrs: &HashMap<String, String>) -> Option<NodeRecord> {
    let node = layout::unescape(attrs.get(ATTR_NODE)?)?;
    let beat_ms = attrs.get(ATTR_BEAT)?.parse().ok()?;
    let beats = match attrs.get(ATTR_BEATS) {
        Some(b) => b.parse().ok()?,
        None => 0,
    };
    let mut parts: Vec<(usize, &String)> = attrs
        .iter()
        .filter_map(|(k, v)| {
            if k == ATTR_MARKED {
                return Some((0, v));
            }
            let i = k
                .strip_prefix(ATTR_MARKED)?
                .strip_prefix('.')?
                .parse()
                .ok()?;
            Some((i, v))
        })
        .collect();
    parts.sort();
    let marked = parts
        .iter()
        .flat_map(|(_, v)| v.split(','))
        .filter_map(|entry| {
            let (service, id) = entry.split_once('/')?;
            Some(EndpointKey::new(
                unescape_part(service)?,
                unescape_part(id)?,
            ))
        })
        .collect();
    Some(
        NodeRecord::new(node, beat_ms)
            .with_beats(beats)
            .with_marked(marked),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within_limits(e: &Encoded) {
        assert!(
            e.attrs.len() <= MAX_CUSTOM_ATTRIBUTES,
            "{} attributes",
            e.attrs.len()
        );
        let total: usize = e.attrs.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(total <= MAX_ATTRIBUTES_LEN, "{total} characters");
        for (k, v) in &e.attrs {
            assert!(
                v.len() <= MAX_ATTRIBUTE_VALUE_LEN,
                "{k}: {} characters",
                v.len()
            );
            assert!(v.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{k} = {v:?}");
        }
    }

    #[test]
    fn records_round_trip_with_odd_keys() {
        let marked = vec![
            EndpointKey::new("web", "pod-a"),
            EndpointKey::new("a/b,c", "ü d%20/,"),
            EndpointKey::new("Payments/EU", "x"),
        ];
        let e = encode("node 7/ü", 12, 1_700_000_000_123, &marked);
        assert_eq!(e.kept, marked);
        assert_eq!(e.left_out, 0);
        within_limits(&e);
        let rec = decode(&e.attrs).expect("a record");
        assert_eq!(rec.node, "node 7/ü");
        assert_eq!(rec.beat_ms, 1_700_000_000_123);
        assert_eq!(rec.beats, 12);
        assert_eq!(rec.marked, marked);
        // No heartbeat counted yet (as a release that did not count them
        // wrote it): no count attribute, read as 0.
        let bare = encode("n", 0, 5, &[]);
        assert_eq!(bare.attrs.len(), 2);
        assert_eq!(decode(&bare.attrs), Some(NodeRecord::new("n", 5)));
    }

    #[test]
    fn what_does_not_fit_is_left_out_and_counted() {
        // 300 keys of about 45 characters: more than 5,000 characters.
        let marked: Vec<EndpointKey> = (0..300)
            .map(|i| EndpointKey::new("payments-service", format!("pod-{i:04}-abcdefghijklmnop")))
            .collect();
        let e = encode(&"n".repeat(253), u64::MAX, u64::MAX, &marked);
        within_limits(&e);
        assert!(e.kept.len() > 90, "{} kept", e.kept.len());
        assert_eq!(e.kept.len() + e.left_out, 300);
        assert_eq!(e.kept[..], marked[..e.kept.len()]);
        assert_eq!(decode(&e.attrs).expect("a record").marked, e.kept);
        // A key too long for any attribute is left out; shorter ones after
        // it still fit.
        let huge = EndpointKey::new("ü".repeat(120), "ü".repeat(120));
        let small = EndpointKey::new("s", "i");
        let e = encode("n", 1, 1, &[huge, small.clone()]);
        assert_eq!((e.kept, e.left_out), (vec![small], 1));
    }

    #[test]
    fn other_instances_are_not_records() {
        let mut attrs = HashMap::new();
        attrs.insert("AWS_INSTANCE_IPV4".to_string(), "10.0.0.1".to_string());
        assert_eq!(decode(&attrs), None);
        attrs.insert(ATTR_NODE.to_string(), "n".to_string());
        assert_eq!(decode(&attrs), None, "no heartbeat");
        attrs.insert(ATTR_BEAT.to_string(), "soon".to_string());
        assert_eq!(decode(&attrs), None, "a heartbeat that is not a number");
        attrs.insert(ATTR_BEAT.to_string(), "5".to_string());
        attrs.insert(ATTR_BEATS.to_string(), "many".to_string());
        assert_eq!(decode(&attrs), None, "a count that is not a number");
    }
}
