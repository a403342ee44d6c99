//! The `fs` domain: the kernel's native namespace ([`vfs`]: a path → a
//! place in the system store or a workspace's store, and who may touch it)
//! and the `fs.*` calls on dofs ([`calls`]). It owns no tables; the stores
//! are the system store the kernel holds and the workspaces' own.

pub mod calls;
pub mod vfs;
