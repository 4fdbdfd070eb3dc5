//! Runnable examples live in `examples/`.
