//! `sandbox.json`: the record that a run was sandboxed, and how.
//!
//! Written when a sandbox becomes ready (into its logs dir, or its runtime
//! dir without one) and completed when it stops, with timestamps from the
//! host's clock and from the sandbox's own.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::spec::{NetMode, SandboxSpec};

/// File name of the evidence.
pub const FILE: &str = "sandbox.json";

/// One moment, as the host and the sandbox saw it (Unix nanoseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moment {
    pub host_unix_ns: u64,
    /// 0 when the sandbox could not be asked (it was already gone).
    pub inside_unix_ns: u64,
}

/// Slurm's ids for the job this sandbox ran in, when it ran under Slurm.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slurm {
    pub job_id: Option<String>,
    pub step_id: Option<String>,
    pub array_job_id: Option<String>,
    pub array_task_id: Option<String>,
    pub node: Option<String>,
}

impl Slurm {
    fn from_env() -> Option<Slurm> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let s = Slurm {
            job_id: get("SLURM_JOB_ID"),
            step_id: get("SLURM_STEP_ID"),
            array_job_id: get("SLURM_ARRAY_JOB_ID"),
            array_task_id: get("SLURM_ARRAY_TASK_ID"),
            node: get("SLURMD_NODENAME"),
        };
        (s != Slurm::default()).then_some(s)
    }
}

/// The image a sandbox runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    /// As the caller named it.
    pub reference: String,
    /// Content digest, when the image came from the store.
    pub digest: Option<String>,
    /// The unpacked root file system used as the read-only layer.
    pub rootfs: PathBuf,
}

/// The whole record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub sifbox_version: String,
    pub name: String,
    pub image: ImageRef,
    /// Every option the sandbox was made with.
    pub spec: SandboxSpec,
    /// Namespaces the sandbox has of its own.
    pub namespaces: Vec<String>,
    pub network: NetMode,
    pub hostname: String,
    pub kernel: String,
    pub host: String,
    pub host_uid: u32,
    pub slurm: Option<Slurm>,
    pub started: Moment,
    pub stopped: Option<Moment>,
}

/// Host clock now, Unix nanoseconds.
pub fn host_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

impl Evidence {
    /// The record of a sandbox that has just become ready.
    pub fn new(spec: &SandboxSpec, image: ImageRef, inside_ready_ns: u64) -> Evidence {
        let uname = rustix::system::uname();
        let mut namespaces: Vec<String> = ["user", "pid", "mount", "ipc", "uts"]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        if spec.net == NetMode::None {
            namespaces.push("net".into());
        }
        Evidence {
            sifbox_version: env!("CARGO_PKG_VERSION").to_string(),
            name: spec.name.clone(),
            image,
            spec: spec.clone(),
            namespaces,
            network: spec.net,
            hostname: spec.hostname.clone(),
            kernel: format!(
                "{} {}",
                uname.release().to_string_lossy(),
                uname.version().to_string_lossy()
            ),
            host: uname.nodename().to_string_lossy().into_owned(),
            host_uid: rustix::process::getuid().as_raw(),
            slurm: Slurm::from_env(),
            started: Moment {
                host_unix_ns: host_now_ns(),
                inside_unix_ns: inside_ready_ns,
            },
            stopped: None,
        }
    }

    /// Writes the record to `path`, in place: the file may be bound
    /// read-only into the sandbox, and a bind follows the file, not its name.
    pub fn write(&self, path: &Path) -> Result<()> {
        let data = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::io("encoding sandbox.json", std::io::Error::other(e)))?;
        std::fs::write(path, data).ctx(|| format!("writing {}", path.display()))
    }

    /// Adds the stop times to the record at `path`.
    pub fn record_stop(path: &Path, inside_unix_ns: u64) -> Result<()> {
        let data = std::fs::read(path).ctx(|| format!("reading {}", path.display()))?;
        let mut ev: Evidence = serde_json::from_slice(&data).map_err(|e| Error::BadInput {
            what: path.display().to_string(),
            why: format!("not a sandbox.json: {e}"),
            fix: "leave sandbox.json as sifbox wrote it".into(),
        })?;
        ev.stopped = Some(Moment {
            host_unix_ns: host_now_ns(),
            inside_unix_ns,
        });
        ev.write(path)
    }
}

/// Makes a logs dir for a sandbox: `dir` (absolute afterwards) with
/// `agent/`, `verifier/` and `artifacts/` writable by any user (the
/// sandbox's commands may run as any user of the image), and an empty
/// sandbox.json to be bound read-only (see [`logs_binds`]) and filled once
/// the sandbox is ready. Returns the absolute path.
pub fn prepare_logs_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::absolute(dir).ctx(|| format!("logs dir {}", dir.display()))?;
    for sub in ["", "agent", "verifier", "artifacts"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| Error::BadInput {
            what: format!("logs dir {}", dir.display()),
            why: format!("cannot create {}: {e}", d.display()),
            fix: "pass a directory you can write".into(),
        })?;
        if !sub.is_empty() {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777))
                .ctx(|| format!("making {} writable", d.display()))?;
        }
    }
    // Made now so that it can be bound read-only; filled once the sandbox
    // is ready.
    let evidence = dir.join(FILE);
    std::fs::write(&evidence, b"{}\n").ctx(|| format!("creating {}", evidence.display()))?;
    Ok(dir)
}

/// The binds of a logs dir made by [`prepare_logs_dir`]: the dir at
/// `/logs`, and its sandbox.json read-only over itself, a mount point that
/// nothing inside can remove, so the sandbox cannot rewrite its record.
pub fn logs_binds(dir: &Path) -> Vec<crate::spec::Bind> {
    vec![
        crate::spec::Bind {
            src: dir.to_path_buf(),
            dst: PathBuf::from("/logs"),
            readonly: false,
        },
        crate::spec::Bind {
            src: dir.join(FILE),
            dst: PathBuf::from("/logs").join(FILE),
            readonly: true,
        },
    ]
}
