//! The one durable timer table: its rows and migration ([`table`]) and
//! the wake the kernel holds; the task that fires due timers is
//! [`calls`].

pub mod calls;
pub mod table;

pub use table::{Timer, TimerWake};

use crate::db::Migration;

/// This domain's table, listed in `domains::MIGRATIONS`; never edit a
/// released migration, add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 20,
    name: "timers",
    sql: table::MIGRATION,
}];
