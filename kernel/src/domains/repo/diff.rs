//! Line hunks of one file's change, with `similar` (Myers, as git's
//! default), grouped with `context` lines around each change.

use similar::{ChangeTag, TextDiff};

use gsv_protocol::repo::{DiffLine, Hunk, LineTag};

/// One file's hunks and line counts.
#[derive(Debug, Clone, Default)]
pub struct FileDiff {
    pub hunks: Vec<Hunk>,
    pub additions: u32,
    pub deletions: u32,
}

/// Binary as the reference decides: any NUL, or not UTF-8.
pub fn is_binary(bytes: &[u8]) -> bool {
    !bytes.is_empty() && (bytes.contains(&0) || std::str::from_utf8(bytes).is_err())
}

/// The hunks turning `old` into `new`. A binary side gives one hunk with a
/// single `binary` line and no line counts (as `git diff --stat` shows `-`).
pub fn file_hunks(old: &[u8], new: &[u8], context: u32) -> FileDiff {
    if old == new {
        return FileDiff::default();
    }
    if is_binary(old) || is_binary(new) {
        return FileDiff {
            hunks: vec![Hunk {
                old_start: 0,
                old_count: 0,
                new_start: 0,
                new_count: 0,
                lines: vec![DiffLine {
                    tag: LineTag::Binary,
                    content: "Binary files differ".into(),
                }],
            }],
            additions: 0,
            deletions: 0,
        };
    }
    let (old, new) = (String::from_utf8_lossy(old), String::from_utf8_lossy(new));
    let diff = TextDiff::from_lines(old.as_ref(), new.as_ref());
    let mut out = FileDiff::default();
    for group in diff.grouped_ops(context as usize) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let old_range = first.old_range().start..last.old_range().end;
        let new_range = first.new_range().start..last.new_range().end;
        let mut lines = Vec::new();
        for op in &group {
            for change in diff.iter_changes(op) {
                let tag = match change.tag() {
                    ChangeTag::Equal => LineTag::Context,
                    ChangeTag::Insert => {
                        out.additions += 1;
                        LineTag::Add
                    }
                    ChangeTag::Delete => {
                        out.deletions += 1;
                        LineTag::Delete
                    }
                };
                let text = change.to_string_lossy();
                let content = text
                    .strip_suffix('\n')
                    .map(|t| t.strip_suffix('\r').unwrap_or(t))
                    .unwrap_or(&text)
                    .to_owned();
                lines.push(DiffLine { tag, content });
            }
        }
        out.hunks.push(Hunk {
            old_start: unified_start(&old_range),
            old_count: old_range.len() as u32,
            new_start: unified_start(&new_range),
            new_count: new_range.len() as u32,
            lines,
        });
    }
    out
}

/// Unified diff numbering: 1-based, and an empty range names the line
/// before it (0 at the top of the file).
fn unified_start(r: &std::ops::Range<usize>) -> u32 {
    if r.is_empty() {
        r.start as u32
    } else {
        r.start as u32 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_changed_line_gives_one_hunk_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\n";
        let new = "a\nb\nc\nD\ne\nf\ng\n";
        let d = file_hunks(old.as_bytes(), new.as_bytes(), 1);
        assert_eq!((d.additions, d.deletions), (1, 1));
        assert_eq!(d.hunks.len(), 1);
        let h = &d.hunks[0];
        assert_eq!(
            (h.old_start, h.old_count, h.new_start, h.new_count),
            (3, 3, 3, 3)
        );
        let tags: Vec<_> = h
            .lines
            .iter()
            .map(|l| (l.tag, l.content.as_str()))
            .collect();
        assert_eq!(
            tags,
            [
                (LineTag::Context, "c"),
                (LineTag::Delete, "d"),
                (LineTag::Add, "D"),
                (LineTag::Context, "e")
            ]
        );
    }

    #[test]
    fn a_new_file_starts_at_zero_and_binary_is_one_line() {
        let d = file_hunks(b"", b"x\ny\n", 3);
        let h = &d.hunks[0];
        assert_eq!(
            (h.old_start, h.old_count, h.new_start, h.new_count),
            (0, 0, 1, 2)
        );
        let b = file_hunks(b"\0\x01", b"\0\x02", 3);
        assert_eq!(b.hunks[0].lines[0].tag, LineTag::Binary);
    }
}
