//! Column conversions and the clock every table shares (a leaf: the
//! row and chunk modules both use it).

use wsd_sync::Hash;

pub(crate) fn conversion_error(col: usize, msg: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, msg.into())
}

pub(crate) fn hash_from_sql(bytes: Vec<u8>, col: usize) -> rusqlite::Result<Hash> {
    Hash::from_slice(&bytes).map_err(|e| conversion_error(col, e.to_string()))
}

/// Milliseconds since the Unix epoch, the mtime unit on the wire (0 if the
/// clock is before it).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
