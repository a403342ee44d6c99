//! The one `fs.read` output format: what type a file is ([`content_type`])
//! and how its selected lines become `content` ([`TextWindow`]).

use super::{FileKind, MAX_READ_CONTENT_BYTES, TextFile};

/// A file's content type, by its first bytes or else its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentType {
    pub mime: String,
    /// Read as numbered lines (else an image block, or refused as binary).
    pub is_text: bool,
}

impl ContentType {
    /// An image that is returned as an image block (SVG is text).
    pub fn is_image(&self) -> bool {
        self.mime.starts_with("image/") && !self.is_text
    }
}

/// The content type of a file whose first bytes (up to
/// [`super::SNIFF_BYTES`]) are `head` and whose name is `name`: sniffed
/// from the bytes, else by extension (unknown: `text/plain`). A NUL byte in
/// the head means binary whatever the name says.
pub fn content_type(head: &[u8], name: &str) -> ContentType {
    if let Some(kind) = infer::get(head) {
        let mime = kind.mime_type();
        let is_text = mime.starts_with("text/") || mime == "image/svg+xml";
        return ContentType {
            mime: mime.to_owned(),
            is_text,
        };
    }
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let mime = match ext.as_str() {
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "xml" => "application/xml",
        "js" | "mjs" | "cjs" => "text/javascript",
        "ts" | "tsx" => "application/typescript",
        "svg" => "image/svg+xml",
        "md" => "text/markdown",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "csv" => "text/csv",
        _ => "text/plain",
    };
    ContentType {
        mime: mime.to_owned(),
        is_text: !head.contains(&0),
    }
}

/// Builds a text read's `content`: lines numbered `{n}\t{line}` from
/// `offset + 1`, joined with `\n`, at most `cap` bytes in all. A line that
/// does not fit ends the window (`truncated`, `nextOffset`); a first line
/// longer than the cap is cut to fit, so a read always moves on.
#[derive(Debug, Clone)]
pub struct TextWindow {
    offset: u64,
    cap: usize,
    content: String,
    lines: u64,
    truncated: bool,
}

impl TextWindow {
    /// A window starting after `offset` lines, capped at
    /// [`MAX_READ_CONTENT_BYTES`].
    pub fn new(offset: u64) -> TextWindow {
        TextWindow::with_cap(offset, MAX_READ_CONTENT_BYTES)
    }

    pub fn with_cap(offset: u64, cap: usize) -> TextWindow {
        TextWindow {
            offset,
            cap,
            content: String::new(),
            lines: 0,
            truncated: false,
        }
    }

    /// Adds the next line (without its `\n`); `cut` says the reader kept
    /// only its start. False once the window is full: read no further.
    pub fn push(&mut self, line: &str, cut: bool) -> bool {
        if self.truncated {
            return false;
        }
        let prefix = format!("{}\t", self.offset + self.lines + 1);
        let sep = usize::from(self.lines > 0);
        let room = self
            .cap
            .saturating_sub(self.content.len() + sep + prefix.len());
        if line.len() > room && self.lines > 0 {
            self.truncated = true;
            return false;
        }
        let keep = floor_char_boundary(line, room);
        if sep == 1 {
            self.content.push('\n');
        }
        self.content.push_str(&prefix);
        self.content.push_str(&line[..keep]);
        self.lines += 1;
        if cut || keep < line.len() {
            self.truncated = true;
        }
        !self.truncated
    }

    /// Adds the lines of `text` (a trailing `\n` ends the last line; it
    /// does not start an empty one). With `cut`, `text` stops inside the
    /// file, so its last line may be partial.
    pub fn push_text(&mut self, text: &str, cut: bool) {
        let body = text.strip_suffix('\n').unwrap_or(text);
        if body.is_empty() && !text.ends_with('\n') {
            return;
        }
        let mut parts = body.split('\n').peekable();
        while let Some(line) = parts.next() {
            let last = parts.peek().is_none();
            if !self.push(line, cut && last && !text.ends_with('\n')) {
                return;
            }
        }
        if cut {
            self.truncated = true;
        }
    }

    /// Lines taken so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The result for a file of `size` bytes of type `content_type`.
    pub fn finish(self, path: String, size: u64, content_type: String) -> TextFile {
        TextFile {
            path,
            size,
            kind: FileKind::Text,
            content_type,
            content: self.content,
            lines: self.lines,
            truncated: self.truncated,
            next_offset: self.truncated.then_some(self.offset + self.lines),
        }
    }
}

/// The largest index `<= at` that is a char boundary of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(offset: u64, cap: usize, text: &str, cut: bool) -> TextFile {
        let mut w = TextWindow::with_cap(offset, cap);
        w.push_text(text, cut);
        w.finish("/f".into(), text.len() as u64, "text/plain".into())
    }

    #[test]
    fn lines_are_numbered_from_the_offset_with_a_tab_and_no_phantom_last_line() {
        let f = window(4, 1 << 20, "a\nb\n", false);
        assert_eq!((f.content.as_str(), f.lines), ("5\ta\n6\tb", 2));
        assert!(!f.truncated && f.next_offset.is_none());
        let f = window(0, 1 << 20, "", false);
        assert_eq!((f.content.as_str(), f.lines), ("", 0));
        let f = window(0, 1 << 20, "\n", false);
        assert_eq!((f.content.as_str(), f.lines), ("1\t", 1));
    }

    #[test]
    fn a_full_window_stops_before_the_line_that_does_not_fit() {
        let f = window(0, 12, "aaaa\nbbbb\ncccc\n", false);
        assert_eq!(f.content, "1\taaaa");
        assert!(f.truncated);
        assert_eq!(f.next_offset, Some(1));
    }

    #[test]
    fn a_first_line_over_the_cap_is_cut_at_a_character_boundary() {
        let f = window(0, 6, "aé€😀\n", false);
        assert!(f.content.len() <= 6, "{}", f.content);
        assert_eq!(f.content, "1\taé");
        assert_eq!((f.lines, f.truncated, f.next_offset), (1, true, Some(1)));
    }

    #[test]
    fn a_cut_body_marks_its_last_line_and_the_window_truncated() {
        let f = window(2, 1 << 20, "x\ny", true);
        assert_eq!(f.content, "3\tx\n4\ty");
        assert_eq!(f.next_offset, Some(4));
    }

    #[test]
    fn types_come_from_the_bytes_then_the_name() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert!(content_type(png, "x.txt").is_image());
        assert_eq!(content_type(b"{}", "a.json").mime, "application/json");
        assert!(content_type(b"<svg/>", "a.svg").is_text);
        assert!(!content_type(b"a\0b", "a.txt").is_text);
        assert_eq!(content_type(b"hi", "README").mime, "text/plain");
    }
}
