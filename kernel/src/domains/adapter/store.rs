//! The adapter domain's rows: identity links, link challenges, surface
//! routes and the last known state of each adapter account. Every
//! function takes a connection and is called from the database thread.

use rand::Rng as _;
use rusqlite::{Connection, OptionalExtension, params};

use gsv_protocol::adapter::AccountStatus;
use gsv_protocol::link::{Link, LinkEntry};

use super::{LINK_CODE_TTL, TIMER_KIND};
use crate::db::now_ms;
use crate::domains::timers::table as timers;
use crate::error::KernelError;

/// Letters and digits that cannot be misread for one another (no 0/O,
/// 1/I/L): 31 symbols, nearly 40 bits per code.
const CODE_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";

/// An adapter account's actor: whom a link or a challenge is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActorKey {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
}

/// A fresh link code, `XXXX-XXXX`.
pub fn new_code() -> String {
    let mut rng = rand::rng();
    let mut pick = || CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())] as char;
    let a: String = (0..4).map(|_| pick()).collect();
    let b: String = (0..4).map(|_| pick()).collect();
    format!("{a}-{b}")
}

/// A code as a person may type it (`abcd efgh`, `ABCD-EFGH`) in the one
/// spelling the table keys it by, or why it cannot be one.
pub fn normalize_code(code: &str) -> Result<String, String> {
    let raw: String = code
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if raw.len() != 8 || !raw.bytes().all(|b| CODE_ALPHABET.contains(&b)) {
        return Err(format!(
            "'{}' is not a link code (XXXX-XXXX, letters and digits)",
            code.chars().take(32).collect::<String>()
        ));
    }
    Ok(format!("{}-{}", &raw[..4], &raw[4..]))
}

pub fn link_of(c: &Connection, key: &ActorKey) -> Result<Option<LinkEntry>, KernelError> {
    Ok(c.query_row(
        "SELECT adapter, account_id, actor_id, uid, created_at, linked_by_uid
         FROM identity_links WHERE adapter = ?1 AND account_id = ?2 AND actor_id = ?3",
        params![key.adapter, key.account_id, key.actor_id],
        entry,
    )
    .optional()?)
}

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<LinkEntry> {
    Ok(LinkEntry {
        adapter: r.get(0)?,
        account_id: r.get(1)?,
        actor_id: r.get(2)?,
        uid: r.get(3)?,
        created_at: r.get(4)?,
        linked_by_uid: r.get(5)?,
    })
}

/// Creates or replaces the link of `key` to `uid`.
pub fn put_link(
    c: &Connection,
    key: &ActorKey,
    uid: i64,
    linked_by: i64,
) -> Result<Link, KernelError> {
    let now = now_ms();
    c.execute(
        "INSERT INTO identity_links(adapter, account_id, actor_id, uid, created_at, linked_by_uid)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT(adapter, account_id, actor_id) DO UPDATE SET uid = ?4, created_at = ?5,
             linked_by_uid = ?6",
        params![
            key.adapter,
            key.account_id,
            key.actor_id,
            uid,
            now,
            linked_by
        ],
    )?;
    Ok(Link {
        adapter: key.adapter.clone(),
        account_id: key.account_id.clone(),
        actor_id: key.actor_id.clone(),
        uid,
        created_at: now,
    })
}

/// Removes the link of `key` if `uid` owns it (any owner when `None`).
pub fn delete_link(c: &Connection, key: &ActorKey, uid: Option<i64>) -> Result<bool, KernelError> {
    Ok(c.execute(
        "DELETE FROM identity_links WHERE adapter = ?1 AND account_id = ?2 AND actor_id = ?3
             AND (?4 IS NULL OR uid = ?4)",
        params![key.adapter, key.account_id, key.actor_id, uid],
    )? > 0)
}

/// Links newest first: of `uid`, or all.
pub fn list_links(c: &Connection, uid: Option<i64>) -> Result<Vec<LinkEntry>, KernelError> {
    let mut st = c.prepare(
        "SELECT adapter, account_id, actor_id, uid, created_at, linked_by_uid
         FROM identity_links WHERE ?1 IS NULL OR uid = ?1
         ORDER BY created_at DESC, adapter, account_id, actor_id",
    )?;
    let rows = st.query_map([uid], entry)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The unexpired, unused challenge of `key`, or a new one (with its
/// expiry timer): one code per actor at a time, so repeated DMs do not
/// pile codes up. `(code, expires_at)`.
pub fn challenge(
    c: &mut Connection,
    key: &ActorKey,
    surface_kind: &str,
    surface_id: &str,
) -> Result<(String, i64), KernelError> {
    let now = now_ms();
    let tx = c.transaction()?;
    let open: Option<(String, i64)> = tx
        .query_row(
            "SELECT code, expires_at FROM link_challenges
             WHERE adapter = ?1 AND account_id = ?2 AND actor_id = ?3
               AND used_at IS NULL AND expires_at > ?4
             ORDER BY expires_at DESC LIMIT 1",
            params![key.adapter, key.account_id, key.actor_id, now],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some(found) = open {
        return Ok(found);
    }
    let expires_at = now + LINK_CODE_TTL.as_millis() as i64;
    let mut code = new_code();
    // Nearly 40 bits make a clash rare; a clash only costs another draw.
    while tx
        .query_row(
            "SELECT 1 FROM link_challenges WHERE code = ?1",
            [&code],
            |_| Ok(()),
        )
        .optional()?
        .is_some()
    {
        code = new_code();
    }
    tx.execute(
        "INSERT INTO link_challenges(code, adapter, account_id, actor_id, surface_kind,
             surface_id, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            code,
            key.adapter,
            key.account_id,
            key.actor_id,
            surface_kind,
            surface_id,
            now,
            expires_at
        ],
    )?;
    timers::arm(&tx, &timer_id(&code), expires_at, TIMER_KIND, "{}")?;
    tx.commit()?;
    Ok((code, expires_at))
}

/// The timer that removes challenge `code` when it expires.
pub fn timer_id(code: &str) -> String {
    format!("link:{code}")
}

/// Why a code cannot be consumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsumeError {
    #[error("Unknown link code: {0}")]
    Unknown(String),
    #[error("Link code expired: {0} (send the adapter another direct message for a new one)")]
    Expired(String),
    #[error("Link code already used: {0}")]
    Used(String),
}

/// Consumes `code` for `uid` in one transaction: the challenge is marked
/// used and its actor linked to `uid` (a link it had is replaced).
pub fn consume(
    c: &mut Connection,
    code: &str,
    uid: i64,
) -> Result<Result<Link, ConsumeError>, KernelError> {
    let now = now_ms();
    let tx = c.transaction()?;
    let row: Option<(ActorKey, i64, Option<i64>)> = tx
        .query_row(
            "SELECT adapter, account_id, actor_id, expires_at, used_at
             FROM link_challenges WHERE code = ?1",
            [code],
            |r| {
                Ok((
                    ActorKey {
                        adapter: r.get(0)?,
                        account_id: r.get(1)?,
                        actor_id: r.get(2)?,
                    },
                    r.get(3)?,
                    r.get(4)?,
                ))
            },
        )
        .optional()?;
    let Some((key, expires_at, used_at)) = row else {
        return Ok(Err(ConsumeError::Unknown(code.to_owned())));
    };
    if used_at.is_some() {
        return Ok(Err(ConsumeError::Used(code.to_owned())));
    }
    if expires_at <= now {
        return Ok(Err(ConsumeError::Expired(code.to_owned())));
    }
    tx.execute(
        "UPDATE link_challenges SET used_at = ?2, used_by_uid = ?3 WHERE code = ?1",
        params![code, now, uid],
    )?;
    let link = put_link(&tx, &key, uid, uid)?;
    tx.commit()?;
    Ok(Ok(link))
}

/// Drops challenge `code` (its timer fired).
pub fn drop_challenge(c: &Connection, code: &str) -> Result<(), KernelError> {
    c.execute("DELETE FROM link_challenges WHERE code = ?1", [code])?;
    Ok(())
}

/// The process a surface is routed to, if a route names one.
pub fn surface_route(
    c: &Connection,
    key: &ActorKey,
    surface_kind: &str,
    surface_id: &str,
    thread_id: &str,
    uid: i64,
) -> Result<Option<String>, KernelError> {
    Ok(c.query_row(
        "SELECT pid FROM surface_routes
         WHERE adapter = ?1 AND account_id = ?2 AND actor_id = ?3 AND surface_kind = ?4
           AND surface_id = ?5 AND thread_id = ?6 AND uid = ?7",
        params![
            key.adapter,
            key.account_id,
            key.actor_id,
            surface_kind,
            surface_id,
            thread_id,
            uid
        ],
        |r| r.get(0),
    )
    .optional()?)
}

/// Forgets routes to `pid` of `uid` (its process is gone or not theirs).
pub fn clear_surface_routes_to(c: &Connection, uid: i64, pid: &str) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM surface_routes WHERE uid = ?1 AND pid = ?2",
        params![uid, pid],
    )?;
    Ok(())
}

/// Records an account's state as the adapter reported it.
pub fn put_status(
    c: &Connection,
    adapter: &str,
    s: &AccountStatus,
    owner_uid: i64,
) -> Result<(), KernelError> {
    let extra = s
        .extra
        .as_ref()
        .map(|m| serde_json::Value::Object(m.clone()).to_string());
    c.execute(
        "INSERT INTO adapter_status(adapter, account_id, connected, authenticated, mode,
             last_activity, error, extra_json, updated_at, owner_uid)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT(adapter, account_id) DO UPDATE SET connected = ?3, authenticated = ?4,
             mode = ?5, last_activity = ?6, error = ?7, extra_json = ?8, updated_at = ?9,
             owner_uid = ?10",
        params![
            adapter,
            s.account_id,
            s.connected,
            s.authenticated,
            s.mode,
            s.last_activity,
            s.error,
            extra,
            now_ms(),
            owner_uid
        ],
    )?;
    Ok(())
}

/// The last known state of `adapter`'s accounts (one, or all), newest
/// first.
pub fn statuses(
    c: &Connection,
    adapter: &str,
    account_id: Option<&str>,
) -> Result<Vec<AccountStatus>, KernelError> {
    let mut st = c.prepare(
        "SELECT account_id, connected, authenticated, mode, last_activity, error, extra_json
         FROM adapter_status WHERE adapter = ?1 AND (?2 IS NULL OR account_id = ?2)
         ORDER BY updated_at DESC, account_id",
    )?;
    let rows = st.query_map(params![adapter, account_id], |r| {
        let extra: Option<String> = r.get(6)?;
        Ok(AccountStatus {
            account_id: r.get(0)?,
            connected: r.get(1)?,
            authenticated: r.get(2)?,
            mode: r.get(3)?,
            last_activity: r.get(4)?,
            error: r.get(5)?,
            extra: extra.and_then(|e| serde_json::from_str(&e).ok()),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_two_groups_of_four_and_read_back_in_any_case() {
        for _ in 0..100 {
            let c = new_code();
            assert_eq!(c.len(), 9, "{c}");
            assert_eq!(normalize_code(&c.to_lowercase()).unwrap(), c);
            assert_eq!(
                normalize_code(&format!(" {} ", c.replace('-', ""))).unwrap(),
                c
            );
        }
        for bad in ["", "ABCD-EFG", "ABCD-EFGHI", "ABCD-EF0H", "ABCD_EFGH"] {
            assert!(normalize_code(bad).is_err(), "{bad}");
        }
    }
}
