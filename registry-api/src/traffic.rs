//! Zones, weights and draining: the traffic model every face and client
//! reads the same way (see `docs/traffic.md`).
//!
//! - **Zone and region** are the labels [`ZONE_LABEL`] and
//!   [`REGION_LABEL`]: plain label values ([`check_plain_value`]); empty or
//!   absent means "no zone".
//! - **Weight** is the label [`WEIGHT_LABEL`]: a whole number from 1 to
//!   [`MAX_WEIGHT`], 1 when absent. An endpoint's share of its service's
//!   new work is its weight over the sum of the weights it competes with.
//! - **Draining** is [`Health::Draining`](crate::Health::Draining): the
//!   endpoint finishes what it has and is sent nothing new.
//!
//! [`ZonePreference`] is the rule a caller in a zone uses to keep its
//! traffic there: Kubernetes' `PreferSameZone` (stay in the zone while it
//! has a healthy endpoint, spread otherwise), with an optional floor.

use crate::error::{quote, Error, Result};
use crate::model::Endpoint;

pub use crate::model::{MAX_WEIGHT, REGION_LABEL, WEIGHT_LABEL, ZONE_LABEL};

/// The longest zone or region, in bytes (a Kubernetes label value's limit).
pub const MAX_ZONE_LEN: usize = 63;

/// The weight of `e`: its [`WEIGHT_LABEL`] when a whole number from 1 to
/// [`MAX_WEIGHT`], otherwise 1 (validation refuses other values, so only
/// an endpoint that was never validated falls back).
pub fn weight_of(e: &Endpoint) -> u32 {
    e.weight()
}

/// Whether `v` is a plain label value, as zones and regions must be:
/// at most [`MAX_ZONE_LEN`] ASCII letters, digits, `-`, `_` and `.`,
/// beginning and ending with a letter or digit (empty means "none").
///
/// ```
/// use waypost::traffic::check_plain_value;
/// assert!(check_plain_value("zone", "eu-west-1a").is_ok());
/// assert!(check_plain_value("zone", "").is_ok());
/// let err = check_plain_value("zone", "eu west").unwrap_err();
/// assert!(err.to_string().contains("\"eu west\""), "{err}");
/// ```
pub fn check_plain_value(label: &str, v: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid(
            format!("labels[{}]", quote(label)),
            format!("{} is not a plain label value: {why}", quote(v)),
        ))
    };
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > MAX_ZONE_LEN {
        return bad(&format!("longer than {MAX_ZONE_LEN} bytes"));
    }
    if !v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !edge(v.bytes().next()) || !edge(v.bytes().last()) {
        return bad("it must begin and end with a letter or digit");
    }
    Ok(())
}

/// Check the traffic labels of `e`: [`WEIGHT_LABEL`] a whole number from 1
/// to [`MAX_WEIGHT`], [`ZONE_LABEL`] and [`REGION_LABEL`] plain label
/// values. The error is `InvalidInput` naming the label and quoting a
/// bounded prefix of the value.
pub fn validate_labels(e: &Endpoint) -> Result<()> {
    if let Some(w) = e.labels.get(WEIGHT_LABEL) {
        let ok = w
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_WEIGHT).contains(n) && !w.starts_with('+'));
        if ok.is_none() {
            return Err(Error::invalid(
                format!("labels[{}]", quote(WEIGHT_LABEL)),
                format!(
                    "{} is not a weight: a whole number from 1 to {MAX_WEIGHT} is expected",
                    quote(w)
                ),
            ));
        }
    }
    for label in [ZONE_LABEL, REGION_LABEL] {
        if let Some(v) = e.labels.get(label) {
            check_plain_value(label, v)?;
        }
    }
    Ok(())
}

/// A caller's zone and the floor under which it stops keeping its traffic
/// there.
///
/// The rule (Kubernetes' `PreferSameZone`, with a floor): new work goes
/// only to the endpoints in the caller's zone while they are at least
/// [`min_healthy`](ZonePreference::min_healthy) and hold at least
/// [`min_share`](ZonePreference::min_share) of the service's total
/// weight; otherwise it spreads over every endpoint (the zone's included),
/// by weight. The defaults (1 endpoint, share 0) are `PreferSameZone`
/// itself: in the zone while it has a healthy endpoint.
///
/// Under load, the floor is what keeps a zone that lost most of its
/// capacity from being buried: without one, every caller in the zone
/// sends everything to whatever is left there. Set `min_healthy` to the
/// number of endpoints that can carry the zone's callers, or `min_share`
/// to the share of the fleet's capacity the zone's callers need (a third
/// of the callers in one of three zones: about 0.33).
///
/// ```
/// use waypost::traffic::ZonePreference;
/// let p = ZonePreference::new("eu-west-1a").with_floor(2, 0.25);
/// assert_eq!((p.min_healthy, p.min_share), (2, 0.25));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct ZonePreference {
    /// The caller's zone, compared with each endpoint's [`ZONE_LABEL`].
    pub zone: String,
    /// Fewest healthy endpoints in the zone to keep traffic there
    /// (default 1; 0 counts as 1).
    pub min_healthy: usize,
    /// Least share of the service's weight in the zone to keep traffic
    /// there, 0 to 1 (default 0).
    pub min_share: f64,
}

impl ZonePreference {
    /// Prefer `zone`, with the default floor (one healthy endpoint).
    pub fn new(zone: impl Into<String>) -> Self {
        Self {
            zone: zone.into(),
            min_healthy: 1,
            min_share: 0.0,
        }
    }

    /// Set the floor: at least `min_healthy` endpoints holding at least
    /// `min_share` (0 to 1) of the service's weight.
    pub fn with_floor(mut self, min_healthy: usize, min_share: f64) -> Self {
        self.min_healthy = min_healthy;
        self.min_share = min_share;
        self
    }

    /// Check the zone (a plain label value, not empty) and the share.
    pub fn validate(&self) -> Result<()> {
        if self.zone.is_empty() {
            return Err(Error::invalid("zone", "must not be empty"));
        }
        check_plain_value(ZONE_LABEL, &self.zone)?;
        if !(0.0..=1.0).contains(&self.min_share) {
            return Err(Error::invalid(
                "min_share",
                format!("{} is out of range: allowed 0 to 1", self.min_share),
            ));
        }
        Ok(())
    }

    /// Whether the zone keeps its traffic, given the healthy endpoints of
    /// the service: the zone's endpoints reach the floor.
    pub fn holds<'a>(&self, healthy: impl IntoIterator<Item = &'a Endpoint>) -> bool {
        let (mut n, mut zone_w, mut total_w) = (0usize, 0u64, 0u64);
        for e in healthy {
            let w = u64::from(e.weight());
            total_w += w;
            if e.zone() == Some(self.zone.as_str()) {
                n += 1;
                zone_w += w;
            }
        }
        n >= self.min_healthy.max(1)
            && total_w > 0
            && (zone_w as f64) >= self.min_share * (total_w as f64)
    }

    /// Whether `e` gets new work when the zone `holds`.
    pub fn admits(&self, holds: bool, e: &Endpoint) -> bool {
        !holds || e.zone() == Some(self.zone.as_str())
    }
}

/// Index into `weights` drawn with probability proportional to each
/// weight, from `r`, uniform in `0..sum` (`None` when empty or all zero).
///
/// ```
/// use waypost::traffic::pick_weighted;
/// assert_eq!(pick_weighted(&[1, 3], 0), Some(0));
/// assert_eq!(pick_weighted(&[1, 3], 1), Some(1));
/// assert_eq!(pick_weighted(&[1, 3], 3), Some(1));
/// assert_eq!(pick_weighted(&[], 0), None);
/// ```
pub fn pick_weighted(weights: &[u32], r: u64) -> Option<usize> {
    let mut acc = 0u64;
    for (i, w) in weights.iter().enumerate() {
        acc += u64::from(*w);
        if r < acc {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::error::ErrorKind;

    fn field_of(e: &Endpoint) -> String {
        match e.validate() {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn weights_out_of_range_are_refused_naming_the_label() {
        let e = |w: &str| Endpoint::new("s", "i", "h", 1).with_label(WEIGHT_LABEL, w);
        for ok in ["1", "7", "65535"] {
            assert!(e(ok).validate().is_ok(), "{ok}");
        }
        for bad in ["0", "65536", "-1", "+3", "1.5", "", " 2", "heavy"] {
            assert_eq!(field_of(&e(bad)), "labels[\"weight\"]", "{bad:?}");
        }
        let huge = "9".repeat(1000);
        let err = e(&huge).validate().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(text.len() < 300 && text.contains("(1000 bytes)"), "{text}");
        assert_eq!(e("0").weight(), 1, "an unvalidated endpoint falls back");
        assert_eq!(e("65535").weight(), 65_535);
    }

    #[test]
    fn zones_and_regions_must_be_plain_label_values() {
        let with = |k: &str, v: &str| Endpoint::new("s", "i", "h", 1).with_label(k, v);
        for ok in ["a", "eu-west-1a", "us_central1.b", "1", ""] {
            assert!(with(ZONE_LABEL, ok).validate().is_ok(), "{ok:?}");
        }
        for bad in ["eu west", "-a", "a-", "zöne", "a/b", &"z".repeat(64)] {
            assert_eq!(field_of(&with(ZONE_LABEL, bad)), "labels[\"zone\"]");
            assert_eq!(field_of(&with(REGION_LABEL, bad)), "labels[\"region\"]");
        }
        let err = with(ZONE_LABEL, &format!("a {}", "z".repeat(500)))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.len() < 300, "{err}");
    }

    #[test]
    fn the_zone_holds_while_the_floor_holds() {
        let ep = |id: &str, zone: &str, w: u32| {
            Endpoint::new("s", id, "h", 1)
                .with_zone(zone)
                .with_weight(w)
        };
        let eps = [ep("a1", "a", 1), ep("b1", "b", 2), ep("c1", "c", 1)];
        let p = ZonePreference::new("a");
        assert!(p.holds(&eps));
        assert!(!p.holds(&eps[1..]), "no endpoint left in a");
        assert!(!p.clone().with_floor(2, 0.0).holds(&eps));
        assert!(
            p.clone().with_floor(1, 0.25).holds(&eps),
            "1/4 of the weight"
        );
        assert!(!p.clone().with_floor(1, 0.26).holds(&eps));
        assert!(p.admits(true, &eps[0]) && !p.admits(true, &eps[1]));
        assert!(p.admits(false, &eps[1]));
        assert!(ZonePreference::new("a b").validate().is_err());
        assert!(p.clone().with_floor(1, 1.5).validate().is_err());
    }
}
