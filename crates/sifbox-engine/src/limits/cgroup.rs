//! Control groups for sandbox limits (interface; the implementation lands
//! with the cgroup backends).
//!
//! A [`Hierarchy`] is what the caller may write: the unified (v2) hierarchy
//! below a cgroup delegated to it, or the v1 memory, pids and cpu
//! controllers (root). [`Hierarchy::create`] makes one sandbox's cgroup
//! with its limits written; the sandbox's outer supervisor joins it before
//! it forks anything, and removes it once the sandbox is gone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// a 100 ms period.
    pub cpus_milli: Option<u32>,
}

/// The writable cgroup hierarchy of the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hierarchy {
    /// cgroup v2: sandboxes' cgroups are made below `parent`, whose
    /// `cgroup.subtree_control` enables `controllers`.
    V2 {
        parent: PathBuf,
        controllers: Vec<String>,
    },
    /// cgroup v1: one dir per controller (memory, pids, cpu), where
    /// sandboxes' cgroups are made (`.../sifbox/NAME`).
    V1 { dirs: Vec<(String, PathBuf)> },
}

/// One sandbox's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxCgroup {
    pub hierarchy: Hierarchy,
    /// The cgroup's dirs: one for v2, one per controller for v1.
    pub dirs: Vec<PathBuf>,
}

impl Hierarchy {
    /// The caller's hierarchy on this host, if it may make cgroups with
    /// the controllers limits need; `root` is where cgroup file systems are
    /// mounted (`/sys/fs/cgroup`; a fake tree in tests).
    pub fn detect(_root: &Path) -> Option<Hierarchy> {
        None
    }

    /// Which of memory, swap, pids and cpu this hierarchy can limit.
    pub fn can(&self, _what: &str) -> bool {
        false
    }

    /// Makes the cgroup of sandbox `name` and writes `limits`.
    pub fn create(&self, _name: &str, _limits: &CgroupLimits) -> std::io::Result<SandboxCgroup> {
        Err(std::io::Error::other("cgroups are not implemented yet"))
    }
}

impl SandboxCgroup {
    /// Moves process `pid` (and its threads) into the cgroup.
    pub fn join(&self, _pid: u32) -> std::io::Result<()> {
        Err(std::io::Error::other("cgroups are not implemented yet"))
    }

    /// Processes killed by the OOM killer in it so far.
    pub fn oom_kills(&self) -> Option<u64> {
        None
    }

    /// Peak memory since creation or the last reset, in bytes.
    pub fn memory_peak(&self) -> Option<u64> {
        None
    }

    /// Starts a new peak (where the kernel allows it).
    pub fn reset_memory_peak(&self) -> std::io::Result<()> {
        Ok(())
    }

    /// CPU time used by its processes so far, in nanoseconds.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        None
    }

    /// Moves `pid` out (to the parent) and removes the cgroup; a cgroup
    /// that is gone already is fine.
    pub fn remove(&self, _pid: u32) -> std::io::Result<()> {
        Ok(())
    }
}
