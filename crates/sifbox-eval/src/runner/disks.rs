//! Each worker thread's disk-backed file systems, reused from one rollout's
//! sandbox to the next ([`sifbox_engine::disk::Reused`]): a sandbox gets a
//! fresh directory on one that no other sandbox uses, and the job's reaper
//! removes that directory once the sandbox is gone (then the file system
//! serves the worker's next sandbox of that size).
//!
//! A file system whose directory could not be removed stays taken; when a
//! worker has [`MOST`] of a size and none is free, its sandbox makes a
//! layer of its own, as `sifbox run` does.

use std::cell::RefCell;
use std::path::Path;

use sifbox_engine::disk::{Removal, Reused};

/// The most file systems of one size a worker keeps.
const MOST: usize = 3;

thread_local! {
    static DISKS: RefCell<Vec<Reused>> = const { RefCell::new(Vec::new()) };
}

/// A layer of `size_mib` for a sandbox whose root is `owner` (host ids):
/// its mount (for [`sifbox_engine::StartOptions::disk_layer`]) and its
/// removal (for after the sandbox); `None` when the sandbox is to make its
/// own (none free, or making one failed: the supervisor's own attempt
/// says why, if it fails too).
pub(super) fn layer(
    scratch: &Path,
    size_mib: u64,
    owner: (u32, u32),
) -> Option<(std::os::fd::OwnedFd, Removal)> {
    DISKS.with(|d| {
        let mut disks = d.borrow_mut();
        let of_size = disks.iter().filter(|r| r.size_mib() == size_mib).count();
        let free = disks
            .iter_mut()
            .position(|r| r.size_mib() == size_mib && r.free());
        let i = match free {
            Some(i) => i,
            None if of_size < MOST => {
                let mkfs = sifbox_engine::disk::mkfs_path()?;
                match Reused::new(size_mib, scratch, &mkfs) {
                    Ok(r) => {
                        disks.push(r);
                        disks.len() - 1
                    }
                    Err(e) => {
                        tracing::debug!("a reused disk-backed file system: {e}");
                        return None;
                    }
                }
            }
            None => return None,
        };
        match disks[i].layer(owner) {
            Ok(l) => Some(l.split()),
            Err(e) => {
                tracing::debug!("a layer on a reused disk-backed file system: {e}");
                None
            }
        }
    })
}
