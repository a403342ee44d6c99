//! Users, groups, capabilities, passwords and tokens in the kernel database
//! (reference §2.2). Everything here is synchronous and runs on the
//! database's blocking thread (`Db::call`); password hashing runs on its
//! own blocking task so it never holds the database.

pub mod calls;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rand::RngCore;
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::caps;
use crate::db::Migration;
use crate::db::{now_ms, opt};
use crate::error::KernelError;

pub const ROOT_UID: i64 = 0;
pub const USERS_GID: i64 = 100;
pub const DRIVERS_GID: i64 = 101;
pub const SERVICES_GID: i64 = 102;
/// Humans get uids from here up.
pub const FIRST_HUMAN_UID: i64 = 1000;
/// A shadow hash that matches no password.
const LOCKED: &str = "!";

pub use gsv_protocol::account::{Account, ProcessIdentity};

/// Seeds root, the base groups and their capabilities; idempotent.
pub fn bootstrap(conn: &mut Connection) -> Result<(), KernelError> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT OR IGNORE INTO passwd(username, uid, gid, home) VALUES ('root', 0, 0, '/root')",
        [],
    )?;
    tx.execute(
        "INSERT OR IGNORE INTO shadow(username, hash) VALUES ('root', ?1)",
        [LOCKED],
    )?;
    for (name, gid) in [
        ("root", 0),
        ("users", USERS_GID),
        ("drivers", DRIVERS_GID),
        ("services", SERVICES_GID),
    ] {
        tx.execute(
            "INSERT OR IGNORE INTO groups(name, gid) VALUES (?1, ?2)",
            params![name, gid],
        )?;
    }
    for (gid, list) in [
        (0, caps::ROOT_CAPABILITIES),
        (USERS_GID, caps::USER_CAPABILITIES),
        (DRIVERS_GID, caps::DRIVER_CAPABILITIES),
        (SERVICES_GID, caps::SERVICE_CAPABILITIES),
    ] {
        for cap in list {
            tx.execute(
                "INSERT OR IGNORE INTO group_capabilities(gid, capability) VALUES (?1, ?2)",
                params![gid, cap],
            )?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Setup mode: root still locked and no human account yet.
pub fn setup_mode(conn: &Connection) -> Result<bool, KernelError> {
    let root_locked: bool = conn.query_row(
        "SELECT hash = ?1 FROM shadow WHERE username = 'root'",
        [LOCKED],
        |r| r.get(0),
    )?;
    let humans: i64 = conn.query_row(
        "SELECT count(*) FROM passwd WHERE uid >= ?1",
        [FIRST_HUMAN_UID],
        |r| r.get(0),
    )?;
    Ok(root_locked && humans == 0)
}

pub fn root_locked(conn: &Connection) -> Result<bool, KernelError> {
    Ok(conn.query_row(
        "SELECT hash = ?1 FROM shadow WHERE username = 'root'",
        [LOCKED],
        |r| r.get(0),
    )?)
}

/// Checks a new username: lowercase, starts with a letter or `_`, ≤ 32.
pub fn validate_username(name: &str) -> Result<(), String> {
    let mut cs = name.chars();
    let ok = matches!(cs.next(), Some('a'..='z' | '_'))
        && cs.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        && name.len() <= 32;
    if ok && name != "root" {
        Ok(())
    } else {
        Err(format!(
            "Invalid username '{name}': use 1-32 of [a-z0-9_-], starting with a letter or _"
        ))
    }
}

pub fn validate_password(pw: &str) -> Result<(), String> {
    if pw.chars().count() < 8 {
        Err("Password must be at least 8 characters".into())
    } else {
        Ok(())
    }
}

/// Creates a human: uid from 1000, a private group, membership in `users`.
pub fn create_human(
    conn: &mut Connection,
    username: &str,
    password_hash: &str,
) -> Result<ProcessIdentity, KernelError> {
    let tx = conn.transaction()?;
    let exists: i64 = tx.query_row(
        "SELECT count(*) FROM passwd WHERE username = ?1",
        [username],
        |r| r.get(0),
    )?;
    if exists > 0 {
        return Err(KernelError::BadRequest(format!(
            "User already exists: {username}"
        )));
    }
    let uid: i64 = tx.query_row(
        "SELECT max(?1, coalesce(max(uid) + 1, ?1)) FROM passwd WHERE uid >= ?1",
        [FIRST_HUMAN_UID],
        |r| r.get(0),
    )?;
    let home = format!("/home/{username}");
    tx.execute(
        "INSERT INTO passwd(username, uid, gid, home) VALUES (?1, ?2, ?2, ?3)",
        params![username, uid, home],
    )?;
    tx.execute(
        "INSERT INTO shadow(username, hash, lastchanged) VALUES (?1, ?2, ?3)",
        params![username, password_hash, now_ms()],
    )?;
    tx.execute(
        "INSERT INTO groups(name, gid, members) VALUES (?1, ?2, ?1)",
        params![username, uid],
    )?;
    let members: String = tx.query_row(
        "SELECT members FROM groups WHERE gid = ?1",
        [USERS_GID],
        |r| r.get(0),
    )?;
    let members = if members.is_empty() {
        username.to_owned()
    } else {
        format!("{members},{username}")
    };
    tx.execute(
        "UPDATE groups SET members = ?1 WHERE gid = ?2",
        params![members, USERS_GID],
    )?;
    tx.commit()?;
    identity(conn, username)?.ok_or_else(|| KernelError::Internal("new user vanished".into()))
}

pub fn set_password(conn: &Connection, username: &str, hash: &str) -> Result<(), KernelError> {
    conn.execute(
        "UPDATE shadow SET hash = ?2, lastchanged = ?3 WHERE username = ?1",
        params![username, hash, now_ms()],
    )?;
    Ok(())
}

pub fn password_hash(conn: &Connection, username: &str) -> Result<Option<String>, KernelError> {
    opt(conn.query_row(
        "SELECT hash FROM shadow WHERE username = ?1",
        [username],
        |r| r.get(0),
    ))
}

/// The identity of `username`, with every group it belongs to.
pub fn identity(conn: &Connection, username: &str) -> Result<Option<ProcessIdentity>, KernelError> {
    let row: Option<(i64, i64, String)> = opt(conn.query_row(
        "SELECT uid, gid, home FROM passwd WHERE username = ?1",
        [username],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    ))?;
    let Some((uid, gid, home)) = row else {
        return Ok(None);
    };
    let mut gids = vec![gid];
    let mut stmt = conn.prepare_cached("SELECT gid, members FROM groups ORDER BY gid")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
    for row in rows {
        let (g, members) = row?;
        if g != gid && members.split(',').any(|m| m == username) {
            gids.push(g);
        }
    }
    Ok(Some(ProcessIdentity {
        uid,
        gid,
        gids,
        username: username.to_owned(),
        cwd: home.clone(),
        home,
    }))
}

pub fn identity_by_uid(
    conn: &Connection,
    uid: i64,
) -> Result<Option<ProcessIdentity>, KernelError> {
    let name: Option<String> = opt(conn.query_row(
        "SELECT username FROM passwd WHERE uid = ?1",
        [uid],
        |r| r.get(0),
    ))?;
    match name {
        Some(n) => identity(conn, &n),
        None => Ok(None),
    }
}

/// The union of the capabilities of `gids`, sorted.
pub fn capabilities(conn: &Connection, gids: &[i64]) -> Result<Vec<String>, KernelError> {
    let mut out = Vec::new();
    let mut stmt =
        conn.prepare_cached("SELECT capability FROM group_capabilities WHERE gid = ?1")?;
    for g in gids {
        for c in stmt.query_map([g], |r| r.get::<_, String>(0))? {
            out.push(c?);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `{uid, username, gid, home}` of every account, by uid.
pub fn list_accounts(conn: &Connection) -> Result<Vec<Account>, KernelError> {
    let mut stmt = conn.prepare("SELECT uid, username, gid, home FROM passwd ORDER BY uid")?;
    let rows = stmt.query_map([], |r| {
        let uid: i64 = r.get(0)?;
        Ok(Account {
            uid,
            username: r.get(1)?,
            gid: r.get(2)?,
            home: r.get(3)?,
            kind: if uid >= FIRST_HUMAN_UID {
                "human"
            } else {
                "system"
            }
            .to_owned(),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Argon2id with a random salt, in PHC string form. CPU-heavy: call it
/// from a blocking task.
pub fn hash_password(pw: &str) -> Result<String, KernelError> {
    let mut raw = [0u8; 16];
    rand::rng().fill_bytes(&mut raw);
    let salt =
        SaltString::encode_b64(&raw).map_err(|e| KernelError::internal("salting a password", e))?;
    Argon2::default()
        .hash_password(pw.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| KernelError::internal("hashing a password", e))
}

/// Whether `pw` matches a stored PHC hash; a locked or corrupt hash never
/// matches. CPU-heavy: call it from a blocking task.
pub fn verify_password(stored: &str, pw: &str) -> bool {
    PasswordHash::new(stored)
        .map(|h| Argon2::default().verify_password(pw.as_bytes(), &h).is_ok())
        .unwrap_or(false)
}

// ---- tokens ----

pub use gsv_protocol::sys::TokenInfo;

/// What `sys.token.create` asks for, after checks.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub uid: i64,
    pub kind: String,
    pub label: Option<String>,
    pub allowed_role: Option<String>,
    pub allowed_device_id: Option<String>,
    pub expires_at: Option<i64>,
}

pub fn token_hash(raw: &str) -> String {
    hex::encode(Sha256::digest(raw.as_bytes()))
}

pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// Stores a new token and returns `(raw token, row)`; the raw value exists
/// only in this return value.
pub fn create_token(conn: &Connection, t: &NewToken) -> Result<(String, TokenInfo), KernelError> {
    let raw = format!("gsv_{}", random_hex(32));
    let info = TokenInfo {
        token_id: format!("tok_{}", random_hex(8)),
        uid: t.uid,
        kind: t.kind.clone(),
        label: t.label.clone(),
        token_prefix: raw[..12].to_owned(),
        allowed_role: t.allowed_role.clone(),
        allowed_device_id: t.allowed_device_id.clone(),
        created_at: now_ms(),
        last_used_at: None,
        expires_at: t.expires_at,
        revoked_at: None,
        revoked_reason: None,
    };
    conn.execute(
        "INSERT INTO auth_tokens(token_id, uid, kind, label, token_hash, token_prefix,
            allowed_role, allowed_device_id, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            info.token_id,
            info.uid,
            info.kind,
            info.label,
            token_hash(&raw),
            info.token_prefix,
            info.allowed_role,
            info.allowed_device_id,
            info.created_at,
            info.expires_at
        ],
    )?;
    Ok((raw, info))
}

const TOKEN_COLUMNS: &str = "token_id, uid, kind, label, token_prefix, allowed_role,
    allowed_device_id, created_at, last_used_at, expires_at, revoked_at, revoked_reason";

fn token_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TokenInfo> {
    Ok(TokenInfo {
        token_id: r.get(0)?,
        uid: r.get(1)?,
        kind: r.get(2)?,
        label: r.get(3)?,
        token_prefix: r.get(4)?,
        allowed_role: r.get(5)?,
        allowed_device_id: r.get(6)?,
        created_at: r.get(7)?,
        last_used_at: r.get(8)?,
        expires_at: r.get(9)?,
        revoked_at: r.get(10)?,
        revoked_reason: r.get(11)?,
    })
}

/// Tokens of `uid` (all tokens when `None`), revoked ones included.
pub fn list_tokens(conn: &Connection, uid: Option<i64>) -> Result<Vec<TokenInfo>, KernelError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {TOKEN_COLUMNS} FROM auth_tokens WHERE ?1 IS NULL OR uid = ?1 ORDER BY created_at, token_id"
    ))?;
    let rows = stmt.query_map([uid], token_from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Revokes `token_id` if it exists and (unless `uid` is `None`) belongs to
/// `uid`; returns whether a live token was revoked.
pub fn revoke_token(
    conn: &Connection,
    token_id: &str,
    uid: Option<i64>,
    reason: Option<&str>,
) -> Result<bool, KernelError> {
    let n = conn.execute(
        "UPDATE auth_tokens SET revoked_at = ?3, revoked_reason = ?4
         WHERE token_id = ?1 AND (?2 IS NULL OR uid = ?2) AND revoked_at IS NULL",
        params![token_id, uid, now_ms(), reason],
    )?;
    Ok(n > 0)
}

/// The live (not revoked, not expired) token with this raw value, marking
/// it used.
pub fn authenticate_token(conn: &Connection, raw: &str) -> Result<Option<TokenInfo>, KernelError> {
    let t = opt(conn.query_row(
        &format!("SELECT {TOKEN_COLUMNS} FROM auth_tokens WHERE token_hash = ?1"),
        [token_hash(raw)],
        token_from_row,
    ))?;
    let now = now_ms();
    let Some(t) = t.filter(|t| t.revoked_at.is_none() && t.expires_at.is_none_or(|e| e > now))
    else {
        return Ok(None);
    };
    conn.execute(
        "UPDATE auth_tokens SET last_used_at = ?2 WHERE token_id = ?1",
        params![t.token_id, now],
    )?;
    Ok(Some(t))
}

// ---- config ----

/// Keys whose values only root may read.
pub fn is_sensitive_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password", "token", "secret", "api_key", "apikey", "api-key",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Whether a non-root `uid` may see `key`: its own `users/<uid>/` keys and
/// non-sensitive `config/` keys.
pub fn config_visible(uid: i64, key: &str) -> bool {
    uid == ROOT_UID
        || key.starts_with(&format!("users/{uid}/"))
        || (key.starts_with("config/") && !is_sensitive_key(key))
}

/// Whether `uid` may write `key`.
pub fn config_writable(uid: i64, key: &str) -> bool {
    uid == ROOT_UID || key.starts_with(&format!("users/{uid}/ai/"))
}

/// Entries equal to `key` or under `key/` (everything when `None`) that
/// `uid` may see, by key.
pub fn config_get(
    conn: &Connection,
    uid: i64,
    key: Option<&str>,
) -> Result<Vec<(String, String)>, KernelError> {
    let mut stmt = conn.prepare_cached("SELECT key, value FROM config_kv ORDER BY key")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (k, v) = row?;
        let selected = match key {
            None => true,
            Some(p) => k == p || k.starts_with(&format!("{}/", p.trim_end_matches('/'))),
        };
        if selected && config_visible(uid, &k) {
            out.push((k, v));
        }
    }
    Ok(out)
}

/// The value of config key `key`, unless missing or blank.
pub fn config_value(conn: &Connection, key: &str) -> Result<Option<String>, KernelError> {
    let v: Option<String> = conn
        .query_row("SELECT value FROM config_kv WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.filter(|v| !v.trim().is_empty()))
}

/// The entries whose key starts with `prefix` and ends with `suffix`, by
/// key (no visibility filter: for the kernel's own reads).
pub fn config_entries(
    conn: &Connection,
    prefix: &str,
    suffix: &str,
) -> Result<Vec<(String, String)>, KernelError> {
    let mut stmt = conn.prepare_cached(
        "SELECT key, value FROM config_kv WHERE substr(key, 1, length(?1)) = ?1 ORDER BY key",
    )?;
    let rows = stmt.query_map([prefix], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (k, v) = row?;
        if k.ends_with(suffix) {
            out.push((k, v));
        }
    }
    Ok(out)
}

pub fn config_set(conn: &Connection, key: &str, value: &str) -> Result<(), KernelError> {
    conn.execute(
        "INSERT INTO config_kv(key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![key, value],
    )?;
    Ok(())
}

/// This domain's tables: users, groups, capabilities, tokens and config rows. Listed in `domains::MIGRATIONS`;
/// never edit a released migration (its checksum is checked at every
/// start), add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "accounts",
    sql: "CREATE TABLE passwd(
            username TEXT PRIMARY KEY,
            uid INTEGER NOT NULL UNIQUE,
            gid INTEGER NOT NULL,
            gecos TEXT NOT NULL DEFAULT '',
            home TEXT NOT NULL,
            shell TEXT NOT NULL DEFAULT '/bin/init');
         CREATE TABLE shadow(
            username TEXT PRIMARY KEY,
            hash TEXT NOT NULL DEFAULT '!',
            lastchanged INTEGER);
         CREATE TABLE groups(
            name TEXT PRIMARY KEY,
            gid INTEGER NOT NULL UNIQUE,
            members TEXT NOT NULL DEFAULT '');
         CREATE TABLE group_capabilities(
            gid INTEGER NOT NULL,
            capability TEXT NOT NULL,
            PRIMARY KEY(gid, capability));
         CREATE TABLE auth_tokens(
            token_id TEXT PRIMARY KEY,
            uid INTEGER NOT NULL,
            kind TEXT NOT NULL,
            label TEXT,
            token_hash TEXT NOT NULL UNIQUE,
            token_prefix TEXT NOT NULL,
            allowed_role TEXT,
            allowed_device_id TEXT,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER,
            expires_at INTEGER,
            revoked_at INTEGER,
            revoked_reason TEXT);
         CREATE INDEX auth_tokens_uid ON auth_tokens(uid);
         CREATE TABLE config_kv(key TEXT PRIMARY KEY, value TEXT NOT NULL);",
}];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::Db;

    fn conn() -> Connection {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, MIGRATIONS).unwrap());
        let mut c = Connection::open(&p).unwrap();
        bootstrap(&mut c).unwrap();
        // The temp dir may go: the open connection keeps the file alive.
        std::mem::forget(dir);
        c
    }

    #[test]
    fn a_fresh_kernel_is_in_setup_mode_until_a_human_exists() {
        let mut c = conn();
        assert!(setup_mode(&c).unwrap());
        let id = create_human(&mut c, "alice", "x").unwrap();
        assert_eq!(id.uid, FIRST_HUMAN_UID);
        assert_eq!(id.gids, vec![1000, USERS_GID]);
        assert!(!setup_mode(&c).unwrap());
        let bob = create_human(&mut c, "bob", "x").unwrap();
        assert_eq!(bob.uid, 1001);
    }

    #[test]
    fn users_get_the_users_group_capabilities_and_root_gets_star() {
        let mut c = conn();
        let id = create_human(&mut c, "alice", "x").unwrap();
        let caps = capabilities(&c, &id.gids).unwrap();
        assert!(caps.contains(&"fs.*".to_string()));
        assert!(!caps.contains(&"*".to_string()));
        assert_eq!(capabilities(&c, &[0]).unwrap(), vec!["*".to_string()]);
    }

    #[test]
    fn a_revoked_or_expired_token_no_longer_authenticates() {
        let c = conn();
        let mk = |expires_at| NewToken {
            uid: 0,
            kind: "user".into(),
            label: None,
            allowed_role: Some("user".into()),
            allowed_device_id: None,
            expires_at,
        };
        let (raw, info) = create_token(&c, &mk(None)).unwrap();
        assert!(authenticate_token(&c, &raw).unwrap().is_some());
        assert!(revoke_token(&c, &info.token_id, Some(0), Some("done")).unwrap());
        assert!(authenticate_token(&c, &raw).unwrap().is_none());
        let (old, _) = create_token(&c, &mk(Some(1))).unwrap();
        assert!(authenticate_token(&c, &old).unwrap().is_none());
        let stored: String = c
            .query_row(
                "SELECT token_hash FROM auth_tokens WHERE token_id = ?1",
                [&info.token_id],
                |r| r.get(0),
            )
            .unwrap();
        assert_ne!(stored, raw, "only a hash is stored");
    }

    #[test]
    fn passwords_verify_only_against_their_own_hash() {
        let h = hash_password("correct horse").unwrap();
        assert!(verify_password(&h, "correct horse"));
        assert!(!verify_password(&h, "wrong"));
        assert!(!verify_password(LOCKED, ""));
    }

    #[test]
    fn sensitive_config_keys_are_hidden_from_non_root() {
        let c = conn();
        config_set(&c, "config/shell/timeout_ms", "30000").unwrap();
        config_set(&c, "config/ai/api_key", "sk-1").unwrap();
        config_set(&c, "users/1000/ai/model", "m").unwrap();
        config_set(&c, "users/1001/ai/model", "n").unwrap();
        let keys: Vec<String> = config_get(&c, 1000, None)
            .unwrap()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(keys, vec!["config/shell/timeout_ms", "users/1000/ai/model"]);
        assert_eq!(config_get(&c, 0, None).unwrap().len(), 4);
        assert_eq!(config_get(&c, 0, Some("config/ai")).unwrap().len(), 1);
    }
}
