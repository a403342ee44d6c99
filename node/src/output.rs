//! Command output as the shell syscalls keep it, on a workspace and on a
//! node alike: the last N characters of a stream, and bytes decoded as
//! UTF-8 without mangling a character split across two reads.

/// The last `n` characters of `s`.
pub fn last_chars(s: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    match s.char_indices().rev().nth(n - 1) {
        Some((i, _)) => &s[i..],
        None => s,
    }
}

/// Text that keeps only its last `cap` characters. Trimming happens when
/// the buffer is half as long again as the cap, so appends stay amortised
/// O(1); readers always see exactly the last `cap`.
#[derive(Debug)]
pub struct CappedText {
    buf: String,
    chars: usize,
    cap: usize,
    /// Set once more than `cap` characters were pushed since the last
    /// [`CappedText::take_flagged`].
    pub overflowed: bool,
}

impl CappedText {
    pub fn new(cap: usize) -> Self {
        Self {
            buf: String::new(),
            chars: 0,
            cap,
            overflowed: false,
        }
    }

    pub fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.chars += s.chars().count();
        if self.chars > self.cap {
            self.overflowed = true;
        }
        if self.chars > self.cap + self.cap / 2 {
            let excess = self.chars - self.cap;
            let cut = self
                .buf
                .char_indices()
                .nth(excess)
                .map_or(self.buf.len(), |(i, _)| i);
            self.buf.drain(..cut);
            self.chars = self.cap;
        }
    }

    pub fn text(&self) -> &str {
        last_chars(&self.buf, self.cap)
    }

    pub fn take(&mut self) -> String {
        let out = self.text().to_owned();
        self.buf.clear();
        self.chars = 0;
        out
    }

    /// The kept text and whether anything was dropped, and starts over.
    pub fn take_flagged(&mut self) -> (String, bool) {
        let overflowed = std::mem::replace(&mut self.overflowed, false);
        (self.take(), overflowed)
    }
}

/// Decodes a byte stream as lossy UTF-8 without splitting a character that
/// straddles two reads.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    carry: Vec<u8>,
}

impl Utf8Stream {
    pub fn decode(&mut self, chunk: &[u8]) -> String {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(chunk);
        let keep = incomplete_suffix(&bytes);
        self.carry = bytes.split_off(bytes.len() - keep);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn finish(&mut self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut self.carry)).into_owned()
    }
}

/// How many trailing bytes form the start of a character not yet complete.
fn incomplete_suffix(b: &[u8]) -> usize {
    let n = b.len();
    for back in 1..=n.min(3) {
        let byte = b[n - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let need = match byte {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_text_keeps_exactly_the_last_cap_chars_and_reports_overflow() {
        let mut t = CappedText::new(10);
        t.push("héllo");
        assert_eq!(t.text(), "héllo");
        assert!(!t.overflowed);
        for i in 0..20 {
            t.push(&i.to_string());
        }
        let all: String = std::iter::once("héllo".to_owned())
            .chain((0..20).map(|i: i32| i.to_string()))
            .collect();
        assert_eq!(t.text(), last_chars(&all, 10));
        assert_eq!(t.text().chars().count(), 10);
        assert!(t.overflowed);
        assert_eq!(t.take().chars().count(), 10);
        assert_eq!(t.text(), "");
    }

    #[test]
    fn a_character_split_across_reads_decodes_whole() {
        let bytes = "aé€😀".as_bytes();
        for cut in 0..=bytes.len() {
            let mut d = Utf8Stream::default();
            let mut s = d.decode(&bytes[..cut]);
            s.push_str(&d.decode(&bytes[cut..]));
            s.push_str(&d.finish());
            assert_eq!(s, "aé€😀", "cut at {cut}");
        }
    }

    #[test]
    fn last_chars_counts_characters_not_bytes() {
        assert_eq!(last_chars("abcé", 2), "cé");
        assert_eq!(last_chars("ab", 5), "ab");
        assert_eq!(last_chars("ab", 0), "");
    }

    #[test]
    fn take_flagged_reports_a_drop_once_and_starts_over() {
        let mut t = CappedText::new(4);
        t.push("abcdé");
        assert_eq!(t.take_flagged(), ("bcdé".to_owned(), true));
        t.push("xy");
        assert_eq!(t.take_flagged(), ("xy".to_owned(), false));
    }
}
