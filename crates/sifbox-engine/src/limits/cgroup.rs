//! Control groups for sandbox limits: finding a hierarchy the caller may
//! write ([`Detection`]), making one cgroup per sandbox with its limits
//! written ([`Hierarchy::create`]), moving the sandbox in and out
//! ([`SandboxCgroup::join`], [`SandboxCgroup::remove`]), reading what it
//! used, and removing what dead sandboxes left ([`gc`]).
//!
//! Two hierarchies, the better first:
//!
//! - cgroup v2 ([`v2`]) below a cgroup *delegated* to the caller: one the
//!   caller may write `cgroup.procs` and `cgroup.subtree_control` of (what
//!   systemd's `Delegate=yes` makes), named by `$SIFBOX_CGROUP` or else the
//!   caller's own; root uses the top of the hierarchy, as Docker does.
//! - cgroup v1 ([`v1`]): the memory, pids, cpu and cpuacct controllers,
//!   where the caller may write them (root).
//!
//! Layout: a sandbox named NAME gets `sifbox/NAME-RAND/` (RAND: 8 random
//! hex digits) holding its limits and counters, and below it `payload/`,
//! the cgroup its processes live in. The limits sit one level above the
//! processes on purpose: a sandbox allowed nested namespaces may make a
//! cgroup namespace, which is rooted at the cgroup it is in, and mount a
//! cgroup file system whose root is that cgroup. From there it sees and,
//! as the owner of the files, may write only `payload/`'s own files, whose
//! limits do not matter (v2 mounted with nsdelegate would refuse even that,
//! but v1 has no such rule and not every v2 mount has the option); the
//! limits above it are out of its sight. A sandbox without nested
//! namespaces cannot mount a cgroup file system at all, and its `/sys` is
//! read-only.
//!
//! Everything here works on paths below a cgroup mount: cgroup file
//! systems hold no symlinks and no files that a user can create, only the
//! kernel's files and the directories cgroups are, so a path cannot be
//! redirected by what a sandbox makes there.
//!
//! Every write to a cgroup file and every removal of a cgroup goes through
//! the syscall seam ([`Syscall::write_file`], [`Syscall::remove_dir`]):
//! [`Hierarchy::create`] takes the caller's, so its writes and its undo on
//! failure are unit-tested on the recording fake; the later calls on a
//! [`SandboxCgroup`] (it crosses processes serialized) use the kernel's.

pub mod v1;
pub mod v2;

use std::io::{self, Write as _};
use std::os::fd::AsFd as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use sifbox_sys::syscall::{Kernel, Syscall};

/// Where cgroup file systems are mounted on a normal host.
pub const MOUNT_ROOT: &str = "/sys/fs/cgroup";
/// The directory below which sandboxes' cgroups are made (in each v1
/// controller's top, or in the delegated v2 cgroup).
pub const BASE: &str = "sifbox";
/// The leaf below a sandbox's cgroup that its processes live in.
pub const PAYLOAD: &str = "payload";
/// The environment variable naming the delegated v2 cgroup to use.
pub const ENV: &str = "SIFBOX_CGROUP";
/// The CPU bandwidth period: the quota is thousandths of a CPU × 100 µs.
pub const PERIOD_US: u64 = 100_000;
/// The kernel's smallest CPU quota (1 ms per period: 0.01 CPU).
pub const MIN_QUOTA_US: u64 = 1000;
/// How long [`SandboxCgroup::remove`] waits for the last processes to go.
const REMOVE_PATIENCE: Duration = Duration::from_secs(2);
/// The most cgroups a walk below a sandbox's cgroup visits (a sandbox with
/// nested namespaces may make its own below `payload/`).
const WALK_LIMIT: usize = 4096;

/// The limits a cgroup enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CgroupLimits {
    /// memory.max / memory.limit_in_bytes.
    pub memory: Option<u64>,
    /// Memory plus swap: memory.swap.max (= total - memory) /
    /// memory.memsw.limit_in_bytes.
    pub memory_swap: Option<u64>,
    /// pids.max.
    pub pids: Option<u64>,
    /// CPU quota in thousandths of a CPU: cpu.max / cpu.cfs_quota_us over
    /// a 100 ms period (at least 0.01 CPU, the kernel's minimum).
    pub cpus_milli: Option<u32>,
    /// pids.max of the parent of all the caller's sandboxes' cgroups (v1:
    /// `sifbox/UID/`, v2: the delegated cgroup's `sifbox/`), written at
    /// each start (the last start's value holds).
    #[serde(default)]
    pub user_pids: Option<u64>,
}

impl CgroupLimits {
    /// The CPU quota in µs per [`PERIOD_US`], if a CPU limit is set.
    pub fn quota_us(&self) -> Option<u64> {
        self.cpus_milli
            .map(|m| (u64::from(m) * (PERIOD_US / 1000)).max(MIN_QUOTA_US))
    }
}

/// One cgroup v1 controller mount that sandboxes' cgroups are made in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct V1Dir {
    /// The controllers of the mount that sifbox uses (memory, pids, cpu,
    /// cpuacct; cpu and cpuacct are often mounted together).
    pub controllers: Vec<String>,
    /// The mount's top directory.
    pub mount: PathBuf,
    /// The caller's own cgroup there: where a process goes back to when
    /// the sandbox's cgroup is removed.
    pub home: PathBuf,
}

/// The writable cgroup hierarchy of the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hierarchy {
    /// cgroup v2: sandboxes' cgroups are made in `delegated/sifbox/`.
    V2 {
        /// The cgroup v2 mount.
        mount: PathBuf,
        /// The mount's root in the hierarchy (mountinfo's fourth field,
        /// "/" unless the mount shows a subtree).
        mount_root: String,
        /// The cgroup delegated to the caller.
        delegated: PathBuf,
        /// Of memory, pids and cpu, those the delegated cgroup has (its
        /// `cgroup.controllers`).
        controllers: Vec<String>,
        /// Swap accounting: memory.swap.max exists.
        swap: bool,
        /// The delegated cgroup is the hierarchy's real root, where the
        /// kernel's no-internal-processes rule does not apply.
        is_root: bool,
        /// Processes in the delegated cgroup that [`Hierarchy::create`]
        /// moves into its `main/` child before it enables controllers
        /// (0 once that is done).
        occupied: usize,
    },
    /// cgroup v1: one mount per controller (or group of controllers),
    /// sandboxes' cgroups in each mount's `sifbox/`.
    V1 {
        dirs: Vec<V1Dir>,
        /// Swap accounting: memory.memsw.limit_in_bytes exists.
        swap: bool,
        /// CPU bandwidth control: cpu.cfs_quota_us exists.
        quota: bool,
    },
}

/// What detection reads of the host: the texts of /proc/self/mountinfo and
/// /proc/self/cgroup, `$SIFBOX_CGROUP` and who the caller is (fake values
/// in tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    pub mountinfo: String,
    pub cgroup: String,
    /// `$SIFBOX_CGROUP`: the delegated v2 cgroup, as a path in the
    /// hierarchy (`/user.slice/...`) or below the mount.
    pub explicit: Option<String>,
    /// The owner a writable cgroup's files must have.
    pub euid: u32,
    /// Host root (uid 0 of the initial user namespace): may write any
    /// cgroup, and uses the top of the v2 hierarchy rather than its own
    /// cgroup.
    pub privileged: bool,
}

impl Inputs {
    /// This process's.
    pub fn current() -> Inputs {
        let euid = rustix::process::geteuid();
        // uid 0 of a user namespace (a rootless container) owns no cgroup.
        let initial_userns = std::fs::read_to_string("/proc/self/uid_map")
            .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]);
        Inputs {
            mountinfo: std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            cgroup: std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
            explicit: std::env::var(ENV).ok().filter(|v| !v.trim().is_empty()),
            euid: euid.as_raw(),
            privileged: euid.is_root() && initial_userns,
        }
    }
}

/// Both hierarchies as the caller finds them: each usable, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    pub v2: Result<Hierarchy, String>,
    pub v1: Result<Hierarchy, String>,
}

impl Detection {
    /// Looks at the hierarchies mounted below `root` (`/sys/fs/cgroup`;
    /// a fake tree in tests, whose mountinfo still names /sys/fs/cgroup).
    pub fn run(root: &Path, inputs: &Inputs) -> Detection {
        let mounts = parse_mountinfo(&inputs.mountinfo);
        Detection {
            v2: v2::detect(root, &mounts, inputs),
            v1: v1::detect(root, &mounts, inputs),
        }
    }

    /// The hierarchy sandboxes use: v2 when it has memory and pids, else
    /// v1, else a v2 with fewer controllers.
    pub fn chosen(&self) -> Option<&Hierarchy> {
        let full = |h: &&Hierarchy| h.can("memory") && h.can("pids");
        self.v2
            .as_ref()
            .ok()
            .filter(full)
            .or(self.v1.as_ref().ok())
            .or(self.v2.as_ref().ok())
    }
}

impl Hierarchy {
    /// The caller's hierarchy on this host, if it may make cgroups with
    /// the controllers limits need; `root` is where cgroup file systems are
    /// mounted (`/sys/fs/cgroup`; a fake tree in tests).
    pub fn detect(root: &Path) -> Option<Hierarchy> {
        Detection::run(root, &Inputs::current()).chosen().cloned()
    }

    /// Whether this hierarchy can limit `what`: "memory", "swap", "pids"
    /// or "cpu".
    pub fn can(&self, what: &str) -> bool {
        match self {
            Hierarchy::V2 {
                controllers, swap, ..
            } => {
                let has = |c: &str| controllers.iter().any(|x| x == c);
                match what {
                    "swap" => has("memory") && *swap,
                    "memory" | "pids" | "cpu" => has(what),
                    _ => false,
                }
            }
            Hierarchy::V1 { dirs, swap, quota } => {
                let has = |c: &str| dirs.iter().any(|d| d.controllers.iter().any(|x| x == c));
                match what {
                    "memory" | "pids" => has(what),
                    "swap" => has("memory") && *swap,
                    "cpu" => has("cpu") && *quota,
                    _ => false,
                }
            }
        }
    }

    /// Makes the cgroup of sandbox `name` and writes `limits`; every limit
    /// set must be one the hierarchy [`can`](Hierarchy::can) enforce.
    pub fn create(
        &self,
        sys: &dyn Syscall,
        name: &str,
        limits: &CgroupLimits,
    ) -> io::Result<SandboxCgroup> {
        for (set, what) in [
            (limits.memory.is_some(), "memory"),
            (limits.memory_swap.is_some(), "swap"),
            (limits.pids.is_some() || limits.user_pids.is_some(), "pids"),
            (limits.cpus_milli.is_some(), "cpu"),
        ] {
            if set && !self.can(what) {
                return Err(io::Error::other(format!(
                    "this cgroup hierarchy cannot limit {what} ({})",
                    self.describe()
                )));
            }
        }
        match self {
            Hierarchy::V1 { dirs, .. } => v1::create(sys, dirs, name, limits),
            Hierarchy::V2 { .. } => v2::create(sys, self, name, limits, &|| {
                std::fs::read_to_string("/proc/self/cgroup")
            }),
        }
    }

    /// One line for `sifbox doctor`.
    pub fn describe(&self) -> String {
        match self {
            Hierarchy::V2 {
                delegated,
                controllers,
                swap,
                is_root,
                occupied,
                ..
            } => {
                let mut s = format!(
                    "cgroup v2, {} {} (controllers: {}; swap accounting: {})",
                    if *is_root {
                        "the hierarchy's root"
                    } else {
                        "delegated cgroup"
                    },
                    delegated.display(),
                    if controllers.is_empty() {
                        "none".to_string()
                    } else {
                        controllers.join(" ")
                    },
                    if *swap { "yes" } else { "no" }
                );
                if *occupied > 0 {
                    s.push_str(&format!(
                        "; its {occupied} process(es) move to {} when the first sandbox starts \
                         (no-internal-processes rule)",
                        delegated.join("main").display()
                    ));
                }
                s
            }
            Hierarchy::V1 { dirs, swap, quota } => {
                let list: Vec<String> = dirs
                    .iter()
                    .map(|d| format!("{} at {}", d.controllers.join(","), d.mount.display()))
                    .collect();
                format!(
                    "cgroup v1: {} (swap accounting: {}; CPU quota: {})",
                    list.join(", "),
                    if *swap { "yes" } else { "no" },
                    if *quota { "yes" } else { "no" }
                )
            }
        }
    }

    /// The directories sandboxes' cgroups are made in: per user (v1
    /// `sifbox/UID/`; v2's delegated cgroup is the user's already).
    pub fn bases(&self) -> Vec<PathBuf> {
        match self {
            Hierarchy::V2 { delegated, .. } => vec![delegated.join(BASE)],
            Hierarchy::V1 { dirs, .. } => dirs.iter().map(|d| v1::user_base(&d.mount)).collect(),
        }
    }

    /// The cgroup whose pids.max caps all the caller's sandboxes, as the
    /// record names it.
    pub fn user_base_name(&self) -> String {
        match self {
            Hierarchy::V2 { delegated, .. } => delegated.join(BASE).display().to_string(),
            Hierarchy::V1 { dirs, .. } => dirs
                .iter()
                .find(|d| d.controllers.iter().any(|c| c == "pids"))
                .map_or_else(
                    || format!("{BASE}/{}", rustix::process::geteuid().as_raw()),
                    |d| v1::user_base(&d.mount).display().to_string(),
                ),
        }
    }
}

/// An open `memory.peak` that was reset: Linux 6.12 resets the peak for
/// reads through the same open file only.
#[derive(Debug, Clone, Default)]
struct PeakFile(Arc<Mutex<Option<std::fs::File>>>);

impl PartialEq for PeakFile {
    fn eq(&self, _: &Self) -> bool {
        // Not part of what a cgroup is: two records of it are equal.
        true
    }
}
impl Eq for PeakFile {}

/// Which of a cgroup's dirs holds a file, as found the first time (eval
/// reads the same counters before and after every command).
#[derive(Debug, Clone, Default)]
struct FoundFiles(Arc<Mutex<Vec<Found>>>);

/// A file's name and the path of it found (None: in none of the dirs).
type Found = (String, Option<PathBuf>);

impl PartialEq for FoundFiles {
    fn eq(&self, _: &Self) -> bool {
        // A cache, not part of what a cgroup is.
        true
    }
}
impl Eq for FoundFiles {}

/// One sandbox's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxCgroup {
    /// 1 or 2.
    pub version: u8,
    /// The cgroup's dirs (`.../sifbox/NAME-RAND`): one for v2, one per
    /// controller mount for v1. Processes live in their `payload/`.
    pub dirs: Vec<PathBuf>,
    /// Where [`SandboxCgroup::remove`] moves a process back to, one per
    /// dir: the cgroup the client was in.
    pub homes: Vec<PathBuf>,
    #[serde(skip)]
    peak: PeakFile,
    #[serde(skip)]
    found: FoundFiles,
}

impl SandboxCgroup {
    fn new(version: u8, dirs: Vec<PathBuf>, homes: Vec<PathBuf>) -> SandboxCgroup {
        SandboxCgroup {
            version,
            dirs,
            homes,
            peak: PeakFile::default(),
            found: FoundFiles::default(),
        }
    }

    /// The cgroup whose `cgroup.procs` [`SandboxCgroup::join`] writes, one
    /// per dir.
    pub fn payloads(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join(PAYLOAD)).collect()
    }

    /// What the sandbox's /sys/fs/cgroup shows: its own `payload/` of each
    /// dir, named as the host's controller mount (v1: `memory`,
    /// `cpu,cpuacct`...; the dir is `MOUNT/sifbox/UID/NAME-RAND`), or for
    /// v2 the one payload at /sys/fs/cgroup itself (name "").
    pub fn views(&self) -> Vec<(String, PathBuf)> {
        self.dirs
            .iter()
            .filter_map(|d| {
                let name = if self.version == 2 {
                    String::new()
                } else {
                    d.parent()?
                        .parent()?
                        .parent()?
                        .file_name()?
                        .to_str()?
                        .to_string()
                };
                Some((name, d.join(PAYLOAD)))
            })
            .collect()
    }

    /// Moves process `pid` (and its threads) into the cgroup.
    pub fn join(&self, pid: u32) -> io::Result<()> {
        for p in self.payloads() {
            write_pid(&Kernel, &p, pid).map_err(|e| context(e, "joining", &p))?;
        }
        Ok(())
    }

    /// The first dir holding `file` (v1 spreads files over the mounts).
    fn file(&self, file: &str) -> Option<PathBuf> {
        let mut found = self
            .found
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, p)) = found.iter().find(|(f, _)| f == file) {
            return p.clone();
        }
        let p = self.dirs.iter().map(|d| d.join(file)).find(|p| p.exists());
        found.push((file.to_string(), p.clone()));
        p
    }

    /// Processes killed by the OOM killer in it so far.
    pub fn oom_kills(&self) -> Option<u64> {
        if self.version == 2 {
            let text = read(&self.file("memory.events")?).ok()?;
            return keyed(&text, "oom_kill");
        }
        // v1 counts a kill in the victim's own cgroup only (payload/ or
        // below): add them up.
        let top = self.file("memory.oom_control")?;
        let mut total = 0u64;
        for dir in walk(top.parent()?) {
            if let Ok(text) = read(&dir.join("memory.oom_control")) {
                total = total.saturating_add(keyed(&text, "oom_kill")?);
            }
        }
        Some(total)
    }

    /// Peak memory since creation or the last reset, in bytes.
    pub fn memory_peak(&self) -> Option<u64> {
        if self.version == 2 {
            if let Ok(guard) = self.peak.0.lock() {
                if let Some(f) = guard.as_ref() {
                    let mut buf = [0u8; 64];
                    let n = f.read_at(&mut buf, 0).ok()?;
                    return parse_u64(std::str::from_utf8(buf.get(..n)?).ok()?);
                }
            }
            return parse_u64(&read(&self.file("memory.peak")?).ok()?);
        }
        parse_u64(&read(&self.file("memory.max_usage_in_bytes")?).ok()?)
    }

    /// Starts a new peak: v1 and Linux 6.12's v2 can; older v2 kernels
    /// cannot (an error says so, and the peak stays the sandbox's).
    pub fn reset_memory_peak(&self) -> io::Result<()> {
        if self.version == 1 {
            let p = self
                .file("memory.max_usage_in_bytes")
                .ok_or_else(|| io::Error::other("the cgroup has no memory controller"))?;
            return write(&Kernel, &p, "0").map_err(|e| context(e, "resetting", &p));
        }
        let p = self
            .file("memory.peak")
            .ok_or_else(|| io::Error::other("no memory.peak (Linux 5.19 has it)"))?;
        let no_reset = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} cannot be reset here ({e}): Linux 6.12 resets it, per open file; \
                     older kernels keep the peak since the sandbox started",
                    p.display()
                ),
            )
        };
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(no_reset)?;
        f.write_all(b"reset\n").map_err(no_reset)?;
        if let Ok(mut slot) = self.peak.0.lock() {
            *slot = Some(f);
        }
        Ok(())
    }

    /// CPU time used by its processes so far, in nanoseconds.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        if self.version == 2 {
            let text = read(&self.file("cpu.stat")?).ok()?;
            return keyed(&text, "usage_usec").map(|us| us.saturating_mul(1000));
        }
        parse_u64(&read(&self.file("cpuacct.usage")?).ok()?)
    }

    /// Moves `pid` back where the client lives (pid 0: none), then removes
    /// the cgroup, waiting briefly for the last processes to be gone; a
    /// cgroup that is gone already is fine.
    pub fn remove(&self, pid: u32) -> io::Result<()> {
        let mut first: Option<io::Error> = None;
        let deadline = Instant::now() + REMOVE_PATIENCE;
        for (dir, home) in self.dirs.iter().zip(&self.homes) {
            if pid != 0 && dir.exists() {
                match write_pid(&Kernel, home, pid) {
                    Ok(()) => {}
                    Err(e) if matches!(errno(&e), Some(Errno::SRCH)) => {}
                    Err(e) => {
                        first.get_or_insert(context(e, "moving the process back to", home));
                    }
                }
            }
            if let Err(e) = remove_tree(&Kernel, dir, deadline) {
                first.get_or_insert(e);
            }
            if self.version == 2 {
                // The base dir too once no sandbox uses it: a delegated
                // cgroup that is Slurm's could not be removed at the end
                // of the job step otherwise. A concurrent create retries.
                if let Some(base) = dir.parent() {
                    let _ = rmdir(&Kernel, base);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Removes the empty cgroups of sandboxes that are gone: directories in the
/// hierarchy's `sifbox/` named `NAME-RAND` whose NAME `live` does not know,
/// at least `min_age` old (a cgroup is made just before its sandbox starts,
/// and is never empty after), holding no process. Returns what it removed.
pub fn gc(h: &Hierarchy, live: &dyn Fn(&str) -> bool, min_age: Duration) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    // v1 made sandboxes' cgroups in `sifbox/` itself before per-user
    // bases (`sifbox/UID/`, whose name no sandbox's matches).
    let legacy = match h {
        Hierarchy::V1 { dirs, .. } => dirs.iter().map(|d| d.mount.join(BASE)).collect(),
        Hierarchy::V2 { .. } => Vec::new(),
    };
    for base in h.bases().into_iter().chain(legacy) {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Some(name) = e
                .file_name()
                .to_str()
                .and_then(sandbox_of)
                .map(str::to_owned)
            else {
                continue;
            };
            let Ok(meta) = e.metadata() else { continue };
            let young = meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < min_age);
            if !meta.is_dir() || live(&name) || young {
                continue;
            }
            // The kernel refuses to remove a cgroup with processes anyway;
            // this is so that a busy one is not even tried (a cgroup.procs
            // that is gone is a cgroup being removed).
            let empty = walk(&path)
                .iter()
                .all(|d| match read(&d.join("cgroup.procs")) {
                    Ok(t) => pids(&t).is_empty(),
                    Err(e) => e.kind() == io::ErrorKind::NotFound,
                });
            if empty && remove_tree(&Kernel, &path, Instant::now()).is_ok() {
                removed.push(path);
            }
        }
    }
    removed
}

/// The sandbox name a cgroup dir of [`BASE`] is for (`NAME-RAND`).
pub fn sandbox_of(dir_name: &str) -> Option<&str> {
    let (name, rand) = dir_name.rsplit_once('-')?;
    let hex = rand.len() == 8
        && rand
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && crate::spec::validate_name(name).is_ok()).then_some(name)
}

/// A new `NAME-RAND` for sandbox `name`.
fn cgroup_name(name: &str) -> String {
    format!("{name}-{}", crate::random_id(4))
}

// ---------------------------------------------------------------------------
// What the kernel shows: mountinfo and /proc/PID/cgroup
// ---------------------------------------------------------------------------

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount's root within its file system (fourth field).
    pub root: String,
    /// Where it is mounted (fifth field, unescaped).
    pub point: PathBuf,
    /// Mounted read-only.
    pub readonly: bool,
    pub fstype: String,
    /// The super block's options (cgroup v1: its controllers).
    pub super_opts: Vec<String>,
}

/// The lines of a /proc/PID/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let _source = r.next()?;
            let super_opts = r
                .next()
                .unwrap_or_default()
                .split(',')
                .map(str::to_string)
                .collect();
            Some(Mount {
                root: unescape(f.get(3)?),
                point: PathBuf::from(unescape(f.get(4)?)),
                readonly: f.get(5)?.split(',').any(|o| o == "ro"),
                fstype,
                super_opts,
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line of /proc/PID/cgroup: hierarchy id, controllers, path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub id: u32,
    /// v1: the hierarchy's controllers (and `name=...`); v2: empty.
    pub controllers: Vec<String>,
    pub path: String,
}

/// The lines of a /proc/PID/cgroup text.
pub fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(3, ':');
            let id = f.next()?.parse().ok()?;
            let controllers = f
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            let path = f.next()?;
            let path = path.strip_suffix(" (deleted)").unwrap_or(path);
            path.starts_with('/').then(|| Membership {
                id,
                controllers,
                path: path.to_string(),
            })
        })
        .collect()
}

/// The directory of cgroup `path` (as /proc/PID/cgroup writes it) in a
/// mount at `dir` whose root is `mount_root`; `None` when the mount does
/// not show it (outside the mount's subtree, or above a cgroup
/// namespace's root).
pub fn locate(dir: &Path, mount_root: &str, path: &str) -> Option<PathBuf> {
    let rel = if mount_root == "/" {
        path
    } else {
        let rest = path.strip_prefix(mount_root)?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    let rel = Path::new(rel.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(dir.join(rel))
}

/// Where a mount point of the host is in a tree whose cgroup mounts are
/// below `root` rather than /sys/fs/cgroup (the same path on a real host).
pub fn under_root(root: &Path, point: &Path) -> PathBuf {
    if root == Path::new(MOUNT_ROOT) {
        return point.to_path_buf();
    }
    match point.strip_prefix(MOUNT_ROOT) {
        Ok(rel) if rel.as_os_str().is_empty() => root.to_path_buf(),
        Ok(rel) => root.join(rel),
        Err(_) => root.join(point.strip_prefix("/").unwrap_or(point)),
    }
}

/// "Slurm job N step S" when `path` is in a Slurm job step's cgroups
/// (v2: `.../job_N/step_S/...`; v1: `/slurm/uid_U/job_N/step_S/...`).
pub fn slurm_step(path: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = path.split('/').collect();
    let j = parts.iter().position(|p| {
        p.strip_prefix("job_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })?;
    let step = parts.get(j + 1)?.strip_prefix("step_")?;
    Some((parts[j]["job_".len()..].to_string(), step.to_string()))
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

/// A cgroup file's text.
pub(crate) fn read(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path)
}

/// The directory holding `path` (an `O_PATH` fd) and `path`'s name in it.
fn parent_of(path: &Path) -> io::Result<(std::os::fd::OwnedFd, &Path)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::from(Errno::INVAL));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = rustix::fs::open(
        parent,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok((dir, Path::new(name)))
}

/// Writes `data` to a cgroup file in one write, through `sys`.
pub(crate) fn write(sys: &dyn Syscall, path: &Path, data: &str) -> io::Result<()> {
    let (dir, name) = parent_of(path)?;
    Ok(sys.write_file(dir.as_fd(), name, data.as_bytes())?)
}

/// Moves `pid` into the cgroup at `dir`.
pub(crate) fn write_pid(sys: &dyn Syscall, dir: &Path, pid: u32) -> io::Result<()> {
    write(sys, &dir.join("cgroup.procs"), &format!("{pid}\n"))
}

/// The errno of an error from the kernel.
pub(crate) fn errno(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw_os_error)
}

/// `e` with what was done to which path said.
pub(crate) fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Makes cgroup directory `path`; with `exclusive`, one that exists is an
/// error (`AlreadyExists`), else fine.
pub(crate) fn make_cgroup(path: &Path, exclusive: bool) -> io::Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => {
            // The kernel fills a new cgroup dir with its files.
            #[cfg(test)]
            fake::populate(path);
            Ok(())
        }
        Err(e) if !exclusive && e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(context(e, "making", path)),
    }
}

/// Removes cgroup directory `path` (EBUSY while it holds processes).
fn rmdir(sys: &dyn Syscall, path: &Path) -> io::Result<()> {
    #[cfg(test)]
    fake::before_rmdir(path)?;
    let (dir, name) = parent_of(path)?;
    Ok(sys.remove_dir(dir.as_fd(), name)?)
}

/// The controller names in a `cgroup.controllers` or
/// `cgroup.subtree_control` text (a `+name` as written counts as `name`).
pub(crate) fn controller_list(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| w.trim_start_matches('+').to_string())
        .filter(|w| !w.is_empty() && !w.starts_with('-'))
        .collect()
}

/// A number file (`123\n`), `max` being none.
pub(crate) fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The value of the `key value` line of a flat-keyed file (memory.events,
/// cpu.stat, memory.oom_control).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The pids in a `cgroup.procs` text.
pub(crate) fn pids(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether the caller may write cgroup file or dir `path`: host root may
/// write any (cgroup dirs are 0555 at a mount's top; root passes by
/// CAP_DAC_OVERRIDE), another caller only what belongs to it and its owner
/// may write (delegation chowns). A mount option `ro` is checked by the
/// callers.
pub(crate) fn owned_writable(path: &Path, inputs: &Inputs) -> Result<(), String> {
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if inputs.privileged {
        return Ok(());
    }
    let euid = inputs.euid;
    if m.uid() != euid {
        return Err(format!(
            "{} belongs to uid {}, not to the caller (uid {euid})",
            path.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o200 == 0 {
        return Err(format!("{} is read-only", path.display()));
    }
    Ok(())
}

/// `top` and the cgroups below it, parents first (at most [`WALK_LIMIT`]).
///
/// A cgroup file system (kernfs) gives a directory 2 + the number of its
/// subdirectories as its link count. A sandbox's cgroup has only
/// `payload/` below it, and `payload/` nothing, as a rule: those are not
/// listed (their 30-odd files each made listing cost more than the rest of
/// reading a sandbox's counters). A link count below 2 (a file system
/// that does not count) means: list.
fn walk(top: &Path) -> Vec<PathBuf> {
    let mut out = vec![top.to_path_buf()];
    let mut i = 0;
    while i < out.len() && out.len() < WALK_LIMIT {
        let dir = out[i].clone();
        i += 1;
        let subdirs = std::fs::symlink_metadata(&dir)
            .ok()
            .and_then(|m| m.nlink().checked_sub(2));
        match subdirs {
            Some(0) => continue,
            Some(1) => {
                let payload = dir.join(PAYLOAD);
                if std::fs::symlink_metadata(&payload).is_ok_and(|m| m.is_dir()) {
                    out.push(payload);
                    continue;
                }
            }
            _ => {}
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) && out.len() < WALK_LIMIT {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// Removes the cgroup at `top` and every cgroup below it, children first,
/// retrying while processes still leave until `deadline`.
pub(crate) fn remove_tree(sys: &dyn Syscall, top: &Path, deadline: Instant) -> io::Result<()> {
    loop {
        let mut busy = None;
        for dir in walk(top).iter().rev() {
            match rmdir(sys, dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    busy = Some((e, dir.clone()));
                    break;
                }
            }
        }
        let Some((e, dir)) = busy else { return Ok(()) };
        let retry = matches!(errno(&e), Some(Errno::BUSY | Errno::NOTEMPTY));
        if !retry || Instant::now() >= deadline {
            let what = if retry {
                "removing (processes still in it)"
            } else {
                "removing"
            };
            return Err(context(e, what, &dir));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Holds an exclusive lock on directory `dir` (released on drop), so that
/// two clients do not prepare the same delegated cgroup at once.
pub(crate) fn lock_dir(dir: &Path) -> io::Result<std::fs::File> {
    let f = std::fs::File::open(dir).map_err(|e| context(e, "opening", dir))?;
    rustix::fs::flock(f.as_fd(), rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| context(e.into(), "locking", dir))?;
    Ok(f)
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake cgroup file system in a temp dir, laid out as the kernel
    //! lays it out (the files are plain files: a test checks what was
    //! written, and writes what the kernel would report).

    use std::path::Path;

    use sifbox_sys::syscall::fake::Recorder;

    /// The syscall seam for the cgroup code on a fake tree: the recording
    /// fake with its writes and removals done on the tree.
    pub fn sys() -> Recorder {
        let r = Recorder::new();
        r.apply_files();
        r
    }

    /// What the kernel puts in a new cgroup dir: a v2 child gets the
    /// files of the controllers its parent's subtree_control enables, a v1
    /// child those of its hierarchy's controllers.
    pub fn populate(dir: &Path) {
        let Some(parent) = dir.parent() else { return };
        if parent.join("cgroup.controllers").exists() {
            let sub =
                std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
            let mut list = super::controller_list(&sub);
            list.dedup();
            v2_cgroup(dir, &list.join(" "), false);
        } else if parent.join("tasks").exists() {
            let mut list = Vec::new();
            for (file, c) in [
                ("memory.limit_in_bytes", "memory"),
                ("pids.max", "pids"),
                ("cpu.cfs_quota_us", "cpu"),
                ("cpuacct.usage", "cpuacct"),
            ] {
                if parent.join(file).exists() {
                    list.push(c);
                }
            }
            let swap = parent.join("memory.memsw.limit_in_bytes").exists();
            v1_cgroup(dir, &list, swap);
        }
    }

    /// What the kernel checks before it removes a cgroup dir: no process
    /// and no child cgroup in it (EBUSY); its files then go with it.
    pub fn before_rmdir(dir: &Path) -> std::io::Result<()> {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let children = std::fs::read_dir(dir)
            .map(|d| d.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir())))
            .unwrap_or(false);
        if !super::pids(&procs).is_empty() || children {
            return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    std::fs::remove_file(e.path())?;
                }
            }
        }
        Ok(())
    }

    /// The last line of a file (a fake cgroup file keeps every write).
    pub fn last(p: &Path) -> String {
        text(p).lines().last().unwrap_or_default().to_string()
    }

    /// Makes cgroup dir `dir` with the files of a v2 cgroup with
    /// `controllers` active (`root`: the hierarchy's root, which has no
    /// cgroup.type and no controller interface files).
    pub fn v2_cgroup(dir: &Path, controllers: &str, root: bool) {
        std::fs::create_dir_all(dir).expect("mkdir");
        let mut files = vec![
            ("cgroup.controllers", format!("{controllers}\n")),
            ("cgroup.subtree_control", String::new()),
            ("cgroup.procs", String::new()),
            ("cgroup.threads", String::new()),
            (
                "cpu.stat",
                "usage_usec 0\nuser_usec 0\nsystem_usec 0\n".into(),
            ),
        ];
        if !root {
            files.push(("cgroup.type", "domain\n".into()));
            files.push(("cgroup.events", "populated 0\nfrozen 0\n".into()));
            for c in controllers.split_whitespace() {
                match c {
                    "memory" => {
                        for (f, v) in [
                            ("memory.max", "max\n"),
                            ("memory.swap.max", "max\n"),
                            ("memory.peak", "0\n"),
                            ("memory.current", "0\n"),
                            (
                                "memory.events",
                                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
                            ),
                        ] {
                            files.push((f, v.into()));
                        }
                    }
                    "pids" => {
                        files.push(("pids.max", "max\n".into()));
                        files.push(("pids.current", "0\n".into()));
                    }
                    "cpu" => files.push(("cpu.max", "max 100000\n".into())),
                    _ => {}
                }
            }
        }
        for (f, v) in files {
            std::fs::write(dir.join(f), v).expect("write");
        }
    }

    /// Makes v1 cgroup dir `dir` with the files of `controllers`.
    pub fn v1_cgroup(dir: &Path, controllers: &[&str], swap: bool) {
        std::fs::create_dir_all(dir).expect("mkdir");
        let mut files = vec![
            ("cgroup.procs", String::new()),
            ("tasks", String::new()),
            ("notify_on_release", "0\n".to_string()),
        ];
        for c in controllers {
            match *c {
                "memory" => {
                    files.extend([
                        ("memory.limit_in_bytes", "9223372036854771712\n".into()),
                        ("memory.max_usage_in_bytes", "0\n".into()),
                        ("memory.usage_in_bytes", "0\n".into()),
                        ("memory.use_hierarchy", "1\n".into()),
                        (
                            "memory.oom_control",
                            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n".into(),
                        ),
                    ]);
                    if swap {
                        files.push((
                            "memory.memsw.limit_in_bytes",
                            "9223372036854771712\n".into(),
                        ));
                    }
                }
                "pids" => files.push(("pids.max", "max\n".into())),
                "cpu" => {
                    files.push(("cpu.cfs_period_us", "100000\n".into()));
                    files.push(("cpu.cfs_quota_us", "-1\n".into()));
                }
                "cpuacct" => files.push(("cpuacct.usage", "0\n".into())),
                _ => {}
            }
        }
        for (f, v) in files {
            std::fs::write(dir.join(f), v).expect("write");
        }
    }

    /// The text of a file, trimmed.
    pub fn text(p: &Path) -> String {
        std::fs::read_to_string(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::fake::*;
    use super::*;

    #[test]
    fn mountinfo_is_read_as_the_kernel_writes_it() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 /.. /sys/fs/cgroup/unified ro,relatime - cgroup2 cgroup2 rw,nsdelegate
50 23 0:40 / /mnt/with\\040space rw - ext4 /dev/sda1 rw
garbage line
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].point, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m[1].fstype, "cgroup");
        assert_eq!(m[1].super_opts, vec!["rw", "cpu", "cpuacct"]);
        assert!(!m[1].readonly);
        assert_eq!(m[2].root, "/..");
        assert!(m[2].readonly);
        assert_eq!(m[3].point, Path::new("/mnt/with space"));
    }

    #[test]
    fn proc_cgroup_lines() {
        let text = "\
12:memory:/user.slice
3:cpu,cpuacct:/a:b
1:name=systemd:/user.slice/user-1000.slice/session-1.scope
0::/user.slice/user-1000.slice/session-1.scope (deleted)
";
        let m = parse_proc_cgroup(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(m[1].path, "/a:b");
        assert_eq!(m[3].id, 0);
        assert!(m[3].controllers.is_empty());
        assert_eq!(m[3].path, "/user.slice/user-1000.slice/session-1.scope");
    }

    #[test]
    fn cgroup_paths_are_found_in_their_mount() {
        let d = Path::new("/sys/fs/cgroup");
        assert_eq!(
            locate(d, "/", "/a/b"),
            Some(PathBuf::from("/sys/fs/cgroup/a/b"))
        );
        assert_eq!(locate(d, "/", "/"), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            locate(d, "/docker/x", "/docker/x/y"),
            Some(PathBuf::from("/sys/fs/cgroup/y"))
        );
        assert_eq!(locate(d, "/docker/x", "/docker/xy"), None);
        assert_eq!(locate(d, "/docker/x", "/other"), None);
        assert_eq!(locate(d, "/", "/../../x"), None, "above a namespace root");
        assert_eq!(
            under_root(Path::new("/tmp/t"), Path::new("/sys/fs/cgroup/memory")),
            PathBuf::from("/tmp/t/memory")
        );
        assert_eq!(
            under_root(Path::new(MOUNT_ROOT), Path::new("/cgroup/memory")),
            PathBuf::from("/cgroup/memory")
        );
    }

    #[test]
    fn flat_keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(2));
        assert_eq!(keyed(events, "oom"), Some(3));
        assert_eq!(keyed(events, "missing"), None);
        let stat = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n";
        assert_eq!(keyed(stat, "usage_usec"), Some(1500));
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n";
        assert_eq!(keyed(oom, "oom_kill"), Some(7));
        assert_eq!(parse_u64("123\n"), Some(123));
        assert_eq!(parse_u64("max\n"), None);
        assert_eq!(pids("1\n22\n333\n"), vec![1, 22, 333]);
    }

    #[test]
    fn names_encode_the_sandbox() {
        assert_eq!(sandbox_of("web-1-0a1b2c3d"), Some("web-1"));
        assert_eq!(sandbox_of("x-0a1b2c3d"), Some("x"));
        assert_eq!(sandbox_of("x-0A1B2C3D"), None, "upper case is not ours");
        assert_eq!(sandbox_of("x-0a1b2c3"), None);
        assert_eq!(sandbox_of("-0a1b2c3d"), None);
        assert_eq!(sandbox_of("payload"), None);
        assert_eq!(sandbox_of("main"), None);
        let n = cgroup_name("box");
        assert_eq!(sandbox_of(&n), Some("box"), "{n}");
        assert_ne!(cgroup_name("box"), n, "random suffixes differ");
    }

    #[test]
    fn slurm_steps_are_recognised() {
        assert_eq!(
            slurm_step("/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0"),
            Some(("3385".into(), "0".into()))
        );
        assert_eq!(
            slurm_step("/slurm/uid_1000/job_7/step_batch/task_0"),
            Some(("7".into(), "batch".into()))
        );
        assert_eq!(slurm_step("/user.slice/job_x/step_0"), None);
        assert_eq!(slurm_step("/job_1"), None);
    }

    #[test]
    fn cpu_quota_has_the_kernels_floor() {
        let l = |m| CgroupLimits {
            cpus_milli: Some(m),
            ..CgroupLimits::default()
        };
        assert_eq!(l(1000).quota_us(), Some(100_000));
        assert_eq!(l(1500).quota_us(), Some(150_000));
        assert_eq!(l(5).quota_us(), Some(MIN_QUOTA_US));
        assert_eq!(CgroupLimits::default().quota_us(), None);
    }

    #[test]
    fn walk_finds_every_cgroup_below_and_lists_only_where_it_must() {
        let t = tempfile::tempdir().expect("tempdir");
        let top = t.path().join("box-0a1b2c3d");
        std::fs::create_dir_all(top.join(PAYLOAD)).expect("mkdir");
        std::fs::write(top.join("memory.limit_in_bytes"), "1\n").expect("w");
        std::fs::write(top.join("payload/cgroup.procs"), "").expect("w");
        assert_eq!(walk(&top), vec![top.clone(), top.join(PAYLOAD)]);
        // What nested namespaces may add below payload/.
        for d in ["payload/a/b", "payload/c"] {
            std::fs::create_dir_all(top.join(d)).expect("mkdir");
        }
        let mut found = walk(&top);
        found.sort();
        let mut want: Vec<PathBuf> = ["", "payload", "payload/a", "payload/a/b", "payload/c"]
            .iter()
            .map(|d| {
                if d.is_empty() {
                    top.clone()
                } else {
                    top.join(d)
                }
            })
            .collect();
        want.sort();
        assert_eq!(found, want);
        // One child that is not payload/ is found by listing.
        let other = t.path().join("other");
        std::fs::create_dir_all(other.join("x")).expect("mkdir");
        assert_eq!(walk(&other), vec![other.clone(), other.join("x")]);
    }

    #[test]
    fn remove_moves_out_waits_for_the_last_processes_and_removes_children_first() {
        let t = tempfile::tempdir().expect("tempdir");
        let top = t.path().join("deleg");
        v2_cgroup(&top, "memory pids", false);
        std::fs::write(top.join("cgroup.subtree_control"), "memory pids\n").expect("w");
        let home = top.join("main");
        make_cgroup(&home, false).expect("main");
        let base = top.join(BASE);
        make_cgroup(&base, false).expect("base");
        std::fs::write(base.join("cgroup.subtree_control"), "memory pids\n").expect("w");
        let dir = base.join("box-0a1b2c3d");
        make_cgroup(&dir, true).expect("dir");
        // What a sandbox with nested namespaces may have made below.
        make_cgroup(&dir.join(PAYLOAD), true).expect("payload");
        make_cgroup(&dir.join("payload/inner"), true).expect("inner");
        make_cgroup(&dir.join("payload/inner/deeper"), true).expect("deeper");
        let last_one = dir.join("payload/inner/deeper/cgroup.procs");
        std::fs::write(&last_one, "77\n").expect("a process still there");
        let cg = SandboxCgroup::new(2, vec![dir.clone()], vec![home.clone()]);
        // The last process leaves a moment later: remove waits for it.
        let leaver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            std::fs::write(&last_one, "").expect("gone");
        });
        let started = Instant::now();
        cg.remove(4242).expect("remove");
        leaver.join().expect("thread");
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(last(&home.join("cgroup.procs")), "4242");
        assert!(!dir.exists());
        assert!(!base.exists(), "v2 base removed when empty");
        assert!(home.exists());
        // Gone already: fine.
        cg.remove(0).expect("again");
    }

    #[test]
    fn removing_one_sandbox_keeps_the_base_of_the_others() {
        let t = tempfile::tempdir().expect("tempdir");
        let top = t.path().join("deleg");
        v2_cgroup(&top, "memory pids", false);
        std::fs::write(top.join("cgroup.subtree_control"), "memory pids\n").expect("w");
        let base = top.join(BASE);
        make_cgroup(&base, false).expect("base");
        std::fs::write(base.join("cgroup.subtree_control"), "memory pids\n").expect("w");
        let mk = |n: &str| {
            let d = base.join(n);
            make_cgroup(&d, true).expect("dir");
            make_cgroup(&d.join(PAYLOAD), true).expect("payload");
            SandboxCgroup::new(2, vec![d], vec![top.clone()])
        };
        let a = mk("a-0a1b2c3d");
        let b = mk("b-0a1b2c3d");
        a.remove(0).expect("remove a");
        assert!(!a.dirs[0].exists() && b.dirs[0].exists());
        assert_eq!(
            text(&base.join("cgroup.subtree_control")),
            "memory pids",
            "the base is intact"
        );
        b.remove(0).expect("remove b");
        assert!(!base.exists());
    }

    #[test]
    fn remove_gives_up_on_a_cgroup_that_stays_busy() {
        let t = tempfile::tempdir().expect("tempdir");
        let top = t.path().join("deleg");
        v2_cgroup(&top, "memory", false);
        let dir = top.join("box-0a1b2c3d");
        v2_cgroup(&dir, "memory", false);
        std::fs::write(dir.join("cgroup.procs"), "9\n").expect("w");
        let cg = SandboxCgroup::new(2, vec![dir.clone()], vec![top.clone()]);
        let err = cg.remove(0).expect_err("busy");
        assert!(err.to_string().contains("box-0a1b2c3d"), "{err}");
        assert!(dir.exists());
    }

    #[test]
    fn gc_removes_only_sifboxs_empty_cgroups_of_gone_sandboxes() {
        let t = tempfile::tempdir().expect("tempdir");
        let d = t.path().join("deleg");
        v2_cgroup(&d, "memory pids", false);
        let base = d.join(BASE);
        // `procs`: what the payload's cgroup.procs shows.
        let mk = |n: &str, procs: Option<&str>| {
            let p = base.join(n);
            std::fs::create_dir_all(p.join(PAYLOAD)).expect("mkdir");
            if let Some(procs) = procs {
                std::fs::write(p.join(PAYLOAD).join("cgroup.procs"), procs).expect("procs");
            }
            p
        };
        let gone = mk("gone-0a1b2c3d", None);
        let gone_too = mk("gone-1a1b2c3d", Some("\n"));
        let busy = mk("busy-0a1b2c3d", Some("1234\n"));
        let live = mk("live-0a1b2c3d", None);
        let foreign = mk("not-ours", None);
        let other_base = d.join("elsewhere-0a1b2c3d");
        std::fs::create_dir_all(&other_base).expect("mkdir");
        let h = Hierarchy::V2 {
            mount: t.path().to_path_buf(),
            mount_root: "/".into(),
            delegated: d.clone(),
            controllers: vec!["memory".into(), "pids".into()],
            swap: true,
            is_root: false,
            occupied: 0,
        };
        // Young ones are kept.
        assert!(gc(&h, &|n| n == "live", Duration::from_secs(3600)).is_empty());
        assert!(gone.exists());
        let mut removed = gc(&h, &|n| n == "live", Duration::ZERO);
        removed.sort();
        assert_eq!(removed, vec![gone.clone(), gone_too.clone()]);
        assert!(!gone.exists() && !gone_too.exists());
        assert!(busy.exists() && live.exists() && foreign.exists());
        assert!(other_base.exists(), "only sifbox/ is looked at");
    }
}
