//! The registrar's engine: its state and write path ([`registrar`]), the
//! refusals of optimistic writes, its health ([`status`]) and the monitor
//! that keeps it true, the backend's opening and sync metrics, and the
//! settings. Every face reads and writes through [`registrar::Registrar`];
//! nothing here knows a face.

pub(crate) mod config;
pub(crate) mod open;
pub(crate) mod refusals;
pub(crate) mod registrar;
pub(crate) mod status;
pub(crate) mod streams;
pub(crate) mod sync;
