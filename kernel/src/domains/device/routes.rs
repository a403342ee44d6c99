//! The `routing_table`: one row per call forwarded to a device's driver
//! or an adapter's service connection, written before the frame is sent
//! and deleted when the route ends. Nothing reads it back but tests and
//! the start-up reset: the waiting callers themselves are in memory
//! (`routing::router`); the rows say what was in flight.

use std::time::Duration;

use rusqlite::{Connection, params};

use super::Devices;
use crate::db::now_ms;
use crate::error::KernelError;

/// Who waits for a forwarded call (`origin_type`/`origin_id`).
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// A socket's request (its connection id).
    Connection(&'a str),
    /// The kernel itself (an adapter delivery for a run; the run id).
    Kernel(&'a str),
}

/// A route as recorded.
#[derive(Debug, Clone)]
pub struct RouteRow<'a> {
    /// The kernel's own request id, as sent to the peer.
    pub id: &'a str,
    pub call: &'a str,
    pub origin: Origin<'a>,
    /// The device id, or `adapter:<name>`.
    pub peer: &'a str,
    pub driver_connection_id: &'a str,
    pub ttl: Duration,
}

impl Devices {
    /// Records a route about to be sent (replacing a row of the same id).
    pub async fn record_route(&self, row: RouteRow<'_>) -> Result<(), KernelError> {
        let (origin_type, origin_id) = match row.origin {
            Origin::Connection(c) => ("connection", c.to_owned()),
            Origin::Kernel(k) => ("kernel", k.to_owned()),
        };
        let values = (
            row.id.to_owned(),
            row.call.to_owned(),
            origin_id,
            row.peer.to_owned(),
            row.driver_connection_id.to_owned(),
        );
        let ttl_ms = row.ttl.as_millis() as i64;
        self.db
            .call(move |c| {
                let now = now_ms();
                c.execute(
                    "INSERT OR REPLACE INTO routing_table(id, call, origin_type, origin_id,
                         device_id, driver_connection_id, created_at, expires_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![
                        values.0,
                        values.1,
                        origin_type,
                        values.2,
                        values.3,
                        values.4,
                        now,
                        now + ttl_ms
                    ],
                )?;
                Ok(())
            })
            .await
    }

    /// Deletes the row of a route that ended (answered, failed or
    /// abandoned).
    pub async fn end_route(&self, id: &str) -> Result<(), KernelError> {
        let id = id.to_owned();
        self.db
            .call(move |c| {
                c.execute("DELETE FROM routing_table WHERE id = ?1", [&id])?;
                Ok(())
            })
            .await
    }
}

/// Deletes the rows of every route sent on `connection_id`.
pub(super) fn delete_of_connection(c: &Connection, connection_id: &str) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM routing_table WHERE driver_connection_id = ?1",
        [connection_id],
    )?;
    Ok(())
}

/// Deletes every route row (at start, when no caller can still wait).
pub(super) fn delete_all(c: &Connection) -> Result<(), KernelError> {
    c.execute("DELETE FROM routing_table", [])?;
    Ok(())
}
