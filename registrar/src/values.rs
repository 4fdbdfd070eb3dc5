//! The values of the CLI's flags: durations and counts within bounds,
//! acknowledgement modes, resume tokens, labels and `HOST:PORT` targets,
//! each refused with a message that quotes what was given.

use std::time::Duration;

use waypost_registrar_server::Ack;

pub(crate) const MS: Duration = Duration::from_millis(1);
pub(crate) const SECOND: Duration = Duration::from_secs(1);
pub(crate) const HOUR: Duration = Duration::from_secs(3600);
pub(crate) const DAYS_30: Duration = Duration::from_secs(30 * 24 * 3600);

/// A duration flag (`100ms`, `5s`, `1m`) within `min..=max`.
pub(crate) fn duration_in(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let d = humantime::parse_duration(s)
            .map_err(|e| format!("{e} (a duration such as 100ms, 5s or 1m)"))?;
        waypost::backend::check_duration("value", d, min, max).map_err(|_| {
            format!(
                "{s} is out of range: allowed {} to {}",
                show(min),
                show(max)
            )
        })?;
        Ok(d)
    }
}

pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A count flag within `min..=max`.
pub(crate) fn count_in(
    min: usize,
    max: usize,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let n: usize = s
            .parse()
            .map_err(|e| format!("{e} (a whole number from {min} to {max})"))?;
        if n < min || n > max {
            return Err(format!("{n} is out of range: allowed {min} to {max}"));
        }
        Ok(n)
    }
}

pub(crate) fn parse_ack(s: &str) -> Result<Ack, String> {
    s.parse::<Ack>().map_err(|_| {
        format!(
            "{:?} is not an acknowledgement mode: optimistic or durable",
            s.chars().take(64).collect::<String>()
        )
    })
}

pub(crate) fn parse_token(s: &str) -> Result<waypost_registrar_client::Token, String> {
    s.parse().map_err(|_| {
        format!(
            "{:?} is not a resume token: <epoch>.<sequence>, as printed by watch --json",
            s.chars().take(64).collect::<String>()
        )
    })
}

pub(crate) fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

pub(crate) fn parse_target(s: &str) -> Result<(String, u16), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:PORT"))?;
    let port: u16 = match port.parse::<u32>() {
        Ok(p @ 1..=65535) => p as u16,
        _ => return Err(format!("{port:?} in {s:?} is not a port (1 to 65535)")),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("no host in {s:?}"));
    }
    Ok((host.to_string(), port))
}
