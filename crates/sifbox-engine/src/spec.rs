//! What a sandbox is made of: the validated, serializable description that the
//! CLI (or a library user) builds and the supervisor executes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Result;

pub(crate) mod error;
pub use error::{BindProblem, Limit, SpecError};

/// The default PATH inside a sandbox (Apptainer's).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Default size of the `--writable-tmpfs` upper layer, in MiB.
pub const DEFAULT_TMPFS_MIB: u64 = 1024;

/// Default size of the sandbox's `/dev/shm`, in bytes (Docker's 64 MiB).
pub const DEFAULT_SHM_BYTES: u64 = 64 << 20;

fn default_shm_bytes() -> u64 {
    DEFAULT_SHM_BYTES
}

/// Network mode of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// Share the host's network namespace.
    #[default]
    Host,
    /// A network namespace of its own with only `lo`, up.
    None,
}

/// How ids are mapped into the sandbox's user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UsernsMode {
    /// `full` when the caller has a subordinate range and newuidmap/newgidmap
    /// exist (or is root), else `single`.
    #[default]
    Auto,
    /// Only the caller's own uid/gid, mapped to 0.
    Single,
    /// The caller's id at 0 plus the caller's whole subordinate range from 1.
    Full,
}

/// One line of a uid_map or gid_map: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// The id maps of a sandbox and how they are written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMapping {
    /// The mode that was asked for, after `auto` was resolved.
    pub mode: UsernsMode,
    pub uid: Vec<IdRange>,
    pub gid: Vec<IdRange>,
    /// True when the maps must be written from outside (newuidmap, or root
    /// writing /proc/PID/uid_map); false when the sandbox writes its own
    /// single-id map.
    pub external: bool,
}

impl IdMapping {
    /// Number of ids mapped (the inside ranges start at 0 and are contiguous).
    pub fn uid_count(&self) -> u32 {
        self.uid.iter().map(|r| r.count).sum()
    }

    /// Number of gids mapped.
    pub fn gid_count(&self) -> u32 {
        self.gid.iter().map(|r| r.count).sum()
    }
}

/// The seccomp policy of a sandbox's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SeccompMode {
    /// sifbox's default policy: an allow-list modelled on Docker's default
    /// profile (see `seccomp/policy.toml` and SECURITY.md).
    #[default]
    Default,
    /// No system call filter at all.
    Unconfined,
}

impl SeccompMode {
    /// Parses `default` or `unconfined`.
    pub fn parse(s: &str) -> Result<SeccompMode> {
        match s {
            "default" => Ok(SeccompMode::Default),
            "unconfined" => Ok(SeccompMode::Unconfined),
            _ => Err(SpecError::SeccompMode(s.to_string()).into()),
        }
    }
}

/// What a sandbox's commands may ask of the kernel beyond the namespaces
/// they run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Confinement {
    #[serde(default)]
    pub seccomp: SeccompMode,
    /// Commands may create user namespaces (and, in them, the other kinds
    /// and mounts): what bubblewrap, Chromium's own sandbox and container
    /// tools inside a sandbox need. Denied by default.
    #[serde(default)]
    pub allow_userns: bool,
}

/// Docker's `--memory-swap`: memory plus swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Swap {
    /// Memory plus swap, in bytes (equal to the memory limit: no swap).
    Total(u64),
    /// As much swap as the host has (`--memory-swap -1`).
    Unlimited,
}

/// Resource limits of a sandbox: all its processes together. `None` is no
/// limit of that kind (the defaults that protect a host are applied by the
/// CLI and eval, see [`DEFAULT_PIDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Limits {
    /// Bytes of memory: resident pages, and the pages the sandbox wrote to
    /// its tmpfs mounts (the writable layer, /dev/shm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Memory plus swap; unset with `memory` set means twice `memory`, as
    /// in Docker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_swap: Option<Swap>,
    /// Processes and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// CPUs, in thousandths (1500 is one and a half).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_milli: Option<u32>,
    /// Processes and threads of all the caller's sandboxes together (with
    /// a cgroup: their common parent's `pids.max`; without: RLIMIT_NPROC,
    /// which then counts every process of the caller's uid on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_pids: Option<u64>,
    /// RLIMIT_NOFILE of the sandbox's processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nofile: Option<Nofile>,
    /// Which of these are sifbox's defaults rather than the caller's
    /// choice (recorded as sandbox.json's `limits.defaults`).
    #[serde(default, skip_serializing_if = "Defaulted::is_none")]
    pub defaults: Defaulted,
}

/// Docker's `--ulimit nofile=SOFT:HARD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nofile {
    pub soft: u64,
    pub hard: u64,
}

/// Open files per process unless told otherwise: systemd's and Docker's
/// (containerd since 2.0) default. A soft 1024 keeps programs that use
/// `select()` (which cannot see fds from 1024 up) working and bounds what
/// a leaking program takes before it fails; the hard 524288 lets a
/// program that needs more (a database, a JVM, a build with many
/// parallel jobs) raise its own soft limit, as on a desktop.
pub const DEFAULT_NOFILE: Nofile = Nofile {
    soft: 1024,
    hard: 524_288,
};

/// The most memory a sandbox gets by default (see [`default_memory`]).
pub const MAX_DEFAULT_MEMORY: u64 = 4 << 30;

/// The memory limit a sandbox gets unless told otherwise: 4 GiB (what eval
/// gives a task that names none, and what most agent tasks ask for), but
/// at most half of the host's RAM, so that one runaway sandbox leaves the
/// host and a neighbour room. `total_ram` is in bytes (0: unknown, then
/// 4 GiB).
pub fn default_memory_for(total_ram: u64) -> u64 {
    if total_ram == 0 {
        return MAX_DEFAULT_MEMORY;
    }
    MAX_DEFAULT_MEMORY.min(total_ram / 2).max(64 << 20)
}

/// [`default_memory_for`] this host (MemTotal of /proc/meminfo).
pub fn default_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib.saturating_mul(1024));
    default_memory_for(total)
}

/// The cap on all of one user's sandboxes' processes unless told
/// otherwise: half of the host's pid space (`pid_max`), so that however
/// many sandboxes a user starts, the host and other users keep the other
/// half. `pid_max` 0 (unknown): the kernel's default 32768.
pub fn default_user_pids_for(pid_max: u64) -> u64 {
    let pid_max = if pid_max == 0 { 32_768 } else { pid_max };
    (pid_max / 2).max(DEFAULT_PIDS)
}

/// [`default_user_pids_for`] this host (/proc/sys/kernel/pid_max).
pub fn default_user_pids() -> u64 {
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    default_user_pids_for(pid_max)
}

/// Parses Docker's `--ulimit nofile=SOFT[:HARD]` (HARD defaults to SOFT);
/// no other resource is taken.
pub fn parse_ulimit(text: &str) -> std::result::Result<Nofile, String> {
    let Some(value) = text.trim().strip_prefix("nofile=") else {
        return Err(format!(
            "{text:?}: only nofile=SOFT[:HARD] is supported (e.g. nofile=4096:65536)"
        ));
    };
    let num = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("{text:?}: {v:?} is not a number of files"))
    };
    let (soft, hard) = match value.split_once(':') {
        Some((s, h)) => (num(s)?, num(h)?),
        None => (num(value)?, num(value)?),
    };
    if soft == 0 || soft > hard {
        return Err(format!(
            "{text:?}: the soft limit must be above 0 and at most the hard one"
        ));
    }
    Ok(Nofile { soft, hard })
}

/// Which limits of a [`Limits`] are sifbox's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Defaulted {
    #[serde(default)]
    pub memory: bool,
    #[serde(default)]
    pub pids: bool,
    #[serde(default)]
    pub user_pids: bool,
    #[serde(default)]
    pub nofile: bool,
}

impl Defaulted {
    fn is_none(&self) -> bool {
        *self == Defaulted::default()
    }

    /// The names of the defaulted limits, as sandbox.json lists them.
    pub fn names(&self) -> Vec<String> {
        [
            (self.memory, "memory"),
            (self.pids, "pids"),
            (self.user_pids, "user_pids"),
            (self.nofile, "nofile"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| (*n).to_string())
        .collect()
    }
}

/// The process cap every sandbox gets unless told otherwise: enough for
/// parallel builds and browsers, far below a host's pid space (32768 by
/// default), so that one fork bomb cannot take the host down.
pub const DEFAULT_PIDS: u64 = 4096;

impl Limits {
    /// The memory-plus-swap total in bytes that applies, if any: Docker's
    /// rule (unset: twice the memory; `Unlimited`: none).
    pub fn swap_total(&self) -> Option<u64> {
        match (self.memory, self.memory_swap) {
            (_, Some(Swap::Unlimited)) | (None, None) => None,
            (_, Some(Swap::Total(t))) => Some(t),
            (Some(m), None) => Some(m.saturating_mul(2)),
        }
    }

    /// Checks the limits as Docker does: a swap total needs a memory limit
    /// at least as large; every limit is positive.
    pub fn validate(&self) -> Result<()> {
        let zero = |limit| Err(SpecError::ZeroLimit(limit).into());
        if self.memory == Some(0) {
            return zero(Limit::Memory);
        }
        if self.pids == Some(0) {
            return zero(Limit::Pids);
        }
        if self.user_pids == Some(0) {
            return zero(Limit::UserPids);
        }
        if let Some(n) = self.nofile {
            if n.soft == 0 || n.soft > n.hard {
                return Err(SpecError::Nofile {
                    soft: n.soft,
                    hard: n.hard,
                }
                .into());
            }
        }
        if self.cpus_milli == Some(0) {
            return zero(Limit::Cpus);
        }
        match (self.memory, self.memory_swap) {
            (None, Some(Swap::Total(_))) => Err(SpecError::SwapWithoutMemory.into()),
            (Some(m), Some(Swap::Total(t))) if t < m => Err(SpecError::SwapBelowMemory {
                memory: m,
                total: t,
            }
            .into()),
            _ => Ok(()),
        }
    }
}

/// Parses a number of CPUs (`2`, `0.5`, `1.25`) into thousandths.
pub fn parse_cpus(text: &str) -> std::result::Result<u32, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of CPUs (e.g. 2 or 0.5)"))?;
    if !v.is_finite() || v <= 0.0 || v > 4_000_000.0 {
        return Err(format!("{text:?}: CPUs must be above 0"));
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a positive, finite value below 4e6, rounded up to thousandths"
    )]
    let milli = (v * 1000.0).ceil() as u32;
    Ok(milli.max(1))
}

/// Where the sandbox's writes go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Writable {
    /// An upper dir on a tmpfs of this many MiB, gone with the sandbox.
    Tmpfs { size_mib: u64 },
    /// An upper dir (`DIR/upper`, `DIR/work`) kept on the host for inspection.
    Overlay { dir: PathBuf },
    /// An upper dir on an ext4 file system of this many MiB, on a loop
    /// device over a nameless file in `scratch`, gone with the sandbox
    /// (host root only: see [`crate::disk`]).
    Disk { size_mib: u64, scratch: PathBuf },
}

/// A tmpfs of its own at a path inside the sandbox (a build's `RUN
/// --mount=type=tmpfs`): a real file system of `size` bytes, nosuid and
/// nodev, gone with the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsMount {
    pub dst: PathBuf,
    pub size: u64,
    pub mode: u32,
}

/// The size of a `RUN --mount=type=tmpfs` without `size=`: 1 GiB, a
/// bound where BuildKit sets none (what a step writes there is memory).
pub const DEFAULT_TMPFS_MOUNT_BYTES: u64 = 1 << 30;

/// A host path made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub readonly: bool,
}

impl Bind {
    /// Parses `SRC:DST[:ro|rw]` (or `SRC` alone, bound at the same path).
    /// SRC must exist; it is made absolute.
    pub fn parse(spec: &str) -> Result<Bind> {
        let bad = |problem| SpecError::BindSyntax {
            spec: spec.to_string(),
            problem,
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let (src, dst, readonly) = match parts.as_slice() {
            [src] => (*src, *src, false),
            [src, dst] => (*src, *dst, false),
            [src, dst, "ro"] => (*src, *dst, true),
            [src, dst, "rw"] => (*src, *dst, false),
            [_, _, opt] => return Err(bad(BindProblem::UnknownOption(opt.to_string())).into()),
            _ => return Err(bad(BindProblem::TooManyFields).into()),
        };
        if src.is_empty() || dst.is_empty() {
            return Err(bad(BindProblem::Empty).into());
        }
        let dst = PathBuf::from(dst);
        if !dst.is_absolute() {
            return Err(bad(BindProblem::RelativeDestination).into());
        }
        if dst
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(bad(BindProblem::ParentInDestination).into());
        }
        let src = std::path::absolute(src).map_err(|e| bad(BindProblem::Source(e)))?;
        if std::fs::symlink_metadata(&src).is_err() {
            return Err(SpecError::BindSourceMissing {
                spec: spec.to_string(),
                src,
            }
            .into());
        }
        Ok(Bind { src, dst, readonly })
    }
}

/// A host directory that the sandbox's commands see read-only at `dst`
/// and only guarded requests (an exec with [`ExecRequest::guarded`], or a
/// [`Request::Guarded`] file request) see writable there: eval's
/// `/logs/verifier`, which nothing an agent leaves running may write.
///
/// The read-only bind is made by init in the sandbox's mount namespace,
/// over which nothing inside holds a capability, so it cannot be made
/// writable again nor unmounted. A second, writable bind of the same
/// directory is mounted over it in a mount namespace of its own, which
/// only guarded requests enter (see DESIGN.md, "Guarded binds").
///
/// [`ExecRequest::guarded`]: crate::protocol::ExecRequest::guarded
/// [`Request::Guarded`]: crate::protocol::Request::Guarded
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardedBind {
    /// A directory on the host.
    pub src: PathBuf,
    /// Where it is shown in the sandbox (absolute).
    pub dst: PathBuf,
}

/// Everything needed to start a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Sandbox name (`^[a-zA-Z0-9._-]+$`).
    pub name: String,
    /// The read-only lower layer: an unpacked root file system.
    pub rootfs: PathBuf,
    /// More read-only layers stacked above `rootfs`, topmost first: overlay
    /// upper dirs of earlier build steps (whiteouts and opaque dirs honoured).
    #[serde(default)]
    pub layers: Vec<PathBuf>,
    pub hostname: String,
    pub net: NetMode,
    pub ids: IdMapping,
    pub writable: Writable,
    pub binds: Vec<Bind>,
    /// Binds read-only to the sandbox's commands and writable to guarded
    /// requests only (see [`GuardedBind`]); made after `binds`.
    #[serde(default)]
    pub guarded: Vec<GuardedBind>,
    /// Paths inside (absolute) over which a fresh, empty directory of the
    /// writable layer is bound, after `binds`: what is written there counts
    /// against the layer's size and stays in the sandbox (eval's
    /// `/logs/agent` and `/logs/artifacts`, over the rollout dir's bind,
    /// copied out with a bound when the agent is done).
    #[serde(default)]
    pub layer_dirs: Vec<PathBuf>,
    /// Tmpfs mounts of their own, made after the binds.
    #[serde(default)]
    pub tmpfs: Vec<TmpfsMount>,
    /// An empty host dir that init opens at the start (as the caller's
    /// root in the sandbox): `Sandbox::stop_keeping_layer` copies the
    /// writable layer's upper dir into it once every process is gone (see
    /// [`crate::layer_copy`]). For a writable layer on a bounded file
    /// system (`Writable::Tmpfs`, `Writable::Disk`): a build step's.
    #[serde(default)]
    pub keep_layer: Option<PathBuf>,
    /// Bind the host's /etc/resolv.conf and /etc/hosts (with `NetMode::Host`).
    pub host_dns: bool,
    /// Size of the tmpfs at `/dev/shm`, in bytes. (`/tmp` is the image's,
    /// in the writable layer, and counts against its size.)
    #[serde(default = "default_shm_bytes")]
    pub shm_bytes: u64,
    #[serde(default)]
    pub confinement: Confinement,
    #[serde(default)]
    pub limits: Limits,
}

impl SandboxSpec {
    /// A sandbox named `name` of the root file system `rootfs`, with the
    /// defaults of `sifbox start`: its name as host name (cut to 64 bytes),
    /// the host's network with its resolv.conf and hosts, a tmpfs of
    /// [`DEFAULT_TMPFS_MIB`] for writes, /dev/shm of [`DEFAULT_SHM_BYTES`],
    /// the default seccomp policy, the pids cap [`DEFAULT_PIDS`], no binds.
    /// Change the fields for anything else; [`SandboxSpec::validate`] (which
    /// the launch calls) checks the result.
    pub fn new(name: impl Into<String>, rootfs: impl Into<PathBuf>, ids: IdMapping) -> SandboxSpec {
        let name = name.into();
        SandboxSpec {
            hostname: hostname_for(&name),
            name,
            rootfs: rootfs.into(),
            layers: Vec::new(),
            net: NetMode::Host,
            ids,
            writable: Writable::Tmpfs {
                size_mib: DEFAULT_TMPFS_MIB,
            },
            binds: Vec::new(),
            guarded: Vec::new(),
            layer_dirs: Vec::new(),
            tmpfs: Vec::new(),
            keep_layer: None,
            host_dns: true,
            shm_bytes: DEFAULT_SHM_BYTES,
            confinement: Confinement::default(),
            limits: Limits {
                pids: Some(DEFAULT_PIDS),
                ..Limits::default()
            },
        }
    }

    /// Checks what the kernel would refuse or sifbox cannot do; the error
    /// names the field.
    pub fn validate(&self) -> Result<()> {
        validate_name(&self.name)?;
        if self.hostname.is_empty() || self.hostname.len() > 64 {
            return Err(SpecError::Hostname(self.hostname.clone()).into());
        }
        match &self.writable {
            Writable::Tmpfs { size_mib: 0 } => return Err(SpecError::TmpfsLayerZero.into()),
            Writable::Disk { size_mib, .. } if *size_mib < MIN_DISK_MIB => {
                return Err(SpecError::DiskLayerTooSmall {
                    size_mib: *size_mib,
                    min_mib: MIN_DISK_MIB,
                }
                .into())
            }
            _ => {}
        }
        if self.shm_bytes == 0 {
            return Err(SpecError::ShmZero.into());
        }
        if self.keep_layer.is_some() && matches!(self.writable, Writable::Overlay { .. }) {
            return Err(SpecError::KeepLayerWithOverlay.into());
        }
        for t in &self.tmpfs {
            if !t.dst.is_absolute() || t.size == 0 {
                return Err(SpecError::Tmpfs {
                    dst: t.dst.clone(),
                    size: t.size,
                }
                .into());
            }
        }
        for b in &self.binds {
            if !b.dst.is_absolute() {
                return Err(SpecError::BindDestination {
                    src: b.src.clone(),
                    dst: b.dst.clone(),
                }
                .into());
            }
        }
        for g in &self.guarded {
            let plain = g.dst.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
            let (src, dst) = (g.src.clone(), g.dst.clone());
            if !g.dst.is_absolute() || !plain || g.dst == Path::new("/") {
                return Err(SpecError::GuardedDestination { src, dst }.into());
            }
            if !g.src.is_absolute() {
                return Err(SpecError::GuardedSource { src, dst }.into());
            }
        }
        for d in &self.layer_dirs {
            if !d.is_absolute() {
                return Err(SpecError::LayerDir(d.clone()).into());
            }
        }
        Ok(())
    }
}

/// The smallest disk-backed writable layer: ext4 needs 16 MiB.
pub const MIN_DISK_MIB: u64 = 16;

/// A host name for `text`: its first 64 bytes, cut at a character
/// boundary (the kernel takes at most 64).
pub fn hostname_for(text: &str) -> String {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Parses a size as Docker writes them: a number of bytes with an
/// optional unit `b`, `k`, `m`, `g` or `t` (binary multiples; any case, an
/// `b`/`ib` suffix after the unit allowed: `64m`, `1.5G`, `512KiB`).
/// Returns bytes, or why the text is not a size.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("unknown unit {unit:?} (use b, k, m, g or t)")),
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err("expected a number, optionally with a unit (e.g. 64m)".into());
    }
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole
            .parse()
            .map_err(|_| "the number is too large".to_string())?
    };
    let scale = 1u64 << shift;
    let mut bytes = whole
        .checked_mul(scale)
        .ok_or_else(|| "the size is too large".to_string())?;
    if !frac.is_empty() {
        // At most 12 fractional digits: enough below a byte for any unit.
        let digits = &frac[..frac.len().min(12)];
        let f: u64 = digits.parse().map_err(|_| "bad fraction".to_string())?;
        let den = 10u64.pow(u32::try_from(digits.len()).unwrap_or(12));
        let part = u128::from(f) * u128::from(scale) / u128::from(den);
        bytes = bytes
            .checked_add(u64::try_from(part).unwrap_or(u64::MAX))
            .ok_or_else(|| "the size is too large".to_string())?;
    }
    Ok(bytes)
}

/// Checks a sandbox name against Apptainer's rule.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name(name.to_string()).into())
    }
}

/// The environment a command starts with, as Apptainer's `--cleanenv`:
/// PATH, HOME=/root, LANG=C, and TERM and the proxy variables taken from
/// `host`, then `extra` in order (later wins).
pub fn clean_env<'a>(
    host: impl IntoIterator<Item = (String, String)>,
    extra: impl IntoIterator<Item = &'a (String, String)>,
) -> Vec<(String, String)> {
    const KEPT: &[&str] = &[
        "TERM",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "ftp_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "FTP_PROXY",
    ];
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), "/root".into()),
        ("LANG".into(), "C".into()),
    ];
    let mut kept: Vec<(String, String)> = host
        .into_iter()
        .filter(|(k, _)| KEPT.contains(&k.as_str()))
        .collect();
    kept.sort();
    env.extend(kept);
    for (k, v) in extra {
        set_env(&mut env, k, v);
    }
    env
}

/// Sets `key` in `env`, replacing an earlier value in place.
pub fn set_env(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    if let Some(slot) = env.iter_mut().find(|(k, _)| k == key) {
        slot.1 = value.to_string();
    } else {
        env.push((key.to_string(), value.to_string()));
    }
}

fn valid_env_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Parses one `--env K=V` argument.
pub fn parse_env_arg(arg: &str) -> Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v)) if valid_env_key(k) => Ok((k.to_string(), v.to_string())),
        _ => Err(SpecError::EnvVar(arg.to_string()).into()),
    }
}

/// Parses an env file: `KEY=VALUE` lines, blank lines and `#` comments
/// ignored, an optional `export ` prefix, no shell evaluation. A value wrapped
/// in one pair of matching quotes loses them; nothing else is interpreted.
pub fn parse_env_file(path: &Path) -> Result<Vec<(String, String)>> {
    let text = std::fs::read(path).map_err(|source| SpecError::EnvFileUnreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let text =
        String::from_utf8(text).map_err(|_| SpecError::EnvFileNotUtf8(path.to_path_buf()))?;
    parse_env_text(&text).map_err(|(line, why)| {
        SpecError::EnvFileLine {
            path: path.to_path_buf(),
            line,
            why,
        }
        .into()
    })
}

/// Parses the text of an env file; an error carries the 1-based line number.
pub fn parse_env_text(text: &str) -> std::result::Result<Vec<(String, String)>, (usize, String)> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err((i + 1, format!("no '=' in {raw:?}")));
        };
        if !valid_env_key(key) {
            return Err((i + 1, format!("invalid variable name {key:?}")));
        }
        let value = strip_matching_quotes(value);
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

fn strip_matching_quotes(v: &str) -> &str {
    for q in ['"', '\''] {
        if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
            return &v[1..v.len() - 1];
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_forms() {
        let b = Bind::parse("/tmp:/data:ro").expect("parse");
        assert_eq!(b.dst, PathBuf::from("/data"));
        assert!(b.readonly);
        let b = Bind::parse("/tmp").expect("parse");
        assert_eq!(b.dst, PathBuf::from("/tmp"));
        assert!(!b.readonly);
        assert!(Bind::parse("/tmp:/d:rx").is_err());
        assert!(Bind::parse("/tmp:rel").is_err());
        assert!(Bind::parse("/tmp:/a/../b").is_err());
        assert!(Bind::parse("/no/such/dir/sifbox:/d").is_err());
        assert!(Bind::parse("/tmp:/d:ro:x").is_err());
        assert!(Bind::parse(":/d").is_err());
    }

    #[test]
    fn env_file_lines() {
        let parsed = parse_env_text("# c\n\nA=1\nexport B=\"two words\"\nC='x'\nD=a=b\nE=\n")
            .expect("parse");
        assert_eq!(
            parsed,
            vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "x".into()),
                ("D".into(), "a=b".into()),
                ("E".into(), String::new()),
            ]
        );
        assert_eq!(parse_env_text("A=1\nnovalue\n").map_err(|e| e.0), Err(2));
        assert_eq!(parse_env_text("1A=1").map_err(|e| e.0), Err(1));
        assert_eq!(parse_env_text("A B=1").map_err(|e| e.0), Err(1));
        // No shell evaluation.
        assert_eq!(
            parse_env_text("A=$(id)`x`${HOME}").expect("parse"),
            vec![("A".into(), "$(id)`x`${HOME}".into())]
        );
    }

    #[test]
    fn clean_env_keeps_only_allowed() {
        let host = vec![
            ("SECRET".to_string(), "x".to_string()),
            ("TERM".to_string(), "xterm".to_string()),
            ("https_proxy".to_string(), "http://p".to_string()),
            ("HOME".to_string(), "/home/me".to_string()),
        ];
        let extra = vec![
            ("A".to_string(), "1".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ];
        let env = clean_env(host, &extra);
        let get = |k: &str| env.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SECRET"), None);
        assert_eq!(get("HOME"), Some("/root"));
        assert_eq!(get("TERM"), Some("xterm"));
        assert_eq!(get("https_proxy"), Some("http://p"));
        assert_eq!(get("A"), Some("1"));
        assert_eq!(get("LANG"), Some("C.UTF-8"));
        assert_eq!(get("PATH"), Some(DEFAULT_PATH));
    }

    #[test]
    fn sizes_parse_as_docker_writes_them() {
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("").is_err());
        assert!(parse_size("m").is_err());
        assert!(parse_size("10x").is_err());
        assert!(parse_size("1.2.3m").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn default_limits_and_ulimit_parse() {
        assert_eq!(default_memory_for(24 << 30), 4 << 30);
        assert_eq!(default_memory_for(6 << 30), 3 << 30, "half the RAM");
        assert_eq!(default_memory_for(0), 4 << 30, "unknown RAM");
        assert_eq!(default_user_pids_for(32_768), 16_384);
        assert_eq!(default_user_pids_for(0), 16_384);
        assert_eq!(default_user_pids_for(4000), DEFAULT_PIDS);
        assert_eq!(
            parse_ulimit("nofile=1024:4096"),
            Ok(Nofile {
                soft: 1024,
                hard: 4096
            })
        );
        assert_eq!(parse_ulimit("nofile=64"), Ok(Nofile { soft: 64, hard: 64 }));
        assert!(parse_ulimit("nproc=10").is_err());
        assert!(parse_ulimit("nofile=10:5").is_err());
        assert!(parse_ulimit("nofile=0").is_err());
        assert!(parse_ulimit("nofile=x").is_err());
        let d = Defaulted {
            memory: true,
            nofile: true,
            ..Defaulted::default()
        };
        assert_eq!(d.names(), vec!["memory", "nofile"]);
    }

    #[test]
    fn limits_follow_dockers_rules() {
        let l = Limits {
            memory: Some(100),
            ..Limits::default()
        };
        assert_eq!(l.swap_total(), Some(200));
        assert!(l.validate().is_ok());
        let no_swap = Limits {
            memory_swap: Some(Swap::Total(100)),
            ..l
        };
        assert_eq!(no_swap.swap_total(), Some(100));
        let unlimited = Limits {
            memory_swap: Some(Swap::Unlimited),
            ..l
        };
        assert_eq!(unlimited.swap_total(), None);
        assert!(Limits {
            memory_swap: Some(Swap::Total(50)),
            ..l
        }
        .validate()
        .is_err());
        assert!(Limits {
            memory: None,
            memory_swap: Some(Swap::Total(50)),
            ..l
        }
        .validate()
        .is_err());
        assert!(Limits {
            pids: Some(0),
            ..Limits::default()
        }
        .validate()
        .is_err());
        assert_eq!(parse_cpus("1"), Ok(1000));
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert_eq!(parse_cpus("0.0001"), Ok(1));
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("-1").is_err());
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("inf").is_err());
    }

    #[test]
    fn names() {
        assert!(validate_name("a.b_c-1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("..").is_err());
        assert!(validate_name("a b").is_err());
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any text: parsing never panics, and an error names a line
            /// that exists.
            #[test]
            fn env_text_never_panics(text in "\\PC{0,400}") {
                if let Err((line, _)) = parse_env_text(&text) {
                    prop_assert!(line >= 1 && line <= text.lines().count());
                }
            }

            /// Well-formed lines come back exactly, values verbatim (no
            /// shell evaluation), in order.
            #[test]
            fn env_text_roundtrip(
                entries in proptest::collection::vec(
                    ("[A-Za-z_][A-Za-z0-9_]{0,12}", "[^\\n\\r'\"]{0,30}"),
                    0..12,
                )
            ) {
                let text: String = entries.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
                let parsed = parse_env_text(&text).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                let expected: Vec<(String, String)> = entries.clone();
                prop_assert_eq!(parsed, expected);
            }

            /// Sizes: never a panic; what parses is what was written.
            #[test]
            fn sizes_never_panic(text in "\\PC{0,24}", n in 0u64..1 << 40) {
                let _ = parse_size(&text);
                prop_assert_eq!(parse_size(&format!("{n}")), Ok(n));
                prop_assert_eq!(parse_size(&format!("{n}k")).ok(), n.checked_mul(1024));
            }

            /// Bind specs: never a panic; an accepted one has an absolute
            /// destination without '..'.
            #[test]
            fn bind_spec_never_panics(spec in "\\PC{0,60}") {
                if let Ok(b) = Bind::parse(&spec) {
                    prop_assert!(b.dst.is_absolute());
                    prop_assert!(!b.dst.components().any(|c| matches!(c, std::path::Component::ParentDir)));
                }
            }
        }
    }
}
