//! Connection settings each owner states for its database.

use std::time::Duration;

use rusqlite::Connection;

/// `PRAGMA journal_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalMode {
    /// Readers never block the one writer; commits append to `NAME-wal`.
    Wal,
    /// SQLite's default rollback journal.
    Delete,
}

/// `PRAGMA synchronous`: how much a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// In WAL mode: a power loss may drop the last commits, never
    /// consistency.
    Normal,
    /// Every commit is on disk when it returns.
    Full,
    /// Never waits for the disk, not even to checkpoint: a process crash
    /// loses nothing, an OS crash or power loss may lose or tear any write
    /// since the last one the kernel flushed. Only for a database its
    /// owner can check and rebuild (wsd's client index).
    Off,
}

/// The settings of every connection to one database. Each owner writes its
/// own constant and says there why it chose its durability.
#[derive(Debug, Clone, Copy)]
pub struct Pragmas {
    pub journal_mode: JournalMode,
    pub synchronous: Synchronous,
    /// How long a statement waits on another connection's lock before
    /// `SQLITE_BUSY`.
    pub busy_timeout: Duration,
    pub foreign_keys: bool,
    /// WAL pages between automatic checkpoints (`None`: SQLite's 1000).
    pub wal_autocheckpoint: Option<u32>,
    /// Page cache in KiB (`None`: SQLite's 2 MiB).
    pub cache_kib: Option<u32>,
    /// `SQLITE_DBCONFIG_ENABLE_QPSG`: plans never depend on bound values, so
    /// a cached statement is not re-prepared when a plan-relevant parameter
    /// (a LIMIT, an indexed key) is rebound (the bundled SQLite has STAT4).
    pub stable_query_plans: bool,
    /// Prepared statements kept per connection (`None`: rusqlite's 16).
    pub statement_cache: Option<usize>,
}

impl Pragmas {
    /// Applies the settings to `conn`. An in-memory database answers
    /// `memory` to the journal mode, and that is fine.
    pub fn apply(&self, conn: &Connection) -> rusqlite::Result<()> {
        conn.busy_timeout(self.busy_timeout)?;
        let mode = match self.journal_mode {
            JournalMode::Wal => "WAL",
            JournalMode::Delete => "DELETE",
        };
        let _mode: String =
            conn.pragma_update_and_check(None, "journal_mode", mode, |r| r.get(0))?;
        let sync = match self.synchronous {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
            Synchronous::Off => "OFF",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.pragma_update(None, "foreign_keys", self.foreign_keys)?;
        if let Some(pages) = self.wal_autocheckpoint {
            conn.pragma_update(None, "wal_autocheckpoint", pages)?;
        }
        if let Some(kib) = self.cache_kib {
            conn.pragma_update(None, "cache_size", -i64::from(kib))?;
        }
        if self.stable_query_plans {
            conn.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
                true,
            )?;
        }
        if let Some(n) = self.statement_cache {
            conn.set_prepared_statement_cache_capacity(n);
        }
        Ok(())
    }
}
