//! Assembling a sandbox's root file system inside its private mount namespace.
//!
//! Runs in the supervisor after it unshared the mount namespace, before
//! pivot_root. Layout under the sandbox's runtime dir (`m/`, a small tmpfs
//! that only this namespace sees):
//!
//! ```text
//! m/upper, m/work   overlay upper and work dirs (--writable-tmpfs)
//! m/root            the overlay: image read-only below, upper above
//! ```
//!
//! Every mount point inside the new root is resolved with
//! `openat2(RESOLVE_IN_ROOT)`, so a symlink in the image (`/proc -> /etc`, an
//! absolute `/tmp -> /`) can never redirect a mount onto the host. Binds use the
//! fd-based mount API (open_tree, mount_setattr, move_mount), so read-only is
//! applied to the detached tree before it becomes visible.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
use rustix::mount::{
    mount, mount_change, move_mount, open_tree, unmount, MountFlags, MountPropagationFlags,
    MoveMountFlags, OpenTreeFlags, UnmountFlags,
};

use crate::error::{Error, Result};
use crate::spec::{NetMode, SandboxSpec, Writable};

fn sys_err(what: String) -> impl FnOnce(rustix::io::Errno) -> Error {
    move |e| Error::Setup(format!("{what}: {}", std::io::Error::from(e)))
}

/// What kind of mount point to create when it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

/// The root being assembled.
#[derive(Debug)]
pub struct NewRoot {
    /// Host path of the overlay mount (`<dir>/m/root`).
    pub path: PathBuf,
    fd: OwnedFd,
}

impl NewRoot {
    /// Opens (creating what is missing) `inside`, an absolute path in the
    /// new root, without ever leaving it; returns an `O_PATH` fd.
    pub fn ensure(&self, inside: &Path, kind: Kind) -> Result<OwnedFd> {
        self.ensure_within(inside, kind, 0)
    }

    fn ensure_within(&self, inside: &Path, kind: Kind, links: u32) -> Result<OwnedFd> {
        const MAX_LINKS: u32 = 40;
        if links > MAX_LINKS {
            return Err(Error::Setup(format!(
                "creating {} in the sandbox: too many levels of symbolic links",
                inside.display()
            )));
        }
        let rel = relative(inside);
        let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        let open = |p: &Path| {
            rustix::fs::openat2(
                &self.fd,
                p,
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                how,
            )
        };
        match open(&rel) {
            Ok(fd) => return Ok(fd),
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                return Err(sys_err(format!(
                    "opening {} in the sandbox",
                    inside.display()
                ))(e))
            }
        }
        let name = rel.file_name().ok_or_else(|| {
            Error::Setup(format!("cannot create {} in the sandbox", inside.display()))
        })?;
        let parent = match rel.parent() {
            Some(p) if !p.as_os_str().is_empty() => {
                self.ensure_within(&Path::new("/").join(p), Kind::Dir, links)?
            }
            _ => open(Path::new(".")).map_err(sys_err("opening the sandbox root".into()))?,
        };
        // The parent was resolved inside the root; the new entry is created
        // in it by name, so nothing here follows a symlink.
        let made = match kind {
            Kind::Dir => rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)),
            Kind::File => rustix::fs::openat(
                &parent,
                name,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map(drop),
        };
        match made {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => {
                // A dangling symlink: create its target, resolved inside the
                // root like any other path.
                if let Ok(target) = rustix::fs::readlinkat(&parent, name, Vec::new()) {
                    let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                    let next = Path::new("/")
                        .join(rel.parent().unwrap_or(Path::new("")))
                        .join(target);
                    return self.ensure_within(&next, kind, links + 1);
                }
            }
            Err(e) => {
                return Err(sys_err(format!(
                    "creating {} in the sandbox",
                    inside.display()
                ))(e))
            }
        }
        open(&rel).map_err(sys_err(format!(
            "opening {} in the sandbox",
            inside.display()
        )))
    }
}

/// `/a/b` -> `a/b`, dropping `.`; `..` is kept for openat2, which clamps it
/// at the root (RESOLVE_IN_ROOT).
fn relative(inside: &Path) -> PathBuf {
    inside
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            Component::ParentDir => Some(std::ffi::OsStr::new("..")),
            _ => None,
        })
        .collect()
}

/// Escapes a path for an overlayfs option value (`,` `:` `\` are special).
fn overlay_escape(p: &Path) -> String {
    let mut out = String::new();
    for ch in p.to_string_lossy().chars() {
        if matches!(ch, ',' | ':' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

fn mount_fs(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> std::result::Result<(), rustix::io::Errno> {
    let data = std::ffi::CString::new(data).map_err(|_| rustix::io::Errno::INVAL)?;
    mount(source, target, fstype, flags, Some(data.as_c_str()))
}

fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Binds host `src` (recursively) onto the O_PATH fd `target`, read-only if
/// asked. The tree is cloned detached, made read-only, then attached.
pub fn bind(src: &Path, target: BorrowedFd<'_>, readonly: bool, what: &str) -> Result<()> {
    let tree = open_tree(
        CWD,
        src,
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(sys_err(format!(
        "{what}: cloning the mount at {}",
        src.display()
    )))?;
    if readonly {
        sifbox_sys::make_readonly_fd(tree.as_fd())
            .map_err(|e| Error::Setup(format!("{what}: making it read-only: {e}")))?;
    }
    move_mount(
        &tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(sys_err(format!("{what}: attaching the mount")))
}

/// Mounts the overlay and everything inside it; returns the new root.
pub fn assemble(spec: &SandboxSpec, dir: &Path) -> Result<NewRoot> {
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(sys_err("making the mount namespace private".into()))?;

    let m = dir.join("m");
    let (upper, work, tmpfs_data) = match &spec.writable {
        Writable::Tmpfs { size_mib } => (
            m.join("upper"),
            m.join("work"),
            format!("mode=0755,size={size_mib}m"),
        ),
        Writable::Overlay { dir } => (
            dir.join("upper"),
            dir.join("work"),
            "mode=0755,size=1m".into(),
        ),
    };
    mount_fs(
        "sifbox",
        &m,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        &tmpfs_data,
    )
    .map_err(sys_err(format!("mounting a tmpfs on {}", m.display())))?;
    let root_path = m.join("root");
    for d in [&root_path, &upper, &work] {
        std::fs::create_dir_all(d)
            .map_err(|e| Error::Setup(format!("creating {}: {e}", d.display())))?;
    }
    let mut lower = String::new();
    for l in &spec.layers {
        lower.push_str(&overlay_escape(l));
        lower.push(':');
    }
    lower.push_str(&overlay_escape(&spec.rootfs));
    let opts = format!(
        "lowerdir={lower},upperdir={},workdir={}",
        overlay_escape(&upper),
        overlay_escape(&work)
    );
    // We are always in a user namespace here, where overlayfs cannot use
    // trusted.* xattrs: ask for user.* ones (without this the kernel falls
    // back to fewer features and logs warnings on every mount).
    mount_fs(
        "sifbox-overlay",
        &root_path,
        "overlay",
        MountFlags::empty(),
        &format!("{opts},userxattr"),
    )
    .or_else(|_| mount_fs("sifbox-overlay", &root_path, "overlay", MountFlags::empty(), &opts))
        .map_err(|e| {
            Error::Setup(format!(
                "mounting the overlay root (image {}): {}; run `sifbox doctor` to see whether overlayfs works in a user namespace here",
                spec.rootfs.display(),
                std::io::Error::from(e)
            ))
        })?;
    let fd = rustix::fs::open(
        &root_path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(sys_err(format!("opening {}", root_path.display())))?;
    let root = NewRoot {
        path: root_path,
        fd,
    };

    mount_proc(&root)?;
    mount_dev(&root)?;
    if !spec.image_tmp {
        let tmp = root.ensure(Path::new("/tmp"), Kind::Dir)?;
        mount_fs(
            "tmpfs",
            &fd_path(tmp.as_fd()),
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            "mode=1777",
        )
        .map_err(sys_err("mounting /tmp".into()))?;
    }
    mount_sys(&root, spec.net);
    if spec.host_dns && spec.net == NetMode::Host {
        for f in ["/etc/resolv.conf", "/etc/hosts"] {
            bind_host_file_if_possible(&root, Path::new(f));
        }
    }
    for b in &spec.binds {
        let is_dir = std::fs::metadata(&b.src)
            .map(|m| m.is_dir())
            .map_err(|e| Error::Setup(format!("--bind {}: {e}", b.src.display())))?;
        let target = root.ensure(&b.dst, if is_dir { Kind::Dir } else { Kind::File })?;
        bind(
            &b.src,
            target.as_fd(),
            b.readonly,
            &format!("--bind {}:{}", b.src.display(), b.dst.display()),
        )?;
    }
    Ok(root)
}

/// A fresh /proc for the new pid namespace, with the host-wide knobs in it
/// read-only and the kernel-memory files masked.
fn mount_proc(root: &NewRoot) -> Result<()> {
    let target = root.ensure(Path::new("/proc"), Kind::Dir)?;
    let target_path = fd_path(target.as_fd());
    mount_fs(
        "proc",
        &target_path,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "",
    )
    .map_err(|e| {
        Error::Setup(format!(
            "mounting /proc: {}; the host may hide parts of its own /proc (as inside a container), which forbids a new proc mount",
            std::io::Error::from(e)
        ))
    })?;
    let proc_dir = root.path.join("proc");
    for knob in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        let p = proc_dir.join(knob);
        if p.exists() {
            let fd = rustix::fs::open(&p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                .map_err(sys_err(format!("opening /proc/{knob}")))?;
            bind(&p, fd.as_fd(), true, &format!("read-only /proc/{knob}"))?;
        }
    }
    for secret in [
        "kcore",
        "keys",
        "timer_list",
        "sched_debug",
        "latency_stats",
    ] {
        let p = proc_dir.join(secret);
        if p.is_file() {
            let fd = rustix::fs::open(&p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                .map_err(sys_err(format!("opening /proc/{secret}")))?;
            bind(
                Path::new("/dev/null"),
                fd.as_fd(),
                true,
                &format!("masking /proc/{secret}"),
            )?;
        }
    }
    Ok(())
}

/// A minimal /dev: a 0755 tmpfs (with the sticky 1777 default, `>` onto the
/// bound /dev/null fails), the harmless host devices bound in, a private
/// devpts, /dev/shm, and the fd links.
fn mount_dev(root: &NewRoot) -> Result<()> {
    let target = root.ensure(Path::new("/dev"), Kind::Dir)?;
    mount_fs(
        "tmpfs",
        &fd_path(target.as_fd()),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=0755,size=1m",
    )
    .map_err(sys_err("mounting /dev".into()))?;
    let dev = root.path.join("dev");
    let mkfile = |p: &Path| {
        std::fs::File::create(p).map_err(|e| Error::Setup(format!("creating {}: {e}", p.display())))
    };
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(node);
        if !host.exists() {
            continue;
        }
        let p = dev.join(node);
        mkfile(&p)?;
        let fd = rustix::fs::open(&p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
            .map_err(sys_err(format!("opening {}", p.display())))?;
        bind(&host, fd.as_fd(), false, &format!("/dev/{node}"))?;
    }
    let pts = dev.join("pts");
    std::fs::create_dir(&pts).map_err(|e| Error::Setup(format!("creating /dev/pts: {e}")))?;
    mount_fs(
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )
    .map_err(sys_err("mounting /dev/pts".into()))?;
    let shm = dev.join("shm");
    std::fs::create_dir(&shm).map_err(|e| Error::Setup(format!("creating /dev/shm: {e}")))?;
    mount_fs(
        "shm",
        &shm,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        "mode=1777",
    )
    .map_err(sys_err("mounting /dev/shm".into()))?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))
            .map_err(|e| Error::Setup(format!("creating /dev/{link}: {e}")))?;
    }
    Ok(())
}

/// /sys read-only where the kernel permits: a fresh sysfs when the sandbox
/// owns its network namespace, else the host's, bound and made read-only.
/// Left empty when neither is allowed.
fn mount_sys(root: &NewRoot, net: NetMode) {
    let Ok(target) = root.ensure(Path::new("/sys"), Kind::Dir) else {
        return;
    };
    if net == NetMode::None {
        let flags =
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        if mount_fs("sysfs", &fd_path(target.as_fd()), "sysfs", flags, "").is_ok() {
            return;
        }
    }
    if let Err(e) = bind(Path::new("/sys"), target.as_fd(), true, "/sys") {
        tracing::debug!("leaving /sys empty: {e}");
    }
}

fn bind_host_file_if_possible(root: &NewRoot, file: &Path) {
    if !file.is_file() {
        return;
    }
    match root.ensure(file, Kind::File) {
        Ok(target) => {
            if let Err(e) = bind(file, target.as_fd(), true, &file.display().to_string()) {
                tracing::debug!("not binding {}: {e}", file.display());
            }
        }
        Err(e) => tracing::debug!("not binding {}: {e}", file.display()),
    }
}

/// Makes `root` the root of this mount namespace and detaches the old one.
pub fn pivot(root: &NewRoot) -> Result<()> {
    rustix::process::chdir(&root.path)
        .map_err(sys_err(format!("chdir {}", root.path.display())))?;
    rustix::process::pivot_root(".", ".").map_err(sys_err("pivot_root".into()))?;
    unmount(".", UnmountFlags::DETACH).map_err(sys_err("detaching the old root".into()))?;
    rustix::process::chdir("/").map_err(sys_err("chdir /".into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_overlay_specials() {
        assert_eq!(overlay_escape(Path::new("/a,b:c\\d")), "/a\\,b\\:c\\\\d");
        assert_eq!(overlay_escape(Path::new("/plain/path")), "/plain/path");
    }

    #[test]
    fn relative_drops_root() {
        assert_eq!(relative(Path::new("/a/./b/")), PathBuf::from("a/b"));
        assert_eq!(relative(Path::new("/")), PathBuf::new());
    }

    #[test]
    fn ensure_stays_inside_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let rootp = dir.path().join("root");
        std::fs::create_dir(&rootp).expect("mkdir");
        // An absolute symlink that would point at the host if followed naively.
        std::os::unix::fs::symlink(outside.path(), rootp.join("evil")).expect("symlink");
        let fd = rustix::fs::open(&rootp, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .expect("open");
        let root = NewRoot {
            path: rootp.clone(),
            fd,
        };
        root.ensure(Path::new("/evil/x/y"), Kind::Dir)
            .expect("ensure");
        root.ensure(Path::new("/f/file"), Kind::File)
            .expect("ensure file");
        assert!(rootp.join("f/file").is_file());
        // Resolved inside the root: the target of the symlink was taken
        // relative to the root, not the host.
        let inside_target = rootp.join(outside.path().strip_prefix("/").expect("abs"));
        assert!(inside_target.join("x/y").is_dir());
        assert!(!outside.path().join("x").exists());
    }
}
