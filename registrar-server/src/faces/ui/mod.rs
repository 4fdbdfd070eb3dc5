//! The live dashboard at `/ui` on the health port (`serve --ui`).
//!
//! - `GET /ui`: the page (HTML, CSS and JavaScript compiled into the
//!   binary; nothing is fetched from elsewhere).
//! - `GET /ui/events`: Server-Sent Events the page renders from (see
//!   [`feed`]): a `snapshot` of every endpoint, then `upsert` and `remove`
//!   deltas as the registrar's state changes, and a `status` of the
//!   registrar itself every second.
//!
//! The health port is plaintext and unauthenticated, so the dashboard is
//! only served when asked for: it shows every endpoint to whoever can
//! reach the port. It only reads; nothing on it writes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use futures::{Stream, StreamExt};
use tokio::sync::watch;

use crate::engine::registrar::Slot;
use crate::engine::status::Status;

mod feed;

const INDEX_HTML: &str = include_str!("index.html");
const STYLE_CSS: &str = include_str!("style.css");
const APP_JS: &str = include_str!("app.js");

/// Events queued for one page before the feed waits for it to read.
const PAGE_BUFFER: usize = 256;

/// What the dashboard's routes need: the status, the registrar once it is
/// open, and the health server's stop signal (which ends the event
/// streams).
#[derive(Clone)]
pub(crate) struct Ui {
    status: Arc<Status>,
    slot: Slot,
    stop: watch::Receiver<bool>,
}

impl Ui {
    /// The dashboard of the registrar in `slot` (reporting to `status`),
    /// whose event streams end once `stop` is `true`.
    pub(crate) fn new(status: Arc<Status>, slot: Slot, stop: watch::Receiver<bool>) -> Self {
        Self { status, slot, stop }
    }
}

/// The dashboard's routes (`/ui`, its assets and its event stream).
pub(crate) fn router(ui: Ui) -> Router {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/style.css", get(style))
        .route("/ui/app.js", get(script))
        .route("/ui/events", get(events))
        .with_state(ui)
}

/// Headers of every asset: no caching (the page is small and must match
/// the binary), no framing by other sites, no sniffing.
fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'self'; style-src 'self'; \
                 img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
            ),
        ],
        body,
    )
}

async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn events(
    State(ui): State<Ui>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let (tx, rx) = tokio::sync::mpsc::channel(PAGE_BUFFER);
    tokio::spawn(feed::run(ui.status, ui.slot, ui.stop, tx));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
