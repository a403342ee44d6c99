//! Exec: the runner and the durable, resumable event log.
