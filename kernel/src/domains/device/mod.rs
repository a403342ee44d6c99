//! Devices as rows: the `devices` table (who owns a device, what it
//! implements, whether it is online) and its `device_access` ACL, the
//! durable record of routed calls (`routing_table`, [`routes`]) and the
//! device shell sessions routed `shell.exec`s opened
//! ([`shell_sessions`]). [`Devices`] is the one way in: routing and the
//! device calls use its methods, nothing else touches these tables.

pub mod calls;
pub mod routes;
pub mod shell_sessions;

use rusqlite::{Connection, OptionalExtension, params};

use crate::db::Migration;
use crate::db::{Db, now_ms};
use crate::domains::accounts::ProcessIdentity;
use crate::error::KernelError;

/// The device domain's state, over the kernel database.
#[derive(Debug, Clone)]
pub struct Devices {
    db: Db,
}

impl Devices {
    pub fn new(db: Db) -> Devices {
        Devices { db }
    }

    /// Devices `who` can see, by id.
    pub async fn list(&self, who: &ProcessIdentity) -> Result<Vec<Device>, KernelError> {
        let who = who.clone();
        self.db.call(move |c| list_devices(c, &who)).await
    }

    /// The device `id` if `who` may see it; unknown and hidden alike are
    /// 403 (see [`visible_device`]).
    pub async fn visible(&self, id: &str, who: &ProcessIdentity) -> Result<Device, KernelError> {
        let (id, who) = (id.to_owned(), who.clone());
        self.db.call(move |c| visible_device(c, &id, &who)).await
    }

    /// Changes label and description of a device `who` can see and owns
    /// (or root does); the row as it is afterwards.
    pub async fn update(
        &self,
        id: &str,
        who: &ProcessIdentity,
        label: Option<String>,
        description: Option<String>,
    ) -> Result<Option<Device>, KernelError> {
        let (id, who) = (id.to_owned(), who.clone());
        self.db
            .call(move |c| {
                let d = visible_device(c, &id, &who)?;
                if !who.is_root() && d.owner_uid != who.uid {
                    return Err(KernelError::AccessDenied { kind: "device", id });
                }
                update_device(c, &d.device_id, label.as_deref(), description.as_deref())?;
                get_device(c, &d.device_id)
            })
            .await
    }

    /// Refuses a driver whose device id already belongs to another user
    /// (see [`check_device_owner`]).
    pub async fn check_owner(&self, device_id: &str, uid: i64) -> Result<(), KernelError> {
        let device_id = device_id.to_owned();
        self.db
            .call(move |c| check_device_owner(c, &device_id, uid))
            .await
    }

    /// Records a driver that completed `sys.connect`: the device row
    /// (owner metadata kept, `implements`/`platform`/`version` replaced,
    /// online) and the owner's primary group in its ACL, in one
    /// transaction, refused (103) when another user owns the id.
    pub async fn register(
        &self,
        reg: Registration,
        who: &ProcessIdentity,
    ) -> Result<(), KernelError> {
        let (uid, gid) = (who.uid, who.gid);
        let implements = serde_json::to_string(&reg.implements)
            .map_err(|e| KernelError::internal("encoding implements", e))?;
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                check_device_owner(&tx, &reg.device_id, uid)?;
                tx.execute(
                    "INSERT INTO devices(device_id, owner_uid, label, implements, platform, version,
                         online, first_seen_at, last_seen_at, connected_at)
                     VALUES (?1, ?2, ?1, ?3, ?4, ?5, 1, ?6, ?6, ?6)
                     ON CONFLICT(device_id) DO UPDATE SET implements = ?3, platform = ?4,
                         version = ?5, online = 1, last_seen_at = ?6, connected_at = ?6",
                    params![reg.device_id, uid, implements, reg.platform, reg.version, now_ms()],
                )?;
                tx.execute(
                    "INSERT OR IGNORE INTO device_access(device_id, gid) VALUES (?1, ?2)",
                    params![reg.device_id, gid],
                )?;
                tx.commit()?;
                Ok(())
            })
            .await
    }

    /// A driver connection closed: its route rows go, and the device goes
    /// offline if that connection was still its current one.
    pub async fn driver_gone(
        &self,
        connection_id: &str,
        device_id: &str,
        was_current: bool,
    ) -> Result<(), KernelError> {
        let (conn, dev) = (connection_id.to_owned(), device_id.to_owned());
        self.db
            .call(move |c| {
                routes::delete_of_connection(c, &conn)?;
                if was_current {
                    c.execute(
                        "UPDATE devices SET online = 0, disconnected_at = ?2, last_seen_at = ?2
                         WHERE device_id = ?1",
                        params![dev, now_ms()],
                    )?;
                }
                Ok(())
            })
            .await
    }
}

/// Longest device label and description (reference §2.1).
const MAX_LABEL_CHARS: usize = 120;
const MAX_DESCRIPTION_CHARS: usize = 500;

pub use gsv_protocol::device::Device;

const DEVICE_COLUMNS: &str = "device_id, owner_uid, label, description, implements, platform, \
     version, online, first_seen_at, last_seen_at, connected_at, disconnected_at";

fn device_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Device> {
    let implements: String = r.get(4)?;
    Ok(Device {
        device_id: r.get(0)?,
        owner_uid: r.get(1)?,
        label: r.get(2)?,
        description: r.get(3)?,
        implements: serde_json::from_str(&implements).unwrap_or_default(),
        platform: r.get(5)?,
        version: r.get(6)?,
        online: r.get::<_, i64>(7)? != 0,
        first_seen_at: r.get(8)?,
        last_seen_at: r.get(9)?,
        connected_at: r.get(10)?,
        disconnected_at: r.get(11)?,
    })
}

/// The device row, if any.
pub fn get_device(c: &Connection, id: &str) -> Result<Option<Device>, KernelError> {
    Ok(c.query_row(
        &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE device_id = ?1"),
        [id],
        device_from_row,
    )
    .optional()?)
}

/// Whether `who` may see and use `device` (reference `canAccess`).
pub fn can_access(
    c: &Connection,
    device: &Device,
    who: &ProcessIdentity,
) -> Result<bool, KernelError> {
    if who.is_root() || device.owner_uid == who.uid {
        return Ok(true);
    }
    let mut stmt = c.prepare_cached("SELECT gid FROM device_access WHERE device_id = ?1")?;
    let gids: Vec<i64> = stmt
        .query_map([&device.device_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(gids.iter().any(|g| who.gids.contains(g) || *g == who.gid))
}

/// The device `id` if `who` may see it; an unknown device is 403 exactly
/// like a hidden one, so ids cannot be probed.
pub fn visible_device(
    c: &Connection,
    id: &str,
    who: &ProcessIdentity,
) -> Result<Device, KernelError> {
    let denied = || KernelError::AccessDenied {
        kind: "device",
        id: id.to_owned(),
    };
    let d = get_device(c, id)?.ok_or_else(denied)?;
    if can_access(c, &d, who)? {
        Ok(d)
    } else {
        Err(denied())
    }
}

/// Devices `who` can see, by id.
pub fn list_devices(c: &Connection, who: &ProcessIdentity) -> Result<Vec<Device>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {DEVICE_COLUMNS} FROM devices ORDER BY device_id"
    ))?;
    let all: Vec<Device> = stmt
        .query_map([], device_from_row)?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for d in all {
        if can_access(c, &d, who)? {
            out.push(d);
        }
    }
    Ok(out)
}

/// Owner-set metadata of a device (`sys.device.update`).
pub fn update_device(
    c: &Connection,
    id: &str,
    label: Option<&str>,
    description: Option<&str>,
) -> Result<(), KernelError> {
    if let Some(l) = label {
        let l = clean_label(l, id);
        c.execute(
            "UPDATE devices SET label = ?2 WHERE device_id = ?1",
            params![id, l],
        )?;
    }
    if let Some(d) = description {
        let d: String = d.trim().chars().take(MAX_DESCRIPTION_CHARS).collect();
        c.execute(
            "UPDATE devices SET description = ?2 WHERE device_id = ?1",
            params![id, d],
        )?;
    }
    Ok(())
}

fn clean_label(label: &str, id: &str) -> String {
    let l = label.trim();
    let l = if l.is_empty() { id } else { l };
    l.chars().take(MAX_LABEL_CHARS).collect()
}

/// Refuses a driver whose device id already belongs to another user
/// (103, reference §1.6).
pub fn check_device_owner(c: &Connection, device_id: &str, uid: i64) -> Result<(), KernelError> {
    let owner: Option<i64> = c
        .query_row(
            "SELECT owner_uid FROM devices WHERE device_id = ?1",
            [device_id],
            |r| r.get(0),
        )
        .optional()?;
    match owner {
        Some(o) if o != uid => Err(KernelError::InvalidClient(format!(
            "Device id already belongs to another user: {device_id}"
        ))),
        _ => Ok(()),
    }
}

/// At start no driver is connected and no caller is waiting: every device
/// is offline and every route row is stale (its caller's socket died with
/// the previous kernel).
pub fn reset_at_start(c: &mut Connection) -> Result<(), KernelError> {
    let now = now_ms();
    c.execute(
        "UPDATE devices SET online = 0, disconnected_at = ?1 WHERE online = 1",
        [now],
    )?;
    routes::delete_all(c)
}

/// What a driver's `sys.connect` says about its device.
#[derive(Debug, Clone)]
pub struct Registration {
    pub device_id: String,
    pub implements: Vec<String>,
    pub platform: String,
    pub version: String,
}

/// This domain's tables: device rows and their ACL, the routes and the
/// device shell sessions. Listed in `domains::MIGRATIONS`;
/// never edit a released migration (its checksum is checked at every
/// start), add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 3,
    name: "devices",
    sql: "CREATE TABLE devices(
            device_id TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            label TEXT NOT NULL DEFAULT '',
            description TEXT NOT NULL DEFAULT '',
            implements TEXT NOT NULL DEFAULT '[]',
            platform TEXT NOT NULL DEFAULT '',
            version TEXT NOT NULL DEFAULT '',
            online INTEGER NOT NULL DEFAULT 0,
            first_seen_at INTEGER NOT NULL,
            last_seen_at INTEGER NOT NULL,
            connected_at INTEGER,
            disconnected_at INTEGER);
         CREATE TABLE device_access(
            device_id TEXT NOT NULL,
            gid INTEGER NOT NULL,
            PRIMARY KEY(device_id, gid));
         CREATE TABLE routing_table(
            id TEXT PRIMARY KEY,
            call TEXT NOT NULL,
            origin_type TEXT NOT NULL,
            origin_id TEXT NOT NULL,
            device_id TEXT NOT NULL,
            driver_connection_id TEXT,
            created_at INTEGER NOT NULL,
            expires_at INTEGER);
         CREATE INDEX routing_table_driver ON routing_table(driver_connection_id);
         CREATE TABLE device_shell_sessions(
            session_id TEXT PRIMARY KEY,
            device_id TEXT NOT NULL,
            owner_uid INTEGER NOT NULL,
            status TEXT NOT NULL,
            exit_code INTEGER,
            error TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL);
         CREATE INDEX device_shell_sessions_device ON device_shell_sessions(device_id);
         CREATE INDEX device_shell_sessions_expiry ON device_shell_sessions(expires_at);",
}];

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(uid: i64, gids: &[i64]) -> ProcessIdentity {
        ProcessIdentity {
            uid,
            gid: uid,
            gids: gids.to_vec(),
            username: format!("u{uid}"),
            home: "/".into(),
            cwd: "/".into(),
        }
    }

    #[tokio::test]
    async fn a_device_is_visible_to_root_its_owner_and_its_acl_groups_only() {
        let db = crate::db::Db::open_in_memory(MIGRATIONS).unwrap();
        db.call(|c| {
            c.execute_batch(
                "INSERT INTO devices(device_id, owner_uid, online, first_seen_at, last_seen_at)
                    VALUES ('d', 1000, 1, 0, 0);
                 INSERT INTO device_access VALUES ('d', 500);
                 INSERT INTO routing_table(id, call, origin_type, origin_id, device_id, created_at)
                    VALUES ('stale', 'fs.read', 'connection', 'c', 'd', 0);",
            )?;
            for (who, ok) in [
                (ident(0, &[0]), true),
                (ident(1000, &[1000, 100]), true),
                (ident(1001, &[1001, 500]), true),
                (ident(1002, &[1002, 100]), false),
            ] {
                assert_eq!(visible_device(c, "d", &who).is_ok(), ok, "{who:?}");
            }
            assert!(matches!(
                visible_device(c, "missing", &ident(0, &[0])),
                Err(KernelError::AccessDenied { .. })
            ));
            reset_at_start(c)?;
            assert!(!get_device(c, "d")?.unwrap().online);
            let routes: i64 =
                c.query_row("SELECT count(*) FROM routing_table", [], |r| r.get(0))?;
            assert_eq!(routes, 0);
            Ok(())
        })
        .await
        .unwrap();
    }
}
