//! xDS tests (placeholder).
