//! What is wrong with a sandbox's description (a leaf: the engine's
//! `Error` rolls it up).

use std::path::PathBuf;

/// What is wrong with a sandbox's description: each variant names the
/// field and carries the value refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("seccomp mode {0:?}: unknown mode; use `default` (sifbox's policy) or `unconfined` (no filter)")]
    SeccompMode(String),
    /// A limit of 0 (memory, pids, user_pids, cpus).
    #[error("{} 0: {}; give {}", .0.field(), .0.needs(), .0.example())]
    ZeroLimit(Limit),
    #[error("nofile limit: the soft limit must be above 0 and at most the hard one (soft {soft}, hard {hard}); give nofile=SOFT:HARD such as nofile=1024:524288")]
    Nofile { soft: u64, hard: u64 },
    #[error("memory-swap limit: a memory-plus-swap total needs a memory limit; give the memory limit too")]
    SwapWithoutMemory,
    #[error("memory-swap limit: memory plus swap ({total} bytes) is less than the memory limit ({memory} bytes); give a total at least as large as the memory limit (equal: no swap; -1: unlimited swap)")]
    SwapBelowMemory { memory: u64, total: u64 },
    #[error("bind {spec:?}: {problem}; write a bind as SRC:DST or SRC:DST:ro, DST absolute")]
    BindSyntax { spec: String, problem: BindProblem },
    #[error("bind {spec:?}: the source {} does not exist on the host; create it first or fix the path", .src.display())]
    BindSourceMissing { spec: String, src: PathBuf },
    #[error("host name {0:?}: must be 1 to 64 bytes; give a shorter host name")]
    Hostname(String),
    #[error("the writable layer's tmpfs size 0: the writable layer needs some space; give a size in MiB, e.g. 1024")]
    TmpfsLayerZero,
    #[error("a disk-backed writable layer of {size_mib} MiB: ext4 needs at least {min_mib} MiB; give a larger size, e.g. 10 GiB")]
    DiskLayerTooSmall { size_mib: u64, min_mib: u64 },
    #[error("the size of /dev/shm, 0: a tmpfs needs some space; give a size, e.g. 64 MiB")]
    ShmZero,
    #[error("keep_layer with an overlay dir: the overlay dir's upper is kept already; give a tmpfs or disk writable layer, or no keep_layer")]
    KeepLayerWithOverlay,
    #[error("the tmpfs at {} of {size} bytes: needs an absolute path and some space; give an absolute path inside the sandbox and a size, e.g. 64 MiB", .dst.display())]
    Tmpfs { dst: PathBuf, size: u64 },
    #[error("the bind of {} at {}: its destination is not an absolute path; give an absolute path inside the sandbox", .src.display(), .dst.display())]
    BindDestination { src: PathBuf, dst: PathBuf },
    #[error("the guarded bind of {} at {}: its destination is not an absolute path below / of plain names; give an absolute path inside the sandbox, without . or ..", .src.display(), .dst.display())]
    GuardedDestination { src: PathBuf, dst: PathBuf },
    #[error("the guarded bind of {} at {}: its source is not an absolute path; give the host directory as an absolute path", .src.display(), .dst.display())]
    GuardedSource { src: PathBuf, dst: PathBuf },
    #[error("the writable layer's dir at {}: not an absolute path; give an absolute path inside the sandbox", .0.display())]
    LayerDir(PathBuf),
    #[error("sandbox name {0:?}: names may only contain letters, digits, '.', '_' and '-' (at most 128); choose a name matching ^[a-zA-Z0-9._-]+$")]
    Name(String),
    #[error("environment variable {0:?}: expected KEY=VALUE with KEY made of letters, digits and '_'; write it as NAME=value")]
    EnvVar(String),
    #[error("env file {}: cannot read it: {source}; check the path and its permissions", .path.display())]
    EnvFileUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("env file {}: it is not valid UTF-8; save the file as UTF-8 text", .0.display())]
    EnvFileNotUtf8(PathBuf),
    #[error("{}:{line}: {why}; each line must be KEY=VALUE (no spaces around '='), a comment or blank", .path.display())]
    EnvFileLine {
        path: PathBuf,
        line: usize,
        why: String,
    },
}

/// A limit that may not be 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Memory,
    Pids,
    UserPids,
    Cpus,
}

impl Limit {
    /// The limit as messages name it.
    pub fn field(self) -> &'static str {
        match self {
            Limit::Memory => "memory limit",
            Limit::Pids => "pids limit",
            Limit::UserPids => "user_pids limit",
            Limit::Cpus => "cpus",
        }
    }

    fn needs(self) -> &'static str {
        match self {
            Limit::Memory => "a sandbox needs some memory",
            Limit::Pids => "a sandbox needs at least one process",
            Limit::UserPids => "a user's sandboxes need at least one process",
            Limit::Cpus => "a sandbox needs some CPU",
        }
    }

    fn example(self) -> &'static str {
        match self {
            Limit::Memory => "a size such as 512m",
            Limit::Pids => "a number such as 4096",
            Limit::UserPids => "a number such as 16384",
            Limit::Cpus => "a number such as 1 or 0.5",
        }
    }
}

/// What is wrong with the text of a bind.
#[derive(Debug, thiserror::Error)]
pub enum BindProblem {
    #[error("unknown option {0:?} (expected ro or rw)")]
    UnknownOption(String),
    #[error("too many ':' separated fields")]
    TooManyFields,
    #[error("empty source or destination")]
    Empty,
    #[error("the destination must be an absolute path inside the sandbox")]
    RelativeDestination,
    #[error("the destination must not contain '..'")]
    ParentInDestination,
    #[error("{0}")]
    Source(std::io::Error),
}
