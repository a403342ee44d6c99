//! `device_shell_sessions`: which device and owner a `shell.exec` session
//! id a device answered with belongs to (reference §3.6 step 5), so a
//! continuation is routed back to that device, for its owner only.
//! Rows live [`SESSION_TTL`] after their last update and are pruned on
//! the path that reads them.

use std::time::Duration;

use rusqlite::{OptionalExtension, params};

use super::Devices;
use crate::db::now_ms;
use crate::error::KernelError;

/// How long a device shell session row lives after its last update.
pub const SESSION_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// A row of `device_shell_sessions`.
#[derive(Debug, Clone)]
pub struct DeviceSession {
    pub session_id: String,
    pub device_id: String,
    pub owner_uid: i64,
    pub status: String,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
}

/// What a device said of a session: in an answer or an `exec.status`.
#[derive(Debug, Clone)]
pub struct SessionReport {
    /// `running`, `completed` or `failed`.
    pub status: &'static str,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
}

fn expires_at(now: i64) -> i64 {
    now + SESSION_TTL.as_millis() as i64
}

impl Devices {
    /// The live session `session_id`, if a routed `shell.exec` recorded
    /// it; expired rows are pruned first, so they never pile up.
    pub async fn shell_session(
        &self,
        session_id: &str,
    ) -> Result<Option<DeviceSession>, KernelError> {
        let sid = session_id.to_owned();
        self.db
            .call(move |c| {
                c.execute(
                    "DELETE FROM device_shell_sessions WHERE expires_at <= ?1",
                    [now_ms()],
                )?;
                Ok(c.query_row(
                    "SELECT session_id, device_id, owner_uid, status, exit_code, error
                     FROM device_shell_sessions WHERE session_id = ?1",
                    [&sid],
                    |r| {
                        Ok(DeviceSession {
                            session_id: r.get(0)?,
                            device_id: r.get(1)?,
                            owner_uid: r.get(2)?,
                            status: r.get(3)?,
                            exit_code: r.get(4)?,
                            error: r.get(5)?,
                        })
                    },
                )
                .optional()?)
            })
            .await
    }

    /// Records `session_id → device_id` for `owner_uid` when a routed
    /// `shell.exec` answers with a session. A session id already recorded
    /// for another device or owner is left as it is: an answer never
    /// hands someone else's session over.
    pub async fn remember_shell_session(
        &self,
        session_id: &str,
        device_id: &str,
        owner_uid: i64,
        report: SessionReport,
    ) -> Result<(), KernelError> {
        let (sid, dev) = (session_id.to_owned(), device_id.to_owned());
        self.db
            .call(move |c| {
                let now = now_ms();
                c.execute(
                    "INSERT INTO device_shell_sessions(session_id, device_id, owner_uid, status,
                         exit_code, error, created_at, updated_at, expires_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8)
                     ON CONFLICT(session_id) DO UPDATE SET status = ?4, exit_code = ?5,
                         error = ?6, updated_at = ?7, expires_at = ?8
                     WHERE device_id = ?2 AND owner_uid = ?3",
                    params![
                        sid,
                        dev,
                        owner_uid,
                        report.status,
                        report.exit_code,
                        report.error,
                        now,
                        expires_at(now)
                    ],
                )?;
                Ok(())
            })
            .await
    }

    /// Updates a session of `device_id` from its driver's `exec.status`;
    /// a session of another device is left alone.
    pub async fn update_shell_session(
        &self,
        session_id: &str,
        device_id: &str,
        report: SessionReport,
    ) -> Result<(), KernelError> {
        let (sid, dev) = (session_id.to_owned(), device_id.to_owned());
        self.db
            .call(move |c| {
                let now = now_ms();
                c.execute(
                    "UPDATE device_shell_sessions SET status = ?3, exit_code = ?4, error = ?5,
                         updated_at = ?6, expires_at = ?7
                     WHERE session_id = ?1 AND device_id = ?2",
                    params![
                        sid,
                        dev,
                        report.status,
                        report.exit_code,
                        report.error,
                        now,
                        expires_at(now)
                    ],
                )?;
                Ok(())
            })
            .await
    }
}
