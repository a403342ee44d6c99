//! The resource limits (rlimits) every sandboxed process runs under: what
//! `wsd serve --sandbox` configures ([`super::sandbox`]) and the runner
//! applies in each child it forks ([`super::sandbox_runner`]).

use nix::sys::resource::{Resource, setrlimit};

/// Default [`SandboxLimits::memory_bytes`]: 4 GiB of address space per
/// process (Node and the JVM start under it).
pub const DEFAULT_SANDBOX_MEMORY: u64 = 4 << 30;
/// Default [`SandboxLimits::open_files`].
pub const DEFAULT_SANDBOX_OPEN_FILES: u64 = 4096;

/// Per-process resource limits (rlimits) of every sandboxed process.
/// `None` leaves the daemon's own limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// `RLIMIT_AS`: address space of each process, in bytes.
    pub memory_bytes: Option<u64>,
    /// `RLIMIT_NPROC`: processes of the daemon's user. The kernel counts all
    /// of that user's processes, and does not apply it to root.
    pub processes: Option<u64>,
    /// `RLIMIT_NOFILE`: open files of each process.
    pub open_files: Option<u64>,
    /// `RLIMIT_FSIZE`: largest file a process may write, in bytes.
    pub file_size_bytes: Option<u64>,
}

impl Default for SandboxLimits {
    fn default() -> SandboxLimits {
        SandboxLimits {
            memory_bytes: Some(DEFAULT_SANDBOX_MEMORY),
            processes: None,
            open_files: Some(DEFAULT_SANDBOX_OPEN_FILES),
            file_size_bytes: None,
        }
    }
}

/// Sets `limits` on the calling process (a child between fork and exec).
pub(crate) fn apply_limits(limits: &SandboxLimits) -> std::io::Result<()> {
    for (resource, value) in [
        (Resource::RLIMIT_AS, limits.memory_bytes),
        (Resource::RLIMIT_NPROC, limits.processes),
        (Resource::RLIMIT_NOFILE, limits.open_files),
        (Resource::RLIMIT_FSIZE, limits.file_size_bytes),
    ] {
        if let Some(v) = value {
            setrlimit(resource, v, v)?;
        }
    }
    Ok(())
}
