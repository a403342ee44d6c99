//! The adapter domain's rows: identity links, link challenges, surface
//! routes, the last known state of each adapter account, the receipts of
//! inbound messages and the answers waiting for their adapter. Every
//! function takes a connection and is called from the database thread.

use rand::Rng as _;
use rusqlite::{Connection, OptionalExtension, params};

use gsv_protocol::adapter::{AccountStatus, SendArgs, Surface, SurfaceKind};
use gsv_protocol::link::{Link, LinkEntry, Route};

use super::{LINK_CODE_TTL, OUTBOX_LIMIT, RECEIPT_TTL, TIMER_KIND};
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

/// One surface of an actor: the key of a surface route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurfaceKey {
    pub actor: ActorKey,
    pub kind: SurfaceKind,
    pub surface_id: String,
    /// `""` outside a thread.
    pub thread_id: String,
}

/// Creates or replaces the route of `key` to `pid` of `uid`.
pub fn put_surface_route(
    c: &Connection,
    key: &SurfaceKey,
    uid: i64,
    pid: &str,
    by_uid: i64,
) -> Result<Route, KernelError> {
    let now = now_ms();
    let a = &key.actor;
    c.execute(
        "INSERT INTO surface_routes(adapter, account_id, actor_id, surface_kind, surface_id,
             thread_id, uid, pid, updated_at, updated_by_uid)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT(adapter, account_id, actor_id, surface_kind, surface_id, thread_id)
         DO UPDATE SET uid = ?7, pid = ?8, updated_at = ?9, updated_by_uid = ?10",
        params![
            a.adapter,
            a.account_id,
            a.actor_id,
            key.kind.as_str(),
            key.surface_id,
            key.thread_id,
            uid,
            pid,
            now,
            by_uid
        ],
    )?;
    Ok(Route {
        adapter: a.adapter.clone(),
        account_id: a.account_id.clone(),
        actor_id: a.actor_id.clone(),
        surface: surface_of(key.kind, &key.surface_id, &key.thread_id),
        uid,
        pid: pid.to_owned(),
        updated_at: now,
        updated_by_uid: by_uid,
    })
}

/// Removes the route of `key` if `uid` owns it (any owner when `None`).
pub fn delete_surface_route(
    c: &Connection,
    key: &SurfaceKey,
    uid: Option<i64>,
) -> Result<bool, KernelError> {
    let a = &key.actor;
    Ok(c.execute(
        "DELETE FROM surface_routes WHERE adapter = ?1 AND account_id = ?2 AND actor_id = ?3
             AND surface_kind = ?4 AND surface_id = ?5 AND thread_id = ?6
             AND (?7 IS NULL OR uid = ?7)",
        params![
            a.adapter,
            a.account_id,
            a.actor_id,
            key.kind.as_str(),
            key.surface_id,
            key.thread_id,
            uid
        ],
    )? > 0)
}

/// Routes newest first: of `uid`, or all.
pub fn list_surface_routes(c: &Connection, uid: Option<i64>) -> Result<Vec<Route>, KernelError> {
    let mut st = c.prepare(
        "SELECT adapter, account_id, actor_id, surface_kind, surface_id, thread_id, uid, pid,
             updated_at, updated_by_uid
         FROM surface_routes WHERE ?1 IS NULL OR uid = ?1
         ORDER BY updated_at DESC, adapter, account_id, actor_id, surface_id, thread_id",
    )?;
    let rows = st.query_map([uid], |r| {
        let kind: String = r.get(3)?;
        // Rows are written from a `SurfaceKind`; another spelling is a
        // row this kernel did not write, left out.
        let Ok(kind) = serde_json::from_value(serde_json::Value::String(kind)) else {
            return Ok(None);
        };
        let (surface_id, thread_id): (String, String) = (r.get(4)?, r.get(5)?);
        Ok(Some(Route {
            adapter: r.get(0)?,
            account_id: r.get(1)?,
            actor_id: r.get(2)?,
            surface: surface_of(kind, &surface_id, &thread_id),
            uid: r.get(6)?,
            pid: r.get(7)?,
            updated_at: r.get(8)?,
            updated_by_uid: r.get(9)?,
        }))
    })?;
    let mut out = Vec::new();
    for row in rows {
        out.extend(row?);
    }
    Ok(out)
}

fn surface_of(kind: SurfaceKind, id: &str, thread_id: &str) -> Surface {
    Surface {
        kind,
        id: id.to_owned(),
        name: None,
        handle: None,
        thread_id: (!thread_id.is_empty()).then(|| thread_id.to_owned()),
    }
}

// ---- the ingress-receipt ledger ----------------------------------------

/// One inbound message, as its platform names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptKey {
    pub adapter: String,
    pub account_id: String,
    pub surface_id: String,
    pub message_id: String,
}

/// What the ledger says about a message about to be handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// First seen: this call handles it.
    Fresh,
    /// Another call is handling it now.
    InProgress,
    /// Handled before; the result it got (JSON).
    Completed(String),
}

/// Claims `key` for handling, or says who did; old receipts go.
pub fn claim_receipt(
    c: &mut Connection,
    key: &ReceiptKey,
    delivery_id: Option<&str>,
) -> Result<Claim, KernelError> {
    let now = now_ms();
    let tx = c.transaction()?;
    tx.execute(
        "DELETE FROM adapter_ingress_receipts WHERE created_at < ?1",
        [now - RECEIPT_TTL.as_millis() as i64],
    )?;
    let seen: Option<(String, Option<String>)> = tx
        .query_row(
            "SELECT state, result_json FROM adapter_ingress_receipts
             WHERE adapter = ?1 AND account_id = ?2 AND surface_id = ?3 AND message_id = ?4",
            params![key.adapter, key.account_id, key.surface_id, key.message_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let claim = match seen {
        Some((state, Some(result))) if state == "completed" => Claim::Completed(result),
        Some(_) => Claim::InProgress,
        None => {
            tx.execute(
                "INSERT INTO adapter_ingress_receipts(adapter, account_id, surface_id,
                     message_id, delivery_id, state, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', ?6)",
                params![
                    key.adapter,
                    key.account_id,
                    key.surface_id,
                    key.message_id,
                    delivery_id,
                    now
                ],
            )?;
            Claim::Fresh
        }
    };
    tx.commit()?;
    Ok(claim)
}

/// Records the result `key` got (JSON).
pub fn complete_receipt(c: &Connection, key: &ReceiptKey, result: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE adapter_ingress_receipts SET state = 'completed', completed_at = ?5,
             result_json = ?6
         WHERE adapter = ?1 AND account_id = ?2 AND surface_id = ?3 AND message_id = ?4",
        params![
            key.adapter,
            key.account_id,
            key.surface_id,
            key.message_id,
            now_ms(),
            result
        ],
    )?;
    Ok(())
}

/// Forgets the claim of `key` (its handling failed; a redelivery may
/// try again).
pub fn release_receipt(c: &Connection, key: &ReceiptKey) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM adapter_ingress_receipts WHERE adapter = ?1 AND account_id = ?2
             AND surface_id = ?3 AND message_id = ?4 AND state = 'in_progress'",
        params![key.adapter, key.account_id, key.surface_id, key.message_id],
    )?;
    Ok(())
}

/// At start: a claim a stopped kernel left was never finished, so a
/// redelivery of its message must be handled again.
pub fn reset_receipts_at_start(c: &mut Connection) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM adapter_ingress_receipts WHERE state = 'in_progress'",
        [],
    )?;
    Ok(())
}

// ---- answers waiting for their adapter ---------------------------------

/// Keeps `args` (with its `deliveryId`) until it is posted; the oldest
/// answers of the account beyond [`OUTBOX_LIMIT`] give way.
pub fn outbox_put(c: &mut Connection, run_id: &str, args: &SendArgs) -> Result<(), KernelError> {
    let json = serde_json::to_string(args)
        .map_err(|e| KernelError::internal("encoding an outbox answer", e))?;
    let tx = c.transaction()?;
    tx.execute(
        "INSERT OR IGNORE INTO adapter_outbox(delivery_id, adapter, account_id, run_id,
             args_json, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            args.delivery_id.as_deref().unwrap_or_default(),
            args.adapter,
            args.account_id,
            run_id,
            json,
            now_ms()
        ],
    )?;
    tx.execute(
        "DELETE FROM adapter_outbox WHERE delivery_id IN (
             SELECT delivery_id FROM adapter_outbox WHERE adapter = ?1 AND account_id = ?2
             ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?3)",
        params![args.adapter, args.account_id, OUTBOX_LIMIT],
    )?;
    tx.commit()?;
    Ok(())
}

/// The answer was posted, or can never be: it leaves the outbox.
pub fn outbox_remove(c: &Connection, delivery_id: &str) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM adapter_outbox WHERE delivery_id = ?1",
        [delivery_id],
    )?;
    Ok(())
}

/// A failed attempt: counted, with why.
pub fn outbox_failed(c: &Connection, delivery_id: &str, error: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE adapter_outbox SET attempts = attempts + 1, last_error = ?2
         WHERE delivery_id = ?1",
        params![delivery_id, error],
    )?;
    Ok(())
}

/// The answers waiting for `adapter`'s `account_id`, oldest first, with
/// their run ids.
pub fn outbox_of(
    c: &Connection,
    adapter: &str,
    account_id: &str,
) -> Result<Vec<(String, SendArgs)>, KernelError> {
    let mut st = c.prepare(
        "SELECT run_id, args_json FROM adapter_outbox WHERE adapter = ?1 AND account_id = ?2
         ORDER BY created_at, rowid",
    )?;
    let rows = st.query_map(params![adapter, account_id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (run_id, json) = row?;
        match serde_json::from_str(&json) {
            Ok(args) => out.push((run_id, args)),
            Err(e) => tracing::warn!(run = %run_id, error = %e, "an unreadable outbox answer"),
        }
    }
    Ok(out)
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

    /// A database with this domain's second migration (receipts, outbox).
    fn receipts_and_outbox() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(super::super::MIGRATIONS[1].sql).unwrap();
        c
    }

    #[test]
    fn a_message_is_claimed_once_replayed_when_done_and_released_when_not() {
        let mut c = receipts_and_outbox();
        let key = |m: &str| ReceiptKey {
            adapter: "matrix".into(),
            account_id: "@bot:x".into(),
            surface_id: "!r:x".into(),
            message_id: m.into(),
        };
        let first = key("$1");
        assert_eq!(
            claim_receipt(&mut c, &first, Some("d1")).unwrap(),
            Claim::Fresh
        );
        assert_eq!(
            claim_receipt(&mut c, &first, Some("d1")).unwrap(),
            Claim::InProgress
        );
        release_receipt(&c, &first).unwrap();
        assert_eq!(claim_receipt(&mut c, &first, None).unwrap(), Claim::Fresh);
        complete_receipt(&c, &first, r#"{"ok":true}"#).unwrap();
        release_receipt(&c, &first).unwrap();
        assert_eq!(
            claim_receipt(&mut c, &first, None).unwrap(),
            Claim::Completed(r#"{"ok":true}"#.into()),
            "a completed receipt stays"
        );
        // A claim a stopped kernel left is dropped at start; results stay.
        let unfinished = key("$2");
        assert_eq!(
            claim_receipt(&mut c, &unfinished, None).unwrap(),
            Claim::Fresh
        );
        reset_receipts_at_start(&mut c).unwrap();
        assert_eq!(
            claim_receipt(&mut c, &unfinished, None).unwrap(),
            Claim::Fresh
        );
        assert!(matches!(
            claim_receipt(&mut c, &first, None).unwrap(),
            Claim::Completed(_)
        ));
    }

    #[test]
    fn the_outbox_keeps_an_accounts_newest_answers_up_to_its_limit() {
        let mut c = receipts_and_outbox();
        let answer = |n: i64, account: &str| SendArgs {
            adapter: "matrix".into(),
            account_id: account.into(),
            delivery_id: Some(format!("d{n}")),
            surface: surface_of(SurfaceKind::Dm, "!r:x", ""),
            actor_id: None,
            text: format!("answer {n}"),
            reply_to_id: None,
            media: Vec::new(),
            also: None,
        };
        for n in 0..=OUTBOX_LIMIT {
            outbox_put(&mut c, "run_1", &answer(n, "@a:x")).unwrap();
        }
        outbox_put(&mut c, "run_2", &answer(-1, "@b:x")).unwrap();
        let a = outbox_of(&c, "matrix", "@a:x").unwrap();
        assert_eq!(a.len() as i64, OUTBOX_LIMIT);
        assert_eq!(
            a[0].1.delivery_id.as_deref(),
            Some("d1"),
            "the oldest gave way"
        );
        assert_eq!(a[0].1.text, "answer 1");
        let b = outbox_of(&c, "matrix", "@b:x").unwrap();
        assert_eq!((b.len(), b[0].0.as_str()), (1, "run_2"));
        outbox_failed(&c, "d-1", "No adapter connected").unwrap();
        outbox_remove(&c, "d-1").unwrap();
        assert!(outbox_of(&c, "matrix", "@b:x").unwrap().is_empty());
    }

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
