//! A plain HTTP client for the HTTP API tests: requests with JSON
//! answers, and a Server-Sent Events reader.

use std::collections::BTreeSet;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::protocols::Stack;

/// Longer than any answer should take.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The service IDs of a Consul health or catalog answer.
pub fn ids(body: &Value) -> BTreeSet<String> {
    body.as_array()
        .unwrap()
        .iter()
        .map(|e| e["Service"]["ID"].as_str().unwrap().to_string())
        .collect()
}

/// `items` as a set, to compare with [`ids`].
pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// An endpoint of the service `web` on `node-1`.
pub fn web(id: &str, ip: &str) -> waypost::Endpoint {
    waypost::Endpoint::new("web", id, ip, 8080).with_node("node-1")
}

pub struct Answer {
    pub status: u16,
    pub index: Option<u64>,
    pub body: Value,
}

pub async fn send(stack: &Stack, method: &str, path: &str, body: Option<String>) -> Answer {
    send_with(stack, method, path, body, &[]).await
}

pub async fn send_with(
    stack: &Stack,
    method: &str,
    path: &str,
    body: Option<String>,
    headers: &[(&str, &str)],
) -> Answer {
    request(stack.http, method, path, body, headers).await
}

/// The JSON answer to `GET path` at `http`, or `None` when nothing (or
/// no JSON) answers there yet.
pub async fn try_get_at(http: std::net::SocketAddr, path: &str) -> Option<Value> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri: hyper::Uri = format!("http://{http}{path}").parse().ok()?;
    let resp = client.get(uri).await.ok()?;
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&bytes).ok()
}

/// `method path` (with a JSON `body`) of the HTTP API at `http`.
pub async fn send_at(
    http: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Answer {
    request(http, method, path, body, &[]).await
}

/// `GET path` of the HTTP API at `http`.
pub async fn get_at(http: std::net::SocketAddr, path: &str) -> Answer {
    request(http, "GET", path, None, &[]).await
}

async fn request(
    http: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<String>,
    headers: &[(&str, &str)],
) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{http}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {path} did not answer within {LIMIT:?}"))
        .unwrap();
    let status = resp.status().as_u16();
    let index = resp
        .headers()
        .get("X-Consul-Index")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {bytes:?}"));
    Answer {
        status,
        index,
        body,
    }
}

pub async fn get(stack: &Stack, path: &str) -> Answer {
    send(stack, "GET", path, None).await
}

pub async fn put(stack: &Stack, path: &str, body: Value) -> Answer {
    send(stack, "PUT", path, Some(body.to_string())).await
}

/// One Server-Sent Events connection, read event by event.
pub struct Sse {
    body: Incoming,
    buf: String,
    /// Snapshot events read.
    pub chunks: usize,
}

#[derive(Debug)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

impl Sse {
    pub async fn open(stack: &Stack, last_event_id: Option<&str>) -> Sse {
        Sse::open_at(stack.http, last_event_id).await
    }

    /// [`Sse::open`] on the HTTP API at `http`.
    pub async fn open_at(http: std::net::SocketAddr, last_event_id: Option<&str>) -> Sse {
        let client = Client::builder(TokioExecutor::new()).build_http::<String>();
        let mut req = hyper::Request::get(format!("http://{http}/v1/watch"));
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp = tokio::time::timeout(LIMIT, client.request(req.body(String::new()).unwrap()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Sse {
            body: resp.into_body(),
            buf: String::new(),
            chunks: 0,
        }
    }

    /// The next event (keep-alive comments skipped).
    pub async fn next(&mut self) -> SseEvent {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), None, String::new());
                for line in block.lines() {
                    let (k, v) = line.split_once(':').unwrap_or((line, ""));
                    let v = v.strip_prefix(' ').unwrap_or(v);
                    match k {
                        "event" => event = v.to_string(),
                        "id" => id = Some(v.to_string()),
                        "data" => data.push_str(v),
                        _ => {}
                    }
                }
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).unwrap();
                return SseEvent { event, id, data };
            }
            let frame = tokio::time::timeout(LIMIT, self.body.frame())
                .await
                .expect("no SSE event in time")
                .expect("the SSE stream ended")
                .unwrap();
            if let Ok(bytes) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&bytes).unwrap());
            }
        }
    }

    /// The whole snapshot the stream starts with: its endpoints' ids and
    /// the last chunk's `id:`.
    pub async fn snapshot(&mut self) -> (BTreeSet<String>, String) {
        let mut ids = BTreeSet::new();
        loop {
            let ev = self.next().await;
            assert_eq!(ev.event, "snapshot", "{ev:?}");
            self.chunks += 1;
            for e in ev.data["endpoints"].as_array().unwrap() {
                ids.insert(e["id"].as_str().unwrap().to_string());
            }
            if ev.data["last"] == json!(true) {
                let id = ev.id.unwrap();
                assert_eq!(id, ev.data["version"].as_str().unwrap());
                return (ids, id);
            }
            assert_eq!(
                ev.id.as_deref(),
                Some(""),
                "a chunk but the last has an empty id"
            );
        }
    }
}
