//! The `shell` domain: `shell.exec` on a workspace ([`calls`]), the push
//! and start that open a command's bracket ([`bracket`]), the commands it
//! keeps running between calls ([`sessions`]), and the live sync of a
//! workspace while a command or a terminal is open in it ([`live`]). Its
//! rows (`shell_sessions`) come with the workspaces' migration.

pub mod bracket;
pub mod calls;
pub mod live;
pub mod sessions;
