//! `fs.read`, `fs.write`, `fs.edit`, `fs.delete` and `fs.search` on the
//! node's own filesystem, every path opened beneath the [`NodeRoot`].
//! Arguments, results, errors and the output format are the one `fs.*`
//! contract of `gsv_protocol::fs`. These are blocking calls; the
//! dispatcher runs them on the blocking pool.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use gsv_protocol::fs::{
    DeleteArgs, DeleteResult, DirectoryListing, EditArgs, EditResult, FsError, ImageFile,
    MAX_EDIT_BYTES, MAX_IMAGE_BYTES, MAX_READ_CONTENT_BYTES, MAX_SEARCH_MATCHES, ReadArgs,
    ReadResult, SNIFF_BYTES, SearchArgs, SearchMatch, SearchResult, TextWindow, WriteArgs,
    WriteResult, content_type,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use tokio_util::sync::CancellationToken;

use super::{NodeRoot, PathError};

/// `fs.search` skips files larger than this.
pub const MAX_SEARCH_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// An I/O failure at `path`; a missing file or a refused permission keep
/// their own codes.
fn io_err(op: &'static str, path: &Path, source: io::Error) -> FsError {
    let path = path.display().to_string();
    match source.kind() {
        io::ErrorKind::NotFound => FsError::NotFound { path },
        io::ErrorKind::PermissionDenied => FsError::PermissionDenied { path },
        _ => FsError::io(op, path, source),
    }
}

impl From<PathError> for FsError {
    fn from(e: PathError) -> FsError {
        match e {
            PathError::Empty => FsError::InvalidArgs("path is empty".into()),
            PathError::Outside { path, root } => FsError::PathEscape {
                path,
                root: root.display().to_string(),
                how: String::new(),
            },
            PathError::Escapes { path, root } => FsError::PathEscape {
                path,
                root: root.display().to_string(),
                how: " (through '..' or a symlink)".into(),
            },
            PathError::NotFound { path } => FsError::NotFound { path },
            PathError::NotADirectory { path } => FsError::NotADirectory { path },
            PathError::IsRoot { path } => FsError::InvalidPath {
                path,
                reason: "it names the node root itself".into(),
            },
            PathError::Io { path, source } => io_err("open", Path::new(&path), source),
        }
    }
}

pub(crate) fn read(root: &NodeRoot, args: ReadArgs) -> Result<ReadResult, FsError> {
    // O_NONBLOCK: opening a FIFO must not hang the tool; it has no effect
    // on regular files and directories.
    let fd = root.open_beneath(&args.path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
    let path = root.real_path(&fd);
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", &path, e.into()))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => list_dir(fd, &path).map(ReadResult::Directory),
        FileType::RegularFile => read_file(File::from(fd), &path, st.st_size as u64, &args),
        _ => Err(FsError::NotAFile {
            path: path.display().to_string(),
        }),
    }
}

fn list_dir(fd: OwnedFd, path: &Path) -> Result<DirectoryListing, FsError> {
    let mut files = Vec::new();
    let mut directories = Vec::new();
    let dir = rustix::fs::Dir::read_from(&fd).map_err(|e| io_err("list", path, e.into()))?;
    for entry in dir {
        let entry = entry.map_err(|e| io_err("list", path, e.into()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => {
                rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            }
            _ => false,
        };
        if is_dir {
            directories.push(name);
        } else {
            // Symlinks and special files count as files, as in the reference.
            files.push(name);
        }
    }
    Ok(DirectoryListing::sorted(
        path.display().to_string(),
        files,
        directories,
    ))
}

fn read_file(
    mut file: File,
    path: &Path,
    size: u64,
    args: &ReadArgs,
) -> Result<ReadResult, FsError> {
    let shown = path.display().to_string();
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_err("read", path, e))?;
    let ty = content_type(&head, &shown);
    if ty.is_image() {
        if size > MAX_IMAGE_BYTES {
            return Err(FsError::TooLarge {
                path: shown,
                size,
                limit: MAX_IMAGE_BYTES,
            });
        }
        let mut bytes = head;
        file.read_to_end(&mut bytes)
            .map_err(|e| io_err("read", path, e))?;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return Ok(ReadResult::Image(ImageFile::new(
            shown, size, ty.mime, data,
        )));
    }
    if !ty.is_text {
        return Err(FsError::Binary {
            path: shown,
            content_type: ty.mime,
            size,
        });
    }
    let offset = args.offset.unwrap_or(0);
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut reader = BufReader::new(io::Cursor::new(head).chain(file));
    let mut window = TextWindow::new(offset);
    let mut line = Vec::new();
    let mut index: u64 = 0;
    while window.lines() < limit {
        // No line longer than the window's cap can fit, so none is held.
        let Some(cut) = read_line_capped(&mut reader, &mut line, MAX_READ_CONTENT_BYTES)
            .map_err(|e| io_err("read", path, e))?
        else {
            break;
        };
        let here = index;
        index += 1;
        if here < offset {
            continue;
        }
        let text = match std::str::from_utf8(&line) {
            Ok(text) => text,
            // A line cut by the cap may end inside a character.
            Err(e) if cut && e.error_len().is_none() => {
                std::str::from_utf8(&line[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                return Err(FsError::Binary {
                    path: shown,
                    content_type: format!("{}, not valid UTF-8 at line {}", ty.mime, here + 1),
                    size,
                });
            }
        };
        if !window.push(text, cut) {
            break;
        }
    }
    Ok(ReadResult::Text(window.finish(shown, size, ty.mime)))
}

/// Replaces the file at `request` with `content`: written to a temporary
/// name in the same directory, then renamed over the target, so a reader
/// never sees half a file. An existing file keeps its permission bits. A
/// final symlink (inside the root) is written through, in place.
fn write_whole(root: &NodeRoot, request: &str, content: &[u8]) -> Result<PathBuf, FsError> {
    let (parent, name) = root.open_parent(request, true)?;
    let parent_path = root.real_path(&parent);
    let target = parent_path.join(&name);
    let existing = rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW).ok();
    if existing.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink) {
        let fd = root.open_beneath(
            request,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o644),
        )?;
        let real = root.real_path(&fd);
        File::from(fd)
            .write_all(content)
            .map_err(|e| io_err("write", &real, e))?;
        return Ok(real);
    }
    if existing.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory) {
        return Err(FsError::IsADirectory {
            path: target.display().to_string(),
        });
    }
    // An `O_PATH` descriptor serves as the directory of the `*at` calls.
    let dir = parent;
    let tmp_name = format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    );
    let tmp = rustix::fs::openat(
        &dir,
        tmp_name.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| io_err("create", &target, e.into()))?;
    let mut file = File::from(tmp);
    let written = (|| {
        file.write_all(content)?;
        if let Some(st) = existing {
            file.set_permissions(std::fs::Permissions::from_mode(st.st_mode & 0o7777))?;
        }
        file.sync_data()?;
        rustix::fs::renameat(&dir, tmp_name.as_str(), &dir, &name).map_err(io::Error::from)
    })();
    if let Err(e) = written {
        let _removed = rustix::fs::unlinkat(&dir, tmp_name.as_str(), AtFlags::empty());
        return Err(io_err("write", &target, e));
    }
    Ok(target)
}

pub(crate) fn write(root: &NodeRoot, args: WriteArgs) -> Result<WriteResult, FsError> {
    let path = write_whole(root, &args.path, args.content.as_bytes())?;
    Ok(WriteResult {
        path: path.display().to_string(),
        size: args.content.len() as u64,
    })
}

pub(crate) fn edit(root: &NodeRoot, args: EditArgs) -> Result<EditResult, FsError> {
    if args.old_string.is_empty() {
        return Err(FsError::EmptyOldString);
    }
    let fd = root.open_beneath(&args.path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
    let path = root.real_path(&fd);
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", &path, e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(FsError::NotAFile {
            path: path.display().to_string(),
        });
    }
    if st.st_size as u64 > MAX_EDIT_BYTES {
        return Err(FsError::TooLarge {
            path: path.display().to_string(),
            size: st.st_size as u64,
            limit: MAX_EDIT_BYTES,
        });
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err("read", &path, e))?;
    let text = String::from_utf8(bytes).map_err(|_| FsError::Binary {
        path: path.display().to_string(),
        content_type: "not valid UTF-8".into(),
        size: st.st_size as u64,
    })?;
    let count = text.matches(&args.old_string).count();
    let shown = path.display().to_string();
    if count == 0 {
        return Err(FsError::NoMatch { path: shown });
    }
    if count > 1 && !args.replace_all {
        return Err(FsError::MultipleMatches {
            path: shown,
            count: count as u64,
        });
    }
    let updated = if args.replace_all {
        text.replace(&args.old_string, &args.new_string)
    } else {
        text.replacen(&args.old_string, &args.new_string, 1)
    };
    write_whole(root, &args.path, updated.as_bytes())?;
    Ok(EditResult {
        path: shown,
        replacements: count as u64,
    })
}

pub(crate) fn delete(root: &NodeRoot, args: DeleteArgs) -> Result<DeleteResult, FsError> {
    let (parent, name) = root.open_parent(&args.path, false)?;
    let target = root.real_path(&parent).join(&name);
    let st = rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
        if e == rustix::io::Errno::NOENT {
            FsError::not_found(&args.path)
        } else {
            io_err("stat", &target, e.into())
        }
    })?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        // The parent is held open, so this path names the directory we
        // checked; std's remove_dir_all walks with openat and never follows
        // a symlink inside the tree.
        let via_fd = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&parent.as_fd())
        ))
        .join(&name);
        std::fs::remove_dir_all(&via_fd).map_err(|e| io_err("delete", &target, e))?;
    } else {
        rustix::fs::unlinkat(&parent, &name, AtFlags::empty())
            .map_err(|e| io_err("delete", &target, e.into()))?;
    }
    Ok(DeleteResult {
        path: target.display().to_string(),
    })
}

/// Where `include` is matched: the file name, or (when the pattern has a
/// `/`) the path relative to the search base.
struct Include {
    set: globset::GlobMatcher,
    by_path: bool,
}

impl Include {
    fn new(pattern: &str) -> Result<Self, FsError> {
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| FsError::InvalidInclude {
                pattern: pattern.to_owned(),
                reason: e.kind().to_string(),
            })?;
        Ok(Self {
            set: glob.compile_matcher(),
            by_path: pattern.contains('/'),
        })
    }

    fn matches(&self, rel: &Path) -> bool {
        if self.by_path {
            self.set.is_match(rel)
        } else {
            rel.file_name().is_some_and(|n| self.set.is_match(n))
        }
    }
}

pub(crate) fn search(
    root: &NodeRoot,
    args: SearchArgs,
    cancel: &CancellationToken,
) -> Result<SearchResult, FsError> {
    if args.query.is_empty() {
        return Err(FsError::EmptyQuery);
    }
    let include = args.include.as_deref().map(Include::new).transpose()?;
    let request = args
        .path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or(".");
    let base_fd = root.open_beneath(request, OFlags::PATH, Mode::empty())?;
    let base = root.real_path(&base_fd);
    let root_path = root.path().to_path_buf();
    let walker = ignore::WalkBuilder::new(&base)
        // The reference searches everything, hidden and ignored files too.
        .standard_filters(false)
        .follow_links(true)
        .filter_entry(move |e| {
            // Do not even walk into a symlinked directory that leads out.
            !e.path_is_symlink()
                || std::fs::canonicalize(e.path()).is_ok_and(|p| p.starts_with(&root_path))
        })
        .build();
    let cancelled = FsError::Cancelled { call: "fs.search" };
    let mut matches = Vec::new();
    'files: for entry in walker {
        if cancel.is_cancelled() {
            return Err(cancelled);
        }
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let walked = entry.path();
        if let Some(inc) = &include
            && !inc.matches(walked.strip_prefix(&base).unwrap_or(walked))
        {
            continue;
        }
        let Ok(rel) = walked.strip_prefix(root.path()) else {
            continue;
        };
        // The walk is path-based; the open is the check that counts.
        let Some(rel) = rel.to_str() else { continue };
        let rel = if rel.is_empty() { "." } else { rel };
        let Ok(fd) = root.open_beneath(rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
        else {
            continue;
        };
        let Some(text) = read_searchable(fd) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if i % 4096 == 0 && cancel.is_cancelled() {
                return Err(cancelled);
            }
            if !line.contains(&args.query) {
                continue;
            }
            // One past the cap says whether there were more.
            if matches.len() > MAX_SEARCH_MATCHES {
                break 'files;
            }
            let shown = walked.display().to_string();
            matches.push(SearchMatch::new(shown, i as u64 + 1, line));
        }
    }
    Ok(SearchResult::capped(matches))
}

/// The file's text, or `None` for a file search skips: not regular, too
/// large, binary (a NUL in the first 8 KiB) or not UTF-8.
fn read_searchable(fd: OwnedFd) -> Option<String> {
    let st = rustix::fs::fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_size as u64 > MAX_SEARCH_FILE_BYTES
    {
        return None;
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .take(MAX_SEARCH_FILE_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// Reads one line (without its `\n`) into `buf`, keeping at most `cap`
/// bytes of it and skipping the rest, so a file with no newlines never
/// fills memory. `None` at end of file; `Some(true)` when the line was cut.
fn read_line_capped(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    cap: usize,
) -> io::Result<Option<bool>> {
    buf.clear();
    let mut seen_any = false;
    let mut cut = false;
    loop {
        let chunk = reader.fill_buf()?;
        if chunk.is_empty() {
            return Ok(seen_any.then_some(cut));
        }
        seen_any = true;
        let (part, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        let room = cap.saturating_sub(buf.len());
        if part.len() > room {
            cut = true;
        }
        buf.extend_from_slice(&part[..part.len().min(room)]);
        let used = done.unwrap_or(chunk.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(Some(cut));
        }
    }
}
