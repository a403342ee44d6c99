//! Remembered excludes: the `--exclude` patterns a local directory keeps
//! using, stored with its sync state (`LOCAL_DIR/.wsd`) so that a later
//! `push`, `pull` or `sync` without the flag leaves the same paths out.
//! Dropping one is explicit (`--no-exclude`, `wsd exclude rm`), and what it
//! hid locally is sent by the next push ([`Released`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use wsd_sync::{
    ApplyBatch, ApplyOutcome, ChangeCursor, ChangeEntry, ChangesQuery, ChangesWindow, EntryState,
    Hash, IgnoreRules, Object, Store, SyncError, SyncPath, Watermarks,
};

/// The file in the state directory listing the remembered patterns, one a
/// line, in the order they were given.
const EXCLUDES_FILE: &str = "excludes";
/// The file listing patterns dropped since the last push: what they hid
/// locally has not been sent yet.
const RELEASED_FILE: &str = "excludes-released";

/// A directory's remembered excludes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remembered {
    /// Left out of every transfer of the directory.
    pub patterns: Vec<String>,
    /// Dropped, and what they hid is still to be pushed.
    pub released: Vec<String>,
}

impl Remembered {
    /// Reads the state directory's lists (none yet: empty).
    pub fn load(state: &Path) -> Result<Remembered> {
        Ok(Remembered {
            patterns: read_lines(&state.join(EXCLUDES_FILE))?,
            released: read_lines(&state.join(RELEASED_FILE))?,
        })
    }

    /// Writes both lists into `state` (created if missing), each replaced
    /// whole so that a reader never sees half of one.
    pub fn save(&self, state: &Path) -> Result<()> {
        std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
        write_lines(&state.join(EXCLUDES_FILE), &self.patterns)?;
        write_lines(&state.join(RELEASED_FILE), &self.released)
    }

    /// Remembers each of `add` (once, after those already kept) and forgets
    /// each of `drop`, which must be remembered; `wsdignore` (the
    /// directory's `.wsdignore` lines) only sharpens the error for a pattern
    /// that lives there. Nothing changes on an error.
    pub fn change(&mut self, add: &[String], drop: &[String], wsdignore: &[String]) -> Result<()> {
        let mut next = self.clone();
        for p in add {
            check_pattern(p)?;
            if drop.contains(p) {
                bail!("{p:?} is given both to exclude and to stop excluding");
            }
            if !next.patterns.contains(p) {
                next.patterns.push(p.clone());
            }
            next.released.retain(|r| r != p);
        }
        for p in drop {
            let Some(at) = next.patterns.iter().position(|q| q == p) else {
                if wsdignore.contains(p) {
                    bail!("{p:?} comes from .wsdignore, not from --exclude: edit that file");
                }
                bail!(
                    "{p:?} is not a remembered exclude (remembered: {})",
                    if self.patterns.is_empty() {
                        "none".to_owned()
                    } else {
                        self.patterns.join(", ")
                    }
                );
            };
            next.patterns.remove(at);
            if !next.released.contains(p) {
                next.released.push(p.clone());
            }
        }
        *self = next;
        Ok(())
    }
}

/// A pattern a line of the file can hold.
fn check_pattern(p: &str) -> Result<()> {
    if p.trim().is_empty() || p.contains(['\n', '\r']) {
        bail!("exclude pattern {p:?} is empty or spans lines");
    }
    Ok(())
}

fn read_lines(file: &Path) -> Result<Vec<String>> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.display())),
    }
}

fn write_lines(file: &Path, lines: &[String]) -> Result<()> {
    if lines.is_empty() {
        return match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", file.display()))
            }
            _ => Ok(()),
        };
    }
    let tmp = PathBuf::from(format!("{}.tmp", file.display()));
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("replacing {}", file.display()))
}

/// The local store as a push of what dropped excludes hid sees it: every
/// live path they match (and the remaining rules, in the query, let
/// through) from the start of the log, whatever the push cursor says,
/// since the cursor passed them while they were left out. Deletions are
/// not sent: an excluded path is never deleted on the other side, and
/// dropping the exclude does not change that for the past. The real push
/// cursor is left alone (this push re-sends what the cursor already
/// covers), and no baseline is made: only these paths go.
pub struct Released<'a, S: Store> {
    pub inner: &'a mut S,
    /// The dropped patterns.
    pub rules: IgnoreRules,
}

impl<S: Store> Released<'_, S> {
    fn wanted(&self, e: &ChangeEntry) -> bool {
        let is_dir = matches!(e.state, EntryState::Dir { .. });
        !matches!(e.state, EntryState::Delete) && self.rules.is_ignored(&e.path, is_dir)
    }
}

impl<S: Store> Store for Released<'_, S> {
    fn current_rev(&mut self) -> Result<u64, SyncError> {
        self.inner.current_rev()
    }

    fn watermarks(&mut self, remote: &str) -> Result<Watermarks, SyncError> {
        Ok(Watermarks {
            push_cursor: ChangeCursor::ZERO,
            ..self.inner.watermarks(remote)?
        })
    }

    fn open_changes(&mut self, after: &ChangeCursor) -> Result<ChangesWindow, SyncError> {
        Ok(ChangesWindow {
            baseline: false,
            ..self.inner.open_changes(after)?
        })
    }

    /// Pages the inner store until `limit` wanted entries are found or its
    /// window ends, so that fewer than `limit` still means "exhausted".
    fn changes(&mut self, query: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, SyncError> {
        let mut after = query.after.clone();
        let mut out = Vec::new();
        loop {
            let page = self.inner.changes(ChangesQuery {
                after: &after,
                through: query.through,
                ignore: query.ignore,
                exclude_applied_from: query.exclude_applied_from,
                limit: query.limit,
            })?;
            let exhausted = page.len() < query.limit;
            if let Some(e) = page.last() {
                after = ChangeCursor::within(e.rev, e.path.clone());
            }
            out.extend(page.into_iter().filter(|e| self.wanted(e)));
            if exhausted || out.len() >= query.limit {
                out.truncate(query.limit);
                return Ok(out);
            }
        }
    }

    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError> {
        self.inner.read_entry(path)
    }

    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        self.inner.has_objects(hashes)
    }

    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError> {
        self.inner.read_object(hash)
    }

    fn read_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        self.inner.read_objects(hashes)
    }

    fn object_reader<'a>(
        &'a mut self,
        wanted: &[(Hash, u32)],
    ) -> Result<Box<dyn wsd_sync::ObjectReader + 'a>, SyncError> {
        self.inner.object_reader(wanted)
    }

    fn stage_objects(&mut self, objects: &[Object]) -> Result<(), SyncError> {
        self.inner.stage_objects(objects)
    }

    fn apply(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, SyncError> {
        self.inner.apply(batch)
    }

    /// Left where the ordinary push put it.
    fn set_push_cursor(&mut self, _: &str, _: &ChangeCursor) -> Result<(), SyncError> {
        Ok(())
    }

    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.inner.set_fetch_cursor(remote, cursor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_remembers_once_forgets_explicitly_and_refuses_unknown_patterns() {
        let mut r = Remembered::default();
        r.change(&[".env*".into(), "*.log".into()], &[], &[])
            .unwrap();
        r.change(&[".env*".into()], &[], &[]).unwrap();
        assert_eq!(r.patterns, [".env*", "*.log"]);
        r.change(&[], &[".env*".into()], &[]).unwrap();
        assert_eq!(r.patterns, ["*.log"]);
        assert_eq!(r.released, [".env*"]);
        let before = r.clone();
        let e = r
            .change(&[], &["nope".into()], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"nope\"") && e.contains("*.log"), "{e}");
        let e = r
            .change(&[], &["target/".into()], &["target/".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains(".wsdignore"), "{e}");
        assert!(r.change(&["a\nb".into()], &[], &[]).is_err());
        assert_eq!(r, before);
        // Excluding it again means its files are hidden again: nothing to send.
        r.change(&[".env*".into()], &[], &[]).unwrap();
        assert!(r.released.is_empty());

        let dir = tempfile::tempdir().unwrap();
        r.save(dir.path()).unwrap();
        assert_eq!(Remembered::load(dir.path()).unwrap(), r);
    }
}
