//! Cross-crate integration tests.
