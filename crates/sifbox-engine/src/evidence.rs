//! `sandbox.json`: the record that a run was sandboxed, and how.
//!
//! Written when a sandbox becomes ready (into its logs dir, or its runtime
//! dir without one) and completed when it stops, with timestamps from the
//! host's clock and from the sandbox's own.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};

use crate::spec::{NetMode, SandboxSpec};

pub(crate) mod error;
pub use error::EvidenceError;

/// File name of the evidence.
pub const FILE: &str = "sandbox.json";

/// The most of a sandbox.json read back.
const MAX_RECORD: u64 = 16 << 20;

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
    /// How its limits were enforced, and what could not be.
    #[serde(default)]
    pub limits: crate::limits::Enforcement,
    /// The calls the default seccomp policy denied, counted; written at
    /// stop (empty: none, or the policy was off).
    #[serde(default)]
    pub seccomp_denied: Vec<crate::denials::Denied>,
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
        let mut namespaces: Vec<String> = ["user", "pid", "mount", "ipc", "uts", "cgroup"]
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
            limits: crate::limits::Enforcement::default(),
            seccomp_denied: Vec::new(),
        }
    }

    /// Writes the record to `path`, in place: the file may be bound
    /// read-only into the sandbox, and a bind follows the file, not its name.
    /// A symlink at `path` is not followed.
    pub fn write(&self, path: &Path) -> Result<()> {
        let data = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::io("encoding sandbox.json", std::io::Error::other(e)))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .and_then(|mut f| f.write_all(&data))
            .ctx(|| format!("writing {}", path.display()))
    }

    /// Adds the stop times, and the calls the default seccomp policy
    /// denied, to the record at `path`.
    pub fn record_stop(
        path: &Path,
        inside_unix_ns: u64,
        denied: &[crate::denials::Denied],
    ) -> Result<()> {
        let mut data = Vec::new();
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .and_then(|f| f.take(MAX_RECORD).read_to_end(&mut data))
            .ctx(|| format!("reading {}", path.display()))?;
        let mut ev: Evidence =
            serde_json::from_slice(&data).map_err(|source| EvidenceError::NotEvidence {
                path: path.to_path_buf(),
                source,
            })?;
        ev.stopped = Some(Moment {
            host_unix_ns: host_now_ns(),
            inside_unix_ns,
        });
        ev.seccomp_denied = denied.to_vec();
        ev.write(path)
    }
}

/// The subdirs of a logs dir, for the agent's logs, the verifier's (and
/// its reward) and what the agent leaves for inspection.
pub const SUBDIRS: [&str; 3] = ["agent", "verifier", "artifacts"];

/// A logs dir made by [`prepare_logs_dir`], held open. The sandbox can
/// replace anything below it (it is bound at /logs): the host makes files
/// there only with `*at()` calls on these fds, never through a path.
#[derive(Debug)]
pub struct LogsDir {
    /// Absolute.
    pub path: PathBuf,
    pub dir: OwnedFd,
    pub agent: OwnedFd,
    pub verifier: OwnedFd,
    pub artifacts: OwnedFd,
}

/// Makes a logs dir for a sandbox (`--logs`): `dir`, made when missing and
/// made 0700 (0711 when `passable`: a user of the image other than root
/// owns the subdirs and must pass through /logs; nobody lists it), with
/// [`SUBDIRS`] 0700, owned by the caller (root inside the sandbox; give
/// them to a user of the image with `Sandbox::chown`), and an empty
/// sandbox.json to be bound read-only (see [`logs_binds`]) and filled once
/// the sandbox is ready. What a sandbox leaves there (a setuid program, a
/// file capability) is stripped when it ends; until then no other host
/// user gets in. `dir` may be one an earlier sandbox had at /logs: a
/// subdir that is not a directory (a symlink it planted, say) is refused,
/// never followed, and one left open to other users is made 0700.
pub fn prepare_logs_dir(dir: &Path, passable: bool) -> Result<LogsDir> {
    prepare(dir, Some(if passable { 0o711 } else { 0o700 }), 0o700)
}

/// [`prepare_logs_dir`] for a dir below one that is the caller's alone
/// (eval's `OUT/JOB`, 0700): the subdirs are 0755, so that the host reads
/// what the image's other users (a subordinate id when unprivileged)
/// write there while the sandbox runs.
pub fn prepare_logs_dir_in_private(dir: &Path) -> Result<LogsDir> {
    prepare(dir, None, 0o755)
}

/// Makes the logs dir `dir`, made `top_mode` (when given) and its subdirs
/// `sub_mode`.
fn prepare(dir: &Path, top_mode: Option<u32>, sub_mode: u32) -> Result<LogsDir> {
    use std::os::unix::fs::DirBuilderExt;
    let path = std::path::absolute(dir).ctx(|| format!("logs dir {}", dir.display()))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(top_mode.unwrap_or(0o755))
        .create(&path)
        .map_err(|source| EvidenceError::LogsCreate {
            path: path.clone(),
            source,
        })?;
    // The dir itself is the caller's choice (and cannot be replaced from
    // inside: it is the mount's root there); what is below it can be.
    let root = rustix::fs::open(
        &path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| EvidenceError::LogsOpen {
        path: path.clone(),
        source: e.into(),
    })?;
    if let Some(mode) = top_mode {
        rustix::fs::fchmod(&root, Mode::from_raw_mode(mode)).map_err(|e| {
            EvidenceError::LogsMode {
                path: path.clone(),
                mode,
                source: e.into(),
            }
        })?;
    }
    let [agent, verifier, artifacts] = SUBDIRS;
    let (agent, verifier, artifacts) = (
        logs_subdir(&root, &path, agent, sub_mode)?,
        logs_subdir(&root, &path, verifier, sub_mode)?,
        logs_subdir(&root, &path, artifacts, sub_mode)?,
    );
    // Made now so that it can be bound read-only; filled once the sandbox
    // is ready.
    let mut evidence = sifbox_sys::beneath::create_new(&root, FILE, Mode::from_raw_mode(0o644))
        .ctx(|| format!("creating {}/{FILE}", path.display()))?;
    evidence
        .write_all(b"{}\n")
        .ctx(|| format!("writing {}/{FILE}", path.display()))?;
    Ok(LogsDir {
        path,
        dir: root,
        agent,
        verifier,
        artifacts,
    })
}

/// Makes (or finds) the subdir `sub` of the logs dir `root` at `path`, and
/// opens it without following a symlink there.
fn logs_subdir(root: &OwnedFd, path: &Path, sub: &'static str, mode: u32) -> Result<OwnedFd> {
    let path = path.to_path_buf();
    if let Err(e) = sifbox_sys::beneath::make_dir(root, sub, Mode::from_raw_mode(mode)) {
        return Err(EvidenceError::SubdirCreate {
            path,
            sub,
            source: e,
        }
        .into());
    }
    let fd = sifbox_sys::beneath::open_dir(root, sub).map_err(|e| EvidenceError::SubdirNotDir {
        path: path.clone(),
        sub,
        source: e.into(),
    })?;
    let st = rustix::fs::fstat(&fd).ctx(|| format!("{}/{sub}", path.display()))?;
    if st.st_mode & !mode & 0o077 != 0 {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| {
            EvidenceError::SubdirOpen {
                path: path.clone(),
                sub,
                mode,
                source: e.into(),
            }
        })?;
    }
    Ok(fd)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_fresh_logs_dir_is_the_callers_alone_and_held_open() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = d.path().join("a/logs");
        let logs = prepare_logs_dir(&dir, false).expect("prepare");
        assert_eq!(logs.path, dir);
        for sub in SUBDIRS {
            assert_eq!(mode(&dir.join(sub)), 0o700, "{sub} is open to others");
        }
        assert_eq!(mode(&dir), 0o700, "the logs dir is open to others");
        prepare_logs_dir(&dir, true).expect("prepare");
        assert_eq!(mode(&dir), 0o711, "a passable logs dir");
        assert_eq!(
            std::fs::read_to_string(dir.join(FILE)).expect("read"),
            "{}\n"
        );
        // The fds are the dirs.
        let st = rustix::fs::fstat(&logs.verifier).expect("fstat");
        let md = std::fs::metadata(dir.join("verifier")).expect("stat");
        assert_eq!(st.st_ino, std::os::unix::fs::MetadataExt::ino(&md));
    }

    #[test]
    fn a_reused_logs_dir_follows_no_planted_symlink() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = d.path().join("logs");
        prepare_logs_dir(&dir, false).expect("prepare");
        // What an earlier sandbox could leave: agent/ a symlink to a host
        // dir (a decoy), artifacts/ made writable by everyone.
        let decoy = d.path().join("decoy");
        std::fs::create_dir(&decoy).expect("mkdir");
        std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::remove_dir(dir.join("agent")).expect("rmdir");
        std::os::unix::fs::symlink(&decoy, dir.join("agent")).expect("symlink");
        std::fs::set_permissions(
            dir.join("artifacts"),
            std::fs::Permissions::from_mode(0o777),
        )
        .expect("chmod");
        let e = prepare_logs_dir(&dir, false).expect_err("a symlinked agent/ is refused");
        assert!(
            matches!(
                &e,
                crate::Error::Evidence(EvidenceError::SubdirNotDir { sub: "agent", .. })
            ),
            "{e}"
        );
        assert_eq!(mode(&decoy), 0o700, "the decoy's mode changed");
        std::fs::remove_file(dir.join("agent")).expect("rm");
        prepare_logs_dir(&dir, false).expect("prepare");
        assert_eq!(mode(&dir.join("artifacts")), 0o700);
        // sandbox.json a symlink: replaced, not written through.
        let target = d.path().join("target.json");
        std::fs::write(&target, "keep").expect("write");
        std::fs::remove_file(dir.join(FILE)).expect("rm");
        std::os::unix::fs::symlink(&target, dir.join(FILE)).expect("symlink");
        prepare_logs_dir(&dir, false).expect("prepare");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep");
        assert!(std::fs::symlink_metadata(dir.join(FILE))
            .expect("stat")
            .is_file());
    }

    #[test]
    fn the_record_is_not_written_through_a_symlink() {
        let d = tempfile::tempdir().expect("tempdir");
        let target = d.path().join("target");
        std::fs::write(&target, "keep").expect("write");
        let link = d.path().join(FILE);
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(Evidence::record_stop(&link, 1, &[]).is_err());
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep");
    }
}
