//! An IO seam for fault tests (cargo feature `failpoints`), for machines
//! where a full or read-only filesystem cannot be mounted: named points in
//! `apply` that, once armed, fail with a chosen `errno` as the filesystem
//! would. Without the feature [`hit`] is an inline no-op. Hand-rolled
//! rather than the `fail` crate, which would pull an older `rand` into the
//! daemon for two call sites.
//!
//! Points: `apply-before-rename` (an entry's temp file is written, the
//! rename into place fails), `apply-before-commit` (every entry is on disk,
//! the index commit fails), `conflict-hard-link` (the hard link that keeps
//! a conflict copy is refused, as on a filesystem without links).

/// Fails with `errno` when `name` is armed.
#[inline]
pub(crate) fn hit(name: &str) -> std::io::Result<()> {
    #[cfg(feature = "failpoints")]
    if let Some(errno) = armed::get(name) {
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    let _ = name;
    Ok(())
}

#[cfg(feature = "failpoints")]
pub use armed::set;

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    static ANY: AtomicBool = AtomicBool::new(false);
    static POINTS: Mutex<Vec<(String, i32)>> = Mutex::new(Vec::new());

    /// Arms `name` to fail with `errno` (in this process), or disarms it.
    pub fn set(name: &str, errno: Option<i32>) {
        let mut points = POINTS.lock().unwrap();
        points.retain(|(n, _)| n != name);
        if let Some(e) = errno {
            points.push((name.to_owned(), e));
        }
        ANY.store(!points.is_empty(), Ordering::SeqCst);
    }

    pub(super) fn get(name: &str) -> Option<i32> {
        if !ANY.load(Ordering::Relaxed) {
            return None;
        }
        let points = POINTS.lock().unwrap();
        points.iter().find(|(n, _)| n == name).map(|(_, e)| *e)
    }
}
