//! What most programs need: `use waypost::prelude::*;`.
//!
//! The model, the four traits, the error type, [`CachedRegistry`] and
//! `futures`' `StreamExt` (for `watch(..).next()`), imported anonymously so
//! it cannot clash with your own import of it.
//!
//! ```
//! use waypost::prelude::*;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let reg = CachedRegistry::new(waypost::memory::MemoryRegistry::new());
//! reg.register(Endpoint::new("api", "a", "127.0.0.1", 80)).await?;
//! let mut events = reg.watch(None);
//! assert!(matches!(events.next().await, Some(Ok(Event::Snapshot(_)))));
//! # Ok::<(), Error>(()) });
//! ```

pub use futures::StreamExt as _;

pub use crate::cached::CachedRegistry;
pub use crate::{
    Batch, Endpoint, EndpointKey, Error, ErrorKind, Event, Health, Heartbeat, Op, Protocol,
    Registry, Result, Snapshot, Version, Watch,
};
