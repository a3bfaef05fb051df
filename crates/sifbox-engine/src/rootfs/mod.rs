//! Assembling a sandbox's root file system inside its private mount namespace.
//!
//! Runs in the supervisor (init) after it unshared the mount namespace,
//! before pivot_root, in two halves:
//!
//! - [`plan`] turns a [`SandboxSpec`] into a list of [`Step`]s: data, made
//!   without a system call, unit-tested without privileges.
//! - [`apply`] carries the steps out, every one relative to a file
//!   descriptor: the overlay root, or a mount that an earlier step made.
//!
//! Every mount, the pivot and the propagation change go through the
//! syscall seam, a `&dyn` [`Syscall`] handed down from init
//! ([`sifbox_sys::syscall::Kernel`] there, the recording fake in the unit
//! tests of `seam_tests.rs`, which assert what is applied). The module is
//! split: `lookup.rs` (the [`NewRoot`] and the lookups beneath it),
//! `apply.rs` (the steps), `prepare.rs` (the writable layer and the
//! overlay), `error.rs` ([`RootfsError`]).
//!
//! The image is hostile. Where it may shape a path (a bind's destination,
//! `/tmp`), the path is resolved with `openat2(RESOLVE_IN_ROOT)`, so its
//! symlinks are followed as if the root were `/` and never lead out. Where
//! sifbox mounts its own file systems (`/proc`, `/dev`, `/sys`), the image
//! must have a plain directory (`RESOLVE_NO_SYMLINKS`), or the start fails
//! naming the path. Covers and masks inside those mounts are looked up
//! beneath the mount's own fd, without following anything, and a cover that
//! cannot be applied fails the start. File systems are made with
//! `fsopen`/`fsmount` and binds with `open_tree`, made read-only while
//! detached, then attached with `move_mount`: nothing is mounted by a path
//! name the image could have redirected.
//!
//! The writable layer and the overlay (prepared by [`prepare_root`]) live
//! on a tmpfs (or the disk-backed ext4 of [`crate::disk`]) at `m/` in the
//! runtime dir that only this mount namespace sees; the overlay's layers
//! are named to the kernel as `/proc/self/fd/N`, so no host path shows in the sandbox's `/proc/self/mountinfo`.

mod apply;
pub(crate) mod error;
mod lookup;
mod prepare;
#[cfg(test)]
mod seam_tests;

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::mount::MountAttrFlags;
use sifbox_sys::syscall::Syscall;

pub use apply::{apply, attach_guarded, pivot, tmpfs_inodes, TMPFS_BYTES_PER_INODE};
pub use error::RootfsError;
pub use lookup::NewRoot;
pub use prepare::prepare_root;

use crate::spec::{NetMode, SandboxSpec};

/// The mounts that later steps look paths up beneath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Base {
    /// The overlay root.
    Root,
    /// The sandbox's `/proc`.
    Proc,
    /// The sandbox's `/dev` tmpfs.
    Dev,
    /// The sandbox's `/sys`.
    Sys,
}

/// What to create when a looked-up path is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    Dir,
    File,
    /// Whatever the bind's source is.
    LikeSource,
}

/// How a step's path is looked up beneath its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A path the image may shape: symlinks are followed as if the root
    /// were `/` (`RESOLVE_IN_ROOT`); what is missing is created.
    Image(Create),
    /// A directory of the image itself: no symlink on the way and a
    /// directory at the end (made when missing); anything else fails the
    /// start.
    RealDir,
    /// Exactly this path beneath one of sifbox's own mounts, following
    /// nothing; when it (or the mount) is absent the step is skipped: there
    /// is nothing to cover.
    IfPresent,
    /// Made anew beneath one of sifbox's own mounts (dir or file).
    New(Create),
}

/// Where a step acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub base: Base,
    /// Relative to the base: plain names only (no `/`, `.`, `..` parts).
    pub path: PathBuf,
    pub lookup: Lookup,
}

impl At {
    fn new(base: Base, path: &str, lookup: Lookup) -> At {
        At {
            base,
            path: relative(Path::new(path)),
            lookup,
        }
    }

    /// The path as the sandbox will see it, for messages.
    pub fn shown(&self) -> String {
        let base = match self.base {
            Base::Root => "",
            Base::Proc => "/proc",
            Base::Dev => "/dev",
            Base::Sys => "/sys",
        };
        if self.path.as_os_str().is_empty() {
            return if base.is_empty() {
                "/".into()
            } else {
                base.into()
            };
        }
        format!("{base}/{}", self.path.display())
    }
}

/// A file system sifbox makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fs {
    /// `size` in bytes.
    Tmpfs {
        mode: u32,
        size: u64,
    },
    Proc,
    Devpts,
}

/// Mount attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl Attrs {
    const NOSUID_NODEV_NOEXEC: Attrs = Attrs {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: true,
    };

    fn flags(self) -> MountAttrFlags {
        let mut f = MountAttrFlags::empty();
        for (on, flag) in [
            (self.readonly, MountAttrFlags::MOUNT_ATTR_RDONLY),
            (self.nosuid, MountAttrFlags::MOUNT_ATTR_NOSUID),
            (self.nodev, MountAttrFlags::MOUNT_ATTR_NODEV),
            (self.noexec, MountAttrFlags::MOUNT_ATTR_NOEXEC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }
}

/// What a host bind may do when it cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any failure fails the start.
    Required,
    /// Skipped when the host has no such path; other failures fail the start.
    IfOnHost,
    /// Skipped on any failure (the host's DNS files: a convenience).
    BestEffort,
}

/// One step of assembling the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A fresh file system at `at`; with `names`, later steps look paths up
    /// beneath it.
    Mount {
        fs: Fs,
        at: At,
        attrs: Attrs,
        names: Option<Base>,
    },
    /// The sandbox's `/sys`: a fresh read-only sysfs when the sandbox has
    /// its own network namespace, else the host's bound read-only; left
    /// empty when the kernel allows neither.
    Sys { at: At, own_netns: bool },
    /// A host path (the caller's choice, so its own symlinks are followed)
    /// bound recursively at `at`, made read-only while still detached.
    BindHost {
        src: PathBuf,
        at: At,
        readonly: bool,
        need: Need,
    },
    /// A guarded bind (see [`crate::spec::GuardedBind`]): the host
    /// directory `src` bound read-only at `at`, and a second, writable
    /// clone of it kept detached ([`NewRoot::take_guarded`]) for the
    /// guarded mount namespace, to be mounted at `dst` there.
    Guarded { src: PathBuf, at: At, dst: PathBuf },
    /// The sandbox's `/sys/fs/cgroup`: only its own cgroup, each of
    /// `views` (a name below `at`, "" for `at` itself, and the host's
    /// directory of the sandbox's cgroup there) bound read-only in a
    /// read-only tmpfs; with no views, an empty read-only tmpfs.
    CgroupView {
        at: At,
        views: Vec<(String, PathBuf)>,
    },
    /// The subtree at `at` covered by a read-only bind of itself.
    ReadOnly { at: At },
    /// `at` hidden: a file under the host's /dev/null, a directory under an
    /// empty read-only tmpfs.
    Mask { at: At },
    /// A directory with `mode`, made only when missing.
    MakeDir { at: At, mode: u32 },
    /// A file of the sandbox's own with `contents`, writable by its root:
    /// made in a small fresh tmpfs and bound over `at` (as Docker binds
    /// its `/etc/hosts`), so the image's file is left as it was.
    File { at: At, contents: Vec<u8> },
    /// A symlink to `target`.
    Symlink { at: At, target: PathBuf },
    /// The writable layer's directory `name` (beside the overlay's upper
    /// and work dirs, seen nowhere else) bound at `at`: what is written
    /// there counts against the layer's size.
    LayerDir { name: String, at: At },
}

/// Size of the tmpfs of a [`Step::File`].
const FILE_TMPFS_BYTES: u64 = 64 << 10;

/// The `/etc/hosts` of a sandbox with a network of its own (`--net none`):
/// the loopback names and the sandbox's host name, as Docker writes one,
/// for programs that connect to `localhost` (test servers, verifiers; an
/// image's own file is often empty, Docker having bound one over it).
pub fn own_hosts(hostname: &str) -> Vec<u8> {
    let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    if !hostname.is_empty() && hostname != "localhost" {
        out.push_str(&format!("127.0.1.1\t{hostname}\n"));
    }
    out.into_bytes()
}

/// Host-wide knobs of /proc, covered read-only (Docker's list).
pub const PROC_READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger"];
/// Files and dirs of /proc that expose the host's kernel state, masked.
pub const PROC_MASKED: &[&str] = &[
    "acpi",
    "asound",
    "kcore",
    "keys",
    "latency_stats",
    "sched_debug",
    "scsi",
    "timer_list",
    "timer_stats",
];
/// Parts of /sys that expose firmware tables and energy counters, masked.
pub const SYS_MASKED: &[&str] = &["firmware", "devices/virtual/powercap"];
/// Host devices bound into /dev.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Size of the /dev tmpfs (only nodes and links live there).
const DEV_TMPFS_BYTES: u64 = 1 << 20;

/// The steps that assemble `spec`'s root on top of its overlay.
pub fn plan(spec: &SandboxSpec) -> Vec<Step> {
    let mut steps = Vec::new();
    // /proc: a fresh proc of the sandbox's pid namespace.
    steps.push(Step::Mount {
        fs: Fs::Proc,
        at: At::new(Base::Root, "proc", Lookup::RealDir),
        attrs: Attrs::NOSUID_NODEV_NOEXEC,
        names: Some(Base::Proc),
    });
    for p in PROC_READ_ONLY {
        steps.push(Step::ReadOnly {
            at: At::new(Base::Proc, p, Lookup::IfPresent),
        });
    }
    for p in PROC_MASKED {
        steps.push(Step::Mask {
            at: At::new(Base::Proc, p, Lookup::IfPresent),
        });
    }
    // /dev: a 0755 tmpfs (with the sticky 1777 default, `>` onto the
    // bound /dev/null fails), the harmless host devices, a private devpts,
    // /dev/shm, and the fd links.
    steps.push(Step::Mount {
        fs: Fs::Tmpfs {
            mode: 0o755,
            size: DEV_TMPFS_BYTES,
        },
        at: At::new(Base::Root, "dev", Lookup::RealDir),
        attrs: Attrs {
            nosuid: true,
            noexec: true,
            ..Attrs::default()
        },
        names: Some(Base::Dev),
    });
    for node in DEV_NODES {
        steps.push(Step::BindHost {
            src: Path::new("/dev").join(node),
            at: At::new(Base::Dev, node, Lookup::New(Create::File)),
            readonly: false,
            need: Need::IfOnHost,
        });
    }
    steps.push(Step::Mount {
        fs: Fs::Devpts,
        at: At::new(Base::Dev, "pts", Lookup::New(Create::Dir)),
        attrs: Attrs {
            nosuid: true,
            noexec: true,
            ..Attrs::default()
        },
        names: None,
    });
    steps.push(Step::Mount {
        fs: Fs::Tmpfs {
            mode: 0o1777,
            size: spec.shm_bytes,
        },
        at: At::new(Base::Dev, "shm", Lookup::New(Create::Dir)),
        attrs: Attrs::NOSUID_NODEV_NOEXEC,
        names: None,
    });
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(Step::Symlink {
            at: At::new(Base::Dev, link, Lookup::New(Create::File)),
            target: PathBuf::from(to),
        });
    }
    // /sys, read-only either way.
    steps.push(Step::Sys {
        at: At::new(Base::Root, "sys", Lookup::RealDir),
        own_netns: spec.net == NetMode::None,
    });
    for p in SYS_MASKED {
        steps.push(Step::Mask {
            at: At::new(Base::Sys, p, Lookup::IfPresent),
        });
    }
    // /tmp is the image's, in the writable layer (so it counts against its
    // size), made world-writable when the image has none.
    steps.push(Step::MakeDir {
        at: At::new(Base::Root, "tmp", Lookup::Image(Create::Dir)),
        mode: 0o1777,
    });
    if spec.host_dns && spec.net == NetMode::Host {
        for f in ["/etc/resolv.conf", "/etc/hosts"] {
            steps.push(Step::BindHost {
                src: PathBuf::from(f),
                at: At::new(Base::Root, f, Lookup::Image(Create::File)),
                readonly: true,
                need: Need::BestEffort,
            });
        }
    }
    if spec.net == NetMode::None {
        steps.push(Step::File {
            at: At::new(Base::Root, "etc/hosts", Lookup::Image(Create::File)),
            contents: own_hosts(&spec.hostname),
        });
    }
    for b in &spec.binds {
        steps.push(Step::BindHost {
            src: b.src.clone(),
            at: At {
                base: Base::Root,
                path: relative(&b.dst),
                lookup: Lookup::Image(Create::LikeSource),
            },
            readonly: b.readonly,
            need: Need::Required,
        });
    }
    for t in &spec.tmpfs {
        steps.push(Step::Mount {
            fs: Fs::Tmpfs {
                mode: t.mode,
                size: t.size,
            },
            at: At {
                base: Base::Root,
                path: relative(&t.dst),
                lookup: Lookup::Image(Create::Dir),
            },
            attrs: Attrs {
                nosuid: true,
                nodev: true,
                ..Attrs::default()
            },
            names: None,
        });
    }
    for (i, p) in spec.layer_dirs.iter().enumerate() {
        steps.push(Step::LayerDir {
            name: layer_dir_name(i),
            at: At {
                base: Base::Root,
                path: relative(p),
                lookup: Lookup::Image(Create::Dir),
            },
        });
    }
    // Last: a guarded bind may lie below a bind (/logs/verifier below
    // /logs).
    for g in &spec.guarded {
        steps.push(Step::Guarded {
            src: g.src.clone(),
            at: At {
                base: Base::Root,
                path: relative(&g.dst),
                lookup: Lookup::Image(Create::Dir),
            },
            dst: g.dst.clone(),
        });
    }
    steps
}

/// The name in the writable layer of the `i`th of `SandboxSpec::layer_dirs`.
fn layer_dir_name(i: usize) -> String {
    format!("d{i}")
}

/// `/a/b` -> `a/b`, dropping `.`; `..` is kept for the Image lookup, which
/// clamps it at the root (RESOLVE_IN_ROOT), and refused by the strict ones.
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

/// Prepares the overlay root and carries out the plan of `spec` on it;
/// `cgroup_views` is what its /sys/fs/cgroup shows ([`Step::CgroupView`]).
pub fn assemble(
    sys: &dyn Syscall,
    spec: &SandboxSpec,
    dir: &Path,
    disk: Option<OwnedFd>,
    cgroup_views: Vec<(String, PathBuf)>,
) -> Result<NewRoot, RootfsError> {
    let mut root = prepare_root(sys, spec, dir, disk)?;
    apply(sys, &mut root, &plan_with_cgroup(spec, cgroup_views))?;
    Ok(root)
}

/// [`plan`] with the sandbox's /sys/fs/cgroup ([`Step::CgroupView`])
/// right after /sys.
pub fn plan_with_cgroup(spec: &SandboxSpec, views: Vec<(String, PathBuf)>) -> Vec<Step> {
    let mut steps = plan(spec);
    let at = steps
        .iter()
        .position(|s| matches!(s, Step::Sys { .. }))
        .map_or(steps.len(), |i| i + 1);
    steps.insert(
        at,
        Step::CgroupView {
            at: At::new(Base::Sys, "fs/cgroup", Lookup::IfPresent),
            views,
        },
    );
    steps
}

#[cfg(test)]
mod tests {
    use super::prepare::overlay_escape;
    use super::*;
    use crate::spec::{Bind, Confinement, IdMapping, UsernsMode, Writable};
    use rustix::fs::{Mode, OFlags};

    pub(super) fn spec() -> SandboxSpec {
        SandboxSpec {
            name: "t".into(),
            rootfs: "/images/x".into(),
            layers: Vec::new(),
            hostname: "t".into(),
            net: NetMode::Host,
            ids: IdMapping {
                mode: UsernsMode::Single,
                uid: Vec::new(),
                gid: Vec::new(),
                external: false,
            },
            writable: Writable::Tmpfs { size_mib: 16 },
            binds: vec![Bind {
                src: "/data".into(),
                dst: "/mnt/../data".into(),
                readonly: true,
            }],
            guarded: Vec::new(),
            layer_dirs: Vec::new(),
            tmpfs: Vec::new(),
            keep_layer: None,
            host_dns: true,
            shm_bytes: 1 << 20,
            confinement: Confinement::default(),
            limits: crate::spec::Limits::default(),
        }
    }

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

    /// The writable layer's dirs are bound last, over the binds (eval's
    /// /logs/agent over the rollout dir's /logs), each its own.
    #[test]
    fn layer_dirs_come_after_the_binds() {
        let mut s = spec();
        s.layer_dirs = vec!["/logs/agent".into(), "/logs/artifacts".into()];
        let steps = plan(&s);
        let last_bind = steps
            .iter()
            .rposition(|st| matches!(st, Step::BindHost { .. }))
            .expect("a bind");
        let dirs: Vec<(usize, String, String)> = steps
            .iter()
            .enumerate()
            .filter_map(|(i, st)| match st {
                Step::LayerDir { name, at } => Some((i, name.clone(), at.shown())),
                _ => None,
            })
            .collect();
        assert_eq!(dirs.len(), 2, "{steps:?}");
        assert!(dirs.iter().all(|(i, _, _)| *i > last_bind));
        assert_eq!(
            (dirs[0].1.as_str(), dirs[0].2.as_str()),
            ("d0", "/logs/agent")
        );
        assert_eq!(
            (dirs[1].1.as_str(), dirs[1].2.as_str()),
            ("d1", "/logs/artifacts")
        );
    }

    #[test]
    fn the_plan_covers_and_masks_what_it_must() {
        let steps = plan(&spec());
        // Each of `want` is a place of a step `pick` selects.
        let assert_each = |what: &str, pick: fn(&Step) -> Option<String>, want: &[&str]| {
            let have: Vec<String> = steps.iter().filter_map(pick).collect();
            for p in want {
                assert!(have.contains(&p.to_string()), "{p} not {what}: {have:?}");
            }
        };
        assert_each(
            "read-only",
            |s| match s {
                Step::ReadOnly { at } => Some(at.shown()),
                _ => None,
            },
            &[
                "/proc/sys",
                "/proc/sysrq-trigger",
                "/proc/irq",
                "/proc/bus",
                "/proc/fs",
            ],
        );
        assert_each(
            "masked",
            |s| match s {
                Step::Mask { at } => Some(at.shown()),
                _ => None,
            },
            &[
                "/proc/kcore",
                "/proc/keys",
                "/proc/timer_list",
                "/sys/firmware",
            ],
        );
        // Covers and masks only ever look inside sifbox's own mounts, and
        // follow nothing there.
        for s in &steps {
            if let Step::ReadOnly { at } | Step::Mask { at } = s {
                assert_ne!(at.base, Base::Root, "{s:?}");
                assert_eq!(at.lookup, Lookup::IfPresent, "{s:?}");
            }
        }
    }

    #[test]
    fn proc_dev_and_sys_must_be_real_directories_of_the_image() {
        let steps = plan(&spec());
        for dir in ["proc", "dev", "sys"] {
            let first = steps
                .iter()
                .position(|s| match s {
                    Step::Mount { at, .. } | Step::Sys { at, .. } => {
                        at.base == Base::Root && at.path == Path::new(dir)
                    }
                    _ => false,
                })
                .unwrap_or_else(|| panic!("nothing mounted at /{dir}"));
            match &steps[first] {
                Step::Mount { at, .. } | Step::Sys { at, .. } => {
                    assert_eq!(at.lookup, Lookup::RealDir, "/{dir}");
                }
                _ => unreachable!(),
            }
            // Nothing mounted there through the image's own lookup.
            assert!(!steps.iter().any(|s| matches!(s,
                Step::Mount { at, .. } | Step::BindHost { at, .. }
                    if at.base == Base::Root
                        && at.path.starts_with(dir)
                        && at.lookup != Lookup::RealDir)));
        }
        // The masks and covers of a mount come after the mount.
        let proc_mount = steps
            .iter()
            .position(|s| {
                matches!(
                    s,
                    Step::Mount {
                        names: Some(Base::Proc),
                        ..
                    }
                )
            })
            .expect("proc");
        let first_cover = steps
            .iter()
            .position(|s| matches!(s, Step::ReadOnly { at } if at.base == Base::Proc))
            .expect("cover");
        assert!(proc_mount < first_cover);
    }

    #[test]
    fn a_guarded_bind_comes_after_the_binds_it_may_lie_below() {
        let mut s = spec();
        s.binds.push(Bind {
            src: "/rollout".into(),
            dst: "/logs".into(),
            readonly: false,
        });
        s.guarded.push(crate::spec::GuardedBind {
            src: "/rollout/verifier".into(),
            dst: "/logs/verifier".into(),
        });
        let steps = plan(&s);
        let logs = steps
            .iter()
            .position(|st| matches!(st, Step::BindHost { src, .. } if src == Path::new("/rollout")))
            .expect("the /logs bind");
        let guarded = steps
            .iter()
            .position(|st| {
                matches!(st, Step::Guarded { src, at, dst }
                    if src == Path::new("/rollout/verifier")
                        && at.path == Path::new("logs/verifier")
                        && at.lookup == Lookup::Image(Create::Dir)
                        && dst == Path::new("/logs/verifier"))
            })
            .expect("the guarded bind");
        assert!(logs < guarded);
        // A destination with `..` or a relative one is refused up front.
        for bad in ["/logs/../etc", "logs/verifier", "/"] {
            let mut s = spec();
            s.name = "t".into();
            s.binds.clear();
            s.guarded.push(crate::spec::GuardedBind {
                src: "/rollout/verifier".into(),
                dst: bad.into(),
            });
            let e = s.validate().expect_err(bad).to_string();
            assert!(e.contains("guarded bind"), "{bad}: {e}");
        }
    }

    #[test]
    fn tmpfs_mounts_are_real_tmpfs_of_their_size_after_the_binds() {
        let mut s = spec();
        s.tmpfs.push(crate::spec::TmpfsMount {
            dst: "/scratch/t".into(),
            size: 1 << 20,
            mode: 0o1777,
        });
        let steps = plan(&s);
        let last = steps.last().expect("steps");
        assert_eq!(
            last,
            &Step::Mount {
                fs: Fs::Tmpfs {
                    mode: 0o1777,
                    size: 1 << 20
                },
                at: At {
                    base: Base::Root,
                    path: "scratch/t".into(),
                    lookup: Lookup::Image(Create::Dir),
                },
                attrs: Attrs {
                    nosuid: true,
                    nodev: true,
                    ..Attrs::default()
                },
                names: None,
            }
        );
        s.tmpfs[0].size = 0;
        assert!(s.validate().is_err());
    }

    #[test]
    fn binds_follow_the_spec_and_the_image_cannot_lead_them_out() {
        let steps = plan(&spec());
        let bind = steps
            .iter()
            .find_map(|s| match s {
                Step::BindHost {
                    src,
                    at,
                    readonly,
                    need,
                } if src == Path::new("/data") => Some((at.clone(), *readonly, *need)),
                _ => None,
            })
            .expect("the bind");
        assert_eq!(bind.0.base, Base::Root);
        assert_eq!(bind.0.lookup, Lookup::Image(Create::LikeSource));
        assert!(bind.1, "read-only");
        assert_eq!(bind.2, Need::Required);
        // Host DNS files only with the host's network.
        let dns = |s: &SandboxSpec| {
            plan(s)
                .iter()
                .any(|st| matches!(st, Step::BindHost { src, .. } if src == Path::new("/etc/resolv.conf")))
        };
        assert!(dns(&spec()));
        let mut none = spec();
        none.net = NetMode::None;
        assert!(!dns(&none));
        // /dev/shm has the spec's size; /tmp is no mount of its own.
        assert!(steps.iter().any(|s| matches!(s,
            Step::Mount { fs: Fs::Tmpfs { size, .. }, at, .. }
                if at.base == Base::Dev && at.path == Path::new("shm") && *size == 1 << 20)));
        assert!(!steps.iter().any(|s| matches!(s,
            Step::Mount { at, .. } if at.path == Path::new("tmp"))));
    }

    #[test]
    fn lookups_stay_inside_and_refuse_symlinked_mount_points() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let rootp = dir.path().join("root");
        std::fs::create_dir(&rootp).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), rootp.join("evil")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), rootp.join("proc")).expect("symlink");
        std::fs::write(rootp.join("sys"), b"").expect("file");
        let fd = rustix::fs::open(&rootp, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .expect("open");
        let root = NewRoot::bare(fd);
        // Image lookups: the absolute symlink is taken relative to the root.
        root.resolve(
            &At::new(Base::Root, "evil/x/y", Lookup::Image(Create::Dir)),
            None,
        )
        .expect("ensure");
        root.resolve(
            &At::new(Base::Root, "f/file", Lookup::Image(Create::File)),
            None,
        )
        .expect("ensure file");
        assert!(rootp.join("f/file").is_file());
        let inside_target = rootp.join(outside.path().strip_prefix("/").expect("abs"));
        assert!(inside_target.join("x/y").is_dir());
        assert!(!outside.path().join("x").exists());
        // Strict lookups refuse what the image redirected, naming it.
        let e = root
            .resolve(&At::new(Base::Root, "proc", Lookup::RealDir), None)
            .expect_err("symlinked /proc");
        let msg = e.to_string();
        assert!(msg.contains("/proc is a symbolic link"), "{msg}");
        assert!(msg.contains(&outside.path().display().to_string()), "{msg}");
        let e = root
            .resolve(&At::new(Base::Root, "sys", Lookup::RealDir), None)
            .expect_err("/sys a file");
        assert!(e.to_string().contains("/sys is not a directory"), "{e}");
        // A missing one is made, as a directory.
        root.resolve(&At::new(Base::Root, "dev", Lookup::RealDir), None)
            .expect("made");
        assert!(rootp.join("dev").is_dir());
        // IfPresent: absent is nothing to do; a symlink is never followed.
        assert!(root
            .resolve(&At::new(Base::Root, "nothing", Lookup::IfPresent), None)
            .expect("absent")
            .is_none());
        assert!(root
            .resolve(&At::new(Base::Root, "evil/x", Lookup::IfPresent), None)
            .is_err());
        assert!(std::fs::read_dir(outside.path())
            .expect("ls")
            .next()
            .is_none());
    }
}
