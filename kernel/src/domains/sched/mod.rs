//! Schedules (`sched.*`): the wire types ([`types`]), expressions and
//! their next run ([`expr`]), the `schedules` table and its wake timers
//! ([`store`]); the calls and the run engine are [`calls`].

pub mod calls;
pub mod expr;
pub mod store;
pub mod types;

pub use store::TIMER_KIND;

use crate::db::Migration;

/// This domain's table, listed in `domains::MIGRATIONS`; never edit a
/// released migration, add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 22,
    name: "schedules",
    sql: store::MIGRATION,
}];
