//! Ranged reads by line: a window of `limit` lines starting at line `skip`,
//! streamed one chunk at a time and stopping as soon as the window is full,
//! so a 10-line read of a large file touches only the chunks before and in
//! the window (the kernel's `fs.read` with `offset`/`limit`).

use std::ops::ControlFlow;

use wsd_sync::SyncPath;

use crate::{Dofs, DofsError};

/// What [`Dofs::read_lines`] returns.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct LineWindow {
    /// The selected lines without their `\n` terminators, as raw bytes (the
    /// caller decides how strict to be about UTF-8).
    pub lines: Vec<Vec<u8>>,
    /// 0-based index of the first selected line (`skip`).
    pub first: u64,
    /// True when the window stopped because of `max_bytes`, not `limit` or
    /// the end of the file.
    pub truncated: bool,
    /// True when the file continues after the window.
    pub more: bool,
}

impl Dofs {
    /// Lines `skip..skip+limit` of the file at `path` (`limit: None`: to the
    /// end), holding at most `max_bytes` of line content in memory. A file
    /// that ends with `\n` has no empty last line; an empty file has none.
    pub fn read_lines(
        &self,
        path: &SyncPath,
        skip: u64,
        limit: Option<u64>,
        max_bytes: usize,
    ) -> Result<LineWindow, DofsError> {
        let (manifest, chunk) = self.file_content(path)?;
        let mut out = LineWindow {
            first: skip,
            ..LineWindow::default()
        };
        let want = limit.unwrap_or(u64::MAX);
        if want == 0 {
            return Ok(out);
        }
        let mut line_no = 0u64;
        let mut current: Vec<u8> = Vec::new();
        let mut held = 0usize;
        // Whether bytes of an unterminated line `line_no` have been seen.
        let mut open = false;
        let mut done = false;
        let chunks = self.chunks();
        chunks.for_each_content_chunk(&manifest, chunk.as_ref(), |mut bytes| {
            while !bytes.is_empty() {
                let (piece, ended) = match memchr::memchr(b'\n', bytes) {
                    Some(i) => (&bytes[..i], true),
                    None => (bytes, false),
                };
                bytes = &bytes[piece.len() + usize::from(ended)..];
                if line_no >= skip {
                    if out.lines.len() as u64 >= want {
                        out.more = true;
                        done = true;
                        return Ok(ControlFlow::Break(()));
                    }
                    let room = max_bytes.saturating_sub(held);
                    if piece.len() > room {
                        current.extend_from_slice(&piece[..room]);
                        out.lines.push(std::mem::take(&mut current));
                        out.truncated = true;
                        out.more = true;
                        done = true;
                        return Ok(ControlFlow::Break(()));
                    }
                    current.extend_from_slice(piece);
                    held += piece.len();
                }
                open = !ended;
                if ended {
                    if line_no >= skip {
                        out.lines.push(std::mem::take(&mut current));
                    }
                    line_no += 1;
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if done {
            return Ok(out);
        }
        if open && line_no >= skip && (out.lines.len() as u64) < want {
            out.lines.push(current);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{p, put, store};

    #[test]
    fn read_lines_returns_the_requested_window_and_says_more_follows() {
        let mut d = store();
        put(&mut d, "f", b"a\nb\nc\nd\n");
        let w = d.read_lines(&p("f"), 1, Some(2), 1 << 20).unwrap();
        assert_eq!(w.lines, vec![b"b".to_vec(), b"c".to_vec()]);
        assert!(w.more);
        assert!(!w.truncated);
        let all = d.read_lines(&p("f"), 0, None, 1 << 20).unwrap();
        assert_eq!(all.lines.len(), 4);
        assert!(!all.more);
    }

    #[test]
    fn read_lines_keeps_an_unterminated_last_line_and_spans_chunks() {
        let mut d = store();
        let mut big = Vec::new();
        for i in 0..20_000 {
            big.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        big.extend_from_slice(b"tail");
        put(&mut d, "big", &big);
        let w = d.read_lines(&p("big"), 19_999, Some(5), 1 << 20).unwrap();
        assert_eq!(w.lines, vec![b"line 19999".to_vec(), b"tail".to_vec()]);
        assert!(!w.more);
    }

    #[test]
    fn read_lines_stops_at_the_byte_cap_and_flags_truncation() {
        let mut d = store();
        put(&mut d, "f", b"0123456789\nabc\n");
        let w = d.read_lines(&p("f"), 0, None, 4).unwrap();
        assert_eq!(w.lines, vec![b"0123".to_vec()]);
        assert!(w.truncated);
    }

    #[test]
    fn read_lines_of_a_directory_is_an_error_naming_it() {
        let mut d = store();
        d.mkdir(&p("dir"), false).unwrap();
        let e = d.read_lines(&p("dir"), 0, None, 10).unwrap_err();
        assert!(e.to_string().contains("dir"), "{e}");
    }
}

#[cfg(test)]
mod search_where_tests {
    use crate::test_util::{p, put, store};

    #[test]
    fn search_where_skips_filtered_files_before_counting_the_limit() {
        let mut d = store();
        put(&mut d, "a.txt", b"needle\n");
        put(&mut d, "b.rs", b"needle\n");
        put(&mut d, "c.rs", b"x\nneedle\n");
        let hits = d
            .search_where(b"needle", None, 1, |path| path.as_str().ends_with(".rs"))
            .unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].path, p("b.rs"));
    }
}
