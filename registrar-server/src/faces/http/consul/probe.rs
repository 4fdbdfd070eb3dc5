//! Running one HTTP, TCP or gRPC check, as Consul's agent judges them.

use std::time::Duration;

use axum::body::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use super::check::{Probe, Status};

/// The client HTTP checks share (plain HTTP/1.1, connections pooled).
#[derive(Clone)]
pub(crate) struct Prober {
    http: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for Prober {
    fn default() -> Self {
        Self {
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

impl Prober {
    /// Run `probe` once: its status and what it saw. A TTL check is not
    /// run (the service reports it): passing.
    pub(crate) async fn run(&self, probe: &Probe) -> (Status, String) {
        match probe {
            Probe::Ttl { .. } => (Status::Passing, String::new()),
            Probe::Tcp {
                target, timeout_ms, ..
            } => tcp(target, Duration::from_millis(*timeout_ms)).await,
            Probe::Http {
                url,
                method,
                header,
                timeout_ms,
                ..
            } => {
                let timeout = Duration::from_millis(*timeout_ms);
                self.http(url, method, header, timeout).await
            }
            Probe::Grpc {
                target, timeout_ms, ..
            } => grpc(target, Duration::from_millis(*timeout_ms)).await,
        }
    }

    async fn http(
        &self,
        url: &str,
        method: &str,
        header: &std::collections::BTreeMap<String, Vec<String>>,
        timeout: Duration,
    ) -> (Status, String) {
        let mut req = axum::http::Request::builder().method(method).uri(url);
        for (name, values) in header {
            for v in values {
                req = req.header(name.as_str(), v.as_str());
            }
        }
        let req = match req.body(Empty::new()) {
            Ok(r) => r,
            Err(e) => return (Status::Critical, format!("HTTP {method} {url}: {e}")),
        };
        match tokio::time::timeout(timeout, self.http.request(req)).await {
            Err(_) => (
                Status::Critical,
                format!("HTTP {method} {url}: no answer within {timeout:?}"),
            ),
            Ok(Err(e)) => (Status::Critical, format!("HTTP {method} {url}: {e}")),
            Ok(Ok(resp)) => {
                let code = resp.status();
                let status = if code.is_success() {
                    Status::Passing
                } else if code == axum::http::StatusCode::TOO_MANY_REQUESTS {
                    Status::Warning
                } else {
                    Status::Critical
                };
                (status, format!("HTTP {method} {url}: {code}"))
            }
        }
    }
}

async fn tcp(target: &str, timeout: Duration) -> (Status, String) {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(target)).await {
        Ok(Ok(_)) => (Status::Passing, format!("TCP connect {target}: Success")),
        Ok(Err(e)) => (Status::Critical, format!("dial tcp {target}: {e}")),
        Err(_) => (
            Status::Critical,
            format!("dial tcp {target}: no connection within {timeout:?}"),
        ),
    }
}

/// `grpc.health.v1.Health/Check` at `target`: `host:port`, optionally
/// followed by `/service`.
async fn grpc(target: &str, timeout: Duration) -> (Status, String) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let (addr, service) = target.split_once('/').unwrap_or((target, ""));
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return (Status::Critical, format!("gRPC check {target}: {e}")),
    };
    let call = async {
        let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .map(|r| r.into_inner().status)
            .map_err(|s| format!("{}: {}", s.code(), s.message()))
    };
    match tokio::time::timeout(timeout, call).await {
        Err(_) => (
            Status::Critical,
            format!("gRPC check {target}: no answer within {timeout:?}"),
        ),
        Ok(Err(e)) => (Status::Critical, format!("gRPC check {target}: {e}")),
        Ok(Ok(code)) => {
            let name = ServingStatus::try_from(code)
                .map(|s| s.as_str_name())
                .unwrap_or("UNKNOWN");
            let status = if code == ServingStatus::Serving as i32 {
                Status::Passing
            } else {
                Status::Critical
            };
            (status, format!("gRPC check {target}: {name}"))
        }
    }
}
