//! How an endpoint travels on the registrar's wire: the protobuf
//! messages of `aether.registry.v1` and `aether.registrar.v1` as
//! `waypost`'s model, and the resume token `<epoch>.<sequence>`.

use std::fmt;
use std::str::FromStr;

use waypost::{Endpoint, EndpointKey, Error, Health, Protocol, Version};

use crate::proto::registry::v1::{service, service_endpoint, ServiceEndpoint};

/// The registrar's version as sent on the wire: `<epoch>.<sequence>`.
///
/// The epoch changes every time a registrar starts, so a client resuming
/// with a token from an earlier run always gets a full snapshot instead of
/// a silent mix of two histories.
///
/// ```
/// use waypost_registrar_client::Token;
/// let t: Token = "17.42".parse().unwrap();
/// assert_eq!((t.epoch, t.version.0), (17, 42));
/// assert_eq!(t.to_string(), "17.42");
/// assert!("garbage".parse::<Token>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// The registrar run that issued the version.
    pub epoch: u64,
    /// The version within that run.
    pub version: Version,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.version.0)
    }
}

impl FromStr for Token {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::invalid(
                "last_version",
                format!("{s:?} is not a version token of the form <epoch>.<sequence>"),
            )
        };
        let (e, v) = s.split_once('.').ok_or_else(bad)?;
        Ok(Token {
            epoch: e.parse().map_err(|_| bad())?,
            version: Version(v.parse().map_err(|_| bad())?),
        })
    }
}

pub(crate) fn protocol_to_proto(p: Protocol) -> service::Protocol {
    match p {
        Protocol::Udp => service::Protocol::Udp,
        Protocol::Http => service::Protocol::Http,
        Protocol::Https => service::Protocol::Https,
        Protocol::Grpc => service::Protocol::Grpc,
        // Tcp, and any protocol added later, travel as TCP.
        _ => service::Protocol::Tcp,
    }
}

/// The health's enum value, each state its own (content digests tell a
/// draining endpoint from an unhealthy one). Not what goes on the wire:
/// see [`health_on_wire`].
pub(crate) fn health_to_proto(h: Health) -> service_endpoint::Health {
    match h {
        Health::Healthy => service_endpoint::Health::Healthy,
        Health::Unhealthy => service_endpoint::Health::Unhealthy,
        Health::Draining => service_endpoint::Health::Draining,
    }
}

/// `health` and `draining` as sent: draining travels as `UNHEALTHY` with
/// `draining` set, so that a decoder that predates `DRAINING` (and refuses
/// enum values it does not know) reads the endpoint as not healthy.
pub(crate) fn health_on_wire(h: Health) -> (service_endpoint::Health, bool) {
    match h {
        Health::Draining => (service_endpoint::Health::Unhealthy, true),
        other => (health_to_proto(other), false),
    }
}

/// Our endpoint as a protobuf message.
pub fn endpoint_to_proto(e: &Endpoint) -> ServiceEndpoint {
    let (health, draining) = health_on_wire(e.health);
    ServiceEndpoint {
        service_name: e.service.clone(),
        id: e.id.clone(),
        address: e.address.clone(),
        port: u32::from(e.port),
        protocol: protocol_to_proto(e.protocol) as i32,
        cluster: e.cluster.clone(),
        node: e.node.clone(),
        health: health as i32,
        labels: e.labels.clone().into_iter().collect(),
        draining,
    }
}

/// A protobuf endpoint as ours, validated. Errors name the field with
/// `prefix` in front (e.g. `endpoint.port`).
pub fn endpoint_from_proto(p: ServiceEndpoint, prefix: &str) -> Result<Endpoint, Error> {
    let field = |f: &str| format!("{prefix}{f}");
    let port = u16::try_from(p.port).map_err(|_| {
        Error::invalid(field("port"), format!("{} is not a port (1-65535)", p.port))
    })?;
    let protocol = match service::Protocol::try_from(p.protocol) {
        Ok(service::Protocol::Unspecified | service::Protocol::Tcp) => Protocol::Tcp,
        Ok(service::Protocol::Udp) => Protocol::Udp,
        Ok(service::Protocol::Http) => Protocol::Http,
        Ok(service::Protocol::Https) => Protocol::Https,
        Ok(service::Protocol::Grpc) => Protocol::Grpc,
        Err(_) => {
            return Err(Error::invalid(
                field("protocol"),
                format!("unknown protocol value {}", p.protocol),
            ))
        }
    };
    let health = match service_endpoint::Health::try_from(p.health) {
        Ok(service_endpoint::Health::Unspecified | service_endpoint::Health::Healthy) => {
            Health::Healthy
        }
        Ok(service_endpoint::Health::Unhealthy) => Health::Unhealthy,
        Ok(service_endpoint::Health::Draining) => Health::Draining,
        Err(_) => {
            return Err(Error::invalid(
                field("health"),
                format!("unknown health value {}", p.health),
            ))
        }
    };
    // The flag wins: a draining endpoint is never read as healthy.
    let health = if p.draining { Health::Draining } else { health };
    let e = Endpoint {
        service: p.service_name,
        id: p.id,
        address: p.address,
        port,
        protocol,
        cluster: p.cluster,
        node: p.node,
        health,
        labels: p.labels.into_iter().collect(),
    };
    e.validate().map_err(|err| match err {
        Error::InvalidInput {
            field: f, reason, ..
        } => {
            let f = if f == "service" {
                "service_name".to_string()
            } else {
                f
            };
            Error::invalid(field(&f), reason)
        }
        other => other,
    })?;
    Ok(e)
}

/// The key named by an unregister request, checked.
pub fn key_from_parts(service_name: String, id: String) -> Result<EndpointKey, Error> {
    waypost::backend::check_name("service_name", &service_name, true)?;
    waypost::backend::check_name("id", &id, true)?;
    Ok(EndpointKey::new(service_name, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips_and_bad_fields_are_named() {
        let e = Endpoint::new("svc", "a", "10.0.0.1", 80)
            .with_protocol(Protocol::Grpc)
            .with_node("n1")
            .with_health(Health::Unhealthy)
            .with_label("zone", "z");
        assert_eq!(endpoint_from_proto(endpoint_to_proto(&e), "").unwrap(), e);

        let mut p = endpoint_to_proto(&e);
        p.port = 70_000;
        let err = endpoint_from_proto(p, "endpoint.").unwrap_err();
        assert!(
            err.to_string().starts_with("invalid endpoint.port:"),
            "{err}"
        );

        let mut p = endpoint_to_proto(&e);
        p.protocol = 99;
        let err = endpoint_from_proto(p, "endpoint.").unwrap_err();
        assert!(
            err.to_string().starts_with("invalid endpoint.protocol:"),
            "{err}"
        );

        let mut p = endpoint_to_proto(&e);
        p.service_name = String::new();
        let err = endpoint_from_proto(p, "endpoint.").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid endpoint.service_name:"),
            "{err}"
        );
    }
}

#[cfg(test)]
#[path = "layout_old_decoder.rs"]
mod old_decoder;
