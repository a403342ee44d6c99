use std::cmp::Ordering;

use crate::SyncPath;

/// A resume point in one store's rev space.
///
/// `{R, None}`: every change committed at or before `R` has been offered.
/// `{R, Some(p)}`: rev `R` has been offered up to and including `p`.
/// Ordering: by rev, then within one rev any `Some(path)` sorts before
/// `None`, paths compared byte-wise on UTF-8.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct ChangeCursor {
    pub rev: u64,
    pub path: Option<SyncPath>,
}

impl ChangeCursor {
    /// The cursor before everything: a full baseline.
    pub const ZERO: ChangeCursor = ChangeCursor { rev: 0, path: None };

    /// `{rev, None}`: rev `rev` is complete.
    pub fn at(rev: u64) -> ChangeCursor {
        ChangeCursor { rev, path: None }
    }

    /// `{rev, Some(path)}`: rev `rev` offered up to and including `path`.
    pub fn within(rev: u64, path: SyncPath) -> ChangeCursor {
        ChangeCursor {
            rev,
            path: Some(path),
        }
    }

    /// True when a change at `(rev, path)` lies strictly after this cursor.
    pub fn is_before(&self, rev: u64, path: &SyncPath) -> bool {
        match rev.cmp(&self.rev) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => match &self.path {
                None => false,
                Some(p) => path > p,
            },
        }
    }

    /// The largest rev every change at or below which has been offered.
    pub fn complete_rev(&self) -> u64 {
        match self.path {
            None => self.rev,
            Some(_) => self.rev.saturating_sub(1),
        }
    }
}

impl Ord for ChangeCursor {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rev
            .cmp(&other.rev)
            .then_with(|| match (&self.path, &other.path) {
                (None, None) => Ordering::Equal,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(a), Some(b)) => a.cmp(b),
            })
    }
}

impl PartialOrd for ChangeCursor {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Display for ChangeCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            None => write!(f, "{{{}, -}}", self.rev),
            Some(p) => write!(f, "{{{}, {:?}}}", self.rev, p.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SyncPath {
        SyncPath::new(s).unwrap()
    }

    #[test]
    fn a_path_cursor_sorts_before_the_complete_rev() {
        assert!(ChangeCursor::within(5, p("z")) < ChangeCursor::at(5));
        assert!(ChangeCursor::at(4) < ChangeCursor::within(5, p("a")));
        assert!(ChangeCursor::within(5, p("a")) < ChangeCursor::within(5, p("b")));
        assert_eq!(ChangeCursor::at(3), ChangeCursor::at(3));
    }

    #[test]
    fn is_before_matches_the_order() {
        let c = ChangeCursor::within(5, p("m"));
        assert!(c.is_before(5, &p("n")));
        assert!(!c.is_before(5, &p("m")));
        assert!(!c.is_before(4, &p("z")));
        assert!(c.is_before(6, &p("a")));
        assert!(!ChangeCursor::at(5).is_before(5, &p("z")));
    }

    #[test]
    fn complete_rev_of_a_partial_cursor_is_the_previous_rev() {
        assert_eq!(ChangeCursor::within(5, p("a")).complete_rev(), 4);
        assert_eq!(ChangeCursor::at(5).complete_rev(), 5);
    }
}
