//! Whether overlayfs mounts in a user namespace, tried in a child on the
//! file systems sifbox uses.

use std::fs::{self, DirBuilder, Permissions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::thread::UnshareFlags;

use super::child::{run_child, ChildVerdict};
use super::userns::{map_self, unshare};
use super::{errno_text, fs_type_name, io_text, Check, FIX_BROKEN_CHILD};

/// The scratch dir of the overlay child with process id `pid`.
fn overlay_scratch_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("sifbox-doctor-overlay.{pid}"))
}

pub(super) fn check_overlay(self_exe: &Path, userns_ok: bool) -> Check {
    const NAME: &str = "overlayfs in a user namespace";
    let run = run_child(self_exe, "overlay");
    // The child removes its scratch dir; if it was killed or failed half-way, the
    // mount is gone with its namespace and the parent removes what is left.
    let mut leftover = None;
    if let Some(pid) = run.pid {
        let dir = overlay_scratch_dir(pid);
        if fs::symlink_metadata(&dir).is_ok() {
            if let Err(e) = remove_tree(&dir) {
                leftover = Some(format!(
                    "; could not remove {}: {}",
                    dir.display(),
                    io_text(&e)
                ));
            }
        }
    }
    let leftover = leftover.unwrap_or_default();
    match run.verdict {
        ChildVerdict::Works(note) if leftover.is_empty() => Check::ok(NAME, note),
        ChildVerdict::Works(note) => Check::optional(
            NAME,
            format!("{note}{leftover}"),
            "remove the leftover directory by hand",
        ),
        ChildVerdict::Broken(why) => {
            Check::fail(NAME, format!("{why}{leftover}"), FIX_BROKEN_CHILD)
        }
        ChildVerdict::Refused(why) if !userns_ok => Check::fail(
            NAME,
            format!("{why}{leftover}"),
            "fix \"user namespaces\" first: the sandbox root is an overlay mounted inside one",
        ),
        ChildVerdict::Refused(why) => Check::fail(
            NAME,
            format!("{why}{leftover}"),
            "sandbox roots are overlays (image below, the sandbox's own upper dir above) \
             mounted in a user namespace: that needs Linux 5.11 or newer and an upper dir \
             on a local file system (ext4, xfs, btrfs or tmpfs; not NFS or another \
             overlay): point TMPDIR and SIFBOX_RUNTIME at one",
        ),
    }
}

/// `sifbox __doctor-child overlay`.
pub(super) fn child_overlay() -> Result<String, String> {
    let euid = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    let base = overlay_scratch_dir(std::process::id());
    // Our pid is ours now: anything under this name is a leftover of a dead process.
    if fs::symlink_metadata(&base).is_ok() {
        remove_tree(&base)
            .map_err(|e| format!("remove stale {}: {}", base.display(), io_text(&e)))?;
    }
    DirBuilder::new()
        .mode(0o700)
        .create(&base)
        .map_err(|e| format!("create {}: {}", base.display(), io_text(&e)))?;
    let result = overlay_in(&base, euid, egid);
    let _ = std::env::set_current_dir("/");
    let cleanup = remove_tree(&base);
    match (result, cleanup) {
        (Ok(note), Ok(())) => Ok(note),
        (Ok(_), Err(e)) => Err(format!(
            "overlay works, but removing {} failed: {}",
            base.display(),
            io_text(&e)
        )),
        (Err(why), _) => Err(why),
    }
}

/// Mounts an overlay from `base/{lower,upper,work}` on `base/merged` in new user and
/// mount namespaces, writes through it, and unmounts it.
fn overlay_in(base: &Path, euid: u32, egid: u32) -> Result<String, String> {
    for sub in ["lower", "upper", "work", "merged"] {
        let dir = base.join(sub);
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("create {}: {}", dir.display(), io_text(&e)))?;
    }
    let lower_file = base.join("lower/from-lower");
    fs::write(&lower_file, b"lower\n")
        .map_err(|e| format!("write {}: {}", lower_file.display(), io_text(&e)))?;
    let fs_name = fs_type_name(base);

    unshare(
        UnshareFlags::NEWUSER | UnshareFlags::NEWNS,
        "CLONE_NEWUSER|CLONE_NEWNS",
    )?;
    map_self(euid, egid)?;
    rustix::mount::mount_change(
        "/",
        rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
    )
    .map_err(|e| format!("make / rprivate: {}", errno_text(e)))?;

    // Relative paths keep the option string free of whatever TMPDIR contains
    // (a ',' or ':' in it would break the option parser).
    std::env::set_current_dir(base)
        .map_err(|e| format!("chdir {}: {}", base.display(), io_text(&e)))?;
    let plain = "lowerdir=lower,upperdir=upper,workdir=work";
    let userxattr = match mount_overlay(plain) {
        Ok(()) => false,
        Err(Errno::INVAL) => {
            mount_overlay(&format!("{plain},userxattr")).map_err(|e| {
                format!(
                    "mount overlay (upper on {fs_name}): EINVAL, and with userxattr: {}{}",
                    errno_text(e),
                    overlay_hint(e, &fs_name)
                )
            })?;
            true
        }
        Err(e) => {
            return Err(format!(
                "mount overlay (upper on {fs_name}): {}{}",
                errno_text(e),
                overlay_hint(e, &fs_name)
            ))
        }
    };

    let probe = write_through(base);
    let unmounted =
        rustix::mount::unmount(base.join("merged"), rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| format!("unmount overlay: {}", errno_text(e)));
    probe?;
    unmounted?;
    Ok(format!(
        "works (upper on {fs_name} under {}{})",
        std::env::temp_dir().display(),
        if userxattr { ", needs userxattr" } else { "" }
    ))
}

fn mount_overlay(options: &str) -> Result<(), Errno> {
    let data = std::ffi::CString::new(options).map_err(|_| Errno::INVAL)?;
    rustix::mount::mount(
        "overlay",
        "merged",
        "overlay",
        rustix::mount::MountFlags::empty(),
        data.as_c_str(),
    )
}

fn overlay_hint(e: Errno, fs_name: &str) -> String {
    match e {
        Errno::PERM => {
            "; this kernel does not allow overlayfs in a user namespace (Linux 5.11+)".to_owned()
        }
        Errno::NODEV => "; the overlay file system is not available (modprobe overlay)".to_owned(),
        Errno::INVAL if matches!(fs_name, "overlayfs" | "nfs" | "fuse" | "9p" | "cifs") => {
            format!("; {fs_name} cannot hold an overlay upper dir: set TMPDIR to a local disk")
        }
        _ => String::new(),
    }
}

/// Writes a file through `base/merged` and checks that it landed in `base/upper`.
fn write_through(base: &Path) -> Result<(), String> {
    let seen = fs::read(base.join("merged/from-lower"))
        .map_err(|e| format!("read lower file through the overlay: {}", io_text(&e)))?;
    if seen != b"lower\n" {
        return Err("the overlay shows the wrong content for a lower file".to_owned());
    }
    let content = b"written through the overlay\n";
    fs::write(base.join("merged/probe"), content)
        .map_err(|e| format!("write through the overlay: {}", io_text(&e)))?;
    match fs::read(base.join("upper/probe")) {
        Ok(bytes) if bytes == content => Ok(()),
        Ok(_) => Err("the file written through the overlay has other content in upper".to_owned()),
        Err(e) => Err(format!(
            "the file written through the overlay is not in the upper dir: {}",
            io_text(&e)
        )),
    }
}

/// Removes a tree without following symlinks, first making directories searchable
/// and writable (overlay leaves `work/work` with mode 000).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    if meta.permissions().mode() & 0o700 != 0o700 {
        let _ = fs::set_permissions(path, Permissions::from_mode(0o700));
    }
    for entry in fs::read_dir(path)? {
        remove_tree(&entry?.path())?;
    }
    fs::remove_dir(path)
}
