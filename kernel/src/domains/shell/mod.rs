//! The `shell` domain: `shell.exec` on a workspace ([`calls`]) and the
//! commands it keeps running between calls ([`sessions`]). Its rows
//! (`shell_sessions`) come with the workspaces' migration.

pub mod calls;
pub mod sessions;
