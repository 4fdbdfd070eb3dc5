//! [`resume_with_backoff`]: a watch that resumes by itself.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};

use crate::error::Error;
use crate::model::Version;
use crate::traits::{EventStream, Watch};

struct State<W: ?Sized> {
    watch: Arc<W>,
    last: Option<Version>,
    stream: Option<EventStream>,
    min: Duration,
    max: Duration,
    delays: backon::ExponentialBackoff,
    /// Wait this long before watching again.
    pause: Option<Duration>,
}

/// Follow `watch` from `from` without end: whenever its stream ends, watch
/// again from the last version delivered, after a delay growing from `min`
/// to `max` (exponential with jitter, reset by every delivered event).
///
/// The source's `Err` items are passed on, and the end of a stream is
/// reported as an `Unavailable` error before watching again, so the
/// consumer knows when it may be behind; the stream itself never ends while
/// `watch` lives. A consumer that wants a fresh start (a resync) drops it
/// and calls this again with `from = None`.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::{sync::Arc, time::Duration};
/// use futures::StreamExt;
/// use waypost::{backend::resume_with_backoff, Event, memory::MemoryRegistry};
/// let reg = Arc::new(MemoryRegistry::new());
/// let mut events = resume_with_backoff(reg, None, Duration::from_millis(10), Duration::from_secs(1));
/// assert!(matches!(events.next().await, Some(Ok(Event::Snapshot(_)))));
/// # });
/// ```
pub fn resume_with_backoff<W: Watch + ?Sized>(
    watch: Arc<W>,
    from: Option<Version>,
    min: Duration,
    max: Duration,
) -> EventStream {
    let state = State {
        watch,
        last: from,
        stream: None,
        min,
        max,
        delays: super::backoff(min, max),
        pause: None,
    };
    stream::unfold(state, |mut st| async move {
        if let Some(pause) = st.pause.take() {
            tokio::time::sleep(pause).await;
        }
        let stream = match &mut st.stream {
            Some(s) => s,
            None => st.stream.insert(st.watch.watch(st.last)),
        };
        let item = match stream.next().await {
            Some(Ok(ev)) => {
                st.last = Some(ev.version());
                st.delays = super::backoff(st.min, st.max);
                Ok(ev)
            }
            Some(Err(e)) => Err(e),
            None => {
                st.stream = None;
                let delay = st.delays.next().unwrap_or(st.max);
                st.pause = Some(delay);
                Err(Error::unavailable(format!(
                    "the watch ended; watching again from {} in {delay:?}",
                    st.last
                        .map_or_else(|| "the start".to_string(), |v| format!("version {v}"))
                )))
            }
        };
        Some((item, st))
    })
    .boxed()
}
