//! The `fs.*` contract, one rule per function, over any [`FsTarget`]: the
//! kernel's native store, the node tools on disk, a call routed to a
//! device. [`crate::fs_contract_tests!`] turns the rules into tests.
//!
//! Paths in results are compared by their ending: a target shows paths in
//! its own spelling (`/home/alice/a.txt` natively, the real absolute path
//! on a node).

use std::fmt::Debug;
use std::future::Future;

use super::*;
use crate::{OpFailure, OpResult};

/// An implementation of `fs.*` under test. Each target gives the suite a
/// fresh, empty scratch directory.
pub trait FsTarget {
    /// How this target spells `rel`, a path inside the scratch directory.
    fn path(&self, rel: &str) -> String;
    /// Puts `bytes` at `rel` (set-up for what `fs.write` cannot write:
    /// binary files).
    fn put(&self, rel: &str, bytes: &[u8]) -> impl Future<Output = ()>;
    fn read(&self, args: ReadArgs) -> impl Future<Output = FsResult<ReadResult>>;
    fn write(&self, args: WriteArgs) -> impl Future<Output = FsResult<WriteResult>>;
    fn edit(&self, args: EditArgs) -> impl Future<Output = FsResult<EditResult>>;
    fn delete(&self, args: DeleteArgs) -> impl Future<Output = FsResult<DeleteResult>>;
    fn search(&self, args: SearchArgs) -> impl Future<Output = FsResult<SearchResult>>;
}

/// A 1×1 grey PNG and its base64.
pub const PNG: &[u8] = b"\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00\x00\x3a\x7e\x9b\x55\x00\x00\x00\x0a\x49\x44\x41\x54\x78\x9c\x63\x60\x00\x00\x00\x02\x00\x01\x48\xaf\xa4\x71\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82";
pub const PNG_BASE64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg==";

fn done<T: Debug>(what: &str, r: FsResult<T>) -> T {
    match r {
        OpResult::Done(d) => {
            assert!(d.ok, "{what}: a result says ok:false");
            d.result
        }
        OpResult::Failed(f) => panic!("{what} failed: {f:?}"),
    }
}

fn failed<T: Debug>(what: &str, r: FsResult<T>, code: FsErrorCode, mentions: &str) -> OpFailure {
    match r {
        OpResult::Failed(f) => {
            assert!(!f.ok, "{what}: {f:?}");
            assert_eq!(f.code.as_deref(), Some(code.as_str()), "{what}: {f:?}");
            assert!(f.error.contains(mentions), "{what}: {f:?} names {mentions}");
            f
        }
        OpResult::Done(d) => panic!("{what} should fail with {code}, got {:?}", d.result),
    }
}

async fn write<T: FsTarget>(t: &T, rel: &str, content: &str) -> WriteResult {
    let r = t
        .write(WriteArgs {
            path: t.path(rel),
            content: content.into(),
        })
        .await;
    done(&format!("writing {rel}"), r)
}

async fn read<T: FsTarget>(
    t: &T,
    rel: &str,
    offset: Option<u64>,
    limit: Option<u64>,
) -> ReadResult {
    let r = t
        .read(ReadArgs {
            path: t.path(rel),
            offset,
            limit,
        })
        .await;
    done(&format!("reading {rel}"), r)
}

async fn text<T: FsTarget>(t: &T, rel: &str, offset: Option<u64>, limit: Option<u64>) -> TextFile {
    match read(t, rel, offset, limit).await {
        ReadResult::Text(f) => f,
        other => panic!("{rel} should read as text: {other:?}"),
    }
}

async fn search<T: FsTarget>(
    t: &T,
    dir: &str,
    query: &str,
    include: Option<&str>,
) -> FsResult<SearchResult> {
    t.search(SearchArgs {
        query: query.into(),
        path: Some(t.path(dir)),
        include: include.map(str::to_owned),
    })
    .await
}

/// Lines are numbered `{n}\t{line}` from 1, joined with `\n`; a final
/// newline starts no empty line; the type and size come along.
pub async fn a_text_read_numbers_lines_from_one_with_a_tab<T: FsTarget>(t: &T) {
    write(t, "a.txt", "one\ntwo\nthree\n").await;
    let f = text(t, "a.txt", None, None).await;
    assert_eq!(f.content, "1\tone\n2\ttwo\n3\tthree");
    assert_eq!((f.lines, f.size, f.kind), (3, 14, FileKind::Text));
    assert_eq!(f.content_type, "text/plain");
    assert!(f.path.ends_with("a.txt"), "{}", f.path);
    assert!(!f.truncated && f.next_offset.is_none(), "{f:?}");
}

/// `offset` skips lines (numbering goes on from `offset + 1`) and `limit`
/// takes at most that many; stopping at the limit is not `truncated`.
pub async fn offset_and_limit_select_a_window_numbered_from_offset_plus_one<T: FsTarget>(t: &T) {
    write(t, "w.txt", "l1\nl2\nl3\nl4\nl5").await;
    let f = text(t, "w.txt", Some(1), Some(2)).await;
    assert_eq!(f.content, "2\tl2\n3\tl3");
    assert_eq!(f.lines, 2);
    assert!(!f.truncated, "{f:?}");
    let tail = text(t, "w.txt", Some(3), None).await;
    assert_eq!(tail.content, "4\tl4\n5\tl5");
    let past = text(t, "w.txt", Some(9), None).await;
    assert_eq!((past.content.as_str(), past.lines), ("", 0));
}

/// An empty file reads as no lines.
pub async fn an_empty_file_has_no_lines<T: FsTarget>(t: &T) {
    write(t, "empty.txt", "").await;
    let f = text(t, "empty.txt", None, None).await;
    assert_eq!((f.content.as_str(), f.lines, f.size), ("", 0, 0));
}

/// A read stops before [`MAX_READ_CONTENT_BYTES`] of numbered text with
/// `truncated` and the `nextOffset` that reads on from there.
pub async fn a_read_over_the_cap_is_truncated_and_says_where_to_go_on<T: FsTarget>(t: &T) {
    let line = "x".repeat(99);
    let n = MAX_READ_CONTENT_BYTES / 100 + 500;
    let body: String = (0..n).map(|_| format!("{line}\n")).collect();
    write(t, "big.txt", &body).await;
    let f = text(t, "big.txt", None, None).await;
    assert!(f.truncated, "{} lines", f.lines);
    assert!(f.content.len() <= MAX_READ_CONTENT_BYTES);
    assert!(f.lines > 0 && f.lines < n as u64);
    assert_eq!(f.next_offset, Some(f.lines));
    assert_eq!(f.size, body.len() as u64);
    let on = text(t, "big.txt", f.next_offset, Some(1)).await;
    assert_eq!(on.content, format!("{}\t{line}", f.lines + 1));
}

/// One line longer than the cap comes back cut to fit, `truncated`, with
/// `nextOffset` past it.
pub async fn a_line_longer_than_the_cap_is_cut<T: FsTarget>(t: &T) {
    let long = "é".repeat(MAX_READ_CONTENT_BYTES);
    write(t, "long.txt", &format!("{long}\nnext\n")).await;
    let f = text(t, "long.txt", None, None).await;
    assert!(f.truncated);
    assert_eq!((f.lines, f.next_offset), (1, Some(1)));
    assert!(f.content.starts_with("1\té"));
    assert!(f.content.len() <= MAX_READ_CONTENT_BYTES);
    let on = text(t, "long.txt", Some(1), None).await;
    assert_eq!(on.content, "2\tnext");
}

/// A directory lists its files and directories, each sorted by name.
pub async fn a_directory_lists_files_and_directories_sorted<T: FsTarget>(t: &T) {
    write(t, "d/b.txt", "b").await;
    write(t, "d/a.txt", "a").await;
    write(t, "d/sub/z.txt", "z").await;
    write(t, "d/asub/z.txt", "z").await;
    match read(t, "d", None, None).await {
        ReadResult::Directory(l) => {
            assert_eq!(l.files, ["a.txt", "b.txt"]);
            assert_eq!(l.directories, ["asub", "sub"]);
            assert!(l.path.ends_with('d'), "{}", l.path);
        }
        other => panic!("a directory should list: {other:?}"),
    }
}

/// A missing path is `not_found`, naming the path.
pub async fn a_missing_path_is_not_found<T: FsTarget>(t: &T) {
    let r = t
        .read(ReadArgs {
            path: t.path("nope/missing.txt"),
            offset: None,
            limit: None,
        })
        .await;
    failed(
        "reading a missing file",
        r,
        FsErrorCode::NotFound,
        "missing.txt",
    );
}

/// A binary file (a NUL byte, or bytes that are not UTF-8) is refused as
/// `binary_file`, naming the path.
pub async fn a_binary_file_is_refused_as_binary<T: FsTarget>(t: &T) {
    t.put("blob.bin", b"\x00\x01\x02\xff\xfe").await;
    let r = t
        .read(ReadArgs {
            path: t.path("blob.bin"),
            offset: None,
            limit: None,
        })
        .await;
    failed(
        "reading a binary file",
        r,
        FsErrorCode::BinaryFile,
        "blob.bin",
    );
    t.put("latin1.txt", b"caf\xe9\n").await;
    let r = t
        .read(ReadArgs {
            path: t.path("latin1.txt"),
            offset: None,
            limit: None,
        })
        .await;
    failed(
        "reading a non-UTF-8 file",
        r,
        FsErrorCode::BinaryFile,
        "latin1.txt",
    );
}

/// An image reads as one inline image block with its type.
pub async fn an_image_reads_as_an_image_block<T: FsTarget>(t: &T) {
    t.put("dot.png", PNG).await;
    match read(t, "dot.png", None, None).await {
        ReadResult::Image(i) => {
            assert_eq!((i.kind, i.size), (FileKind::Image, PNG.len() as u64));
            assert_eq!(i.content_type, "image/png");
            assert_eq!(i.content.len(), 1);
            assert_eq!(i.content[0].block_type, "image");
            assert_eq!(i.content[0].mime_type, "image/png");
            assert_eq!(i.content[0].data, PNG_BASE64);
        }
        other => panic!("an image should read as an image: {other:?}"),
    }
}

/// A write creates missing parents, returns the byte size, and a second
/// write replaces the whole file.
pub async fn a_write_creates_parents_and_replaces_the_whole_file<T: FsTarget>(t: &T) {
    let w = write(t, "new/deeper/f.txt", "héllo\nworld\n").await;
    assert_eq!(w.size, 13);
    assert!(w.path.ends_with("f.txt"), "{}", w.path);
    write(t, "new/deeper/f.txt", "short").await;
    let f = text(t, "new/deeper/f.txt", None, None).await;
    assert_eq!((f.content.as_str(), f.size), ("1\tshort", 5));
}

/// Writing to a directory's path is `is_a_directory`.
pub async fn a_write_to_a_directory_is_refused<T: FsTarget>(t: &T) {
    write(t, "dir/inner.txt", "x").await;
    let r = t
        .write(WriteArgs {
            path: t.path("dir"),
            content: "x".into(),
        })
        .await;
    failed(
        "writing over a directory",
        r,
        FsErrorCode::IsADirectory,
        "dir",
    );
}

/// An edit replaces a unique string and counts one replacement.
pub async fn an_edit_replaces_a_unique_string<T: FsTarget>(t: &T) {
    write(t, "e.txt", "alpha beta gamma\n").await;
    let r = t
        .edit(EditArgs {
            path: t.path("e.txt"),
            old_string: "beta".into(),
            new_string: "BETA".into(),
            replace_all: false,
        })
        .await;
    let e = done("editing", r);
    assert_eq!(e.replacements, 1);
    assert!(e.path.ends_with("e.txt"), "{}", e.path);
    let f = text(t, "e.txt", None, None).await;
    assert_eq!(f.content, "1\talpha BETA gamma");
}

/// Several matches need `replaceAll` (`multiple_matches` names the count);
/// with it every one is replaced.
pub async fn several_matches_need_replace_all<T: FsTarget>(t: &T) {
    write(t, "m.txt", "x x x").await;
    let edit = |all| EditArgs {
        path: t.path("m.txt"),
        old_string: "x".into(),
        new_string: "y".into(),
        replace_all: all,
    };
    let r = t.edit(edit(false)).await;
    failed(
        "an ambiguous edit",
        r,
        FsErrorCode::MultipleMatches,
        "found 3 times",
    );
    assert_eq!(text(t, "m.txt", None, None).await.content, "1\tx x x");
    let e = done("replacing all", t.edit(edit(true)).await);
    assert_eq!(e.replacements, 3);
    assert_eq!(text(t, "m.txt", None, None).await.content, "1\ty y y");
}

/// Text that is not there is `no_match`; an empty `oldString` is
/// `invalid_argument`; an edit of a missing file is `not_found`. None
/// changes anything.
pub async fn an_edit_that_cannot_apply_changes_nothing<T: FsTarget>(t: &T) {
    write(t, "n.txt", "keep").await;
    let edit = |rel: &str, old: &str| EditArgs {
        path: t.path(rel),
        old_string: old.into(),
        new_string: "z".into(),
        replace_all: false,
    };
    let r = t.edit(edit("n.txt", "absent")).await;
    failed("editing absent text", r, FsErrorCode::NoMatch, "n.txt");
    let r = t.edit(edit("n.txt", "")).await;
    failed(
        "an empty oldString",
        r,
        FsErrorCode::InvalidArgument,
        "oldString",
    );
    let r = t.edit(edit("gone.txt", "keep")).await;
    failed(
        "editing a missing file",
        r,
        FsErrorCode::NotFound,
        "gone.txt",
    );
    assert_eq!(text(t, "n.txt", None, None).await.content, "1\tkeep");
}

/// A delete removes a file, or a directory with everything in it.
pub async fn a_delete_removes_a_file_or_a_whole_directory<T: FsTarget>(t: &T) {
    write(t, "del/one.txt", "1").await;
    write(t, "del/sub/two.txt", "2").await;
    let path = t.path("del/one.txt");
    let d = done("deleting a file", t.delete(DeleteArgs { path }).await);
    assert!(d.path.ends_with("one.txt"), "{}", d.path);
    let r = t
        .read(ReadArgs {
            path: t.path("del/one.txt"),
            offset: None,
            limit: None,
        })
        .await;
    failed(
        "reading a deleted file",
        r,
        FsErrorCode::NotFound,
        "one.txt",
    );
    done(
        "deleting a directory",
        t.delete(DeleteArgs {
            path: t.path("del"),
        })
        .await,
    );
    let r = t
        .read(ReadArgs {
            path: t.path("del/sub/two.txt"),
            offset: None,
            limit: None,
        })
        .await;
    failed(
        "reading inside a deleted directory",
        r,
        FsErrorCode::NotFound,
        "two.txt",
    );
}

/// Deleting what is not there is `not_found`.
pub async fn deleting_a_missing_path_is_not_found<T: FsTarget>(t: &T) {
    let r = t
        .delete(DeleteArgs {
            path: t.path("never.txt"),
        })
        .await;
    failed(
        "deleting a missing file",
        r,
        FsErrorCode::NotFound,
        "never.txt",
    );
}

/// A search matches the query literally (no regex), line by line, with
/// 1-based line numbers and the line's text.
pub async fn a_search_matches_literal_text_with_1_based_lines<T: FsTarget>(t: &T) {
    write(t, "s/a.txt", "nothing\nneedle here\nabc\na.c\n").await;
    write(t, "s/sub/b.md", "needle too\n").await;
    let r = done("searching", search(t, "s", "needle", None).await);
    let mut got: Vec<(String, u64, String)> = r
        .matches
        .iter()
        .map(|m| {
            (
                m.path.rsplit('/').next().unwrap().to_owned(),
                m.line,
                m.content.clone(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("a.txt".to_owned(), 2, "needle here".to_owned()),
            ("b.md".to_owned(), 1, "needle too".to_owned()),
        ]
    );
    assert_eq!(r.count, 2);
    assert!(!r.truncated);
    assert!(
        r.matches.iter().any(|m| m.path.ends_with("s/sub/b.md")),
        "{r:?}"
    );
    let literal = done("a literal dot", search(t, "s", "a.c", None).await);
    assert_eq!(literal.count, 1, "{literal:?}");
    assert_eq!(literal.matches[0].content, "a.c");
}

/// `include` filters by file name.
pub async fn a_search_include_filters_by_file_name<T: FsTarget>(t: &T) {
    write(t, "i/a.txt", "hit\n").await;
    write(t, "i/deep/b.md", "hit\n").await;
    let r = done("searching *.md", search(t, "i", "hit", Some("*.md")).await);
    assert_eq!(r.count, 1, "{r:?}");
    assert!(r.matches[0].path.ends_with("b.md"));
    let r = search(t, "i", "hit", Some("[z-a")).await;
    failed("a bad include", r, FsErrorCode::InvalidArgument, "[z-a");
}

/// A search stops at [`MAX_SEARCH_MATCHES`] with `truncated`, and cuts
/// each line to [`MAX_SEARCH_LINE_CHARS`] characters.
pub async fn a_search_stops_at_the_match_cap_and_cuts_long_lines<T: FsTarget>(t: &T) {
    let long = format!("hit {}", "é".repeat(300));
    let body: String = (0..MAX_SEARCH_MATCHES + 20)
        .map(|_| format!("{long}\n"))
        .collect();
    write(t, "c/many.txt", &body).await;
    let r = done("searching", search(t, "c", "hit", None).await);
    assert_eq!(
        (r.count, r.matches.len(), r.truncated),
        (MAX_SEARCH_MATCHES, MAX_SEARCH_MATCHES, true)
    );
    assert_eq!(r.matches[0].content.chars().count(), MAX_SEARCH_LINE_CHARS);
    assert_eq!(r.matches[0].line, 1);
}

/// An empty query is `invalid_argument` with the seed's message.
pub async fn an_empty_search_query_is_refused<T: FsTarget>(t: &T) {
    let r = search(t, "", "", None).await;
    failed(
        "an empty query",
        r,
        FsErrorCode::InvalidArgument,
        "Search query is required.",
    );
}

/// Generates one test per contract rule for one target:
/// `fs_contract_tests!(make)`, where `make` is an async fn returning a
/// fresh [`FsTarget`] (it owns its scratch directory). The calling crate
/// needs `tokio` (with `macros` and `rt`).
#[macro_export]
macro_rules! fs_contract_tests {
    ($make:path) => {
        $crate::__fs_rule!($make, a_text_read_numbers_lines_from_one_with_a_tab);
        $crate::__fs_rule!(
            $make,
            offset_and_limit_select_a_window_numbered_from_offset_plus_one
        );
        $crate::__fs_rule!($make, an_empty_file_has_no_lines);
        $crate::__fs_rule!(
            $make,
            a_read_over_the_cap_is_truncated_and_says_where_to_go_on
        );
        $crate::__fs_rule!($make, a_line_longer_than_the_cap_is_cut);
        $crate::__fs_rule!($make, a_directory_lists_files_and_directories_sorted);
        $crate::__fs_rule!($make, a_missing_path_is_not_found);
        $crate::__fs_rule!($make, a_binary_file_is_refused_as_binary);
        $crate::__fs_rule!($make, an_image_reads_as_an_image_block);
        $crate::__fs_rule!($make, a_write_creates_parents_and_replaces_the_whole_file);
        $crate::__fs_rule!($make, a_write_to_a_directory_is_refused);
        $crate::__fs_rule!($make, an_edit_replaces_a_unique_string);
        $crate::__fs_rule!($make, several_matches_need_replace_all);
        $crate::__fs_rule!($make, an_edit_that_cannot_apply_changes_nothing);
        $crate::__fs_rule!($make, a_delete_removes_a_file_or_a_whole_directory);
        $crate::__fs_rule!($make, deleting_a_missing_path_is_not_found);
        $crate::__fs_rule!($make, a_search_matches_literal_text_with_1_based_lines);
        $crate::__fs_rule!($make, a_search_include_filters_by_file_name);
        $crate::__fs_rule!($make, a_search_stops_at_the_match_cap_and_cuts_long_lines);
        $crate::__fs_rule!($make, an_empty_search_query_is_refused);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __fs_rule {
    ($make:path, $rule:ident) => {
        #[tokio::test]
        async fn $rule() {
            let target = $make().await;
            $crate::fs::testkit::$rule(&target).await;
        }
    };
}
