//! cgroup v1: the memory, pids, cpu and cpuacct controllers, each in its
//! own mount (or several in one, as `cpu,cpuacct`), writable by root only.
//!
//! A sandbox's cgroup is `sifbox/UID/NAME-RAND/` at the top of every mount
//! that holds one of these controllers (as Docker's cgroupfs driver does),
//! its processes in `payload/` below; `sifbox/UID/`'s `pids.max` caps all
//! of that user's sandboxes together (`user_pids`); the limits:
//! `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` (only where swap
//! accounting exists: the file is there), `pids.max`, `cpu.cfs_period_us`
//! and `cpu.cfs_quota_us`. Counters: `memory.oom_control`'s `oom_kill`
//! (Linux 4.13), `memory.max_usage_in_bytes` (reset by writing 0),
//! `cpuacct.usage` (ns).

use std::io;
use std::path::{Path, PathBuf};

use sifbox_sys::syscall::Syscall;

use super::{
    cgroup_name, context, errno, locate, make_cgroup, owned_writable, parse_proc_cgroup, read,
    remove_tree, under_root, write, CgroupLimits, Hierarchy, Inputs, Mount, SandboxCgroup, V1Dir,
    BASE, PAYLOAD, PERIOD_US,
};

/// The v1 controllers sifbox uses.
const USED: [&str; 4] = ["memory", "pids", "cpu", "cpuacct"];

/// Where the caller's sandboxes' cgroups are made in the mount `mount`:
/// `sifbox/EUID/`, whose pids.max caps them all.
pub fn user_base(mount: &Path) -> PathBuf {
    mount
        .join(BASE)
        .join(rustix::process::geteuid().as_raw().to_string())
}

/// The v1 hierarchy of the caller, or why there is none.
pub fn detect(root: &Path, mounts: &[Mount], inputs: &Inputs) -> Result<Hierarchy, String> {
    let member = parse_proc_cgroup(&inputs.cgroup);
    let mut dirs: Vec<V1Dir> = Vec::new();
    let mut refused = Vec::new();
    for m in mounts.iter().filter(|m| m.fstype == "cgroup") {
        let controllers: Vec<String> = USED
            .iter()
            .filter(|c| m.super_opts.iter().any(|o| o == *c))
            .map(|c| (*c).to_string())
            .collect();
        if controllers.is_empty() {
            continue;
        }
        let mount = under_root(root, &m.point);
        if dirs.iter().any(|d| d.mount == mount) {
            continue;
        }
        let what = format!("{} at {}", controllers.join(","), mount.display());
        if m.readonly {
            refused.push((what, "it is mounted read-only".to_string()));
            continue;
        }
        let base = mount.join(BASE);
        let check = owned_writable(&mount, inputs).and_then(|()| {
            if base.exists() {
                owned_writable(&base, inputs)
            } else {
                Ok(())
            }
        });
        if let Err(why) = check {
            refused.push((what, why));
            continue;
        }
        // The caller's own cgroup there, to move processes back to.
        let home = member
            .iter()
            .find(|l| l.controllers.iter().any(|c| controllers.contains(c)))
            .and_then(|l| locate(&mount, &m.root, &l.path))
            .filter(|h| h.is_dir())
            .unwrap_or_else(|| mount.clone());
        dirs.push(V1Dir {
            controllers,
            mount,
            home,
        });
    }
    if dirs.is_empty() {
        let mounts: Vec<&str> = refused.iter().map(|(w, _)| w.as_str()).collect();
        return Err(if refused.is_empty() {
            "no cgroup v1 memory, pids or cpu controller is mounted".to_string()
        } else if refused
            .iter()
            .all(|(_, why)| why.contains("belongs to uid 0,"))
        {
            format!(
                "the cgroup v1 controllers ({}) belong to root, and only root may make cgroups \
                 there (the caller is uid {})",
                mounts.join(", "),
                inputs.euid
            )
        } else {
            let each: Vec<String> = refused
                .iter()
                .map(|(w, why)| format!("{w}: {why}"))
                .collect();
            format!("no cgroup v1 controller is writable: {}", each.join("; "))
        });
    }
    dirs.sort_by(|a, b| a.mount.cmp(&b.mount));
    let with = |c: &str| dirs.iter().find(|d| d.controllers.iter().any(|x| x == c));
    let swap = with("memory").is_some_and(|d| d.mount.join("memory.memsw.limit_in_bytes").exists());
    let quota = with("cpu").is_some_and(|d| d.mount.join("cpu.cfs_quota_us").exists());
    Ok(Hierarchy::V1 { dirs, swap, quota })
}

/// Makes sandbox `name`'s cgroup in every mount of `dirs`, with `limits`.
pub fn create(
    sys: &dyn Syscall,
    dirs: &[V1Dir],
    name: &str,
    limits: &CgroupLimits,
) -> io::Result<SandboxCgroup> {
    let mut last = None;
    for _ in 0..4 {
        let leaf = cgroup_name(name);
        match make(sys, dirs, &leaf, limits) {
            Ok(made) => {
                let homes = dirs.iter().map(|d| d.home.clone()).collect();
                return Ok(SandboxCgroup::new(1, made, homes));
            }
            // A clash of the random part: another name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free cgroup name")))
}

/// Makes `sifbox/UID/LEAF/` and its `payload/` in every mount and writes
/// the limits (`user_pids` on `sifbox/UID/`); on failure removes what it
/// made.
fn make(
    sys: &dyn Syscall,
    dirs: &[V1Dir],
    leaf: &str,
    limits: &CgroupLimits,
) -> io::Result<Vec<PathBuf>> {
    let mut made: Vec<PathBuf> = Vec::new();
    let result = (|| {
        for d in dirs {
            make_cgroup(&d.mount.join(BASE), false)?;
            let base = user_base(&d.mount);
            make_cgroup(&base, false)?;
            if has_pids(d) {
                if let Some(u) = limits.user_pids {
                    set(sys, &base, "user_pids", "pids.max", &u.to_string())?;
                }
            }
            let dir = base.join(leaf);
            make_cgroup(&dir, true)?;
            made.push(dir.clone());
            let has = |c: &str| d.controllers.iter().any(|x| x == c);
            if has("memory") {
                write_memory(sys, &dir, limits)?;
            }
            if has("pids") {
                if let Some(p) = limits.pids {
                    set(sys, &dir, "pids", "pids.max", &p.to_string())?;
                }
            }
            if has("cpu") {
                if let Some(q) = limits.quota_us() {
                    set(
                        sys,
                        &dir,
                        "cpus",
                        "cpu.cfs_period_us",
                        &PERIOD_US.to_string(),
                    )?;
                    set(sys, &dir, "cpus", "cpu.cfs_quota_us", &q.to_string())?;
                }
            }
            make_cgroup(&dir.join(PAYLOAD), true)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(made),
        Err(e) => {
            for dir in &made {
                let _ = remove_tree(sys, dir, std::time::Instant::now());
            }
            Err(e)
        }
    }
}

fn has_pids(d: &V1Dir) -> bool {
    d.controllers.iter().any(|c| c == "pids")
}

/// The memory limits of the cgroup at `dir`: hierarchical accounting (the
/// limits must cover `payload/`), then memory, then memory plus swap (the
/// kernel wants memsw at least the memory limit, so in this order).
fn write_memory(sys: &dyn Syscall, dir: &Path, limits: &CgroupLimits) -> io::Result<()> {
    let h = dir.join("memory.use_hierarchy");
    // Always 1 since Linux 5.x; older kernels inherit the parent's value
    // and may refuse a write of the same one.
    if h.exists() && read(&h).map(|t| t.trim() != "1").unwrap_or(true) {
        set(sys, dir, "memory", "memory.use_hierarchy", "1")?;
    }
    if let Some(m) = limits.memory {
        set(sys, dir, "memory", "memory.limit_in_bytes", &m.to_string())?;
    }
    if let Some(t) = limits.memory_swap {
        let f = dir.join("memory.memsw.limit_in_bytes");
        if !f.exists() {
            return Err(io::Error::other(format!(
                "{}: no swap accounting (boot with swapaccount=1)",
                f.display()
            )));
        }
        set(
            sys,
            dir,
            "memory_swap",
            "memory.memsw.limit_in_bytes",
            &t.to_string(),
        )?;
    }
    Ok(())
}

/// Writes `value` of limit `limit` to file `file` of `dir`.
fn set(sys: &dyn Syscall, dir: &Path, limit: &str, file: &str, value: &str) -> io::Result<()> {
    let p = dir.join(file);
    write(sys, &p, value).map_err(|e| {
        let hint = match errno(&e) {
            Some(rustix::io::Errno::INVAL) => " (a value the kernel refuses)",
            _ => "",
        };
        context(e, &format!("setting {limit}: writing {value}{hint} to"), &p)
    })
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/1b9c
2:cpu,cpuacct:/
0::/
";

    fn tree(swap: bool) -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        v1_cgroup(&r.join("memory"), &["memory"], swap);
        v1_cgroup(&r.join("memory/process_api/1b9c"), &["memory"], swap);
        v1_cgroup(&r.join("pids"), &["pids"], false);
        v1_cgroup(&r.join("cpu,cpuacct"), &["cpu", "cpuacct"], false);
        v1_cgroup(&r.join("cpuset"), &[], false);
        std::fs::create_dir_all(r.join("unified")).expect("mkdir");
        t
    }

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    fn inputs(euid: u32) -> Inputs {
        Inputs {
            mountinfo: MOUNTINFO.into(),
            cgroup: CGROUP.into(),
            explicit: None,
            euid,
            privileged: true,
        }
    }

    #[test]
    fn detects_the_mounts_and_the_callers_own_cgroups() {
        let t = tree(true);
        let r = t.path();
        let d = Detection::run(r, &inputs(me()));
        let h = d.v1.clone().expect("v1");
        let Hierarchy::V1 { dirs, swap, quota } = &h else {
            panic!("{h:?}")
        };
        assert!(*swap && *quota);
        assert_eq!(
            dirs.iter().map(|d| d.mount.clone()).collect::<Vec<_>>(),
            vec![r.join("cpu,cpuacct"), r.join("memory"), r.join("pids")],
            "co-mounted cpu,cpuacct once; cpuset and name=systemd not used"
        );
        assert_eq!(dirs[0].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(dirs[1].home, r.join("memory/process_api/1b9c"));
        assert_eq!(dirs[2].home, r.join("pids"));
        for what in ["memory", "swap", "pids", "cpu"] {
            assert!(h.can(what), "{what}");
        }
        assert!(!h.can("io"));
        // The empty v2 mount is not usable, so v1 is the one.
        assert!(d.v2.is_err(), "{:?}", d.v2);
        assert_eq!(d.chosen(), Some(&h));
        assert!(h.describe().contains("cpu,cpuacct at"), "{}", h.describe());
    }

    #[test]
    fn without_swap_accounting_swap_cannot_be_limited() {
        let t = tree(false);
        let h = Detection::run(t.path(), &inputs(me())).v1.expect("v1");
        assert!(h.can("memory") && !h.can("swap"));
        let err = h
            .create(
                &sys(),
                "box",
                &CgroupLimits {
                    memory: Some(1 << 20),
                    memory_swap: Some(2 << 20),
                    ..CgroupLimits::default()
                },
            )
            .expect_err("swap");
        assert!(err.to_string().contains("cannot limit swap"), "{err}");
    }

    #[test]
    fn controllers_of_another_owner_or_read_only_are_not_usable() {
        let t = tree(true);
        let other = Inputs {
            privileged: false,
            ..inputs(me().wrapping_add(1))
        };
        let d = Detection::run(t.path(), &other);
        let why = d.v1.expect_err("not ours");
        if me() == 0 {
            // Root's, as on a real host: said once for all of them.
            assert!(why.contains("belong to root, and only root"), "{why}");
            assert!(why.contains("memory at"), "{why}");
        } else {
            assert!(why.contains("no cgroup v1 controller is writable"), "{why}");
            assert!(why.contains(&format!("belongs to uid {}", me())), "{why}");
        }
        let ro = MOUNTINFO.replace(
            "0:32 / /sys/fs/cgroup/memory rw,relatime",
            "0:32 / /sys/fs/cgroup/memory ro,relatime",
        );
        let i = Inputs {
            mountinfo: ro,
            ..inputs(me())
        };
        let h = Detection::run(t.path(), &i).v1.expect("pids and cpu still");
        assert!(!h.can("memory") && h.can("pids"));
        let none = Inputs {
            mountinfo: String::new(),
            ..inputs(me())
        };
        assert!(Detection::run(t.path(), &none)
            .v1
            .expect_err("none")
            .contains("no cgroup v1"));
    }

    #[test]
    fn create_writes_the_limits_join_writes_the_pid_and_counters_are_read() {
        let t = tree(true);
        let r = t.path();
        let h = Detection::run(r, &inputs(me())).v1.expect("v1");
        let limits = CgroupLimits {
            memory: Some(64 << 20),
            memory_swap: Some(128 << 20),
            pids: Some(20),
            cpus_milli: Some(1500),
            user_pids: Some(300),
        };
        let cg = h.create(&sys(), "box", &limits).expect("create");
        assert_eq!(cg.version, 1);
        assert_eq!(cg.dirs.len(), 3);
        let leaf = cg.dirs[0]
            .file_name()
            .expect("name")
            .to_str()
            .expect("utf8");
        assert_eq!(sandbox_of(leaf), Some("box"));
        let uid = me().to_string();
        let mem = r.join("memory/sifbox").join(&uid).join(leaf);
        let pids = r.join("pids/sifbox").join(&uid).join(leaf);
        let cpu = r.join("cpu,cpuacct/sifbox").join(&uid).join(leaf);
        assert_eq!(cg.dirs, vec![cpu.clone(), mem.clone(), pids.clone()]);
        assert_eq!(last(&mem.join("memory.limit_in_bytes")), "67108864");
        assert_eq!(last(&mem.join("memory.memsw.limit_in_bytes")), "134217728");
        assert_eq!(last(&pids.join("pids.max")), "20");
        // The user's cap is on the parent of all their sandboxes.
        assert_eq!(
            last(&r.join("pids/sifbox").join(&uid).join("pids.max")),
            "300"
        );
        assert_eq!(h.bases()[1], r.join("memory/sifbox").join(&uid));
        // The sandbox's /sys/fs/cgroup shows each payload, named as the mount.
        assert_eq!(
            cg.views(),
            vec![
                ("cpu,cpuacct".to_string(), cpu.join(PAYLOAD)),
                ("memory".to_string(), mem.join(PAYLOAD)),
                ("pids".to_string(), pids.join(PAYLOAD)),
            ]
        );
        assert_eq!(last(&cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(last(&cpu.join("cpu.cfs_quota_us")), "150000");
        // Each mount's dir has its own controllers' files only.
        assert!(!pids.join("memory.limit_in_bytes").exists());
        assert_eq!(last(&mem.join("memory.use_hierarchy")), "1");
        assert!(mem.join(PAYLOAD).is_dir() && pids.join(PAYLOAD).is_dir());
        assert_eq!(
            cg.homes,
            vec![
                r.join("cpu,cpuacct"),
                r.join("memory/process_api/1b9c"),
                r.join("pids")
            ]
        );

        cg.join(4242).expect("join");
        for d in &cg.dirs {
            assert_eq!(text(&d.join(PAYLOAD).join("cgroup.procs")), "4242");
            assert_eq!(
                text(&d.join("cgroup.procs")),
                "",
                "only payload/ holds processes"
            );
        }

        // The counters, in the kernel's formats (a kill is counted in the
        // victim's cgroup, payload/ or below).
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .expect("w");
        std::fs::write(
            mem.join(PAYLOAD).join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .expect("w");
        assert_eq!(cg.oom_kills(), Some(3));
        std::fs::write(mem.join("memory.max_usage_in_bytes"), "5242880\n").expect("w");
        assert_eq!(cg.memory_peak(), Some(5 << 20));
        cg.reset_memory_peak().expect("reset");
        assert_eq!(
            std::fs::read_to_string(mem.join("memory.max_usage_in_bytes")).expect("r"),
            "5242880\n0",
            "reset by writing 0"
        );
        std::fs::write(cpu.join("cpuacct.usage"), "123456789\n").expect("w");
        assert_eq!(cg.cpu_usage_ns(), Some(123_456_789));

        // A second sandbox of the same name gets another cgroup.
        let other = h
            .create(&sys(), "box", &CgroupLimits::default())
            .expect("again");
        assert_ne!(other.dirs, cg.dirs);
        assert_eq!(
            text(&other.dirs[1].join("memory.limit_in_bytes")),
            "9223372036854771712",
            "no limit asked, none written"
        );

        // Removal moves the process back to the client's cgroups (the
        // processes gone, the fake kernel lets the dirs go).
        for d in &cg.dirs {
            std::fs::write(d.join(PAYLOAD).join("cgroup.procs"), "").expect("w");
        }
        cg.remove(4242).expect("remove");
        for (d, home) in cg.dirs.iter().zip(&cg.homes) {
            assert!(!d.exists(), "{}", d.display());
            assert_eq!(last(&home.join("cgroup.procs")), "4242");
        }
        assert!(r.join("memory/sifbox").is_dir(), "v1 keeps its base dirs");
    }

    #[test]
    fn a_failed_write_removes_what_was_made() {
        let t = tree(true);
        let r = t.path();
        let h = Detection::run(r, &inputs(me())).v1.expect("v1");
        let limits = CgroupLimits {
            pids: Some(20),
            ..CgroupLimits::default()
        };
        // The pids mount's base is not a directory: making the sandbox's
        // cgroup there fails after the cpu and memory ones were made.
        std::fs::write(r.join("pids/sifbox"), "").expect("file in the way");
        let err = h.create(&sys(), "box", &limits).expect_err("fails");
        assert!(err.to_string().contains("pids/sifbox"), "{err}");
        for m in ["memory", "cpu,cpuacct"] {
            let left: Vec<_> = std::fs::read_dir(r.join(m).join("sifbox").join(me().to_string()))
                .expect("ls")
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .collect();
            assert!(left.is_empty(), "{m} cleaned up: {left:?}");
        }
    }

    #[test]
    fn a_refused_limit_write_names_it_and_removes_each_mount_s_half_made_cgroup() {
        use sifbox_sys::syscall::fake::{Call, Obj};
        let t = tree(true);
        let r = t.path();
        let h = Detection::run(r, &inputs(me())).v1.expect("v1");
        let limits = CgroupLimits {
            memory: Some(64 << 20),
            pids: Some(20),
            cpus_milli: Some(500),
            ..CgroupLimits::default()
        };
        let sys = sys();
        // The writes: cpu's period and quota, then memory's limit (the
        // mounts in order: cpu,cpuacct, memory, pids).
        sys.fail("write_file", 3, rustix::io::Errno::ACCESS);
        let err = h.create(&sys, "box", &limits).expect_err("refused");
        let calls = sys.calls();
        let failed = calls
            .iter()
            .position(|e| e.failed.is_some())
            .expect("the refused write");
        let Call::WriteFile {
            at: Obj::Host(file),
            ..
        } = &calls[failed].call
        else {
            panic!("{:?}", calls[failed]);
        };
        assert!(file.ends_with("memory.limit_in_bytes"), "{file:?}");
        let msg = err.to_string();
        for part in [
            "setting memory",
            &*file.to_string_lossy(),
            "Permission denied",
        ] {
            assert!(msg.contains(part), "{msg:?} lacks {part:?}");
        }
        let mem = file.parent().expect("dir").to_path_buf();
        let leaf = mem.file_name().expect("leaf");
        let cpu = r
            .join("cpu,cpuacct/sifbox")
            .join(me().to_string())
            .join(leaf);
        // After it: no write, and the removal of what this create made, a
        // cgroup's children first; the shared sifbox/UID/ stays.
        let after: Vec<Call> = calls[failed + 1..].iter().map(|e| e.call.clone()).collect();
        let rm = |p: PathBuf| Call::RemoveDir { at: Obj::Host(p) };
        assert_eq!(
            after,
            [rm(cpu.join(PAYLOAD)), rm(cpu.clone()), rm(mem.clone())]
        );
        assert!(!cpu.exists() && !mem.exists());
        assert!(mem.parent().is_some_and(Path::is_dir));
    }
}
