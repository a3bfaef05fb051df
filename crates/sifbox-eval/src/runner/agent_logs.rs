//! The agent's logs: `/logs/agent` and `/logs/artifacts` are directories of
//! the sandbox's writable layer (`SandboxSpec::layer_dirs`, bound over the
//! rollout dir's at /logs), so what the agent writes there counts against
//! the task's `storage_mb` (an agent of `storage_mb = 64` left 1.1 GB in
//! the job dir when /logs was the host's). Once the agent is done they are
//! copied to the rollout's `agent/` and `artifacts/`, as a download is
//! (confined, nothing followed, setuid bits dropped), within
//! [`MAX_BYTES`] of file contents and [`MAX_ENTRIES`] entries for both
//! together: what does not fit is left out and said so in result.json's
//! `logs`. A multi-step task keeps the host's dirs (its steps' outputs are
//! moved aside between steps on the host).

use std::io::{Read as _, Seek as _, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sifbox_engine::Sandbox;

use crate::result::LogsCopied;

/// File contents copied out of one rollout's logs, at most.
pub(super) const MAX_BYTES: u64 = 1 << 30;
/// Entries (files, dirs, links) copied out of one rollout's logs, at most.
pub(super) const MAX_ENTRIES: u64 = 20_000;
/// The logs subdirs kept in the writable layer.
pub(super) const DIRS: [&str; 2] = ["agent", "artifacts"];

/// The sandbox paths of [`DIRS`].
pub(super) fn layer_dirs() -> Vec<std::path::PathBuf> {
    DIRS.iter().map(|d| Path::new("/logs").join(d)).collect()
}

/// A writer that takes `left` bytes and then fails, noting it.
struct Bounded {
    out: std::fs::File,
    left: u64,
    cut: Arc<AtomicBool>,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            self.cut.store(true, Ordering::SeqCst);
            return Err(std::io::Error::other("the logs' bound"));
        }
        let n = usize::try_from(self.left).map_or(buf.len(), |left| buf.len().min(left));
        let n = self.out.write(&buf[..n])?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Copies [`DIRS`] out of `sb` into `rollout_dir` (their host dirs there
/// exist), temp files in `scratch` (the job dir, which no sandbox sees).
pub(super) fn copy_out(sb: &Sandbox, rollout_dir: &Path, scratch: &Path) -> LogsCopied {
    let mut rec = LogsCopied::default();
    let mut cut = Vec::new();
    for name in DIRS {
        if let Err(e) = copy_one(sb, name, rollout_dir, scratch, &mut rec, &mut cut) {
            cut.push(format!("/logs/{name}: {e}"));
        }
    }
    if !cut.is_empty() {
        rec.truncated = true;
        rec.cut = Some(cut.join("; "));
    }
    rec
}

fn copy_one(
    sb: &Sandbox,
    name: &str,
    rollout_dir: &Path,
    scratch: &Path,
    rec: &mut LogsCopied,
    cut: &mut Vec<String>,
) -> std::io::Result<()> {
    // The stream as the sandbox sends it, bounded: contents, plus the
    // headers of as many entries (long names take a few blocks more).
    let raw = tempfile::tempfile_in(scratch)?;
    let hit = Arc::new(AtomicBool::new(false));
    let room = (MAX_BYTES - rec.bytes) + (MAX_ENTRIES - rec.files) * 2048 + (1 << 20);
    let w = Bounded {
        out: raw.try_clone()?,
        left: room,
        cut: Arc::clone(&hit),
    };
    let src = format!("/logs/{name}");
    // Bounded here (whole entries kept), not by the transfer's limits,
    // which would fail the copy and keep nothing.
    let got = sb.download_tar(
        &src,
        false,
        sifbox_engine::transfer::SetId::Strip,
        sifbox_engine::transfer::Limits::UNLIMITED,
        w,
    );
    let stream_cut = hit.load(Ordering::SeqCst);
    if let Err(e) = got {
        if !stream_cut {
            return Err(std::io::Error::other(e.to_string()));
        }
    }
    // The whole entries within the bounds: a prefix of the stream (each
    // entry's extension headers come before it, so a cut after an entry
    // is a cut between entries), unpacked as a download is.
    let mut raw = raw;
    raw.seek(SeekFrom::Start(0))?;
    let (mut keep_to, mut left_out, mut left_bytes) = (0u64, 0u64, 0u64);
    let mut broken = stream_cut;
    let raw_len = raw.metadata()?.len();
    {
        let mut archive = tar::Archive::new(&raw);
        let mut full = false;
        for entry in archive.entries()? {
            let Ok(entry) = entry else {
                broken = true;
                break;
            };
            // Stored data (a sparse file's holes are not in the stream).
            let size = entry.header().entry_size().unwrap_or(0);
            if full || rec.files >= MAX_ENTRIES || rec.bytes + size > MAX_BYTES {
                full = true;
                left_out += 1;
                left_bytes += size;
                continue;
            }
            let end = entry.raw_file_position() + size.div_ceil(512) * 512;
            if end > raw_len {
                // Cut inside its data.
                broken = true;
                break;
            }
            keep_to = end;
            rec.files += 1;
            rec.bytes += size;
        }
    }
    if left_out > 0 {
        cut.push(format!(
            "/logs/{name}: {left_out} entries ({left_bytes} bytes) over the bounds ({MAX_ENTRIES} entries, {MAX_BYTES} bytes)"
        ));
    } else if broken {
        cut.push(format!(
            "/logs/{name}: the rest, past the bounds ({MAX_ENTRIES} entries, {MAX_BYTES} bytes)"
        ));
    }
    raw.seek(SeekFrom::Start(0))?;
    let kept = std::io::Read::chain(
        std::io::Read::take(raw, keep_to),
        std::io::repeat(0).take(1024),
    );
    sifbox_engine::transfer::unpack_to_host(
        kept,
        rollout_dir,
        name,
        sifbox_engine::transfer::SetId::Strip,
    )
}
