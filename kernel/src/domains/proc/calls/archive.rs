//! A process's archived history in the system store: gzip JSONL files
//! under its sessions directory, written by a reset, a kill or a
//! compaction and read back by forks and segment reads.

use std::io::Write as _;
use std::sync::Arc;

use serde_json::Value;
use wsd_sync::SyncPath;

use crate::domains::fs::calls::{ensure_dir, with_store};
use crate::domains::proc::store::ProcRow;
use crate::error::KernelError;
use crate::kernel::Kernel;

/// `var/sessions/<user>/<pid>` in the system store. `:` is legal in dofs
/// names but awkward in shells: `proc:` is dropped, other `:` become `-`.
pub fn sessions_dir(row: &ProcRow) -> String {
    format!(
        "var/sessions/{}/{}",
        row.username,
        row.pid.trim_start_matches("proc:").replace(':', "-")
    )
}

/// Writes `messages` as gzip JSONL to `<dir>/<name>` in the system store;
/// its absolute path.
pub async fn write_archive(
    k: &Arc<Kernel>,
    dir: &str,
    name: &str,
    messages: &[Value],
) -> Result<String, KernelError> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for m in messages {
        writeln!(gz, "{m}").map_err(|e| KernelError::internal("compressing history", e))?;
    }
    let bytes = gz
        .finish()
        .map_err(|e| KernelError::internal("compressing history", e))?;
    ensure_dir(&k.system, dir).await?;
    let file = format!("{dir}/{name}");
    let path = SyncPath::canonicalize(&file).map_err(|e| KernelError::internal(&file, e))?;
    with_store(&k.system, move |d| d.write_file(&path, &bytes[..]))
        .await?
        .map_err(|e| KernelError::internal(&format!("writing /{file}"), e))?;
    Ok(format!("/{file}"))
}

/// Reads a gzip JSONL archive written by [`write_archive`].
pub async fn read_archive(k: &Arc<Kernel>, path: &str) -> Result<Vec<Value>, KernelError> {
    let file = path.trim_start_matches('/').to_owned();
    let p = SyncPath::canonicalize(&file).map_err(|e| KernelError::internal(&file, e))?;
    let bytes = with_store(&k.system, move |d| d.read_file(&p))
        .await?
        .map_err(|e| KernelError::internal(&format!("reading {path}"), e))?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text)
        .map_err(|e| KernelError::internal(&format!("decompressing {path}"), e))?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| KernelError::internal(path, e)))
        .collect()
}
