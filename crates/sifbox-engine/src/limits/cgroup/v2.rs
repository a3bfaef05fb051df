//! cgroup v2 below a cgroup delegated to the caller.
//!
//! Which cgroup: `$SIFBOX_CGROUP` when set; root: the top of the hierarchy
//! (as Docker does); else the caller's own (the `0::` line of
//! /proc/self/cgroup), or its parent when the caller lives in the `main/`
//! leaf that sifbox made there before, or, in a Slurm job step
//! (`.../job_N/step_S/user/task_T`), the step's `user/` cgroup. Delegated
//! means the caller may write that cgroup's directory, `cgroup.procs` and
//! `cgroup.subtree_control`: they belong to it, as systemd's `Delegate=yes`
//! makes them (Slurm makes its job steps' cgroups as root: they are
//! usable by root only, or where a site hands them to the user).
//!
//! The kernel's no-internal-processes rule: a cgroup other than the root
//! can enable controllers for its children only while it holds no process
//! itself. Like podman and crun, sifbox moves the processes of the
//! delegated cgroup (the caller itself, the shell that started it) into a
//! leaf child, `main/`, first, where they stay below the delegated cgroup
//! and its limits; a process it cannot move (another pid namespace's, or
//! one the kernel refuses) makes the cgroup not usable, with the reason,
//! and the ones moved go back. Then `memory pids cpu` are enabled in it
//! and in its `sifbox/`, where sandboxes' cgroups go: `memory.max`,
//! `memory.swap.max` (the total minus memory), `pids.max`, `cpu.max`.
//! Counters: `memory.events`' `oom_kill`, `memory.peak` (Linux 5.19;
//! resettable from Linux 6.12), `cpu.stat`'s `usage_usec`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sifbox_sys::syscall::Syscall;

use super::{
    cgroup_name, context, controller_list, errno, locate, lock_dir, make_cgroup, owned_writable,
    parse_proc_cgroup, pids, read, remove_tree, slurm_step, under_root, write, write_pid,
    CgroupLimits, Hierarchy, Inputs, Mount, SandboxCgroup, BASE, MOUNT_ROOT, PAYLOAD, PERIOD_US,
};

/// The controllers sifbox uses, in the order it enables them.
const USED: [&str; 3] = ["memory", "pids", "cpu"];
/// The leaf of the delegated cgroup its own processes move to.
pub const MAIN: &str = "main";
/// What to do to get a delegated cgroup.
const HOW: &str = "start sifbox in a cgroup of its own: \
    `systemd-run --user --scope -p Delegate=yes sifbox ...`, Delegate=yes in the unit \
    that starts it, or name one in $SIFBOX_CGROUP";

/// The caller's v2 hierarchy, or why there is none.
pub fn detect(root: &Path, mounts: &[Mount], inputs: &Inputs) -> Result<Hierarchy, String> {
    let v2: Vec<&Mount> = mounts.iter().filter(|m| m.fstype == "cgroup2").collect();
    let m = [MOUNT_ROOT, "/sys/fs/cgroup/unified"]
        .iter()
        .find_map(|p| v2.iter().find(|m| m.point == Path::new(p)))
        .or(v2.first())
        .ok_or("no cgroup2 file system is mounted")?;
    let mount = under_root(root, &m.point);
    if m.readonly {
        return Err(format!(
            "the cgroup v2 mount {} is read-only",
            mount.display()
        ));
    }
    let top = read(&mount.join("cgroup.controllers"))
        .map_err(|e| format!("{}/cgroup.controllers: {e}", mount.display()))?;
    let top = controller_list(&top);
    if !USED.iter().any(|c| top.iter().any(|t| t == c)) {
        return Err(format!(
            "the cgroup v2 hierarchy at {} holds none of the memory, pids and cpu controllers \
             (cgroup.controllers: {}; on a hybrid host they are bound to cgroup v1)",
            mount.display(),
            if top.is_empty() {
                "empty".to_string()
            } else {
                top.join(" ")
            }
        ));
    }
    let own_path = parse_proc_cgroup(&inputs.cgroup)
        .into_iter()
        .find(|l| l.id == 0 && l.controllers.is_empty())
        .map(|l| l.path)
        .ok_or("/proc/self/cgroup has no cgroup v2 (0::) line")?;
    let own = locate(&mount, &m.root, &own_path).ok_or_else(|| {
        format!(
            "the caller's cgroup {own_path} is not below the mount's root {} \
             (a cgroup namespace or bind mount hides it)",
            m.root
        )
    })?;

    let delegated = if let Some(e) = &inputs.explicit {
        let rel = Path::new(e)
            .strip_prefix(&m.point)
            .ok()
            .map(|r| format!("/{}", r.display()));
        let path = rel.as_deref().unwrap_or(e);
        let in_hierarchy = if m.root == "/" || rel.is_some() {
            locate(&mount, "/", path)
        } else {
            locate(&mount, &m.root, path)
        };
        in_hierarchy.ok_or_else(|| {
            format!(
                "${} = {e} is not a cgroup below {}",
                super::ENV,
                mount.display()
            )
        })?
    } else if inputs.privileged {
        mount.clone()
    } else if own.file_name().is_some_and(|n| n == MAIN)
        && own.parent().is_some_and(|p| p.join(BASE).is_dir())
    {
        // sifbox moved this process (or the shell that started it) into
        // the delegated cgroup's main/ before.
        own.parent().map_or_else(|| own.clone(), Path::to_path_buf)
    } else if let Some(user) = slurm_user_cgroup(&own, &own_path) {
        user
    } else {
        own.clone()
    };

    read(&delegated.join("cgroup.controllers"))
        .map_err(|e| format!("{}: not a cgroup ({e})", delegated.display()))?;
    let writable = owned_writable(&delegated, inputs)
        .and_then(|()| owned_writable(&delegated.join("cgroup.procs"), inputs))
        .and_then(|()| owned_writable(&delegated.join("cgroup.subtree_control"), inputs))
        .and_then(|()| match delegated.join(BASE) {
            b if b.exists() => owned_writable(&b, inputs),
            _ => Ok(()),
        });
    if let Err(why) = writable {
        let mut msg = format!(
            "cgroup {} is not delegated to the caller: {why}",
            delegated.display()
        );
        if let Some((job, step)) = slurm_step(&own_path) {
            msg.push_str(&format!(
                "; this is Slurm job {job} step {step}, whose cgroups Slurm makes as root: \
                 the job's own limits cap all its sandboxes together{}",
                job_memory(&own, &job)
                    .map(|m| format!(" (memory.max {m})"))
                    .unwrap_or_default()
            ));
        }
        msg.push_str("; ");
        msg.push_str(HOW);
        return Err(msg);
    }
    let have = controller_list(&read(&delegated.join("cgroup.controllers")).unwrap_or_default());
    let controllers: Vec<String> = USED
        .iter()
        .filter(|c| have.iter().any(|h| h == *c))
        .map(|c| (*c).to_string())
        .collect();
    if controllers.is_empty() {
        return Err(format!(
            "cgroup {} has none of the memory, pids and cpu controllers (cgroup.controllers: {}): \
             its parent does not enable them for it",
            delegated.display(),
            have.join(" ")
        ));
    }
    if !inputs.privileged && !own.starts_with(&delegated) {
        // Moving a process between cgroups needs write access to the
        // cgroup.procs of their common ancestor.
        let common = common_ancestor(&own, &delegated);
        if let Err(why) = owned_writable(&common.join("cgroup.procs"), inputs) {
            return Err(format!(
                "sifbox runs in cgroup {}, outside {}: moving its processes there needs write \
                 access to the cgroup.procs of {} ({why}); start sifbox inside {}",
                own.display(),
                delegated.display(),
                common.display(),
                delegated.display()
            ));
        }
    }
    let is_root = !delegated.join("cgroup.type").exists();
    let swap = delegated.join("memory.swap.max").exists()
        || (is_root
            && std::fs::read_dir(&delegated).is_ok_and(|mut d| {
                d.any(|e| e.is_ok_and(|e| e.path().join("memory.swap.max").exists()))
            }));
    let enabled =
        controller_list(&read(&delegated.join("cgroup.subtree_control")).unwrap_or_default());
    let ready = controllers.iter().all(|c| enabled.contains(c));
    let occupied = if is_root || ready {
        0
    } else {
        pids(&read(&delegated.join("cgroup.procs")).unwrap_or_default()).len()
    };
    Ok(Hierarchy::V2 {
        mount,
        mount_root: m.root.clone(),
        delegated,
        controllers,
        swap,
        is_root,
        occupied,
    })
}

/// The step's `user/` cgroup when `own` is a Slurm task's
/// (`.../job_N/step_S/user/task_T`): a cgroup with no processes of its own
/// and controllers enabled, where sandboxes' cgroups can go without moving
/// the task's processes out of the cgroup Slurm tracks them in.
fn slurm_user_cgroup(own: &Path, own_path: &str) -> Option<PathBuf> {
    slurm_step(own_path)?;
    let task = own.file_name()?.to_str()?;
    let user = own.parent()?;
    (task.starts_with("task_") && user.file_name()? == "user").then(|| user.to_path_buf())
}

/// The memory.max of Slurm job `job`'s cgroup, an ancestor of `own`.
fn job_memory(own: &Path, job: &str) -> Option<String> {
    let name = format!("job_{job}");
    let dir = own
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| *n == *name))?;
    Some(read(&dir.join("memory.max")).ok()?.trim().to_string())
}

/// The deepest directory both `a` and `b` are in.
fn common_ancestor(a: &Path, b: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for (x, y) in a.components().zip(b.components()) {
        if x != y {
            break;
        }
        out.push(x);
    }
    out
}

/// Makes sandbox `name`'s cgroup in `h` (a [`Hierarchy::V2`]);
/// `self_cgroup` reads the caller's /proc/self/cgroup (after it may have
/// moved), for where its processes go back to.
pub fn create(
    sys: &dyn Syscall,
    h: &Hierarchy,
    name: &str,
    limits: &CgroupLimits,
    self_cgroup: &dyn Fn() -> io::Result<String>,
) -> io::Result<SandboxCgroup> {
    let Hierarchy::V2 {
        mount,
        mount_root,
        delegated,
        controllers,
        is_root,
        ..
    } = h
    else {
        return Err(io::Error::other("not a cgroup v2 hierarchy"));
    };
    let mut needed = Vec::new();
    if limits.memory.is_some() || limits.memory_swap.is_some() {
        needed.push("memory");
    }
    if limits.pids.is_some() || limits.user_pids.is_some() {
        needed.push("pids");
    }
    if limits.cpus_milli.is_some() {
        needed.push("cpu");
    }
    let mut last = None;
    for _ in 0..4 {
        let base = prepare(sys, delegated, controllers, &needed, *is_root)?;
        if let Some(u) = limits.user_pids {
            // The cap on all this user's sandboxes, on their parent.
            match write(sys, &base.join("pids.max"), &u.to_string()) {
                Ok(()) => {}
                // The base removed by a sandbox that ended meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    last = Some(e);
                    continue;
                }
                Err(e) => {
                    return Err(context(
                        e,
                        "setting user_pids: writing to",
                        &base.join("pids.max"),
                    ))
                }
            }
        }
        let dir = base.join(cgroup_name(name));
        match make_cgroup(&dir, true) {
            Ok(()) => {}
            // A clash of the random part, or the base removed by a
            // sandbox that ended meanwhile: again.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::AlreadyExists | io::ErrorKind::NotFound
                ) =>
            {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        }
        if let Err(e) =
            write_limits(sys, &dir, limits).and_then(|()| make_cgroup(&dir.join(PAYLOAD), true))
        {
            let _ = remove_tree(sys, &dir, std::time::Instant::now());
            return Err(e);
        }
        let main = delegated.join(MAIN);
        let home = self_cgroup()
            .ok()
            .and_then(|t| {
                parse_proc_cgroup(&t)
                    .into_iter()
                    .find(|l| l.id == 0 && l.controllers.is_empty())
            })
            .and_then(|l| locate(mount, mount_root, &l.path))
            .filter(|p| p.is_dir() && (*is_root || p != delegated))
            .unwrap_or_else(|| {
                if main.is_dir() {
                    main
                } else {
                    delegated.clone()
                }
            });
        return Ok(SandboxCgroup::new(2, vec![dir], vec![home]));
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free cgroup name")))
}

/// Makes the delegated cgroup ready for sandboxes' cgroups: its processes
/// moved to `main/` (not in the root), `controllers` enabled in it and in
/// its `sifbox/`; returns `sifbox/`. A controller in `needed` that cannot
/// be enabled is an error, another one is left out.
fn prepare(
    sys: &dyn Syscall,
    delegated: &Path,
    controllers: &[String],
    needed: &[&str],
    is_root: bool,
) -> io::Result<PathBuf> {
    // One client at a time: two moving the same processes, or one enabling
    // controllers while another moves processes in, would fail.
    let _lock = lock_dir(delegated)?;
    let enabled = |dir: &Path| {
        controller_list(&read(&dir.join("cgroup.subtree_control")).unwrap_or_default())
    };
    let have = enabled(delegated);
    let missing: Vec<&str> = controllers
        .iter()
        .map(String::as_str)
        .filter(|c| !have.iter().any(|h| h == c))
        .collect();
    if !missing.is_empty() {
        if !is_root {
            evacuate(sys, delegated)?;
        }
        enable(sys, delegated, &missing, needed, !is_root)?;
    }
    let base = delegated.join(BASE);
    make_cgroup(&base, false)?;
    let have = enabled(delegated);
    let in_base = enabled(&base);
    let missing: Vec<&str> = controllers
        .iter()
        .map(String::as_str)
        .filter(|c| have.iter().any(|h| h == c) && !in_base.iter().any(|h| h == c))
        .collect();
    enable(sys, &base, &missing, needed, false)?;
    Ok(base)
}

/// Enables `list` in `dir`'s subtree_control, one at a time (a cpu
/// controller the kernel refuses, for one, leaves memory and pids);
/// `evacuate`: processes that arrived meanwhile are moved again.
fn enable(
    sys: &dyn Syscall,
    dir: &Path,
    list: &[&str],
    needed: &[&str],
    may_evacuate: bool,
) -> io::Result<()> {
    let file = dir.join("cgroup.subtree_control");
    for c in list {
        let mut tries = 0;
        loop {
            match write(sys, &file, &format!("+{c}\n")) {
                Ok(()) => break,
                Err(e)
                    if may_evacuate
                        && tries < 5
                        && matches!(errno(&e), Some(rustix::io::Errno::BUSY)) =>
                {
                    // A process forked into the cgroup after it was
                    // emptied: move it too.
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(5));
                    evacuate(sys, dir)?;
                }
                Err(e) if needed.contains(c) => {
                    return Err(context(
                        e,
                        &format!("enabling the {c} controller in"),
                        &file,
                    ));
                }
                Err(_) => break,
            }
        }
    }
    Ok(())
}

/// Moves every process of cgroup `dir` into its `main/` child; one that
/// cannot be moved makes it fail (and the ones moved go back).
fn evacuate(sys: &dyn Syscall, dir: &Path) -> io::Result<()> {
    let procs = pids(&read(&dir.join("cgroup.procs")).map_err(|e| context(e, "reading", dir))?);
    if procs.is_empty() {
        return Ok(());
    }
    let main = dir.join(MAIN);
    make_cgroup(&main, false)?;
    let mut moved = Vec::new();
    for pid in procs {
        // cgroup.procs shows 0 for a process of another pid namespace;
        // writing 0 would move the writer instead.
        let result = if pid == 0 {
            Err(io::Error::other("a process of another pid namespace"))
        } else {
            write_pid(sys, &main, pid)
        };
        match result {
            Ok(()) => moved.push(pid),
            Err(e) if matches!(errno(&e), Some(rustix::io::Errno::SRCH)) => {}
            Err(e) => {
                for m in moved {
                    let _ = write_pid(sys, dir, m);
                }
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cgroup {} holds process {pid}, which sifbox cannot move to {} ({e}); \
                         a cgroup with processes can enable no controllers for sandboxes (the \
                         kernel's no-internal-processes rule): {HOW}",
                        dir.display(),
                        main.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The limits of the cgroup at `dir`.
fn write_limits(sys: &dyn Syscall, dir: &Path, limits: &CgroupLimits) -> io::Result<()> {
    let set = |limit: &str, file: &str, value: String| {
        let p = dir.join(file);
        write(sys, &p, &value)
            .map_err(|e| context(e, &format!("setting {limit}: writing {value} to"), &p))
    };
    if let Some(m) = limits.memory {
        set("memory", "memory.max", m.to_string())?;
    }
    if let Some(t) = limits.memory_swap {
        let f = dir.join("memory.swap.max");
        if !f.exists() {
            return Err(io::Error::other(format!(
                "{}: no swap accounting",
                f.display()
            )));
        }
        set(
            "memory_swap",
            "memory.swap.max",
            t.saturating_sub(limits.memory.unwrap_or(0)).to_string(),
        )?;
    }
    if let Some(p) = limits.pids {
        set("pids", "pids.max", p.to_string())?;
    }
    if let Some(q) = limits.quota_us() {
        set("cpus", "cpu.max", format!("{q} {PERIOD_US}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::super::*;
    use super::{create, MAIN};

    const MOUNTINFO: &str = "\
24 1 0:22 / /sys rw - sysfs sysfs rw
25 24 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const SCOPE: &str = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope";

    fn me() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    /// A host with systemd: the root, the user's service, and a scope made
    /// by `systemd-run --user --scope -p Delegate=yes` holding `procs`.
    fn host(procs: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        v2_cgroup(r, "cpuset cpu io memory hugetlb pids rdma misc", true);
        std::fs::write(r.join("cgroup.subtree_control"), "cpu io memory pids\n").expect("w");
        let mut p = r.to_path_buf();
        for part in SCOPE.trim_start_matches('/').split('/') {
            p.push(part);
            v2_cgroup(&p, "cpu io memory pids", false);
        }
        std::fs::write(p.join("cgroup.procs"), procs).expect("procs");
        v2_cgroup(&r.join("init.scope"), "cpu io memory pids", false);
        (t, p)
    }

    fn inputs(cgroup: &str) -> Inputs {
        Inputs {
            mountinfo: MOUNTINFO.into(),
            cgroup: format!("0::{cgroup}\n"),
            explicit: None,
            euid: me(),
            privileged: false,
        }
    }

    #[test]
    fn a_delegated_scope_is_found_with_its_controllers_and_processes() {
        let (t, scope) = host("100\n200\n");
        let h = Detection::run(t.path(), &inputs(SCOPE)).v2.expect("v2");
        let Hierarchy::V2 {
            delegated,
            controllers,
            swap,
            is_root,
            occupied,
            ..
        } = &h
        else {
            panic!("{h:?}")
        };
        assert_eq!(delegated, &scope);
        assert_eq!(controllers, &["memory", "pids", "cpu"]);
        assert!(*swap && !*is_root);
        assert_eq!(*occupied, 2);
        for what in ["memory", "swap", "pids", "cpu"] {
            assert!(h.can(what), "{what}");
        }
        assert!(
            h.describe().contains("2 process(es) move to"),
            "{}",
            h.describe()
        );
    }

    #[test]
    fn a_cgroup_of_someone_else_is_not_usable_and_says_why() {
        let (t, _) = host("100\n");
        let i = Inputs {
            euid: me().wrapping_add(1),
            ..inputs(SCOPE)
        };
        let why = Detection::run(t.path(), &i).v2.expect_err("not delegated");
        assert!(why.contains("is not delegated to the caller"), "{why}");
        assert!(
            why.contains("systemd-run --user --scope -p Delegate=yes"),
            "{why}"
        );
    }

    #[test]
    fn an_empty_or_read_only_or_missing_v2_is_not_usable() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        // A hybrid host: v2 at unified/ with every controller bound to v1.
        v2_cgroup(&r.join("unified"), "", true);
        let hybrid = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let i = Inputs {
            mountinfo: hybrid.into(),
            ..inputs("/")
        };
        let why = Detection::run(r, &i).v2.expect_err("empty");
        assert!(why.contains("holds none of the memory"), "{why}");
        let ro = Inputs {
            mountinfo: hybrid.replace("rw,relatime", "ro,relatime"),
            ..inputs("/")
        };
        assert!(Detection::run(r, &ro)
            .v2
            .expect_err("ro")
            .contains("read-only"));
        let none = Inputs {
            mountinfo: String::new(),
            ..inputs("/")
        };
        assert!(Detection::run(r, &none)
            .v2
            .expect_err("none")
            .contains("no cgroup2"));
    }

    /// The writes and removals `r` recorded: (path, data); a removal has
    /// no data; and the errno a write was made to fail with.
    fn recorded(
        r: &sifbox_sys::syscall::fake::Recorder,
    ) -> Vec<(PathBuf, Option<String>, Option<rustix::io::Errno>)> {
        use sifbox_sys::syscall::fake::{Call, Obj};
        r.calls()
            .into_iter()
            .filter_map(|e| match e.call {
                Call::WriteFile {
                    at: Obj::Host(p),
                    data,
                } => Some((
                    p,
                    Some(String::from_utf8_lossy(&data).into_owned()),
                    e.failed,
                )),
                Call::RemoveDir { at: Obj::Host(p) } => Some((p, None, e.failed)),
                _ => None,
            })
            .collect()
    }

    const ALL: CgroupLimits = CgroupLimits {
        memory: Some(64 << 20),
        memory_swap: Some(96 << 20),
        pids: Some(20),
        cpus_milli: Some(500),
        user_pids: Some(300),
    };

    #[test]
    fn each_limit_is_one_write_of_its_file_and_value_through_the_seam() {
        let (t, scope) = host("");
        let h = Detection::run(t.path(), &inputs(SCOPE)).v2.expect("v2");
        let sys = sys();
        let cg = create(&sys, &h, "box", &ALL, &|| Ok(String::new())).expect("create");
        let dir = &cg.dirs[0];
        let base = scope.join(BASE);
        let calls = recorded(&sys);
        let limits: Vec<(PathBuf, Option<String>, Option<rustix::io::Errno>)> = calls
            .into_iter()
            .filter(|(p, _, _)| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.starts_with("cgroup."))
            })
            .collect();
        let w = |p: PathBuf, v: &str| (p, Some(v.to_string()), None);
        assert_eq!(
            limits,
            vec![
                // The user's cap on the parent of their sandboxes, first.
                w(base.join("pids.max"), "300"),
                w(dir.join("memory.max"), "67108864"),
                // The swap limit is what swap may add to memory.
                w(dir.join("memory.swap.max"), &(32u64 << 20).to_string()),
                w(dir.join("pids.max"), "20"),
                w(dir.join("cpu.max"), "50000 100000"),
            ]
        );
    }

    #[test]
    fn a_failed_limit_write_names_file_limit_and_errno_and_removes_the_half_made_cgroup() {
        use rustix::io::Errno;
        // Which write_file is the memory.max one (the same in every run:
        // only the cgroup's random name differs).
        let nth = {
            let (t, _) = host("");
            let h = Detection::run(t.path(), &inputs(SCOPE)).v2.expect("v2");
            let sys = sys();
            create(&sys, &h, "box", &ALL, &|| Ok(String::new())).expect("create");
            recorded(&sys)
                .iter()
                .filter(|(_, d, _)| d.is_some())
                .position(|(p, _, _)| p.ends_with("memory.max"))
                .expect("memory.max written")
                + 1
        };
        for (errno, says) in [
            (Errno::ACCESS, "Permission denied"),
            (Errno::BUSY, "Device or resource busy"),
        ] {
            let (t, scope) = host("");
            let h = Detection::run(t.path(), &inputs(SCOPE)).v2.expect("v2");
            let sys = sys();
            sys.fail("write_file", nth, errno);
            let err =
                create(&sys, &h, "box", &ALL, &|| Ok(String::new())).expect_err("a refused limit");
            let calls = recorded(&sys);
            let failed = calls
                .iter()
                .position(|(_, _, f)| *f == Some(errno))
                .expect("the failed write");
            let dir = calls[failed].0.parent().expect("dir").to_path_buf();
            let msg = err.to_string();
            for part in [
                "setting memory",
                &*dir.join("memory.max").to_string_lossy(),
                says,
            ] {
                assert!(msg.contains(part), "{msg:?} lacks {part:?}");
            }
            // After the failure: the sandbox's cgroup removed, and nothing
            // else (sifbox/ is shared by all the user's sandboxes); no
            // limit written after it.
            assert_eq!(
                calls[failed + 1..],
                [(dir.clone(), None, None)],
                "{errno:?}"
            );
            assert!(!dir.exists());
            assert!(scope.join(BASE).is_dir());
        }
    }

    #[test]
    fn create_moves_the_processes_to_main_enables_controllers_and_writes_limits() {
        let (t, scope) = host("100\n200\n");
        let h = Detection::run(t.path(), &inputs(SCOPE)).v2.expect("v2");
        let limits = CgroupLimits {
            memory: Some(64 << 20),
            memory_swap: Some(96 << 20),
            pids: Some(20),
            cpus_milli: Some(500),
            user_pids: Some(300),
        };
        let main_path = format!("0::{SCOPE}/main\n");
        let cg = create(&sys(), &h, "box", &limits, &|| Ok(main_path.clone())).expect("create");
        // The scope's processes moved into main/, then its controllers on.
        assert_eq!(text(&scope.join(MAIN).join("cgroup.procs")), "100\n200");
        assert_eq!(
            text(&scope.join("cgroup.subtree_control")),
            "+memory\n+pids\n+cpu"
        );
        let base = scope.join(BASE);
        assert_eq!(
            text(&base.join("cgroup.subtree_control")),
            "+memory\n+pids\n+cpu"
        );
        assert_eq!(cg.version, 2);
        assert_eq!(cg.dirs.len(), 1);
        let dir = &cg.dirs[0];
        assert_eq!(dir.parent(), Some(base.as_path()));
        assert_eq!(last(&dir.join("memory.max")), "67108864");
        assert_eq!(
            last(&dir.join("memory.swap.max")),
            (32u64 << 20).to_string()
        );
        assert_eq!(last(&dir.join("pids.max")), "20");
        assert_eq!(last(&base.join("pids.max")), "300", "the user's cap");
        assert_eq!(cg.views(), vec![(String::new(), dir.join(PAYLOAD))]);
        assert_eq!(last(&dir.join("cpu.max")), "50000 100000");
        assert!(dir.join(PAYLOAD).join("cgroup.procs").exists());
        assert_eq!(cg.homes, vec![scope.join(MAIN)]);

        cg.join(4242).expect("join");
        assert_eq!(text(&dir.join(PAYLOAD).join("cgroup.procs")), "4242");
        assert_eq!(text(&dir.join("cgroup.procs")), "");

        // After the move the caller lives in main/: it finds the same
        // delegated cgroup again, and nothing is moved twice.
        std::fs::write(scope.join("cgroup.procs"), "").expect("w");
        let again = Detection::run(t.path(), &inputs(&format!("{SCOPE}/main")))
            .v2
            .expect("v2");
        let Hierarchy::V2 { delegated, .. } = &again else {
            panic!()
        };
        assert_eq!(delegated, &scope);
        let second = create(&sys(), &again, "box", &CgroupLimits::default(), &|| {
            Ok(main_path.clone())
        })
        .expect("second");
        assert_ne!(second.dirs, cg.dirs);
        assert_eq!(text(&scope.join(MAIN).join("cgroup.procs")), "100\n200");
        assert_eq!(last(&second.dirs[0].join("memory.max")), "max");

        // Counters in the kernel's formats.
        std::fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 40\noom 2\noom_kill 2\noom_group_kill 0\n",
        )
        .expect("w");
        assert_eq!(cg.oom_kills(), Some(2));
        std::fs::write(
            dir.join("cpu.stat"),
            "usage_usec 2500000\nuser_usec 2000000\n",
        )
        .expect("w");
        assert_eq!(cg.cpu_usage_ns(), Some(2_500_000_000));
        std::fs::write(dir.join("memory.peak"), "1048576\n").expect("w");
        assert_eq!(cg.memory_peak(), Some(1 << 20));
        // A reset reads through the file it wrote "reset" to (Linux 6.12:
        // the reset is per open file): the next value comes through it.
        cg.reset_memory_peak().expect("reset");
        std::fs::write(dir.join("memory.peak"), "4096\n").expect("w");
        assert_eq!(cg.memory_peak(), Some(4096));
    }

    #[test]
    fn a_process_that_cannot_be_moved_makes_the_cgroup_unusable_and_the_others_go_back() {
        let (t, scope) = host("100\n0\n");
        let h = Detection::run(t.path(), &inputs(SCOPE)).v2.expect("v2");
        let err = create(&sys(), &h, "box", &CgroupLimits::default(), &|| {
            Ok(String::new())
        })
        .expect_err("pid 0 is another namespace's");
        let msg = err.to_string();
        assert!(msg.contains("cannot move"), "{msg}");
        assert!(msg.contains("no-internal-processes"), "{msg}");
        assert_eq!(text(&scope.join(MAIN).join("cgroup.procs")), "100");
        assert_eq!(last(&scope.join("cgroup.procs")), "100", "moved back");
        assert_eq!(
            text(&scope.join("cgroup.subtree_control")),
            "",
            "nothing enabled"
        );
    }

    #[test]
    fn root_uses_the_top_of_the_hierarchy_without_moving_anything() {
        let (t, _) = host("100\n");
        std::fs::write(t.path().join("cgroup.procs"), "1\n2\n").expect("w");
        let i = Inputs {
            privileged: true,
            ..inputs("/user.slice")
        };
        let h = Detection::run(t.path(), &i).v2.expect("v2");
        let Hierarchy::V2 {
            delegated,
            is_root,
            occupied,
            swap,
            ..
        } = &h
        else {
            panic!()
        };
        assert_eq!(delegated, t.path());
        assert!(*is_root && *swap, "swap seen in a child");
        assert_eq!(*occupied, 0, "the root may hold processes");
        let me_cg = "0::/init.scope\n".to_string();
        let cg = create(
            &sys(),
            &h,
            "box",
            &CgroupLimits {
                pids: Some(5),
                ..CgroupLimits::default()
            },
            &|| Ok(me_cg.clone()),
        )
        .expect("create");
        assert!(!t.path().join(MAIN).exists());
        assert_eq!(cg.dirs[0].parent(), Some(t.path().join(BASE).as_path()));
        assert_eq!(cg.homes, vec![t.path().join("init.scope")]);
    }

    #[test]
    fn sifbox_cgroup_names_the_delegated_cgroup() {
        let (t, scope) = host("");
        let i = Inputs {
            explicit: Some(SCOPE.into()),
            ..inputs(SCOPE)
        };
        let Hierarchy::V2 { delegated, .. } = Detection::run(t.path(), &i).v2.expect("v2") else {
            panic!()
        };
        assert_eq!(delegated, scope);
        // Outside it, the caller needs the common ancestor's cgroup.procs,
        // which is root's on a real host (here: another owner's).
        let outside = Inputs {
            explicit: Some(SCOPE.into()),
            euid: me(),
            ..inputs("/init.scope")
        };
        // Every fake file is the caller's: make the root's cgroup.procs
        // read-only to stand for root's.
        let procs = t.path().join("cgroup.procs");
        let mut perm = std::fs::metadata(&procs).expect("meta").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o444);
        std::fs::set_permissions(&procs, perm).expect("chmod");
        let why = Detection::run(t.path(), &outside).v2.expect_err("outside");
        assert!(why.contains("outside"), "{why}");
        assert!(
            why.contains("needs write access to the cgroup.procs of"),
            "{why}"
        );
        let bad = Inputs {
            explicit: Some("/../etc".into()),
            ..inputs(SCOPE)
        };
        assert!(Detection::run(t.path(), &bad).v2.is_err());
    }

    #[test]
    fn a_slurm_step_is_understood() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        v2_cgroup(r, "cpuset cpu memory pids", true);
        let job = r.join("system.slice/slurmstepd.scope/job_3385");
        let task = job.join("step_0/user/task_0");
        let mut p = r.to_path_buf();
        for part in [
            "system.slice",
            "slurmstepd.scope",
            "job_3385",
            "step_0",
            "user",
            "task_0",
        ] {
            p.push(part);
            v2_cgroup(&p, "cpuset cpu memory pids", false);
        }
        std::fs::write(job.join("memory.max"), "4294967296\n").expect("w");
        std::fs::write(task.join("cgroup.procs"), "500\n501\n").expect("w");
        let path = "/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0";
        // The step's user/ cgroup, when the caller may write it (root, or
        // a site that hands it to the user).
        let h = Detection::run(r, &inputs(path)).v2.expect("v2");
        let Hierarchy::V2 {
            delegated,
            occupied,
            ..
        } = &h
        else {
            panic!()
        };
        assert_eq!(delegated, &job.join("step_0/user"));
        assert_eq!(
            *occupied, 0,
            "the task's processes stay where Slurm put them"
        );
        // As Slurm makes them (root's): not usable, and the job's limit
        // is named.
        let other = Inputs {
            euid: me().wrapping_add(1),
            ..inputs(path)
        };
        let why = Detection::run(r, &other).v2.expect_err("root's");
        assert!(why.contains("Slurm job 3385 step 0"), "{why}");
        assert!(why.contains("memory.max 4294967296"), "{why}");
    }
}
