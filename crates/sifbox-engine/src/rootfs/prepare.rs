//! The private mount namespace's writable layer and the overlay root over
//! the image's layers ([`prepare_root`]), every mount through the syscall
//! seam.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{MountAttrFlags, MountPropagationFlags};
use sifbox_sys::syscall::{FsParam, Syscall};

use super::apply::{attach, make_fs};
use super::error::{sys_err, Result, RootfsError};
use super::lookup::NewRoot;
use super::{layer_dir_name, Attrs, Fs};
use crate::spec::{SandboxSpec, Writable};
use sifbox_sys::beneath;

/// Escapes a path for an overlayfs option value (`,` `:` `\` are special).
pub(super) fn overlay_escape(p: &Path) -> String {
    let mut out = String::new();
    for ch in p.to_string_lossy().chars() {
        if matches!(ch, ',' | ':' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn open_dir(p: &Path, nofollow: bool) -> Result<OwnedFd> {
    let mut flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if nofollow {
        flags |= OFlags::NOFOLLOW;
    }
    rustix::fs::open(p, flags, Mode::empty()).map_err(sys_err(format!("opening {}", p.display())))
}

/// Makes the private mount namespace's writable layer at `m/` in the
/// runtime dir `dir` (a tmpfs; `disk`, the detached ext4 mount outer made
/// for [`Writable::Disk`]; or a small tmpfs beside `--overlay DIR`) and the
/// overlay root over the image's layers; returns the root, ready for
/// [`apply`].
pub fn prepare_root(
    sys: &dyn Syscall,
    spec: &SandboxSpec,
    dir: &Path,
    disk: Option<OwnedFd>,
) -> Result<NewRoot> {
    sys.mount_propagation(
        Path::new("/"),
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(sys_err("making the mount namespace private"))?;
    let tmpfs_bytes = match &spec.writable {
        Writable::Tmpfs { size_mib } => size_mib.saturating_mul(1 << 20),
        Writable::Overlay { .. } | Writable::Disk { .. } => 1 << 20,
    };
    let m_target = open_dir(&dir.join("m"), true)?;
    let m = match (&spec.writable, disk) {
        (Writable::Disk { .. }, Some(disk)) => disk,
        (Writable::Disk { .. }, None) => return Err(RootfsError::NoDisk),
        _ => make_fs(
            sys,
            &Fs::Tmpfs {
                mode: 0o755,
                size: tmpfs_bytes,
            },
            Attrs {
                nosuid: true,
                nodev: true,
                ..Attrs::default()
            },
            "the writable layer",
        )?,
    };
    attach(sys, &m, m_target.as_fd(), "the writable layer")?;
    // On ext4 each directory of the root starts in a block group of its
    // own (the Orlov allocator spreads them), and the first allocation in
    // a group sets up its bitmaps (0.27 ms each at a start): the three go
    // under one directory there, in its group.
    let m = if matches!(spec.writable, Writable::Disk { .. }) {
        rustix::fs::mkdirat(&m, "l", Mode::from_raw_mode(0o755))
            .map_err(sys_err("creating m/l"))?;
        beneath::open_beneath(&m, Path::new("l"), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(sys_err("opening m/l"))?
    } else {
        m
    };
    let mkdir = |name: &str| {
        rustix::fs::mkdirat(&m, name, Mode::from_raw_mode(0o755))
            .map_err(sys_err(format!("creating m/{name}")))
    };
    mkdir("root")?;
    for i in 0..spec.layer_dirs.len() {
        mkdir(&layer_dir_name(i))?;
    }
    let (upper, work) = match &spec.writable {
        Writable::Tmpfs { .. } | Writable::Disk { .. } => {
            mkdir("upper")?;
            mkdir("work")?;
            (
                beneath::open_beneath(&m, Path::new("upper"), OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(sys_err("opening m/upper"))?,
                beneath::open_beneath(&m, Path::new("work"), OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(sys_err("opening m/work"))?,
            )
        }
        Writable::Overlay { dir } => {
            let d = open_dir(dir, false)?;
            let sub = |n: &str| {
                beneath::open_beneath(&d, Path::new(n), OFlags::PATH | OFlags::DIRECTORY)
                    .map_err(sys_err(format!("opening {}/{n}", dir.display())))
            };
            (sub("upper")?, sub("work")?)
        }
    };
    // Every layer by fd: the option string names only /proc/self/fd/N, so
    // the sandbox's mountinfo shows no host path.
    let mut lowers = Vec::new();
    for l in spec.layers.iter().chain(std::iter::once(&spec.rootfs)) {
        lowers.push(open_dir(l, false)?);
    }
    if let Some(tree) = lowers.last() {
        remake_modes(tree, &upper);
    }
    let lower = lowers
        .iter()
        .map(|fd| overlay_escape(&fd_path(fd)))
        .collect::<Vec<_>>()
        .join(":");
    let root_target =
        beneath::open_beneath(&m, Path::new("root"), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(sys_err("opening m/root"))?;
    // The new mount API first, one layer per `lowerdir+` (Linux 6.8: no
    // limit on the number of layers, where an fsconfig string holds 256
    // bytes); else mount(2), whose options hold a page (some 200 layers
    // named by fd).
    let upper_s = overlay_escape(&fd_path(&upper));
    let work_s = overlay_escape(&fd_path(&work));
    let new_api = |userxattr: bool| -> Result<()> {
        let lowers: Vec<String> = lowers
            .iter()
            .map(|fd| overlay_escape(&fd_path(fd)))
            .collect();
        let mut params = vec![FsParam::set("source", "sifbox-overlay").optional()];
        params.extend(lowers.iter().map(|l| FsParam::set("lowerdir+", l)));
        params.push(FsParam::set("upperdir", &upper_s));
        params.push(FsParam::set("workdir", &work_s));
        if userxattr {
            // We are always in a user namespace here, where overlayfs
            // cannot use trusted.* xattrs: ask for user.* ones.
            params.push(FsParam::flag("userxattr"));
        }
        let ovl = sys
            .fs_mount("overlay", &params, MountAttrFlags::empty())
            .map_err(|source| RootfsError::Fs {
                step: "the overlay".into(),
                source,
            })?;
        attach(sys, &ovl, root_target.as_fd(), "the overlay root")
    };
    let legacy = |userxattr: bool| -> Result<()> {
        let mut opts = format!("lowerdir={lower},upperdir={upper_s},workdir={work_s}");
        if userxattr {
            opts.push_str(",userxattr");
        }
        let data = std::ffi::CString::new(opts).map_err(|_| RootfsError::OverlayNul)?;
        sys.mount(
            "sifbox-overlay",
            fd_path(&root_target).as_path(),
            "overlay",
            rustix::mount::MountFlags::empty(),
            Some(data.as_c_str()),
        )
        .map_err(sys_err("mount(overlay)"))
    };
    new_api(true)
        .or_else(|e| {
            tracing::debug!("the mount API's overlay failed ({e}); using mount(2)");
            legacy(true)
        })
        .or_else(|_| legacy(false))
        .map_err(|e| RootfsError::Overlay {
            image: spec.rootfs.clone(),
            source: Box::new(e),
        })?;
    // The overlay is what m/root shows now.
    let fd = beneath::open_beneath(&m, Path::new("root"), OFlags::PATH | OFlags::DIRECTORY)
        .map_err(sys_err("opening the overlay root"))?;
    Ok(NewRoot {
        layer: Some(m),
        upper: spec.keep_layer.is_some().then_some(upper),
        ..NewRoot::bare(fd)
    })
}

/// The record a shared store's tree has at its root of the modes that were
/// closed to group and world writes there (`sifbox_image::setid::
/// MODES_RECORD`: JSON `[[path, mode, is_dir], ...]`).
const MODES_RECORD: &str = ".sifbox-modes";

/// Re-makes, in the sandbox's own upper layer `upper`, the directories the
/// tree `lower` records in [`MODES_RECORD`] with the modes the image gave
/// them: a merged directory takes its mode from the upper one, so `/tmp`
/// is 1777 inside while the shared tree's is not writable by the group.
/// Parents made on the way get the tree's modes. Best effort: a record that
/// is missing, too big or malformed, or an entry that cannot be made, is
/// left (the directory then stays as the tree has it).
fn remake_modes(lower: &OwnedFd, upper: &OwnedFd) {
    use std::io::Read as _;
    let Ok(fd) = beneath::open_beneath(
        lower,
        MODES_RECORD,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
    ) else {
        return;
    };
    let mut text = Vec::new();
    if std::fs::File::from(fd)
        .take((1 << 20) + 1)
        .read_to_end(&mut text)
        .is_err()
        || text.len() > 1 << 20
    {
        return;
    }
    let Ok(record) = serde_json::from_slice::<Vec<(String, u32, bool)>>(&text) else {
        return;
    };
    for (path, mode, dir) in record {
        if !dir || path.is_empty() {
            continue;
        }
        let parts: Vec<&std::ffi::OsStr> = match Path::new(&path)
            .components()
            .map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            Some(p) if !p.is_empty() => p,
            _ => continue,
        };
        let mut made = PathBuf::new();
        let mut cur: Option<OwnedFd> = None;
        for (i, name) in parts.iter().enumerate() {
            made.push(name);
            let last = i + 1 == parts.len();
            let parent = cur.as_ref().map_or(upper.as_fd(), AsFd::as_fd);
            let fresh = match rustix::fs::mkdirat(parent, *name, Mode::from_raw_mode(0o700)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(_) => break,
            };
            let Ok(next) = rustix::fs::openat(
                parent,
                *name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                break;
            };
            let want = if last {
                Some(mode & 0o7777)
            } else if fresh {
                // The tree's own mode for a parent made on the way.
                beneath::open_beneath(lower, &made, OFlags::PATH)
                    .and_then(|p| rustix::fs::fstat(&p))
                    .ok()
                    .map(|st| st.st_mode & 0o7777)
            } else {
                None
            };
            if let Some(m) = want {
                let _ = rustix::fs::fchmod(&next, Mode::from_raw_mode(m));
            }
            cur = Some(next);
        }
    }
}
