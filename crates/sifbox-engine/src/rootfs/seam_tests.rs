//! Root assembly against the recording fake of the syscall seam: what is
//! applied (each mount, its flags and where it goes), run as any user.
//! The image is a temp directory; the fake's trees are scratch ones.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{MountAttrFlags, MountPropagationFlags, UnmountFlags};
use sifbox_sys::syscall::fake::{Call, Entry, Obj, Recorder};

use super::tests::spec;
use super::*;
use crate::spec::{Bind, GuardedBind, Writable};

/// An image root with /proc, /dev and /sys dirs, an absolute symlink
/// `/data -> /outside` (a bind destination the image redirects), and the
/// host dirs its binds take.
struct Image {
    dir: tempfile::TempDir,
    host: tempfile::TempDir,
}

impl Image {
    fn new() -> Image {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        for d in ["proc", "dev", "sys", "etc", "tmp"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        std::os::unix::fs::symlink("/outside", root.join("data")).expect("symlink");
        for d in ["ro", "rw", "guarded"] {
            std::fs::create_dir(host.path().join(d)).expect("mkdir");
        }
        Image { dir, host }
    }

    fn root_path(&self) -> PathBuf {
        self.dir
            .path()
            .join("root")
            .canonicalize()
            .expect("canonical")
    }

    fn new_root(&self) -> NewRoot {
        let fd = rustix::fs::open(
            self.dir.path().join("root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open root");
        NewRoot::bare(fd)
    }

    /// A sandbox with its own network, a read-only and a writable bind
    /// (the first at the image's redirected /data), and a guarded bind.
    fn spec(&self) -> SandboxSpec {
        let mut s = spec();
        s.net = NetMode::None;
        s.binds = vec![
            Bind {
                src: self.host.path().join("ro"),
                dst: "/data/ro".into(),
                readonly: true,
            },
            Bind {
                src: self.host.path().join("rw"),
                dst: "/work".into(),
                readonly: false,
            },
        ];
        s.guarded = vec![GuardedBind {
            src: self.host.path().join("guarded"),
            dst: "/logs/verifier".into(),
        }];
        s
    }
}

/// A recorder whose proc and sysfs hold what the plan covers and masks.
fn recorder() -> Recorder {
    let r = Recorder::new();
    let mut proc: Vec<String> = PROC_READ_ONLY.iter().map(|p| format!("{p}/")).collect();
    proc.extend(PROC_MASKED.iter().map(|p| (*p).to_string()));
    proc.push("self/".into());
    let proc: Vec<&str> = proc.iter().map(String::as_str).collect();
    r.seed("proc", &proc);
    let mut sys: Vec<String> = SYS_MASKED.iter().map(|p| format!("{p}/")).collect();
    sys.push("fs/cgroup/".into());
    let sys: Vec<&str> = sys.iter().map(String::as_str).collect();
    r.seed("sysfs", &sys);
    r
}

/// The tree each call made, by number, with the call that made it.
fn made(calls: &[Entry]) -> HashMap<usize, Call> {
    calls
        .iter()
        .filter_map(|e| match &e.call {
            Call::FsMount { tree: Some(n), .. } | Call::OpenTree { tree: Some(n), .. } => {
                Some((*n, e.call.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Where each attached tree went.
fn attached(calls: &[Entry]) -> Vec<(usize, usize, Obj)> {
    calls
        .iter()
        .enumerate()
        .filter(|(_, e)| e.failed.is_none())
        .filter_map(|(i, e)| match &e.call {
            Call::MoveMount {
                from: Obj::Tree(n, p),
                to,
                ..
            } if p.as_os_str().is_empty() => Some((i, *n, to.clone())),
            _ => None,
        })
        .collect()
}

/// Index of the successful read-only `mount_setattr` of tree `n`.
fn made_readonly(calls: &[Entry], n: usize) -> Option<usize> {
    calls.iter().position(|e| {
        e.failed.is_none()
            && matches!(&e.call, Call::MountSetattr { tree: Obj::Tree(t, _), set, recursive: true, .. }
                if *t == n && set.contains(MountAttrFlags::MOUNT_ATTR_RDONLY))
    })
}

/// Every attachment lands inside the new root: on a path under it, or
/// inside a tree that was itself attached inside it.
fn assert_all_inside(calls: &[Entry], root: &Path) {
    let att = attached(calls);
    let inside = |to: &Obj, seen: &mut Vec<usize>| -> bool {
        let mut to = to.clone();
        loop {
            match to {
                Obj::Host(p) => return p.starts_with(root),
                Obj::Tree(n, _) => {
                    if seen.contains(&n) {
                        return false;
                    }
                    seen.push(n);
                    match att.iter().find(|(_, t, _)| *t == n) {
                        Some((_, _, next)) => to = next.clone(),
                        None => return false,
                    }
                }
            }
        }
    };
    for (_, n, to) in &att {
        assert!(
            inside(to, &mut Vec::new()),
            "tree {n} attached at {to:?}, outside {}",
            root.display()
        );
    }
}

#[test]
fn the_applied_root_has_its_masks_covers_and_read_only_binds() {
    let img = Image::new();
    let sys = recorder();
    let mut root = img.new_root();
    let spec = img.spec();
    apply(&sys, &mut root, &plan_with_cgroup(&spec, Vec::new())).expect("apply");
    let calls = sys.calls();
    let trees = made(&calls);
    let att = attached(&calls);
    let tree_of = |fstype: &str| {
        trees
            .iter()
            .find(|(_, c)| matches!(c, Call::FsMount { fstype: f, .. } if f == fstype))
            .map(|(n, _)| *n)
            .expect("made")
    };
    let proc = tree_of("proc");
    let sysfs = tree_of("sysfs");
    // /proc is attached at the image's /proc, nosuid, nodev, noexec.
    assert!(att
        .iter()
        .any(|(_, n, to)| *n == proc && *to == Obj::Host(img.root_path().join("proc"))));
    assert!(matches!(&trees[&proc], Call::FsMount { attrs, .. }
        if attrs.contains(MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV | MountAttrFlags::MOUNT_ATTR_NOEXEC)));
    // Every mask is attached over its path in /proc and /sys: a
    // directory under a read-only tmpfs, a file under /dev/null made
    // read-only first.
    for (tree, p) in PROC_MASKED
        .iter()
        .map(|p| (proc, *p))
        .chain(SYS_MASKED.iter().map(|p| (sysfs, *p)))
    {
        let (i, n, _) = att
            .iter()
            .find(|(_, _, to)| *to == Obj::Tree(tree, PathBuf::from(p)))
            .unwrap_or_else(|| panic!("{p} is not masked"));
        match &trees[n] {
            Call::FsMount { fstype, attrs, .. } => {
                assert_eq!(fstype, "tmpfs");
                assert!(attrs.contains(MountAttrFlags::MOUNT_ATTR_RDONLY), "{p}");
            }
            Call::OpenTree { source, .. } => {
                if *source == Obj::Host("/dev/null".into()) {
                    assert!(made_readonly(&calls, *n).is_some_and(|r| r < *i), "{p}");
                } else {
                    // A clone of the first empty tmpfs, which is read-only.
                    assert!(
                        matches!(source, Obj::Tree(t, _) if matches!(&trees[t], Call::FsMount { attrs, .. } if attrs.contains(MountAttrFlags::MOUNT_ATTR_RDONLY))),
                        "{p}: {source:?}"
                    );
                }
            }
            other => panic!("{other:?}"),
        }
    }
    // /proc's host-wide knobs are covered by read-only clones of themselves.
    for p in PROC_READ_ONLY {
        let at = Obj::Tree(proc, PathBuf::from(p));
        let (i, n, _) = att
            .iter()
            .find(|(_, _, to)| *to == at)
            .unwrap_or_else(|| panic!("{p} is not covered"));
        assert!(matches!(&trees[n], Call::OpenTree { source, .. } if *source == at));
        assert!(made_readonly(&calls, *n).is_some_and(|r| r < *i), "{p}");
    }
    // The read-only bind: cloned from the host, made read-only while
    // detached, then attached where the image's /data leads inside the
    // root; the writable one is never made read-only.
    let bind_of = |src: &str| {
        trees
            .iter()
            .find(|(_, c)| matches!(c, Call::OpenTree { source: Obj::Host(p), .. } if *p == img.host.path().join(src)))
            .map(|(n, _)| *n)
            .expect("cloned")
    };
    let ro = bind_of("ro");
    let (i, _, to) = att.iter().find(|(_, n, _)| *n == ro).expect("attached");
    assert_eq!(*to, Obj::Host(img.root_path().join("outside/ro")));
    assert!(made_readonly(&calls, ro).is_some_and(|r| r < *i));
    let rw = bind_of("rw");
    assert!(made_readonly(&calls, rw).is_none());
    assert!(att
        .iter()
        .any(|(_, n, to)| *n == rw && *to == Obj::Host(img.root_path().join("work"))));
    // The guarded bind: a read-only clone attached, a writable one kept
    // detached for the guarded namespace.
    let guarded: Vec<usize> = trees
        .iter()
        .filter(|(_, c)| matches!(c, Call::OpenTree { source: Obj::Host(p), .. } if *p == img.host.path().join("guarded")))
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(guarded.len(), 2);
    let shown: Vec<usize> = guarded
        .iter()
        .copied()
        .filter(|n| att.iter().any(|(_, t, _)| t == n))
        .collect();
    assert_eq!(shown.len(), 1);
    let (i, _, _) = att
        .iter()
        .find(|(_, t, _)| *t == shown[0])
        .expect("attached");
    assert!(made_readonly(&calls, shown[0]).is_some_and(|r| r < *i));
    assert_eq!(root.take_guarded().len(), 1);
    // /etc/hosts is the sandbox's own, in a tmpfs of its own.
    assert!(att
        .iter()
        .any(|(_, _, to)| *to == Obj::Host(img.root_path().join("etc/hosts"))));
    // Nothing lands outside the new root, and nothing is mounted by path.
    assert_all_inside(&calls, &img.root_path());
    assert!(!calls.iter().any(|e| matches!(
        e.call,
        Call::Mount { .. }
            | Call::Umount { .. }
            | Call::PivotRoot { .. }
            | Call::MountPropagation { .. }
    )));
    // The trees still open are the ones the root holds (its /proc, /dev,
    // /sys and the empty mask): every other was closed once attached.
    let held: Vec<usize> = sys.open_trees();
    assert!(held.len() <= 4, "{held:?}");
    for n in &held {
        assert!(
            att.iter().any(|(_, t, _)| t == n),
            "tree {n} open, never attached"
        );
    }
    drop(root);
    assert!(sys.open_trees().is_empty());
}

/// The calls a full assembly makes, by name.
fn counts() -> HashMap<&'static str, usize> {
    let img = Image::new();
    let sys = recorder();
    apply(
        &sys,
        &mut img.new_root(),
        &plan_with_cgroup(&img.spec(), Vec::new()),
    )
    .expect("apply");
    let mut n = HashMap::new();
    for e in sys.calls() {
        *n.entry(e.call.name()).or_insert(0) += 1;
    }
    n
}

#[test]
fn every_failed_mount_call_names_its_step_and_errno_and_leaves_no_tree_behind() {
    let mut failures = 0;
    for (name, count) in counts() {
        for nth in 1..=count {
            let img = Image::new();
            let sys = recorder();
            sys.fail(name, nth, Errno::PERM);
            let mut root = img.new_root();
            let got = apply(&sys, &mut root, &plan_with_cgroup(&img.spec(), Vec::new()));
            let calls = sys.calls();
            let failed = calls
                .iter()
                .position(|e| e.failed.is_some())
                .expect("the failure was reached");
            match got {
                Err(e) => {
                    failures += 1;
                    // The assembly stopped at the failure.
                    assert_eq!(failed + 1, calls.len(), "{name} #{nth}: went on");
                    let (step, errno) = e.step_errno().expect("a step and errno");
                    assert_eq!(errno, Errno::PERM.raw_os_error(), "{name} #{nth}");
                    assert!(
                        !step.is_empty() && step.contains(' '),
                        "{name} #{nth}: {step}"
                    );
                    let line = crate::Error::from(e).status_line();
                    assert!(line.starts_with("errno=1 "), "{line}");
                }
                Ok(()) => {
                    // Only /sys may be left out (the kernel allowing no
                    // sysfs): the failed call is the sysfs's or the
                    // fallback clone's of the host's /sys.
                    let trees = made(&calls);
                    let about_sys = |c: &Call| match c {
                        Call::FsMount { fstype, .. } => fstype == "sysfs",
                        Call::OpenTree { source, .. } => *source == Obj::Host("/sys".into()),
                        _ => false,
                    };
                    let ok = match &calls[failed].call {
                        c @ (Call::FsMount { .. } | Call::OpenTree { .. }) => about_sys(c),
                        Call::MountSetattr { tree, .. } | Call::MoveMount { from: tree, .. } => {
                            tree.tree()
                                .and_then(|n| trees.get(&n))
                                .is_some_and(about_sys)
                        }
                        _ => false,
                    };
                    assert!(ok, "{name} #{nth} was ignored: {:?}", calls[failed]);
                    // The writable clone of the guarded bind is kept
                    // detached on purpose (for the guarded namespace).
                    assert_eq!(root.take_guarded().len(), 1);
                }
            }
            // No tree was left detached and open: only what the root
            // holds, all attached; none once the root is dropped.
            let att = attached(&calls);
            for n in sys.open_trees() {
                assert!(
                    att.iter().any(|(_, t, _)| *t == n),
                    "{name} #{nth}: tree {n} left open"
                );
            }
            assert_all_inside(&calls, &img.root_path());
            drop(root);
            assert!(sys.open_trees().is_empty(), "{name} #{nth}");
        }
    }
    assert!(failures > 30, "{failures}");
}

#[test]
fn a_symlinked_proc_fails_before_anything_is_mounted() {
    let img = Image::new();
    let root_dir = img.dir.path().join("root");
    std::fs::remove_dir(root_dir.join("proc")).expect("rmdir");
    std::os::unix::fs::symlink("/", root_dir.join("proc")).expect("symlink");
    let sys = recorder();
    let e = apply(&sys, &mut img.new_root(), &plan(&img.spec())).expect_err("refused");
    assert!(
        matches!(&e, RootfsError::NotARealDir { path, .. } if path == "/proc"),
        "{e}"
    );
    assert!(sys.calls().is_empty(), "{:?}", sys.calls());
}

/// A runtime dir with `m/` and an image tree, for [`prepare_root`].
fn runtime() -> (tempfile::TempDir, SandboxSpec) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("m")).expect("mkdir");
    std::fs::create_dir(dir.path().join("image")).expect("mkdir");
    let mut s = spec();
    s.rootfs = dir.path().join("image");
    s.writable = Writable::Tmpfs { size_mib: 16 };
    (dir, s)
}

#[test]
fn prepare_root_makes_the_namespace_private_then_the_layer_and_the_overlay_by_fd() {
    let (dir, spec) = runtime();
    let sys = Recorder::new();
    prepare_root(&sys, &spec, dir.path(), None).expect("prepared");
    let calls = sys.calls();
    assert_eq!(
        calls[0].call,
        Call::MountPropagation {
            target: "/".into(),
            flags: MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        }
    );
    let Call::FsMount {
        fstype,
        params,
        attrs,
        tree: Some(layer),
    } = &calls[1].call
    else {
        panic!("{:?}", calls[1]);
    };
    assert_eq!(fstype, "tmpfs");
    assert!(params.contains(&("size".into(), Some((16u64 << 20).to_string()))));
    assert_eq!(
        *attrs,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV
    );
    let m = dir.path().canonicalize().expect("canonical").join("m");
    assert!(
        matches!(&calls[2].call, Call::MoveMount { from: Obj::Tree(t, _), to: Obj::Host(p), .. } if t == layer && *p == m)
    );
    let Call::FsMount {
        fstype,
        params,
        tree: Some(ovl),
        ..
    } = &calls[3].call
    else {
        panic!("{:?}", calls[3]);
    };
    assert_eq!(fstype, "overlay");
    // Every layer by fd, so no host path shows in the sandbox's mountinfo.
    for (k, v) in params {
        if let Some(v) = v {
            assert!(k == "source" || v.starts_with("/proc/self/fd/"), "{k}={v}");
        }
    }
    assert!(params.contains(&("userxattr".into(), None)));
    assert!(
        matches!(&calls[4].call, Call::MoveMount { from: Obj::Tree(t, _), to: Obj::Tree(l, p), .. }
        if t == ovl && l == layer && p == Path::new("root"))
    );
    assert_eq!(calls.len(), 5);
}

#[test]
fn the_overlay_falls_back_to_mount2_then_names_the_image_and_the_errno() {
    let (dir, spec) = runtime();
    let sys = Recorder::new();
    sys.fail("fs_mount", 2, Errno::INVAL);
    prepare_root(&sys, &spec, dir.path(), None).expect("mount(2) did it");
    let calls = sys.calls();
    let Some(Call::Mount {
        fstype,
        data: Some(data),
        target,
        ..
    }) = calls.last().map(|e| &e.call)
    else {
        panic!("{:?}", calls.last());
    };
    assert_eq!(fstype, "overlay");
    assert!(
        data.starts_with("lowerdir=/proc/self/fd/") && data.ends_with(",userxattr"),
        "{data}"
    );
    assert!(
        matches!(target, Obj::Tree(_, p) if p == Path::new("root")),
        "{target:?}"
    );

    let sys = Recorder::new();
    sys.fail("fs_mount", 2, Errno::INVAL);
    sys.fail("mount", 1, Errno::INVAL);
    sys.fail("mount", 2, Errno::PERM);
    let e = prepare_root(&sys, &spec, dir.path(), None).expect_err("no overlay");
    assert!(
        matches!(&e, RootfsError::Overlay { image, .. } if *image == spec.rootfs),
        "{e}"
    );
    assert_eq!(e.errno(), Some(Errno::PERM.raw_os_error()));
    assert!(e.to_string().contains("mount(overlay)"), "{e}");
    // Without userxattr the last time.
    assert!(
        matches!(&sys.calls().last().map(|e| &e.call), Some(Call::Mount { data: Some(d), .. }) if !d.contains("userxattr"))
    );
}

#[test]
fn a_disk_layer_that_was_not_made_fails_naming_it() {
    let (dir, mut spec) = runtime();
    spec.writable = Writable::Disk {
        size_mib: 64,
        scratch: "/nonexistent".into(),
    };
    let sys = Recorder::new();
    let e = prepare_root(&sys, &spec, dir.path(), None).expect_err("no disk");
    assert!(matches!(e, RootfsError::NoDisk));
}

#[test]
fn pivot_enters_the_root_then_detaches_the_old_one() {
    let img = Image::new();
    let sys = Recorder::new();
    pivot(&sys, &img.new_root()).expect("pivot");
    let calls: Vec<Call> = sys.calls().into_iter().map(|e| e.call).collect();
    assert_eq!(
        calls,
        vec![
            Call::Fchdir {
                dir: Obj::Host(img.root_path())
            },
            Call::PivotRoot {
                new_root: ".".into(),
                put_old: ".".into()
            },
            Call::Umount {
                target: ".".into(),
                flags: UnmountFlags::DETACH
            },
            Call::Chdir { path: "/".into() },
        ]
    );
    let sys = Recorder::new();
    sys.fail("pivot_root", 1, Errno::BUSY);
    let e = pivot(&sys, &img.new_root()).expect_err("busy");
    assert_eq!(
        e.step_errno(),
        Some(("pivot_root".into(), Errno::BUSY.raw_os_error()))
    );
    assert_eq!(sys.calls().len(), 2, "nothing after the failure");
}
