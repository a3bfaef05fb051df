//! Resource limits: which mechanism enforces each limit of a sandbox on
//! this host, the record of it, and the fallbacks for hosts that give the
//! caller no cgroup.
//!
//! [`plan`] is pure: from the limits asked for and what the host allows
//! ([`Host`]) it decides, per limit, a mechanism ([`How`]) or a note that
//! the limit cannot be enforced here; the record goes into sandbox.json and
//! eval's results. The mechanisms, best first:
//!
//! - a cgroup (v2 below a cgroup delegated to the caller, or v1 where the
//!   caller may write the controllers, as root): memory, memory plus swap,
//!   pids and CPU quota, all enforced by the kernel (see [`cgroup`]);
//! - pids without a cgroup: `RLIMIT_NPROC`, which the kernel counts per user
//!   namespace (Linux 5.14): init sets it before it makes the sandbox's
//!   nested user namespace, whose processes together are then capped
//!   (host root is exempt from it, but has cgroups);
//! - memory without a cgroup: a watchdog in the outer supervisor that
//!   samples the sandbox's processes (their private resident pages) and
//!   its tmpfs mounts, and kills the largest process when the sum passes
//!   the limit, as the kernel's OOM killer would;
//! - CPUs without a cgroup: CPU affinity, rounded up to whole CPUs.

pub mod cgroup;

/// The watchdog's record in a sandbox's runtime dir: a [`crate::Usage`].
pub const USAGE_FILE: &str = "usage.json";

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::spec::Limits;

/// How a limit is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// A cgroup of the unified hierarchy.
    CgroupV2,
    /// cgroup v1 controllers.
    CgroupV1,
    /// `RLIMIT_NPROC` of the sandbox's user namespace.
    Rlimit,
    /// The supervisor's memory watchdog.
    Watchdog,
    /// CPU affinity (whole CPUs).
    Affinity,
    /// The size of the tmpfs that holds the writable layer (its pages are
    /// memory).
    Tmpfs,
    /// The size of the ext4 file system on a loop device that holds the
    /// writable layer (on the host's disk).
    Disk,
}

/// One limit as it is enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// `memory`, `memory_swap`, `pids`, `cpus` or `storage`.
    pub limit: String,
    /// The value enforced (bytes, processes, thousandths of a CPU).
    pub value: u64,
    pub how: How,
    /// What exactly does it (the cgroup file, the rlimit, the CPUs).
    pub detail: String,
}

/// What a sandbox's limits are on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Enforcement {
    pub applied: Vec<Applied>,
    /// Limits asked for that this host cannot enforce, and why.
    pub not_enforced: Vec<String>,
    /// The limits that are sifbox's defaults, not the caller's choice.
    #[serde(default)]
    pub defaults: Vec<String>,
    /// `RLIMIT_NPROC` for outer to set before it makes the sandbox's user
    /// namespace: the kernel then caps the processes of the caller's uid,
    /// all its sandboxes' included, at it (the user-wide cap without a
    /// cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_nproc: Option<u64>,
    /// `RLIMIT_NOFILE` (soft, hard) for outer to set before it makes the
    /// sandbox's user namespace (raising the hard limit needs host
    /// privilege, which only outer may still have).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nofile: Option<(u64, u64)>,
    /// The sandbox's cgroup, once made (outer joins it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<cgroup::SandboxCgroup>,
    /// `RLIMIT_NPROC` for init to set before the nested user namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nproc: Option<u64>,
    /// The watchdog's memory limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog_memory: Option<u64>,
    /// CPUs for outer's affinity (and so everything below it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Vec<usize>>,
}

impl Enforcement {
    /// How `limit` is enforced, if it is.
    pub fn how(&self, limit: &str) -> Option<How> {
        self.applied
            .iter()
            .find(|a| a.limit == limit)
            .map(|a| a.how)
    }
}

/// What the host allows the caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Host {
    /// A cgroup hierarchy the caller may make cgroups in.
    pub cgroup: Option<cgroup::Hierarchy>,
    /// The CPUs this process may run on.
    pub cpus: Vec<usize>,
    /// The caller is host root (exempt from `RLIMIT_NPROC`).
    pub root: bool,
    /// The caller's hard `RLIMIT_NPROC` and `RLIMIT_NOFILE` (None:
    /// unlimited), which only root may raise.
    pub nproc_hard: Option<u64>,
    pub nofile_hard: Option<u64>,
    /// `fs.nr_open`: no process may have a higher `RLIMIT_NOFILE`.
    pub nr_open: Option<u64>,
    /// The caller holds CAP_SYS_RESOURCE (may raise hard limits): root,
    /// unless a container runtime dropped it.
    pub sys_resource: bool,
}

impl Host {
    /// This host, for the calling process.
    pub fn detect() -> Host {
        use rustix::process::{getrlimit, Resource};
        Host {
            cgroup: cgroup::Hierarchy::detect(Path::new("/sys/fs/cgroup")),
            cpus: allowed_cpus(),
            root: rustix::process::getuid().is_root(),
            nproc_hard: getrlimit(Resource::Nproc).maximum,
            nofile_hard: getrlimit(Resource::Nofile).maximum,
            nr_open: std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|t| t.trim().parse().ok()),
            sys_resource: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("CapEff:"))
                        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                })
                .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0),
        }
    }

    /// [`Host::detect`], reused for a second: a job starting sandboxes
    /// back to back reads the host's mountinfo and its own cgroup once,
    /// not for each (they change when an administrator changes them).
    pub fn detect_recent() -> Host {
        use std::sync::Mutex;
        use std::time::{Duration, Instant};
        static LAST: Mutex<Option<(Instant, Host)>> = Mutex::new(None);
        let mut last = LAST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, host)) = last.as_ref() {
            if at.elapsed() < Duration::from_secs(1) {
                return host.clone();
            }
        }
        let host = Host::detect();
        *last = Some((Instant::now(), host.clone()));
        host
    }
}

/// The capability's number (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Decides how each of `limits` is enforced on `host`; `seed` spreads
/// sandboxes over the CPUs when only affinity can limit them.
pub fn plan(limits: &Limits, host: &Host, seed: u64) -> Enforcement {
    let mut e = Enforcement::default();
    let cg = host.cgroup.as_ref();
    let cg_how = |h: &cgroup::Hierarchy| match h {
        cgroup::Hierarchy::V2 { .. } => How::CgroupV2,
        cgroup::Hierarchy::V1 { .. } => How::CgroupV1,
    };
    let mut applied = |limit: &str, value: u64, how: How, detail: String| {
        e.applied.push(Applied {
            limit: limit.into(),
            value,
            how,
            detail,
        });
    };
    let mut not_enforced = Vec::new();
    if let Some(m) = limits.memory {
        match cg.filter(|h| h.can("memory")) {
            Some(h) => applied(
                "memory",
                m,
                cg_how(h),
                match h {
                    cgroup::Hierarchy::V2 { .. } => "memory.max".into(),
                    cgroup::Hierarchy::V1 { .. } => "memory.limit_in_bytes".into(),
                },
            ),
            None => {
                applied(
                    "memory",
                    m,
                    How::Watchdog,
                    "private resident pages of every process plus the tmpfs mounts' pages, sampled; the largest process is killed above the limit".into(),
                );
                e.watchdog_memory = Some(m);
            }
        }
    }
    if let (Some(m), Some(total)) = (limits.memory, limits.swap_total()) {
        match cg.filter(|h| h.can("swap")) {
            Some(h) => applied(
                "memory_swap",
                total,
                cg_how(h),
                match h {
                    cgroup::Hierarchy::V2 { .. } => format!("memory.swap.max = {}", total - m),
                    cgroup::Hierarchy::V1 { .. } => "memory.memsw.limit_in_bytes".into(),
                },
            ),
            None if e.watchdog_memory.is_some() => not_enforced.push(
                "memory_swap: without a cgroup swapped-out pages are not counted (the watchdog counts resident ones)".to_string(),
            ),
            None => not_enforced.push(
                "memory_swap: the cgroup has no swap accounting here (cgroup v1 needs swapaccount=1)".to_string(),
            ),
        }
    }
    if let Some(p) = limits.pids {
        match cg.filter(|h| h.can("pids")) {
            Some(h) => applied("pids", p, cg_how(h), "pids.max".into()),
            None if !host.root => {
                applied(
                    "pids",
                    p,
                    How::Rlimit,
                    "RLIMIT_NPROC of the sandbox's user namespace".into(),
                );
                e.nproc = Some(p);
            }
            None => not_enforced.push(
                "pids: host root is exempt from RLIMIT_NPROC and no pids cgroup is writable"
                    .to_string(),
            ),
        }
    }
    if let Some(c) = limits.cpus_milli {
        match cg.filter(|h| h.can("cpu")) {
            Some(h) => applied(
                "cpus",
                u64::from(c),
                cg_how(h),
                match h {
                    cgroup::Hierarchy::V2 { .. } => {
                        format!("cpu.max = {} 100000", u64::from(c) * 100)
                    }
                    cgroup::Hierarchy::V1 { .. } => {
                        format!(
                            "cpu.cfs_quota_us = {}, cpu.cfs_period_us = 100000",
                            u64::from(c) * 100
                        )
                    }
                },
            ),
            None if !host.cpus.is_empty() => {
                let cpus = pick_cpus(&host.cpus, c, seed);
                let whole = u64::try_from(cpus.len()).unwrap_or(u64::MAX) * 1000;
                let rounded = if whole == u64::from(c) {
                    String::new()
                } else {
                    format!(" (rounded up from {:.3})", f64::from(c) / 1000.0)
                };
                applied(
                    "cpus",
                    whole,
                    How::Affinity,
                    format!("CPU affinity to {cpus:?}{rounded}"),
                );
                e.affinity = Some(cpus);
            }
            None => not_enforced.push("cpus: no cgroup and no CPU affinity here".to_string()),
        }
    }
    if let Some(u) = limits.user_pids {
        match cg.filter(|h| h.can("pids")) {
            Some(h) => applied(
                "user_pids",
                u,
                cg_how(h),
                format!(
                    "pids.max of {}, the parent of every sandbox's cgroup of this user",
                    h.user_base_name()
                ),
            ),
            None if !host.root => {
                let value = host.nproc_hard.map_or(u, |h| u.min(h));
                let clamped = if value < u {
                    format!(" (lowered from {u} to the caller's hard limit)")
                } else {
                    String::new()
                };
                applied(
                    "user_pids",
                    value,
                    How::Rlimit,
                    format!("RLIMIT_NPROC of the sandbox's user namespace's creator: every process of the caller's uid on the host counts{clamped}"),
                );
                e.user_nproc = Some(value);
            }
            None => not_enforced.push(
                "user_pids: host root is exempt from RLIMIT_NPROC and no pids cgroup is writable"
                    .to_string(),
            ),
        }
    }
    if let Some(n) = limits.nofile {
        // CAP_SYS_RESOURCE may raise a hard limit up to fs.nr_open;
        // without it a hard limit only goes down.
        let cap = if host.sys_resource {
            host.nr_open
        } else {
            match (host.nofile_hard, host.nr_open) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        let hard = cap.map_or(n.hard, |c| n.hard.min(c));
        let soft = n.soft.min(hard);
        let mut detail = format!("RLIMIT_NOFILE {soft}:{hard} of every process");
        if hard < n.hard {
            detail.push_str(&format!(
                " (hard lowered from {}: the caller's hard limit or fs.nr_open)",
                n.hard
            ));
            if !limits.defaults.nofile {
                not_enforced.push(format!(
                    "nofile: a hard limit of {} was asked for; only {hard} is possible here (the caller's hard limit or fs.nr_open)",
                    n.hard
                ));
            }
        }
        applied("nofile", soft, How::Rlimit, detail);
        e.nofile = Some((soft, hard));
    }
    e.not_enforced = not_enforced;
    e.defaults = limits.defaults.names();
    e
}

/// Adds how the writable layer's size is enforced to `e`: a tmpfs's size
/// (memory, counted in the memory limit), an ext4 file system's (disk), or
/// nothing for a host directory (`--overlay DIR`).
pub fn plan_storage(e: &mut Enforcement, writable: &crate::spec::Writable) {
    use crate::spec::Writable;
    let counted = match e.how("memory") {
        Some(How::Watchdog) => "; the watchdog counts its pages in the memory limit",
        Some(_) => "; the memory cgroup charges its pages",
        None => "",
    };
    match writable {
        Writable::Tmpfs { size_mib } => e.applied.push(Applied {
            limit: "storage".into(),
            value: size_mib.saturating_mul(1 << 20),
            how: How::Tmpfs,
            detail: format!(
                "the writable layer is a tmpfs of {size_mib} MiB (full: ENOSPC), held in memory{counted}"
            ),
        }),
        Writable::Disk { size_mib, scratch } => e.applied.push(Applied {
            limit: "storage".into(),
            value: size_mib.saturating_mul(1 << 20),
            how: How::Disk,
            detail: format!(
                "the writable layer is an ext4 file system of {size_mib} MiB (full: ENOSPC) on a loop device over a nameless file in {}, on disk",
                scratch.display()
            ),
        }),
        Writable::Overlay { dir } => e.not_enforced.push(format!(
            "storage: the writable layer is the host directory {}, whose size nothing limits",
            dir.display()
        )),
    }
}

/// `milli` thousandths of a CPU as whole CPUs of `allowed`, starting at a
/// place that `seed` chooses (so that sandboxes spread over the host).
fn pick_cpus(allowed: &[usize], milli: u32, seed: u64) -> Vec<usize> {
    let want = usize::try_from(milli.div_ceil(1000))
        .unwrap_or(usize::MAX)
        .clamp(1, allowed.len());
    let start = usize::try_from(seed % u64::try_from(allowed.len()).unwrap_or(1)).unwrap_or(0);
    let mut out: Vec<usize> = (0..want)
        .map(|i| allowed[(start + i) % allowed.len()])
        .collect();
    out.sort_unstable();
    out
}

// ---------------------------------------------------------------------------
// The watchdog: what a sandbox's processes and tmpfs mounts hold
// ---------------------------------------------------------------------------

/// A process of the sandbox and the memory it holds alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMemory {
    pub pid: i32,
    /// Resident pages that are not file-backed or shared (statm's
    /// resident minus shared), in bytes.
    pub private: u64,
}

/// `(resident - shared) * page` from the text of /proc/PID/statm.
pub fn statm_private(text: &str, page: u64) -> Option<u64> {
    let mut f = text.split_ascii_whitespace().skip(1);
    let resident: u64 = f.next()?.parse().ok()?;
    let shared: u64 = f.next()?.parse().ok()?;
    Some(resident.saturating_sub(shared).saturating_mul(page))
}

/// The children of every thread of `pid`, from /proc (`root` is /proc).
fn children(root: &Path, pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(root.join(pid.to_string()).join("task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// `top` and every process below it, with the memory each holds alone
/// (`proc` is the /proc to read: a fake tree in tests).
pub fn tree_memory(proc: &Path, top: i32) -> Vec<ProcMemory> {
    let page = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
    let mut out = Vec::new();
    let mut todo = vec![top];
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        if let Some(private) = std::fs::read_to_string(proc.join(pid.to_string()).join("statm"))
            .ok()
            .and_then(|t| statm_private(&t, page))
        {
            out.push(ProcMemory { pid, private });
        }
        todo.extend(children(proc, pid));
    }
    out
}

/// The processes of a pid namespace (its thread-group leaders, zombies
/// included), from `proc`, a directory handle on that namespace's /proc
/// (rewound and read again at each call).
pub fn ns_pids(proc: &mut rustix::fs::Dir) -> Vec<i32> {
    let mut pids = Vec::new();
    proc.rewind();
    while let Some(Ok(e)) = proc.read() {
        if let Some(pid) = std::str::from_utf8(e.file_name().to_bytes())
            .ok()
            .and_then(|n| n.parse::<i32>().ok())
        {
            pids.push(pid);
        }
    }
    pids
}

/// The processes of a pid namespace and the memory each holds alone, from
/// `proc`, a directory handle on that namespace's /proc (rewound and read
/// again at each call: one getdents and a statm read per process, which
/// keeps an idle sandbox's samples cheap). Pids are the namespace's own.
pub fn ns_memory(proc: &mut rustix::fs::Dir) -> Vec<ProcMemory> {
    let page = u64::try_from(rustix::param::page_size()).unwrap_or(4096);
    let pids = ns_pids(proc);
    let dir = proc.fd().ok();
    let mut out = Vec::with_capacity(pids.len());
    for pid in pids {
        let Some(dir) = dir else { break };
        let mut buf = [0u8; 128];
        let path = format!("{pid}/statm");
        let Ok(fd) = rustix::fs::openat(
            dir,
            path.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            continue;
        };
        let n = rustix::io::read(&fd, &mut buf).unwrap_or(0);
        if let Some(private) = std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|t| statm_private(t, page))
        {
            out.push(ProcMemory { pid, private });
        }
    }
    out
}

/// The host pid of the process that is `ns_pid` in the pid namespace
/// whose init is host pid `init` (its NSpid's last field), found below
/// `init` in the host's /proc.
pub fn host_pid(init: i32, ns_pid: i32) -> Option<i32> {
    if ns_pid == 1 {
        return Some(init);
    }
    let proc = Path::new("/proc");
    let mut todo = vec![init];
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let status =
            std::fs::read_to_string(proc.join(pid.to_string()).join("status")).unwrap_or_default();
        let last = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_ascii_whitespace().last())
            .and_then(|v| v.parse::<i32>().ok());
        if last == Some(ns_pid) {
            return Some(pid);
        }
        todo.extend(children(proc, pid));
    }
    None
}

/// CPU time that `top` and everything below it used so far, in clock
/// ticks: each live process's own time plus that of the children it
/// reaped (utime, stime, cutime, cstime of /proc/PID/stat); a process that
/// exited counts in its reaper's.
pub fn tree_cpu_ticks(proc: &Path, top: i32) -> u64 {
    let mut total = 0u64;
    let mut todo = vec![top];
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")) {
            total = total.saturating_add(stat_cpu_ticks(&stat).unwrap_or(0));
        }
        todo.extend(children(proc, pid));
    }
    total
}

/// utime + stime + cutime + cstime from the text of /proc/PID/stat.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields after the name start at 3 (state); utime..cstime are 14..17.
    let f: Vec<&str> = after.split_ascii_whitespace().skip(11).take(4).collect();
    if f.len() < 4 {
        return None;
    }
    f.iter().try_fold(0u64, |acc, v| {
        Some(acc.saturating_add(u64::try_from(v.parse::<i64>().ok()?).unwrap_or(0)))
    })
}

/// Bytes in use on the file system of `fd` (a tmpfs mount's root).
pub fn used_bytes(fd: &OwnedFd) -> u64 {
    match rustix::fs::fstatfs(fd.as_fd()) {
        Ok(s) => s
            .f_blocks
            .saturating_sub(s.f_bfree)
            .saturating_mul(u64::try_from(s.f_bsize).unwrap_or(4096)),
        Err(_) => 0,
    }
}

/// What the watchdog does after a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the limit; sample again after this many milliseconds.
    Wait(u64),
    /// Over it: kill this process (the one holding the most alone).
    Kill(i32),
}

/// The watchdog's decision for a sample: `used` is the sandbox's total,
/// of which `tmpfs` its tmpfs mounts hold, `procs` its processes. Samples
/// come faster as the headroom shrinks (memory can grow by gigabytes a
/// second), from every 20 ms to every second.
pub fn verdict(limit: u64, used: u64, tmpfs: u64, procs: &[ProcMemory], init: i32) -> Verdict {
    if used > limit {
        // Files in tmpfs are freed by no process's death but the sandbox's:
        // over the limit on their own, the whole sandbox goes (its init).
        // Else the process that holds the most alone, as the OOM killer
        // picks; init only when nothing else holds memory.
        let victim = if tmpfs >= limit {
            procs.iter().find(|p| p.pid == init)
        } else {
            procs
                .iter()
                .filter(|p| p.pid != init)
                .max_by_key(|p| p.private)
                .or_else(|| procs.iter().find(|p| p.pid == init))
        };
        if let Some(v) = victim {
            return Verdict::Kill(v.pid);
        }
    }
    Verdict::Wait(headroom_ms(limit, used))
}

/// How long the memory of a sandbox `used` of `limit` can take to reach
/// it, at a growth of 1 GiB a second (a process faulting in pages
/// as fast as one CPU does), from 20 ms to 5 s.
pub fn headroom_ms(limit: u64, used: u64) -> u64 {
    const GROWTH_BYTES_PER_MS: u64 = 1 << 20;
    (limit.saturating_sub(used) / GROWTH_BYTES_PER_MS).clamp(20, 5000)
}

/// The next wait after a sample: the headroom bounds it; within that a
/// sandbox whose memory stays put (within 1 MiB) is sampled ever less
/// often, from `last` doubling up to 5 s, and one that moves at once
/// more often.
pub fn next_wait_ms(last: u64, headroom: u64, moved: bool) -> u64 {
    let backoff = if moved { 20 } else { last.saturating_mul(2) };
    backoff.clamp(20, 5000).min(headroom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Swap;

    #[test]
    fn without_a_cgroup_the_fallbacks_apply_and_say_so() {
        let limits = Limits {
            memory: Some(1 << 30),
            memory_swap: None,
            pids: Some(100),
            cpus_milli: Some(1500),
            ..Limits::default()
        };
        let host = Host {
            cgroup: None,
            cpus: vec![0, 1, 2, 3],
            root: false,
            ..Host::default()
        };
        let e = plan(&limits, &host, 1);
        assert_eq!(e.how("memory"), Some(How::Watchdog));
        assert_eq!(e.watchdog_memory, Some(1 << 30));
        assert_eq!(e.how("pids"), Some(How::Rlimit));
        assert_eq!(e.nproc, Some(100));
        assert_eq!(e.how("cpus"), Some(How::Affinity));
        assert_eq!(e.affinity.as_deref(), Some(&[1, 2][..]));
        let cpus = e.applied.iter().find(|a| a.limit == "cpus").expect("cpus");
        assert_eq!(cpus.value, 2000);
        assert!(cpus.detail.contains("rounded up from 1.500"), "{cpus:?}");
        // Swap cannot be counted without a cgroup: said, not dropped.
        assert!(
            e.not_enforced.iter().any(|n| n.starts_with("memory_swap")),
            "{e:?}"
        );
        // Root has no NPROC limit: said.
        let root = plan(&limits, &Host { root: true, ..host }, 0);
        assert_eq!(root.how("pids"), None);
        assert!(root.not_enforced.iter().any(|n| n.starts_with("pids")));
    }

    #[test]
    fn nothing_asked_nothing_planned() {
        let e = plan(&Limits::default(), &Host::default(), 0);
        assert!(e.applied.is_empty() && e.not_enforced.is_empty(), "{e:?}");
        let swap = Limits {
            memory: Some(1 << 20),
            memory_swap: Some(Swap::Unlimited),
            ..Limits::default()
        };
        let e = plan(&swap, &Host::default(), 0);
        assert!(
            e.not_enforced.is_empty(),
            "unlimited swap asks for nothing: {e:?}"
        );
    }

    #[test]
    fn affinity_spreads_and_stays_within_the_allowed_set() {
        assert_eq!(pick_cpus(&[0, 1, 2, 3], 1000, 0), vec![0]);
        assert_eq!(pick_cpus(&[0, 1, 2, 3], 1000, 3), vec![3]);
        assert_eq!(pick_cpus(&[0, 1, 2, 3], 2500, 3), vec![0, 1, 3]);
        assert_eq!(pick_cpus(&[4, 6], 9000, 7), vec![4, 6]);
        assert_eq!(pick_cpus(&[5], 1, 9), vec![5]);
    }

    #[test]
    fn statm_and_stat_are_read_as_the_kernel_writes_them() {
        assert_eq!(
            statm_private("5000 1200 200 10 0 900 0\n", 4096),
            Some(1000 * 4096)
        );
        assert_eq!(statm_private("5000 100 200 10 0 900 0\n", 4096), Some(0));
        assert_eq!(statm_private("garbage", 4096), None);
        let stat =
            "42 (a (tricky) name) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 11 13 20 0 1 0 100 1000 50";
        assert_eq!(stat_cpu_ticks(stat), Some(7 + 3 + 11 + 13));
        assert_eq!(stat_cpu_ticks("1 (x) S"), None);
    }

    #[test]
    fn the_watchdog_kills_the_largest_process_not_init() {
        let procs = [
            ProcMemory {
                pid: 1,
                private: 900,
            },
            ProcMemory {
                pid: 7,
                private: 500,
            },
            ProcMemory {
                pid: 9,
                private: 600,
            },
        ];
        assert_eq!(verdict(1000, 2000, 0, &procs, 1), Verdict::Kill(9));
        assert_eq!(
            verdict(1000, 2000, 0, &procs[..1], 1),
            Verdict::Kill(1),
            "init alone holds it"
        );
        assert_eq!(
            verdict(1000, 2100, 1100, &procs, 1),
            Verdict::Kill(1),
            "the tmpfs alone is over: the whole sandbox goes"
        );
        assert_eq!(verdict(1 << 40, 0, 0, &procs, 1), Verdict::Wait(5000));
        assert_eq!(headroom_ms(2 << 30, 0), 2048);
        assert_eq!(next_wait_ms(20, 2048, false), 40);
        assert_eq!(next_wait_ms(2000, 2048, false), 2048);
        assert_eq!(next_wait_ms(2000, 2048, true), 20);
        assert_eq!(next_wait_ms(4000, 9000, false), 5000);
        assert_eq!(
            verdict(1 << 30, (1 << 30) - (1 << 20), 0, &procs, 1),
            Verdict::Wait(20)
        );
    }

    #[test]
    fn tree_memory_walks_a_fake_proc() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = t.path();
        let mk = |pid: i32, statm: &str, children: &str| {
            let d = p.join(pid.to_string()).join("task").join(pid.to_string());
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("children"), children).expect("children");
            std::fs::write(p.join(pid.to_string()).join("statm"), statm).expect("statm");
            std::fs::write(
                p.join(pid.to_string()).join("stat"),
                format!("{pid} (x) S 1 1 1 0 -1 0 0 0 0 0 {pid} 1 0 0 20 0 1 0 1 1 1"),
            )
            .expect("stat");
        };
        mk(10, "100 10 5 0 0 0 0", "11 12 ");
        mk(11, "100 20 0 0 0 0 0", "");
        mk(12, "100 30 10 0 0 0 0", "11 ");
        let mut got = tree_memory(p, 10);
        got.sort_by_key(|m| m.pid);
        let page = u64::try_from(rustix::param::page_size()).expect("page");
        assert_eq!(
            got,
            vec![
                ProcMemory {
                    pid: 10,
                    private: 5 * page
                },
                ProcMemory {
                    pid: 11,
                    private: 20 * page
                },
                ProcMemory {
                    pid: 12,
                    private: 20 * page
                },
            ]
        );
        assert_eq!(tree_cpu_ticks(p, 10), 10 + 1 + 11 + 1 + 12 + 1);
    }
}
