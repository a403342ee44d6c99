//! The workspace daemon.
