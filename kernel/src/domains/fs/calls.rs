//! `fs.read|write|edit|delete|search` natively on dofs, in the one `fs.*`
//! contract of `gsv_protocol::fs` (the node tools answer in the same).
//! Operation failures (missing file, permission, bad pattern) are
//! `ok:true, data:{ok:false, error, code}`; only kernel faults are frame
//! errors.

use base64::Engine as _;
use gsv_protocol::OpResult;
use gsv_protocol::fs::{
    DeleteArgs, DeleteResult, DirectoryListing, EditArgs, EditResult, FsError, ImageFile,
    MAX_IMAGE_BYTES, MAX_READ_CONTENT_BYTES, MAX_SEARCH_LINE_CHARS, MAX_SEARCH_MATCHES, ReadArgs,
    ReadResult, SNIFF_BYTES, SearchArgs, SearchMatch, SearchResult, TextWindow, WriteArgs,
    WriteResult, content_type,
};
use std::sync::{Arc, Mutex};

use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::{Kind, SyncPath};

use crate::domains::fs::vfs::{self, Access, Place, Resolved, from_dofs};
use crate::domains::workspace::{self, Workspace};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// A handler failure: an operation error or a kernel fault.
#[derive(Debug)]
pub enum Fail {
    Op(FsError),
    Kernel(KernelError),
}

impl From<FsError> for Fail {
    fn from(e: FsError) -> Self {
        Fail::Op(e)
    }
}

impl From<KernelError> for Fail {
    fn from(e: KernelError) -> Self {
        Fail::Kernel(e)
    }
}

/// Folds an operation error into `{ok:false, error}`.
fn finish<T>(r: Result<T, Fail>) -> Result<OpResult<T>, KernelError> {
    match r {
        Ok(v) => Ok(OpResult::done(v)),
        Err(Fail::Op(e)) => Ok(OpResult::Failed(e.into())),
        Err(Fail::Kernel(e)) => Err(e),
    }
}

/// Runs `f` on a store from a blocking thread.
pub async fn with_store<R: Send + 'static>(
    store: &Arc<Mutex<Dofs>>,
    f: impl FnOnce(&mut Dofs) -> R + Send + 'static,
) -> Result<R, KernelError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let mut d = store.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut d)
    })
    .await
    .map_err(|e| KernelError::internal("filesystem task", e))
}

/// Creates a directory (and parents) in the system store if missing.
pub async fn ensure_dir(store: &Arc<Mutex<Dofs>>, path: &str) -> Result<(), KernelError> {
    let p = SyncPath::canonicalize(path).map_err(|e| KernelError::internal(path, e))?;
    with_store(store, move |d| d.mkdir(&p, true))
        .await?
        .map_err(|e| KernelError::internal(&format!("creating /{path}"), e))
}

/// Where a resolved path lives, after the permission check.
enum Located {
    Store {
        store: Arc<Mutex<Dofs>>,
        sub: Option<SyncPath>,
        workspace: Option<Arc<Workspace>>,
    },
    WorkspacesDir,
}

async fn locate(
    k: &Arc<Kernel>,
    s: &Session,
    path: &str,
    access: Access,
) -> Result<(Resolved, Located), Fail> {
    let r = vfs::resolve(path, &s.identity.home)?;
    let located = match &r.place {
        Place::System(sub) => {
            vfs::check_system(&s.identity, &r, access)?;
            Located::Store {
                store: k.system.clone(),
                sub: sub.clone(),
                workspace: None,
            }
        }
        Place::WorkspacesDir => {
            if access == Access::Write {
                return Err(FsError::PermissionDenied {
                    path: r.display.clone(),
                }
                .into());
            }
            Located::WorkspacesDir
        }
        Place::Workspace { id, sub } => {
            let wid = id.clone();
            let row = k.db.call(move |c| workspace::get_row(c, &wid)).await?;
            let row = match row {
                Some(row) if vfs::check_workspace(&s.identity, row.owner_uid) => row,
                Some(_) => {
                    return Err(FsError::PermissionDenied {
                        path: r.display.clone(),
                    }
                    .into());
                }
                None => return Err(FsError::not_found(&r.display).into()),
            };
            if access == Access::Write && row.is_archived() {
                return Err(FsError::Refused {
                    op: "change",
                    path: r.display.clone(),
                    reason: format!("workspace {} is archived", row.id),
                }
                .into());
            }
            let w = k.workspaces.open(&row).await?;
            Located::Store {
                store: w.dofs.clone(),
                sub: sub.clone(),
                workspace: Some(w),
            }
        }
    };
    Ok((r, located))
}

/// The store, the file path and the workspace (if any) of a file.
type FileTarget = (Arc<Mutex<Dofs>>, SyncPath, Option<Arc<Workspace>>);

/// The store, the file path and the workspace of a write target; roots of
/// stores are not files.
fn file_target(r: &Resolved, l: Located) -> Result<FileTarget, Fail> {
    match l {
        Located::Store {
            store,
            sub: Some(sub),
            workspace,
        } => Ok((store, sub, workspace)),
        _ => Err(FsError::IsADirectory {
            path: r.display.clone(),
        }
        .into()),
    }
}

pub async fn read(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ReadArgs,
) -> Result<OpResult<ReadResult>, KernelError> {
    finish(read_inner(&k, &s, a).await)
}

async fn read_inner(k: &Arc<Kernel>, s: &Session, a: ReadArgs) -> Result<ReadResult, Fail> {
    let (r, l) = locate(k, s, &a.path, Access::Read).await?;
    let (store, sub) = match l {
        Located::WorkspacesDir => {
            let uid = (!s.identity.is_root()).then_some(s.identity.uid);
            let rows =
                k.db.call(move |c| workspace::list_rows(c, uid, None, i64::MAX))
                    .await?;
            let dirs = rows.into_iter().map(|w| w.id).collect();
            return Ok(ReadResult::Directory(DirectoryListing::sorted(
                r.display,
                Vec::new(),
                dirs,
            )));
        }
        Located::Store { store, sub, .. } => (store, sub),
    };
    let display = r.display.clone();
    let at_system_root = matches!(r.place, Place::System(None));
    let (offset, limit) = (a.offset.unwrap_or(0), a.limit);
    let out = with_store(&store, move |d| -> Result<ReadResult, FsError> {
        let is_dir = match &sub {
            None => true,
            Some(p) => d.stat(p).map_err(|e| from_dofs(&display, e))?.kind == Kind::Dir,
        };
        if is_dir {
            let entries = d
                .readdir(sub.as_ref())
                .map_err(|e| from_dofs(&display, e))?;
            let (mut files, mut dirs) = (Vec::new(), Vec::new());
            for e in entries {
                if e.stat.kind == Kind::Dir {
                    dirs.push(e.name);
                } else {
                    files.push(e.name);
                }
            }
            if at_system_root {
                dirs.push("workspaces".to_owned());
            }
            return Ok(ReadResult::Directory(DirectoryListing::sorted(
                display, files, dirs,
            )));
        }
        let p = sub.expect("a file has a path");
        read_file(d, &p, display, offset, limit)
    })
    .await??;
    Ok(out)
}

/// Collects a file's first [`SNIFF_BYTES`], then stops the copy.
struct Head(Vec<u8>);

impl std::io::Write for Head {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = SNIFF_BYTES - self.0.len();
        if room == 0 {
            return Err(std::io::Error::other("sniffed enough"));
        }
        let n = buf.len().min(room);
        self.0.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A file read in the contract's format: an image inline, text as
/// numbered lines (the [`TextWindow`]), anything else refused as binary.
fn read_file(
    d: &Dofs,
    p: &SyncPath,
    display: String,
    offset: u64,
    limit: Option<u64>,
) -> Result<ReadResult, FsError> {
    let size = d.stat(p).map_err(|e| from_dofs(&display, e))?.size;
    let mut head = Head(Vec::with_capacity(SNIFF_BYTES));
    // Stopping the copy after the head is the way to read only that much;
    // the store's error then means nothing.
    if let Err(e) = d.read_file_to(p, &mut head)
        && head.0.len() < SNIFF_BYTES
    {
        return Err(from_dofs(&display, e));
    }
    let ty = content_type(&head.0, &display);
    if ty.is_image() {
        if size > MAX_IMAGE_BYTES {
            return Err(FsError::TooLarge {
                path: display,
                size,
                limit: MAX_IMAGE_BYTES,
            });
        }
        let bytes = d.read_file(p).map_err(|e| from_dofs(&display, e))?;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return Ok(ReadResult::Image(ImageFile::new(
            display, size, ty.mime, data,
        )));
    }
    if !ty.is_text {
        return Err(FsError::Binary {
            path: display,
            content_type: ty.mime,
            size,
        });
    }
    // One byte over the cap: a window that fills it is cut by the
    // `TextWindow`, which then says `truncated`.
    let w = d
        .read_lines(p, offset, limit, MAX_READ_CONTENT_BYTES + 1)
        .map_err(|e| from_dofs(&display, e))?;
    let mut window = TextWindow::new(offset);
    let last = w.lines.len().saturating_sub(1);
    for (i, line) in w.lines.iter().enumerate() {
        let cut = w.truncated && i == last;
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            // A line cut by the cap may end inside a character.
            Err(e) if cut && e.error_len().is_none() => {
                std::str::from_utf8(&line[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                return Err(FsError::Binary {
                    path: display,
                    content_type: format!(
                        "{}, not valid UTF-8 at line {}",
                        ty.mime,
                        offset + i as u64 + 1
                    ),
                    size,
                });
            }
        };
        if !window.push(text, cut) {
            break;
        }
    }
    Ok(ReadResult::Text(window.finish(display, size, ty.mime)))
}

pub async fn write(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: WriteArgs,
) -> Result<OpResult<WriteResult>, KernelError> {
    finish(write_inner(&k, &s, a).await)
}

async fn write_inner(k: &Arc<Kernel>, s: &Session, a: WriteArgs) -> Result<WriteResult, Fail> {
    let (r, l) = locate(k, s, &a.path, Access::Write).await?;
    let (store, p, ws) = file_target(&r, l)?;
    // Holding the bracket keeps this write out of a running push → pull.
    let _bracket = match &ws {
        Some(w) => Some(w.bracket.lock().await),
        None => None,
    };
    let display = r.display.clone();
    let size = a.content.len();
    with_store(&store, move |d| {
        let opts = WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        d.write_file_with(&p, a.content.as_bytes(), opts)
            .map_err(|e| from_dofs(&display, e))
    })
    .await??;
    Ok(WriteResult {
        path: r.display,
        size: size as u64,
    })
}

pub async fn edit(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: EditArgs,
) -> Result<OpResult<EditResult>, KernelError> {
    finish(edit_inner(&k, &s, a).await)
}

async fn edit_inner(k: &Arc<Kernel>, s: &Session, a: EditArgs) -> Result<EditResult, Fail> {
    if a.old_string.is_empty() {
        return Err(FsError::EmptyOldString.into());
    }
    let (r, l) = locate(k, s, &a.path, Access::Write).await?;
    let (store, p, ws) = file_target(&r, l)?;
    let _bracket = match &ws {
        Some(w) => Some(w.bracket.lock().await),
        None => None,
    };
    let display = r.display.clone();
    let n = with_store(&store, move |d| -> Result<u64, FsError> {
        let bytes = d.read_file(&p).map_err(|e| from_dofs(&display, e))?;
        let size = bytes.len() as u64;
        let text = String::from_utf8(bytes).map_err(|_| FsError::Binary {
            path: display.clone(),
            content_type: "not valid UTF-8".into(),
            size,
        })?;
        let n = text.matches(&a.old_string).count() as u64;
        if n == 0 {
            return Err(FsError::NoMatch { path: display });
        }
        if n > 1 && !a.replace_all {
            return Err(FsError::MultipleMatches {
                path: display,
                count: n,
            });
        }
        let new = if a.replace_all {
            text.replace(&a.old_string, &a.new_string)
        } else {
            text.replacen(&a.old_string, &a.new_string, 1)
        };
        d.write_file(&p, new.as_bytes())
            .map_err(|e| from_dofs(&display, e))?;
        Ok(n)
    })
    .await??;
    Ok(EditResult {
        path: r.display,
        replacements: n,
    })
}

pub async fn delete(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: DeleteArgs,
) -> Result<OpResult<DeleteResult>, KernelError> {
    finish(delete_inner(&k, &s, a).await)
}

async fn delete_inner(k: &Arc<Kernel>, s: &Session, a: DeleteArgs) -> Result<DeleteResult, Fail> {
    let (r, l) = locate(k, s, &a.path, Access::Write).await?;
    let (store, p, ws) = match file_target(&r, l) {
        Ok(t) => t,
        Err(_) => {
            return Err(FsError::Refused {
                op: "delete",
                path: r.display,
                reason: "archive a workspace with sys.workspace.archive".into(),
            }
            .into());
        }
    };
    if ws.is_none() && p.depth() <= 1 {
        return Err(FsError::Refused {
            op: "delete",
            path: r.display,
            reason: "it is a top-level system directory".into(),
        }
        .into());
    }
    let _bracket = match &ws {
        Some(w) => Some(w.bracket.lock().await),
        None => None,
    };
    let display = r.display.clone();
    with_store(&store, move |d| {
        d.rm(&p, true).map_err(|e| from_dofs(&display, e))
    })
    .await??;
    Ok(DeleteResult { path: r.display })
}

pub async fn search(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SearchArgs,
) -> Result<OpResult<SearchResult>, KernelError> {
    finish(search_inner(&k, &s, a).await)
}

async fn search_inner(k: &Arc<Kernel>, s: &Session, a: SearchArgs) -> Result<SearchResult, Fail> {
    if a.query.is_empty() {
        return Err(FsError::EmptyQuery.into());
    }
    // A pattern with `/` matches the path below the search root; one
    // without matches the file name. Braces (`*.{rs,ts}`) work.
    let include = match &a.include {
        None => None,
        Some(g) => Some((
            globset::Glob::new(g)
                .map_err(|e| FsError::InvalidInclude {
                    pattern: g.clone(),
                    reason: e.kind().to_string(),
                })?
                .compile_matcher(),
            g.contains('/'),
        )),
    };
    let path = a.path.unwrap_or_else(|| s.identity.cwd.clone());
    let (r, l) = locate(k, s, &path, Access::Read).await?;
    let Located::Store {
        store,
        sub,
        workspace,
    } = l
    else {
        return Err(FsError::Refused {
            op: "search",
            path: r.display,
            reason: "search one workspace at a time: /workspaces/<id>".into(),
        }
        .into());
    };
    // How a store path reads back to the caller.
    let prefix = match &workspace {
        Some(w) => format!("/workspaces/{}/", w.id),
        None => "/".to_owned(),
    };
    let who = s.identity.clone();
    let in_system = workspace.is_none();
    let query = a.query;
    let root = sub.clone();
    let matches = with_store(&store, move |d| -> Result<Vec<SearchMatch>, FsError> {
        let display = r.display.clone();
        let keep = |p: &SyncPath| {
            if in_system {
                let shown = Resolved {
                    display: format!("/{p}"),
                    place: Place::System(Some(p.clone())),
                };
                if vfs::check_system(&who, &shown, Access::Read).is_err() {
                    return false;
                }
            }
            match &include {
                None => true,
                Some((m, by_path)) => {
                    if *by_path {
                        let rel = match &root {
                            Some(r) => p.as_str().strip_prefix(r.as_str()).unwrap_or(p.as_str()),
                            None => p.as_str(),
                        };
                        m.is_match(rel.trim_start_matches('/'))
                    } else {
                        m.is_match(p.file_name())
                    }
                }
            }
        };
        let hits = d
            .search_where(query.as_bytes(), sub.as_ref(), MAX_SEARCH_MATCHES + 1, keep)
            .map_err(|e| from_dofs(&display, e))?;
        let mut out = Vec::new();
        // One past the cap tells `SearchResult::capped` there were more.
        for h in hits {
            let w = d
                .read_lines(&h.path, h.line - 1, Some(1), MAX_SEARCH_LINE_CHARS * 4)
                .map_err(|e| from_dofs(&display, e))?;
            let line = w
                .lines
                .first()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .unwrap_or_default();
            out.push(SearchMatch::new(
                format!("{prefix}{}", h.path),
                h.line,
                &line,
            ));
        }
        Ok(out)
    })
    .await??;
    Ok(SearchResult::capped(matches))
}
