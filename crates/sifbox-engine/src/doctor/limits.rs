//! Cgroups and the resource limits: which mechanism enforces each limit
//! here and what it promises.

use std::path::Path;

use super::Check;

/// What to do to get a cgroup when the host has cgroup v2.
const FIX_DELEGATE: &str =
    "for kernel-enforced limits, start sifbox in a delegated cgroup: `systemd-run --user --scope \
    -p Delegate=yes sifbox ...`, Delegate=yes in the systemd unit that starts it (login \
    sessions: `systemctl edit user@.service`, [Service] Delegate=memory pids cpu), or name a \
    delegated cgroup in $SIFBOX_CGROUP";

/// What to do on a host with cgroup v1 only (or v2 without controllers).
const FIX_UNIFIED: &str =
    "for kernel-enforced limits, run sifbox as root (cgroup v1 is writable by root only), or boot \
    with the unified cgroup v2 hierarchy (kernel parameter systemd.unified_cgroup_hierarchy=1) \
    and start sifbox in a delegated cgroup: `systemd-run --user --scope -p Delegate=yes sifbox \
    ...`";

pub(super) fn check_cgroups() -> Check {
    use crate::limits::cgroup::{Detection, Hierarchy, Inputs, MOUNT_ROOT};
    const NAME: &str = "cgroups";
    let d = Detection::run(Path::new(MOUNT_ROOT), &Inputs::current());
    let why = |r: &Result<Hierarchy, String>| match r {
        Ok(h) => format!("usable ({})", h.describe()),
        Err(e) => e.clone(),
    };
    match d.chosen() {
        Some(h) => {
            let other = match h {
                Hierarchy::V1 { .. } => format!("; v2: {}", why(&d.v2)),
                Hierarchy::V2 { .. } => String::new(),
            };
            Check::ok(
                NAME,
                format!("sandboxes get their own cgroup: {}{other}", h.describe()),
            )
        }
        None => {
            let v2 = why(&d.v2);
            let fix = if v2.contains("no cgroup2") || v2.contains("holds none") {
                FIX_UNIFIED
            } else {
                FIX_DELEGATE
            };
            Check::optional(
                NAME,
                format!(
                    "no cgroup sifbox may make: v2: {v2}; v1: {}; sandboxes still run: each \
                     limit below says what enforces it instead (a watchdog for memory, CPU \
                     affinity for cpus, RLIMIT_NPROC for pids) and what that cannot promise",
                    why(&d.v1)
                ),
                fix,
            )
        }
    }
}

/// The limits doctor asks the planner about: every one set.
pub(super) fn every_limit() -> crate::spec::Limits {
    crate::spec::Limits {
        memory: Some(1 << 30),
        // Unset: twice the memory, as Docker.
        memory_swap: None,
        pids: Some(crate::spec::DEFAULT_PIDS),
        cpus_milli: Some(1500),
        ..crate::spec::Limits::default()
    }
}

/// How this host enforces each limit for the caller (a sandbox asking for
/// all of them: 1 GiB, swap as much again, the default pids cap, 1.5 CPUs).
#[must_use]
pub fn limits_plan() -> crate::limits::Enforcement {
    crate::limits::plan(&every_limit(), &crate::limits::Host::detect(), 0)
}

/// One check per limit: the mechanism `plan` chose and what it promises;
/// `ok` when the kernel enforces the limit for the sandbox alone.
pub(super) fn limit_checks(plan: &crate::limits::Enforcement, kernel: (u32, u32)) -> Vec<Check> {
    use crate::limits::How;
    let fix = if plan
        .applied
        .iter()
        .any(|a| matches!(a.how, How::CgroupV1 | How::CgroupV2))
    {
        // Some limit has a cgroup: what is missing is a controller.
        "the cgroup sifbox uses lacks this controller: enable it in the delegated cgroup's \
         parent (systemd: Delegate=memory pids cpu)"
    } else {
        "a cgroup would enforce it in the kernel: see the cgroups check"
    };
    // The example sandbox's flags (see [`every_limit`]), which the values
    // on each line (1 GiB, `cfs_quota_us = 150000`, "rounded up from
    // 1.500") are for.
    let asked = |key: &str| match key {
        "memory" => "for `sifbox run --memory 1g`: ".to_string(),
        "memory_swap" => {
            "for `sifbox run --memory 1g` without --memory-swap (swap as much again): ".to_string()
        }
        "pids" => format!(
            "for `sifbox run --pids {}` (the default): ",
            crate::spec::DEFAULT_PIDS
        ),
        "cpus" => "for `sifbox run --cpus 1.5`: ".to_string(),
        _ => String::new(),
    };
    let mut out = Vec::new();
    for (name, key) in [
        ("limit: memory", "memory"),
        ("limit: memory+swap", "memory_swap"),
        ("limit: pids", "pids"),
        ("limit: cpus", "cpus"),
    ] {
        let Some(a) = plan.applied.iter().find(|a| a.limit == key) else {
            let note = plan
                .not_enforced
                .iter()
                .find(|n| n.starts_with(key) && !n.starts_with(&format!("{key}_")))
                .cloned()
                .unwrap_or_else(|| format!("{key}: not enforced here"));
            out.push(Check::optional(
                name,
                format!("{}not enforced: {note}", asked(key)),
                fix,
            ));
            continue;
        };
        let cg = |v: &str| format!("kernel-enforced by cgroup {v} ({})", a.detail);
        let check = match (key, a.how) {
            ("memory", How::CgroupV1 | How::CgroupV2) => Check::ok(
                name,
                format!(
                    "{}: the sandbox's processes, page cache and tmpfs pages (its writable \
                     layer, /dev/shm) are charged; past it the kernel reclaims, then its OOM \
                     killer kills inside the sandbox only, and the kill is counted",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("memory", _) => Check::optional(
                name,
                "fallback: sifbox's watchdog samples the private resident memory of the \
                 sandbox's processes and its tmpfs use (every 20 ms to 5 s, faster near the \
                 limit) and kills the largest process above the limit; it cannot promise the \
                 limit: a burst between samples overshoots it, shared and kernel memory are \
                 not counted, and the host's OOM killer may act first",
                fix,
            ),
            ("memory_swap", _) => Check::ok(
                name,
                format!(
                    "{}: memory plus swap capped together",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("pids", How::CgroupV1 | How::CgroupV2) => Check::ok(
                name,
                format!(
                    "{}: processes and threads of the whole sandbox; a fork past it fails \
                     with EAGAIN",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("pids", _) if kernel < (5, 14) => Check::optional(
                name,
                format!(
                    "fallback: RLIMIT_NPROC, but this kernel ({}.{}) counts it for the \
                     caller's user id across the whole host, not per sandbox (Linux 5.14 \
                     counts per user namespace)",
                    kernel.0, kernel.1
                ),
                fix,
            ),
            ("pids", _) => Check::ok(
                name,
                "fallback, kernel-enforced: RLIMIT_NPROC of the sandbox's user namespace \
                 (Linux 5.14 counts processes per user namespace); a fork past it fails with \
                 EAGAIN; it counts per user id inside the sandbox, threads included",
            ),
            ("cpus", How::CgroupV1 | How::CgroupV2) => Check::ok(
                name,
                format!(
                    "{}: the quota is CPU time per period, in microseconds (150000 per 100000: \
                     150 ms every 100 ms, 1.5 CPUs), spent on any CPU, fractions exact",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("cpus", _) => Check::optional(
                name,
                format!(
                    "fallback: {}; affinity gives whole CPUs, so a fraction is rounded up \
                     (`sifbox run` says so when it does), and it cannot promise a share: \
                     sandboxes on the same CPUs share them",
                    a.detail
                ),
                fix,
            ),
            _ => Check::ok(name, a.detail.clone()),
        };
        out.push(Check {
            detail: format!("{}{}", asked(key), check.detail),
            ..check
        });
    }
    out
}

/// Where writable layers can live: on disk (host root with loop devices and
/// mkfs.ext4) or only in a tmpfs; `why_not` is [`crate::disk::unavailable`].
pub(super) fn check_storage(why_not: Option<String>) -> Check {
    const NAME: &str = "limit: storage";
    match why_not {
        None => Check::ok(
            NAME,
            "writable layers can be on disk (`sifbox run --disk SIZE`; eval's default): an ext4 \
             file system of the size asked on a loop device, full at its size (ENOSPC), holding \
             no memory; else a tmpfs of `sifbox run --tmpfs-size`, whose pages are memory",
        ),
        Some(why) => Check::optional(
            NAME,
            format!(
                "no disk-backed layer (`sifbox run --disk`): {why}; sifbox does without: \
                 the tmpfs layer (`sifbox run --tmpfs-size`) is full at its size (ENOSPC) too"
            ),
            "run as root for disk-backed layers; meanwhile keep a task's storage_mb below \
             its memory_mb",
        ),
    }
}

/// The kernel's major and minor version.
pub(super) fn kernel_version() -> (u32, u32) {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}
