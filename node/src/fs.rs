//! `fs.read`, `fs.write`, `fs.edit`, `fs.delete` and `fs.search` on the
//! node's own filesystem, every path opened beneath the [`NodeRoot`].
//! These are blocking calls; the dispatcher runs them on the blocking pool.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{NodeRoot, OpError, PathError};

/// At most this many bytes of line content come back from one `fs.read`;
/// a longer window stops early with `truncated: true` and `nextOffset`.
pub const MAX_READ_CONTENT_BYTES: usize = 256 * 1024;
/// Images are returned inline (base64), so they are capped (the reference
/// node's image cap).
pub const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;
/// `fs.edit` loads the whole file; larger files are refused.
pub const MAX_EDIT_BYTES: u64 = 16 * 1024 * 1024;
/// `fs.search` skips files larger than this.
pub const MAX_SEARCH_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// `fs.search` stops after this many matches and says `truncated: true`.
pub const MAX_SEARCH_MATCHES: usize = 100;
/// Matching lines are cut to this many characters.
pub const MAX_SEARCH_LINE_CHARS: usize = 200;
/// A line is cut to this many bytes, leaving room for its number.
const MAX_LINE_BYTES: usize = MAX_READ_CONTENT_BYTES - 32;
/// How much of a file is sniffed for its type.
const SNIFF_BYTES: usize = 8192;

#[derive(Debug, Deserialize)]
pub(crate) struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct DeleteArgs {
    path: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct SearchArgs {
    /// `pattern` is the older tools' name for the same thing.
    #[serde(default, alias = "pattern")]
    query: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    include: Option<String>,
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> OpError {
    OpError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

pub(crate) fn read(root: &NodeRoot, args: ReadArgs) -> Result<Value, OpError> {
    // O_NONBLOCK: opening a FIFO must not hang the tool; it has no effect
    // on regular files and directories.
    let fd = root.open_beneath(&args.path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
    let path = root.real_path(&fd);
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", &path, e.into()))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => list_dir(fd, &path),
        FileType::RegularFile => read_file(File::from(fd), &path, st.st_size as u64, &args),
        _ => Err(OpError::Invalid(format!(
            "'{}' is not a regular file or directory",
            path.display()
        ))),
    }
}

fn list_dir(fd: OwnedFd, path: &Path) -> Result<Value, OpError> {
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
    files.sort();
    directories.sort();
    Ok(json!({"ok": true, "path": path, "files": files, "directories": directories}))
}

/// The content type by the file's first bytes, else by its extension.
/// Returns `(type, is_text)`.
fn sniff(head: &[u8], path: &Path) -> (String, bool) {
    if let Some(kind) = infer::get(head) {
        let mime = kind.mime_type();
        let text = mime.starts_with("text/") || mime == "image/svg+xml";
        return (mime.to_owned(), text);
    }
    let ext = path
        .extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase);
    let mime = match ext.as_deref() {
        Some("json") => "application/json",
        Some("yaml" | "yml") => "application/yaml",
        Some("toml") => "application/toml",
        Some("xml") => "application/xml",
        Some("js" | "mjs" | "cjs") => "text/javascript",
        Some("ts" | "tsx") => "application/typescript",
        Some("svg") => "image/svg+xml",
        Some("md") => "text/markdown",
        Some("html" | "htm") => "text/html",
        Some("css") => "text/css",
        Some("csv") => "text/csv",
        _ => "text/plain",
    };
    // A NUL byte in the sniffed head means binary whatever the name says.
    (mime.to_owned(), !head.contains(&0))
}

fn read_file(mut file: File, path: &Path, size: u64, args: &ReadArgs) -> Result<Value, OpError> {
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_err("read", path, e))?;
    let (mime, is_text) = sniff(&head, path);
    if mime.starts_with("image/") && !is_text {
        if size > MAX_IMAGE_BYTES {
            return Err(OpError::TooLarge {
                path: path.display().to_string(),
                size,
                limit: MAX_IMAGE_BYTES,
            });
        }
        let mut bytes = head;
        file.read_to_end(&mut bytes)
            .map_err(|e| io_err("read", path, e))?;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return Ok(json!({
            "ok": true, "path": path, "size": size, "kind": "image", "contentType": mime,
            "content": [{"type": "image", "data": data, "mimeType": mime}],
        }));
    }
    if !is_text {
        return Err(OpError::Binary {
            path: path.display().to_string(),
            content_type: mime,
            size,
        });
    }
    let offset = args.offset.unwrap_or(0);
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut reader = BufReader::new(io::Cursor::new(head).chain(file));
    let mut content = String::new();
    let mut line = Vec::new();
    let mut index: u64 = 0;
    let mut returned: u64 = 0;
    let mut truncated = false;
    while returned < limit {
        let Some(cut) = read_line_capped(&mut reader, &mut line, MAX_LINE_BYTES)
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
                return Err(OpError::Binary {
                    path: path.display().to_string(),
                    content_type: format!("{mime}, not valid UTF-8 at line {}", here + 1),
                    size,
                });
            }
        };
        let sep = usize::from(returned > 0);
        let numbered = format!("{}\t{}", here + 1, text);
        if returned > 0 && content.len() + sep + numbered.len() > MAX_READ_CONTENT_BYTES {
            truncated = true;
            break;
        }
        if returned > 0 {
            content.push('\n');
        }
        content.push_str(&numbered);
        returned += 1;
        if cut {
            // One enormous line: its start is all that fits.
            truncated = true;
            break;
        }
    }
    let mut out = json!({
        "ok": true, "path": path, "size": size, "kind": "text", "contentType": mime,
        "content": content, "lines": returned,
    });
    if truncated {
        out["truncated"] = json!(true);
        out["nextOffset"] = json!(offset + returned);
    }
    Ok(out)
}

/// Replaces the file at `request` with `content`: written to a temporary
/// name in the same directory, then renamed over the target, so a reader
/// never sees half a file. An existing file keeps its permission bits. A
/// final symlink (inside the root) is written through, in place.
fn write_whole(root: &NodeRoot, request: &str, content: &[u8]) -> Result<PathBuf, OpError> {
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
        return Err(OpError::Invalid(format!(
            "'{}' is a directory",
            target.display()
        )));
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

pub(crate) fn write(root: &NodeRoot, args: WriteArgs) -> Result<Value, OpError> {
    let path = write_whole(root, &args.path, args.content.as_bytes())?;
    Ok(json!({"ok": true, "path": path, "size": args.content.len()}))
}

pub(crate) fn edit(root: &NodeRoot, args: EditArgs) -> Result<Value, OpError> {
    if args.old_string.is_empty() {
        return Err(OpError::Invalid("oldString must not be empty".into()));
    }
    let fd = root.open_beneath(&args.path, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
    let path = root.real_path(&fd);
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", &path, e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(OpError::Invalid(format!(
            "'{}' is not a regular file",
            path.display()
        )));
    }
    if st.st_size as u64 > MAX_EDIT_BYTES {
        return Err(OpError::TooLarge {
            path: path.display().to_string(),
            size: st.st_size as u64,
            limit: MAX_EDIT_BYTES,
        });
    }
    let mut bytes = Vec::new();
    File::from(fd)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err("read", &path, e))?;
    let text = String::from_utf8(bytes).map_err(|_| OpError::Binary {
        path: path.display().to_string(),
        content_type: "not valid UTF-8".into(),
        size: st.st_size as u64,
    })?;
    let count = text.matches(&args.old_string).count();
    let shown = path.display().to_string();
    if count == 0 {
        return Err(OpError::NoMatch { path: shown });
    }
    if count > 1 && !args.replace_all {
        return Err(OpError::MultipleMatches { path: shown, count });
    }
    let updated = if args.replace_all {
        text.replace(&args.old_string, &args.new_string)
    } else {
        text.replacen(&args.old_string, &args.new_string, 1)
    };
    write_whole(root, &args.path, updated.as_bytes())?;
    Ok(json!({"ok": true, "path": path, "replacements": count}))
}

pub(crate) fn delete(root: &NodeRoot, args: DeleteArgs) -> Result<Value, OpError> {
    let (parent, name) = root.open_parent(&args.path, false)?;
    let target = root.real_path(&parent).join(&name);
    let st = rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
        if e == rustix::io::Errno::NOENT {
            OpError::Path(PathError::NotFound {
                path: args.path.clone(),
            })
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
    Ok(json!({"ok": true, "path": target}))
}

/// Where `include` is matched: the file name, or (when the pattern has a
/// `/`) the path relative to the search base.
struct Include {
    set: globset::GlobMatcher,
    by_path: bool,
}

impl Include {
    fn new(pattern: &str) -> Result<Self, OpError> {
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| OpError::InvalidInclude {
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
) -> Result<Value, OpError> {
    if args.query.is_empty() {
        return Err(OpError::Invalid("Search query is required.".into()));
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
    let mut matches = Vec::new();
    let mut truncated = false;
    'files: for entry in walker {
        if cancel.is_cancelled() {
            return Err(OpError::Cancelled);
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
                return Err(OpError::Cancelled);
            }
            if !line.contains(&args.query) {
                continue;
            }
            if matches.len() == MAX_SEARCH_MATCHES {
                truncated = true;
                break 'files;
            }
            let content: String = line.chars().take(MAX_SEARCH_LINE_CHARS).collect();
            matches.push(json!({"path": walked, "line": i + 1, "content": content}));
        }
    }
    let mut out = json!({"ok": true, "matches": matches, "count": matches.len()});
    if truncated {
        out["truncated"] = json!(true);
    }
    Ok(out)
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
