//! Checking a squashfs image through, without unpacking it: what an import
//! does before an image becomes visible, so that a damaged file is refused
//! then rather than at its first run.
//!
//! The check reads the image as [`super::unpack`] does, with the same
//! rules: the superblock (and its `bytes_used` against the space the image
//! has), the id and fragment tables, every directory listing from the root
//! down (names, entry types against inode types, loops, a name twice in
//! one directory) and every inode it reaches; then every data block and
//! every fragment tail of every regular file is decompressed and its size
//! compared with what the inode says. Nothing is written. Data blocks are
//! checked on all CPUs, in batches handed out as the walk goes, so memory
//! stays bounded whatever the image holds.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use super::unpack::{
    check_name, corrupt, first_visit, in_batches, FileInfo, FileWriter, Image, InodeKind, Meta,
};
use super::{SquashError, VerifyStats};

/// Regular files per batch handed to a checking thread, and bytes.
const BATCH_FILES: usize = 64;
const BATCH_BYTES: u64 = 8 << 20;

/// A regular file to check: its path in the image (for messages) and where
/// its data is.
struct Job {
    path: PathBuf,
    info: FileInfo,
}

/// Checks the squashfs image at `base..base+len` of `file`: see the module's
/// note. `threads`: 0 for one per CPU.
pub(super) fn verify(
    file: &File,
    base: u64,
    len: u64,
    threads: usize,
) -> Result<VerifyStats, SquashError> {
    let img = Image::open(file, base, len)?;
    let bytes = AtomicU64::new(0);
    let walked = in_batches(
        threads,
        || FileWriter::new(&img),
        |reader, job: &Job| {
            reader.read_file(&job.info, &job.path, |_, _| Ok(()))?;
            bytes.fetch_add(job.info.size, Ordering::Relaxed);
            Ok(())
        },
        |send, failed| walk(&img, send, failed),
    );
    let mut stats = walked?;
    stats.bytes = bytes.into_inner();
    if stats.inodes > u64::from(img.sb.inode_count) {
        return Err(corrupt(format!(
            "the directories reach {} inodes, the superblock counts {}",
            stats.inodes, img.sb.inode_count
        )));
    }
    Ok(stats)
}

/// The path of `rel` as the image's root sees it, for messages.
fn shown(rel: &Path) -> PathBuf {
    Path::new("/").join(rel)
}

/// Walks every directory from the root, checking what it meets and sending
/// regular files to the checking threads in batches (dropping `send` at the
/// end lets them finish).
fn walk(
    img: &Image<'_>,
    send: mpsc::Sender<Vec<Job>>,
    failed: &AtomicBool,
) -> Result<VerifyStats, SquashError> {
    let mut meta = Meta::new(img);
    let (_, (block, offset, size)) = img.root_dir(&mut meta)?;
    let mut stats = VerifyStats {
        inodes: 1,
        ..VerifyStats::default()
    };
    let mut seen_dirs: HashSet<u64> = HashSet::from([img.sb.root_inode]);
    let mut seen_nodes: HashSet<u64> = HashSet::new();
    let mut pending: Vec<(PathBuf, u32, u16, u32)> = vec![(PathBuf::new(), block, offset, size)];
    let mut batch: Vec<Job> = Vec::new();
    let mut batch_bytes = 0u64;
    let mut names: HashSet<Vec<u8>> = HashSet::new();
    while let Some((rel, block, offset, size)) = pending.pop() {
        if failed.load(Ordering::Relaxed) {
            break;
        }
        let mut listing = img.listing(block, offset, size)?;
        let dir_shown = shown(&rel);
        names.clear();
        while let Some((name, r, entry_type)) = listing.next(&mut meta)? {
            let raw = name;
            let name = check_name(&dir_shown, raw)?;
            let path = rel.join(name);
            if !names.insert(raw.to_vec()) {
                return Err(corrupt(format!(
                    "{}: two entries of that name",
                    shown(&path).display()
                )));
            }
            let info = img.inode(&mut meta, r)?;
            if info.basic_type != entry_type {
                return Err(corrupt(format!(
                    "{}: entry type {entry_type} but inode type {}",
                    shown(&path).display(),
                    info.basic_type
                )));
            }
            if let InodeKind::Dir {
                block,
                offset,
                size,
            } = info.kind
            {
                first_visit(&mut seen_dirs, r, &shown(&path))?;
                stats.dirs += 1;
                stats.inodes += 1;
                pending.push((path, block, offset, size));
                continue;
            }
            if !seen_nodes.insert(r) {
                stats.hard_links += 1;
                continue;
            }
            stats.inodes += 1;
            match info.kind {
                InodeKind::File(f) => {
                    stats.files += 1;
                    batch_bytes += f.size;
                    batch.push(Job {
                        path: shown(&path),
                        info: f,
                    });
                    if batch.len() >= BATCH_FILES || batch_bytes >= BATCH_BYTES {
                        // A closed queue: every checker stopped on an error,
                        // which the caller reports.
                        let _ = send.send(std::mem::take(&mut batch));
                        batch_bytes = 0;
                    }
                }
                InodeKind::Symlink(target) => {
                    if target.contains(&0) {
                        return Err(corrupt(format!(
                            "{}: symlink target contains NUL",
                            shown(&path).display()
                        )));
                    }
                }
                InodeKind::Dir { .. }
                | InodeKind::Device { .. }
                | InodeKind::Fifo
                | InodeKind::Socket => {}
            }
        }
    }
    if !batch.is_empty() {
        let _ = send.send(batch);
    }
    Ok(stats)
}
