//! The cgroup v1 backend against the real hierarchy: as root on a host
//! whose memory and pids controllers are mounted v1 and writable (each test
//! prints why it skips elsewhere). Every test makes its own sandbox
//! cgroup, moves a `/bin/sh` it started into it, and kills what it started
//! and removes the cgroup at the end, also when it fails; the processes are
//! capped (20 of them, 64 MiB, a few seconds), so the host stays usable.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use sifbox_engine::limits::cgroup::{
    CgroupLimits, Detection, Hierarchy, Inputs, SandboxCgroup, MOUNT_ROOT, PAYLOAD,
};

/// The v1 hierarchy, if this host gives the caller one with memory and
/// pids; else says why not.
fn v1_or_skip(test: &str) -> Option<Hierarchy> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("{test}: skipped: needs root (cgroup v1 is writable by root only)");
        return None;
    }
    match Detection::run(Path::new(MOUNT_ROOT), &Inputs::current()).v1 {
        Ok(h) if h.can("memory") && h.can("pids") => Some(h),
        Ok(h) => {
            eprintln!(
                "{test}: skipped: no v1 memory and pids here ({})",
                h.describe()
            );
            None
        }
        Err(why) => {
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}

/// A sandbox cgroup and a shell in it; dropping it kills every process in
/// the cgroup and removes it.
struct InCgroup {
    cg: SandboxCgroup,
    child: Child,
}

impl InCgroup {
    /// Makes the cgroup, starts `script` under `/bin/sh -c` waiting for a
    /// line on stdin, moves it in, and lets it go.
    fn start(h: &Hierarchy, name: &str, limits: &CgroupLimits, script: &str) -> InCgroup {
        let cg = h
            .create(&sifbox_sys::syscall::Kernel, name, limits)
            .expect("create the cgroup");
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("read go; {script}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn /bin/sh");
        let mut me = InCgroup { cg, child };
        me.cg.join(me.child.id()).expect("join");
        let mut stdin = me.child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("go");
        me
    }

    /// Waits for the shell (at most `limit`).
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(Instant::now() < end, "the shell did not end in {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    }

    /// The sandbox's cgroup dir holding `file`.
    fn file(&self, file: &str) -> PathBuf {
        self.cg
            .dirs
            .iter()
            .map(|d| d.join(file))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {file} in {:?}", self.cg.dirs))
    }
}

/// Every pid in `dir`'s cgroup.procs and those of the cgroups below it.
fn procs_below(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(t.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                procs_below(&e.path(), out);
            }
        }
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pids = Vec::new();
            for p in self.cg.payloads() {
                procs_below(&p, &mut pids);
            }
            if pids.is_empty() || Instant::now() > end {
                break;
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Err(e) = self.cg.remove(0) {
            eprintln!("removing the test cgroup: {e}");
        }
    }
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[test]
fn forks_beyond_the_pids_cap_fail() {
    let Some(h) = v1_or_skip("forks_beyond_the_pids_cap_fail") else {
        return;
    };
    let limits = CgroupLimits {
        pids: Some(20),
        memory: Some(64 << 20),
        ..CgroupLimits::default()
    };
    // Forty sleeps in the background: the shell counts as one of the 20,
    // so the 20th fork fails and the shell gives up (a failed fork ends a
    // non-interactive sh).
    let script = "i=0; while [ $i -lt 40 ]; do sleep 30 >/dev/null 2>&1 & i=$((i+1)); done; wait";
    let mut s = InCgroup::start(&h, "cgtest-pids", &limits, script);
    let status = s.wait(Duration::from_secs(20));
    let err = s.stderr();
    assert!(
        !status.success(),
        "the shell should fail to fork: {status:?} {err}"
    );
    assert!(err.to_lowercase().contains("fork"), "stderr: {err}");
    let current: u64 = read_trim(&s.file("pids.current"))
        .parse()
        .expect("pids.current");
    assert_eq!(current, 19, "the sleeps that fit beside the shell");
    // v1 counts a refused fork in the forking task's cgroup (payload/).
    let events_file = s.file("pids.events");
    let payload_events = events_file.with_file_name(PAYLOAD).join("pids.events");
    let refused: u64 = [&events_file, &payload_events]
        .iter()
        .map(|p| {
            read_trim(p)
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("pids.events max")
        })
        .sum();
    assert!(refused >= 1, "no refused fork counted in pids.events");
    assert_eq!(read_trim(&s.file("pids.max")), "20");
}

#[test]
fn a_process_past_the_memory_limit_is_oom_killed_and_counted() {
    let Some(h) = v1_or_skip("a_process_past_the_memory_limit_is_oom_killed_and_counted") else {
        return;
    };
    let limits = CgroupLimits {
        memory: Some(64 << 20),
        // Where swap is accounted, no swap either: the kill comes at 64 MiB.
        memory_swap: h.can("swap").then_some(64 << 20),
        pids: Some(20),
        ..CgroupLimits::default()
    };
    // dd's 100 MiB buffer is filled from /dev/zero: every page touched.
    let script = "exec dd if=/dev/zero of=/dev/null bs=100M count=1";
    let mut s = InCgroup::start(&h, "cgtest-oom", &limits, script);
    let status = s.wait(Duration::from_secs(30));
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(9),
        "dd should be killed by the OOM killer: {status:?} {}",
        s.stderr()
    );
    let kills = s.cg.oom_kills().expect("oom_kill counter (Linux 4.13)");
    assert!(kills >= 1, "oom_kills {kills}");
    let peak = s.cg.memory_peak().expect("peak");
    assert!(
        peak > 32 << 20 && peak <= 64 << 20,
        "the peak is at the limit: {peak}"
    );
    s.cg.reset_memory_peak().expect("reset");
    assert!(
        s.cg.memory_peak().expect("peak") < peak,
        "a new peak starts"
    );
}

#[test]
fn the_cpu_quota_holds_a_busy_loop_to_half_a_cpu() {
    let Some(h) = v1_or_skip("the_cpu_quota_holds_a_busy_loop_to_half_a_cpu") else {
        return;
    };
    if !h.can("cpu") {
        eprintln!("skipped: no CPU bandwidth control here");
        return;
    }
    let limits = CgroupLimits {
        cpus_milli: Some(500),
        pids: Some(20),
        ..CgroupLimits::default()
    };
    let s = InCgroup::start(&h, "cgtest-cpu", &limits, "while :; do :; done");
    let start = Instant::now();
    let before = s.cg.cpu_usage_ns().expect("cpuacct.usage");
    std::thread::sleep(Duration::from_millis(1500));
    let used = s.cg.cpu_usage_ns().expect("cpuacct.usage") - before;
    let wall = start.elapsed().as_nanos();
    let used = u128::from(used);
    // Half of the wall time, plus one period's slack.
    assert!(
        used <= wall / 2 + 100_000_000,
        "used {used} ns of CPU in {wall} ns with 0.5 CPU"
    );
    assert!(used > 50_000_000, "the loop ran: {used} ns");
}

#[test]
fn a_nested_cgroup_namespace_cannot_raise_the_limits() {
    // A sandbox allowed nested namespaces makes a user and a cgroup
    // namespace (rooted at the cgroup it is in) and mounts the memory
    // hierarchy: it may write the files of that cgroup, its namespace's
    // root. The limits sit one level up, out of its sight.
    let Some(h) = v1_or_skip("a_nested_cgroup_namespace_cannot_raise_the_limits") else {
        return;
    };
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(unshare) = unshare else {
        eprintln!("skipped: no unshare(1)");
        return;
    };
    let limits = CgroupLimits {
        memory: Some(64 << 20),
        pids: Some(20),
        ..CgroupLimits::default()
    };
    let attack = format!(
        "exec {unshare} -U -r -C -m sh -c 'mount -t cgroup -o memory none /mnt && \
         echo 1073741824 > /mnt/memory.limit_in_bytes && cat /mnt/memory.limit_in_bytes'"
    );
    let mut s = InCgroup::start(&h, "cgtest-nested", &limits, &attack);
    let status = s.wait(Duration::from_secs(20));
    let mut out = String::new();
    if let Some(mut o) = s.child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut out);
    }
    let err = s.stderr();
    if !status.success() {
        // The kernel refused the namespace or the mount: the attack failed
        // even earlier, which is fine too.
        eprintln!("the nested mount was refused ({status:?}): {err}");
    } else {
        assert_eq!(out.trim(), "1073741824", "it wrote its own cgroup's limit");
    }
    let mem = s.file("memory.limit_in_bytes");
    assert_eq!(
        read_trim(&mem),
        (64u64 << 20).to_string(),
        "the sandbox's limit is untouched"
    );
    if status.success() {
        // What it changed is the payload's own limit, below the real one.
        assert_eq!(
            read_trim(&mem.with_file_name(PAYLOAD).join("memory.limit_in_bytes")),
            "1073741824"
        );
    }
}

#[test]
fn create_join_remove_and_gc_leave_nothing_behind() {
    let Some(h) = v1_or_skip("create_join_remove_and_gc_leave_nothing_behind") else {
        return;
    };
    let t = Instant::now();
    let cg = h
        .create(
            &sifbox_sys::syscall::Kernel,
            "cgtest-life",
            &CgroupLimits {
                memory: Some(64 << 20),
                pids: Some(20),
                cpus_milli: Some(1000),
                ..CgroupLimits::default()
            },
        )
        .expect("create");
    eprintln!("create took {:?}", t.elapsed());
    let dirs = cg.dirs.clone();
    assert!(dirs.iter().all(|d| d.join(PAYLOAD).is_dir()));
    // A process moves in and back out with remove.
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg("read x")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let t = Instant::now();
    cg.join(pid).expect("join");
    eprintln!("join took {:?}", t.elapsed());
    for d in &dirs {
        let procs = read_trim(&d.join(PAYLOAD).join("cgroup.procs"));
        assert_eq!(procs, pid.to_string(), "{}", d.display());
    }
    let t = Instant::now();
    cg.remove(pid).expect("remove");
    eprintln!("remove took {:?}", t.elapsed());
    for (d, home) in dirs.iter().zip(&cg.homes) {
        assert!(!d.exists(), "{} removed", d.display());
        let procs = read_trim(&home.join("cgroup.procs"));
        assert!(
            procs.lines().any(|l| l == pid.to_string()),
            "back in {}",
            home.display()
        );
    }
    drop(child.stdin.take());
    let _ = child.wait();

    // gc: an empty cgroup of a sandbox that is gone goes; one whose
    // sandbox lives stays.
    let stale = h
        .create(
            &sifbox_sys::syscall::Kernel,
            "cgtest-stale",
            &CgroupLimits::default(),
        )
        .expect("create");
    let kept = h
        .create(
            &sifbox_sys::syscall::Kernel,
            "cgtest-kept",
            &CgroupLimits::default(),
        )
        .expect("create");
    // Every other name counts as live: this host's other sandboxes (and
    // this binary's other tests, between create and join) are not this
    // test's to remove.
    let mut removed =
        sifbox_engine::limits::cgroup::gc(&h, &|n| n != "cgtest-stale", Duration::ZERO);
    removed.sort();
    let mut want = stale.dirs.clone();
    want.sort();
    assert_eq!(removed, want);
    assert!(stale.dirs.iter().all(|d| !d.exists()));
    assert!(kept.dirs.iter().all(|d| d.exists()));
    // A young one stays whatever its name.
    let young = h
        .create(
            &sifbox_sys::syscall::Kernel,
            "cgtest-stale",
            &CgroupLimits::default(),
        )
        .expect("create");
    let removed =
        sifbox_engine::limits::cgroup::gc(&h, &|n| n != "cgtest-stale", Duration::from_secs(600));
    assert!(removed.is_empty(), "{removed:?}");
    young.remove(0).expect("remove young");
    kept.remove(0).expect("remove kept");
}
