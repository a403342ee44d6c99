//! The `sys` domain: `sys.token.*` and `sys.config.*`. It owns no tables:
//! tokens and config rows belong to [`crate::domains::accounts`], whose
//! functions its calls use.

pub mod calls;
