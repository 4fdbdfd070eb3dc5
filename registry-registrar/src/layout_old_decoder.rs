//! The draining encoding read by the previous release's decoder: its
//! generated `ServiceEndpoint` (prost-build's output for
//! `aether/registry/v1/registry.proto` at the release before `DRAINING`,
//! trimmed to the message) and its health conversion, as `layout.rs` had
//! them. A draining endpoint must reach it as not healthy, and must not
//! make it fail.

#![allow(clippy::unwrap_used)]

use prost::Message;
use waypost::{Endpoint, Health};

use super::{endpoint_from_proto, endpoint_to_proto};

/// The previous release's generated types.
mod old {
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ServiceEndpoint {
        #[prost(string, tag = "1")]
        pub service_name: ::prost::alloc::string::String,
        #[prost(string, tag = "2")]
        pub id: ::prost::alloc::string::String,
        #[prost(string, tag = "3")]
        pub address: ::prost::alloc::string::String,
        #[prost(uint32, tag = "4")]
        pub port: u32,
        #[prost(int32, tag = "5")]
        pub protocol: i32,
        #[prost(string, tag = "6")]
        pub cluster: ::prost::alloc::string::String,
        #[prost(string, tag = "7")]
        pub node: ::prost::alloc::string::String,
        #[prost(enumeration = "Health", tag = "8")]
        pub health: i32,
        #[prost(map = "string, string", tag = "9")]
        pub labels: ::std::collections::HashMap<
            ::prost::alloc::string::String,
            ::prost::alloc::string::String,
        >,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum Health {
        Unspecified = 0,
        Healthy = 1,
        Unhealthy = 2,
    }
}

/// The previous release's reading of `health` (its `endpoint_from_proto`):
/// UNSPECIFIED and HEALTHY are healthy, UNHEALTHY unhealthy, anything else
/// refused, which fails the whole endpoint (and a watch carrying it).
fn old_health(p: &old::ServiceEndpoint) -> Result<Health, String> {
    match old::Health::try_from(p.health) {
        Ok(old::Health::Unspecified | old::Health::Healthy) => Ok(Health::Healthy),
        Ok(old::Health::Unhealthy) => Ok(Health::Unhealthy),
        Err(_) => Err(format!("unknown health value {}", p.health)),
    }
}

fn draining() -> Endpoint {
    Endpoint::new("svc", "a", "10.0.0.1", 80)
        .with_node("n1")
        .with_health(Health::Draining)
        .with_zone("z1")
        .with_weight(3)
}

#[test]
fn a_decoder_of_the_previous_release_reads_draining_as_unhealthy() {
    let bytes = endpoint_to_proto(&draining()).encode_to_vec();
    let seen = old::ServiceEndpoint::decode(bytes.as_slice()).unwrap();
    assert_eq!(old_health(&seen), Ok(Health::Unhealthy));
    assert_eq!((seen.service_name.as_str(), seen.port), ("svc", 80));
    assert_eq!(seen.labels.get("weight").map(String::as_str), Some("3"));
    // Healthy and unhealthy read as they always did.
    for h in [Health::Healthy, Health::Unhealthy] {
        let bytes = endpoint_to_proto(&draining().with_health(h)).encode_to_vec();
        let seen = old::ServiceEndpoint::decode(bytes.as_slice()).unwrap();
        assert_eq!(old_health(&seen), Ok(h));
    }
}

#[test]
fn the_new_enum_value_alone_would_fail_the_previous_release() {
    // Why draining is not sent as DRAINING: the previous release keeps the
    // unknown value and then refuses the endpoint.
    let mut p = endpoint_to_proto(&draining());
    p.draining = false;
    p.health = super::service_endpoint::Health::Draining as i32;
    let seen = old::ServiceEndpoint::decode(p.encode_to_vec().as_slice()).unwrap();
    assert_eq!(seen.health, 3);
    assert!(old_health(&seen).is_err());
    // This release reads that value, and the flag, as draining.
    assert_eq!(endpoint_from_proto(p, "").unwrap().health, Health::Draining);
}

#[test]
fn this_release_reads_its_own_encoding_and_the_flag_wins() {
    let e = draining();
    let p = endpoint_to_proto(&e);
    assert_eq!(p.health, super::service_endpoint::Health::Unhealthy as i32);
    assert!(p.draining);
    assert_eq!(endpoint_from_proto(p.clone(), "").unwrap(), e);
    let mut healthy_flagged = p;
    healthy_flagged.health = super::service_endpoint::Health::Healthy as i32;
    assert_eq!(
        endpoint_from_proto(healthy_flagged, "").unwrap().health,
        Health::Draining,
        "a draining endpoint is never read as healthy"
    );
    // An endpoint of the previous release (no field 10) is not draining.
    let old_bytes = old::ServiceEndpoint {
        service_name: "svc".into(),
        id: "a".into(),
        address: "10.0.0.1".into(),
        port: 80,
        health: old::Health::Healthy as i32,
        ..Default::default()
    }
    .encode_to_vec();
    let p = super::ServiceEndpoint::decode(old_bytes.as_slice()).unwrap();
    assert_eq!(endpoint_from_proto(p, "").unwrap().health, Health::Healthy);
}
