//! The task format (Harbor/BenchFlow layout):
//!
//! ```text
//! TASK/
//!   task.toml                 [environment] [agent] [verifier] [solution]
//!   instruction.md            -> /instruction.md
//!   task.md                   (BenchFlow's, instead of both: front matter
//!                             and prompt, see [`document`]; it wins)
//!   environment/Dockerfile    the build context (or [environment] docker_image)
//!   environment/docker-compose.yaml   one service, see [`compose`]
//!   solution/solve.sh         (or oracle/) -> /solution, for the oracle agent
//!   tests/test.sh             (or verifier/) -> /tests
//! ```
//!
//! task.toml is untrusted input: it is size-limited, every value is checked
//! here (types, ranges, names, paths), and nothing in it reaches a command
//! line of the host. What Harbor 0.26 and BenchFlow 0.7.11 accept is
//! accepted (their spellings included); what sifbox cannot honour makes
//! the task `unsupported` rather than the job bad input; unknown keys are
//! warnings ([`keys`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result};

mod check;
pub mod compose;
mod discover;
pub mod document;
mod keys;
mod model;
mod yaml;

pub use check::{parse_config, parse_memory, valid_name, valid_step_name};
pub use discover::{check_filters, discover, load, select};
pub use document::TASK_MD;
pub use model::{
    HealthCommand, NetworkMode, RawAgent, RawEnvironment, RawHealthcheck, RawMinReward,
    RawSetupCommand, RawSolution, RawStep, RawTaskToml, RawUser, RawVerifier,
    RawVerifierEnvironment, RewardStrategy, VerifierMode,
};

/// The agent's time limit when task.toml gives none.
pub const DEFAULT_AGENT_TIMEOUT_SEC: f64 = 600.0;
/// The verifier's time limit when task.toml gives none.
pub const DEFAULT_VERIFIER_TIMEOUT_SEC: f64 = 600.0;
/// The environment build's time limit when task.toml gives none.
pub const DEFAULT_BUILD_TIMEOUT_SEC: f64 = 600.0;
/// The size of the sandbox's writable layer when task.toml gives none
/// (Harbor's old default and BenchFlow's).
pub const DEFAULT_STORAGE_MB: u64 = 10240;
/// The memory limit of a rollout whose task.toml gives none. Harbor 0.26
/// has no default (under Docker such a task may take the whole host);
/// Harbor up to 0.5 and BenchFlow 0.7 give 2048 MB, for the processes
/// alone, with the writable layer on disk. Here the writable layer is a
/// tmpfs whose pages count in the limit, so the default is those 2 GiB for
/// the processes plus 2 GiB for the files they write.
pub const DEFAULT_MEMORY_MB: u64 = 4096;
/// A setup command's time limit when task.toml gives none (BenchFlow's).
pub const DEFAULT_SETUP_TIMEOUT_SEC: f64 = 600.0;
/// A healthcheck's pauses (`interval_sec`, `start_interval_sec`) and time
/// limit when task.toml gives none (Harbor 0.26's).
pub const DEFAULT_HEALTH_INTERVAL_SEC: f64 = 5.0;
pub const DEFAULT_HEALTH_TIMEOUT_SEC: f64 = 30.0;
/// The largest memory_mb or storage_mb accepted (1 PiB).
const MAX_MB: u64 = 1 << 30;
/// The longest time limit accepted (a week).
const MAX_TIMEOUT_SEC: f64 = 7.0 * 24.0 * 3600.0;
/// The largest task.toml read.
const MAX_TASK_TOML: u64 = 1 << 20;
/// The file names of a task.
pub const TASK_TOML: &str = "task.toml";
pub const INSTRUCTION: &str = "instruction.md";

/// One step of a multi-step task, checked (its own values, else the
/// task's).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    pub agent_timeout: Duration,
    pub agent_user: Option<String>,
    pub verifier_timeout: Duration,
    pub verifier_user: Option<String>,
    /// Env templates, unresolved: on top of `[verifier] env`.
    pub verifier_env: Vec<(String, String)>,
    /// The remaining steps are not run when one of these rewards (a
    /// number's: `reward`) is below its threshold or missing.
    pub min_reward: Option<BTreeMap<String, f64>>,
}

/// One setup command (BenchFlow's `setup_commands`), checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SetupCommand {
    /// Run as `/bin/sh -c COMMAND`.
    pub command: String,
    pub timeout: Duration,
    pub cwd: Option<String>,
    /// Env templates, unresolved.
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    /// Rollouts of every sifbox process holding a lock of this name run
    /// the command one at a time.
    pub host_lock: Option<String>,
}

/// A compose service's own `entrypoint`/`command`: under Harbor its
/// container's main process, here a detached command started before the
/// healthcheck, running until the sandbox stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCommand {
    pub entrypoint: Option<Vec<String>>,
    pub command: Option<Vec<String>>,
}

impl ServiceCommand {
    /// The argv to start, by Docker's rule (an entrypoint of the service
    /// replaces the image's ENTRYPOINT and drops its CMD; a command alone
    /// follows the image's ENTRYPOINT); None when there is nothing to run
    /// but a keep-alive (`sleep infinity`), which a sandbox needs not.
    pub fn argv(&self, image_entrypoint: Option<&[String]>) -> Option<Vec<String>> {
        let command = self.command.clone().unwrap_or_default();
        let argv: Vec<String> = match &self.entrypoint {
            Some(e) if !e.is_empty() => e.iter().cloned().chain(command).collect(),
            Some(_) => command,
            None if compose::keep_alive(&command) => return None,
            None => image_entrypoint
                .unwrap_or_default()
                .iter()
                .cloned()
                .chain(command)
                .collect(),
        };
        (!argv.is_empty() && !compose::keep_alive(&argv)).then_some(argv)
    }
}

/// A healthcheck, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Healthcheck {
    /// The argv to run (`/bin/sh -c STRING` for a string).
    pub argv: Vec<String>,
    /// Between checks after the start period.
    pub interval: Duration,
    pub timeout: Duration,
    /// Failures of checks started within it do not count.
    pub start_period: Duration,
    /// Between checks within the start period.
    pub start_interval: Duration,
    /// Failures after the start period that end it (at least 1).
    pub retries: u32,
}

/// Resources the task asks for, as task.toml says (see [`Limits::resolve`]
/// for what a rollout gets).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub storage_mb: Option<u64>,
    pub gpus: Option<u64>,
    /// Acceptable GPU types (recorded with `gpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_types: Option<Vec<String>>,
}

/// What a job sets for every task, as Harbor's `--override-cpus`,
/// `--override-memory-mb`, `--override-storage-mb` and `--override-gpus`
/// do (the value replaces the task's, whether it gives one or not), and
/// the pids cap (`--pids`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub storage_mb: Option<u64>,
    pub gpus: Option<u64>,
    pub pids: Option<u64>,
}

impl Overrides {
    /// Checks the values as task.toml's are checked; `flag` names each in
    /// errors (`--override-cpus`...).
    pub fn check(&self) -> Result<()> {
        let bad_flag = |flag: &str, v: &dyn std::fmt::Display, why: &str, fix: &str| {
            Err(bad(format!("{flag} {v}"), why, fix))
        };
        if let Some(c) = self.cpus {
            if cpus_milli(c).is_none() {
                return bad_flag(
                    "--override-cpus",
                    &c,
                    "not a number of CPUs above 0",
                    "pass e.g. --override-cpus 2 or 0.5",
                );
            }
        }
        for (flag, v) in [
            ("--override-memory-mb", self.memory_mb),
            ("--override-storage-mb", self.storage_mb),
        ] {
            if let Some(v) = v {
                if v == 0 || v > MAX_MB {
                    return bad_flag(
                        flag,
                        &v,
                        "not a size in MiB from 1 to 2^30",
                        "pass e.g. 4096",
                    );
                }
            }
        }
        if self.pids == Some(0) {
            return bad_flag(
                "--pids",
                &0,
                "a sandbox needs at least one process",
                "pass e.g. --pids 4096",
            );
        }
        Ok(())
    }
}

/// Where a rollout's limit came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSource {
    /// task.toml.
    Task,
    /// sifbox's default (no value in task.toml).
    Default,
    /// A flag of the job (`--override-*`, `--pids`).
    Override,
}

/// The limits of a rollout: what the task asked for after sifbox's
/// defaults and the job's overrides. `None`: no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutLimits {
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub storage_mb: Option<u64>,
    pub gpus: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_types: Option<Vec<String>>,
    pub pids: Option<u64>,
    /// Where each value came from.
    pub source: BTreeMap<String, LimitSource>,
}

impl Limits {
    /// The rollout's limits: an override replaces the task's value; the
    /// memory, storage and pids limits fall back to sifbox's defaults
    /// ([`DEFAULT_MEMORY_MB`], [`DEFAULT_STORAGE_MB`],
    /// [`sifbox_engine::spec::DEFAULT_PIDS`]); CPUs and GPUs have none.
    pub fn resolve(&self, o: &Overrides) -> RolloutLimits {
        let mut source = BTreeMap::new();
        let memory_mb = pick(
            &mut source,
            "memory_mb",
            o.memory_mb,
            self.memory_mb,
            Some(DEFAULT_MEMORY_MB),
        );
        let storage_mb = pick(
            &mut source,
            "storage_mb",
            o.storage_mb,
            self.storage_mb,
            Some(DEFAULT_STORAGE_MB),
        );
        let pids = pick(
            &mut source,
            "pids",
            o.pids,
            None,
            Some(sifbox_engine::spec::DEFAULT_PIDS),
        );
        let cpus = pick(&mut source, "cpus", o.cpus, self.cpus, None);
        let gpus = pick(&mut source, "gpus", o.gpus, self.gpus, None);
        RolloutLimits {
            cpus,
            memory_mb,
            storage_mb,
            gpus,
            gpu_types: self.gpu_types.clone(),
            pids,
            source,
        }
    }
}

/// The override, else the task's value, else the default; records where
/// it came from in `source`.
fn pick<T>(
    source: &mut BTreeMap<String, LimitSource>,
    key: &str,
    over: Option<T>,
    task: Option<T>,
    default: Option<T>,
) -> Option<T> {
    let (v, s) = match (over, task, default) {
        (Some(v), _, _) => (v, LimitSource::Override),
        (None, Some(v), _) => (v, LimitSource::Task),
        (None, None, Some(v)) => (v, LimitSource::Default),
        (None, None, None) => return None,
    };
    source.insert(key.to_string(), s);
    Some(v)
}

impl RolloutLimits {
    /// The sandbox's limits. Memory plus swap is left to Docker's rule
    /// (twice the memory), as Harbor's Docker environment gets it.
    pub fn spec(&self) -> sifbox_engine::spec::Limits {
        sifbox_engine::spec::Limits {
            memory: self.memory_mb.map(|m| m.saturating_mul(1 << 20)),
            memory_swap: None,
            pids: self.pids,
            cpus_milli: self.cpus.and_then(cpus_milli),
            ..sifbox_engine::spec::Limits::default()
        }
    }

    /// The writable layer's size in MiB.
    pub fn storage_mib(&self) -> u64 {
        self.storage_mb.unwrap_or(DEFAULT_STORAGE_MB)
    }
}

/// `cpus` in thousandths, rounded up; None unless it is a finite number
/// above 0 that the engine accepts.
pub fn cpus_milli(cpus: f64) -> Option<u32> {
    // f64's Display never uses an exponent: the engine's parser reads it.
    sifbox_engine::spec::parse_cpus(&format!("{cpus}")).ok()
}

/// task.toml, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskConfig {
    pub build_timeout: Duration,
    pub docker_image: Option<String>,
    pub limits: Limits,
    /// The environment's network, and each phase's (overrides applied).
    pub network: NetworkMode,
    pub agent_network: NetworkMode,
    pub verifier_network: NetworkMode,
    /// Env templates (`${VAR:-default}` unresolved), by phase.
    pub env: Vec<(String, String)>,
    pub verifier_env: Vec<(String, String)>,
    pub solution_env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub healthcheck: Option<Healthcheck>,
    pub agent_timeout: Duration,
    pub agent_user: Option<String>,
    pub verifier_timeout: Duration,
    pub verifier_user: Option<String>,
    /// The user of every command that names none, in place of the image's
    /// (a compose service's `user`).
    pub default_user: Option<String>,
    /// A compose service's own command.
    pub service: Option<ServiceCommand>,
    /// `[metadata.sifbox] allow_userns = true`: the task asks that its
    /// commands may create user namespaces (bubblewrap, Chromium's
    /// sandbox). A request only, noted in its results: the caller grants it
    /// (`--allow-userns`, `--allow-userns-task NAME`). Kept under
    /// `[metadata]`, which Harbor and BenchFlow leave free-form.
    pub allow_userns: bool,
    /// BenchFlow's setup commands, run in order after the healthcheck and
    /// before the agent.
    pub setup_commands: Vec<SetupCommand>,
    /// Where the verifier runs: Harbor's `environment_mode`, else
    /// `separate` when `[verifier.environment]` is there, else `shared`.
    pub verifier_mode: VerifierMode,
    /// `[verifier.environment] docker_image`: the separate verifier's
    /// image (which holds its tests at /tests).
    pub verifier_image: Option<String>,
    /// `[[steps]]`: none for a single-step task.
    pub steps: Vec<Step>,
    pub reward_strategy: RewardStrategy,
    /// What of the task sifbox cannot honour, one line each naming the
    /// field: such a task's rollouts end `unsupported` (and run nothing).
    pub unsupported: Vec<String>,
    /// Unknown keys, and known keys not honoured: one line each.
    pub warnings: Vec<String>,
}

/// Where a task's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSource {
    /// Built from this context (its `Dockerfile`).
    Dockerfile { context: PathBuf },
    /// A prebuilt image (`docker_image`): a store name or `docker://REF`.
    Image(String),
    /// `docker_image` naming a SIF file (`*.sif`, relative to the task's
    /// dir or absolute: the convention of Harbor's singularity and
    /// BenchFlow's apptainer environments), imported once.
    Sif(PathBuf),
}

/// The instruction a task gives its agent (/instruction.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    /// instruction.md.
    File(PathBuf),
    /// task.md's prompt.
    Text(String),
}

impl Instruction {
    /// The text.
    pub fn text(&self) -> std::io::Result<String> {
        match self {
            Instruction::File(p) => std::fs::read_to_string(p),
            Instruction::Text(t) => Ok(t.clone()),
        }
    }
}

/// A task directory, loaded and checked.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    /// Absolute.
    pub dir: PathBuf,
    /// The file the config came from: task.md or task.toml.
    pub config_file: PathBuf,
    pub config: TaskConfig,
    pub instruction: Instruction,
    pub environment: EnvSource,
    /// `solution/` (or `oracle/`), when there is one.
    pub solution: Option<PathBuf>,
    /// `tests/` (or `verifier/`), holding test.sh.
    pub tests: PathBuf,
    /// The verifier's own environment, when it runs separately.
    pub separate_verifier: Option<SeparateVerifier>,
    /// A multi-step task's steps' files, in `config.steps`' order.
    pub steps: Vec<StepFiles>,
}

/// The files of one step (Harbor's `steps/NAME/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFiles {
    /// `steps/NAME/instruction.md`.
    pub instruction: Instruction,
    /// Uploaded to /tests in this order, merged: `tests/` (when there is
    /// one), then `steps/NAME/tests/` (when there is one).
    pub tests: Vec<PathBuf>,
    /// The test.sh that runs (at /tests/test.sh): the step's, else the
    /// task's.
    pub test_script: PathBuf,
    /// The oracle's: `steps/NAME/solution/` when there is one, else the
    /// task's.
    pub solution: Option<PathBuf>,
}

/// A separate verifier's environment (Harbor's
/// `resolve_verifier_environment_definition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeparateVerifier {
    /// `[verifier.environment] docker_image`, else `tests/Dockerfile`
    /// (built with tests/ as its context), else the task's environment.
    pub environment: EnvSource,
    /// The image holds the tests at /tests (the first two): sifbox
    /// uploads none. With the task's environment they are uploaded.
    pub bundled_tests: bool,
}

impl Task {
    /// The oracle's script, `solve.sh` in `solution/` (or `oracle/`), when
    /// there is one.
    pub fn solve_script(&self) -> Option<PathBuf> {
        self.solution
            .as_ref()
            .map(|s| s.join("solve.sh"))
            .filter(|p| p.is_file())
    }
}

fn bad(what: impl Into<String>, why: impl Into<String>, fix: impl Into<String>) -> EvalError {
    EvalError::bad(what, why, fix)
}

/// Whether `docker_image` names a SIF file on the host (`*.sif`) rather
/// than an image reference: a reference never ends so.
pub fn is_sif_path(image: &str) -> bool {
    image.len() > 4 && image.to_ascii_lowercase().ends_with(".sif")
}

/// The script a phase runs, by its shebang: `[path]` (executed directly,
/// its `#!` line decides, as Harbor runs test.sh and solve.sh), else
/// `bash path` (a script without one; Harbor's would fail to execute).
/// `host` is the script in the task's dir, `inside` where it is in the
/// sandbox.
pub fn script_argv(root: &Path, host: &Path, inside: &str) -> Vec<String> {
    let mut head = [0u8; 2];
    let shebang = open_task_file(root, host)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok()
        && head == *b"#!";
    if shebang {
        vec![inside.to_string()]
    } else {
        vec!["bash".to_string(), inside.to_string()]
    }
}

/// Opens the task's file `path` (below the task's directory `root`)
/// through `openat2(RESOLVE_BENEATH)` from `root`: a symlink on the way is
/// followed only while it stays inside the task's directory; one that leads
/// out (a `solve.sh` naming the caller's `~/.ssh/id_ed25519`) is refused,
/// and so is what is not a regular file. A suite is untrusted: eval reads
/// nothing of the host through it.
pub fn open_task_file(root: &Path, path: &Path) -> std::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let rel = path.strip_prefix(root).map_err(|_| {
        std::io::Error::other(format!(
            "{} is not in the task's directory {}",
            path.display(),
            root.display()
        ))
    })?;
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = sifbox_sys::beneath::open_inside(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
    )
    .map_err(|e| match e {
        rustix::io::Errno::XDEV => std::io::Error::other(format!(
            "{}: a symlink that leads out of the task's directory {} (a task's files are read only from inside it)",
            path.display(),
            root.display()
        )),
        e => std::io::Error::other(format!("{}: {e}", path.display())),
    })?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// Where a task's SIF file (`docker_image = "../img.sif"`) may be: beneath
/// a directory given to eval (several tasks of a suite may share one SIF
/// there), or beneath one the caller allows (`--allow-image-dir DIR`,
/// `[eval] image_dirs`). A suite is untrusted: without this, a task's
/// `../../private/private.sif` (or an absolute path) imported any SIF the
/// caller can read and ran its contents in the task's sandbox, where the
/// agent reads them.
#[derive(Debug, Clone, Default)]
pub struct ImageDirs {
    /// Canonical (a symlink naming the suite is the caller's choice).
    dirs: Vec<PathBuf>,
}

impl ImageDirs {
    /// The dirs given to eval (`given`) and those the caller allows; an
    /// error names a dir that cannot be resolved.
    pub fn new(given: &[PathBuf], allowed: &[PathBuf]) -> std::io::Result<ImageDirs> {
        let dirs = given
            .iter()
            .chain(allowed)
            .map(|d| {
                std::fs::canonicalize(d)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", d.display())))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ImageDirs { dirs })
    }

    /// Opens the SIF at `path` (a task's dir joined with its
    /// `docker_image`): the file it resolves to must be beneath one of the
    /// dirs, and is opened from that dir with `openat2(RESOLVE_BENEATH)`,
    /// so that a link swapped meanwhile still leads nowhere outside. What
    /// is imported is read through the fd this returns. The error says why
    /// (the fix is the caller's).
    pub fn open(&self, path: &Path) -> std::result::Result<std::fs::File, String> {
        use rustix::fs::{Mode, OFlags};
        let canon = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for dir in &self.dirs {
            let Ok(rel) = canon.strip_prefix(dir) else {
                continue;
            };
            let Ok(top) = rustix::fs::open(
                dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            match sifbox_sys::beneath::open_inside(
                &top,
                rel,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            ) {
                Ok(fd) => {
                    let file = std::fs::File::from(fd);
                    return match file.metadata() {
                        Ok(m) if m.is_file() => Ok(file),
                        Ok(_) => Err(format!("{}: not a regular file", path.display())),
                        Err(e) => Err(format!("{}: {e}", path.display())),
                    };
                }
                // Changed meanwhile to lead out of this dir.
                Err(rustix::io::Errno::XDEV) => continue,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
        Err(format!(
            "{} (that is, {}) is not beneath a directory given to eval nor one allowed for images ({})",
            path.display(),
            canon.display(),
            self.dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Every SIF file the tasks name (their environments' and separate
    /// verifiers'), checked up front: the first that does not open
    /// beneath a dir, as (task, what, why).
    pub fn check(&self, tasks: &[Task]) -> std::result::Result<(), (String, String, String)> {
        for t in tasks {
            let sources = std::iter::once(("[environment] docker_image", &t.environment)).chain(
                t.separate_verifier
                    .iter()
                    .map(|v| ("[verifier.environment] docker_image", &v.environment)),
            );
            for (what, source) in sources {
                if let EnvSource::Sif(p) = source {
                    if let Err(why) = self.open(p) {
                        return Err((t.name.clone(), format!("{what} {}", p.display()), why));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task file is read beneath the task's dir: a symlink inside it is
    /// followed, one that leads out (absolute, or by `..`) is refused, and
    /// so is a FIFO (which would hang a plain read).
    #[test]
    fn task_files_are_read_beneath_the_task_dir_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let task = d.path().join("task");
        std::fs::create_dir_all(task.join("solution")).expect("mkdir");
        std::fs::write(d.path().join("secret"), "host secret").expect("write");
        std::fs::write(task.join("shared.sh"), "#!/bin/sh\n").expect("write");
        let link = |to: &str, name: &str| {
            std::os::unix::fs::symlink(to, task.join("solution").join(name)).expect("symlink");
        };
        link("../shared.sh", "inside.sh");
        link(&d.path().join("secret").display().to_string(), "abs.sh");
        link("../../secret", "up.sh");
        let read = |name: &str| {
            open_task_file(&task, &task.join("solution").join(name)).map(|mut f| {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut f, &mut s).expect("read");
                s
            })
        };
        assert_eq!(read("inside.sh").expect("inside"), "#!/bin/sh\n");
        for name in ["abs.sh", "up.sh"] {
            let e = read(name).expect_err(name);
            assert!(
                e.to_string().contains("leads out of the task's directory"),
                "{e}"
            );
        }
        rustix::fs::mknodat(
            rustix::fs::CWD,
            task.join("solution/fifo.sh"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        assert!(read("fifo.sh").is_err());
        assert!(open_task_file(&task.join("solution"), &d.path().join("secret")).is_err());
    }

    /// A SIF named by a task opens beneath a dir given to eval, or one the
    /// caller allows, only: `..` and symlinks out of it are refused.
    #[test]
    fn a_tasks_sif_opens_beneath_the_given_dirs_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let suite = d.path().join("suite");
        let private = d.path().join("private");
        std::fs::create_dir_all(suite.join("task/img")).expect("mkdir");
        std::fs::create_dir_all(&private).expect("mkdir");
        std::fs::write(suite.join("shared.sif"), "s").expect("write");
        std::fs::write(suite.join("task/img/own.sif"), "o").expect("write");
        std::fs::write(private.join("private.sif"), "p").expect("write");
        std::os::unix::fs::symlink(private.join("private.sif"), suite.join("task/link.sif"))
            .expect("symlink");
        let task = suite.join("task");
        let dirs = ImageDirs::new(std::slice::from_ref(&suite), &[]).expect("dirs");
        for ok in ["img/own.sif", "../shared.sif"] {
            assert!(dirs.open(&task.join(ok)).is_ok(), "{ok}");
        }
        for bad in ["../../private/private.sif", "link.sif"] {
            let e = dirs.open(&task.join(bad)).expect_err(bad);
            assert!(e.contains("not beneath"), "{e}");
        }
        assert!(dirs.open(&private.join("private.sif")).is_err());
        // Only the task's dir given: the suite's shared SIF is outside it.
        let only = ImageDirs::new(std::slice::from_ref(&task), &[]).expect("dirs");
        assert!(only.open(&task.join("../shared.sif")).is_err());
        // Allowed explicitly.
        let allowed = ImageDirs::new(std::slice::from_ref(&suite), std::slice::from_ref(&private))
            .expect("dirs");
        assert!(allowed
            .open(&task.join("../../private/private.sif"))
            .is_ok());
        assert!(allowed.open(&private.join("private.sif")).is_ok());
    }

    #[test]
    fn scripts_run_by_their_shebang() {
        let d = tempfile::tempdir().expect("tempdir");
        let with = d.path().join("a.sh");
        std::fs::write(&with, "#!/bin/sh\necho\n").expect("write");
        let without = d.path().join("b.sh");
        std::fs::write(&without, "echo\n").expect("write");
        let dir = d.path();
        assert_eq!(
            script_argv(dir, &with, "/tests/test.sh"),
            ["/tests/test.sh"]
        );
        assert_eq!(
            script_argv(dir, &without, "/tests/test.sh"),
            ["bash", "/tests/test.sh"]
        );
        assert!(is_sif_path("img.sif") && is_sif_path("/abs/IMG.SIF"));
        assert!(!is_sif_path(".sif") && !is_sif_path("busybox"));
    }

    #[test]
    fn defaults_then_task_then_overrides() {
        use sifbox_engine::spec;
        // Nothing asked: the defaults that protect the host.
        let l = Limits::default().resolve(&Overrides::default());
        assert_eq!(l.memory_mb, Some(DEFAULT_MEMORY_MB));
        assert_eq!(l.storage_mb, Some(DEFAULT_STORAGE_MB));
        assert_eq!(l.pids, Some(spec::DEFAULT_PIDS));
        assert_eq!((l.cpus, l.gpus), (None, None));
        let src = |l: &RolloutLimits, k: &str| l.source.get(k).copied();
        assert_eq!(src(&l, "memory_mb"), Some(LimitSource::Default));
        assert_eq!(src(&l, "pids"), Some(LimitSource::Default));
        assert_eq!(src(&l, "cpus"), None, "no limit, no source");
        assert_eq!(
            l.spec(),
            spec::Limits {
                memory: Some(DEFAULT_MEMORY_MB << 20),
                memory_swap: None,
                pids: Some(spec::DEFAULT_PIDS),
                cpus_milli: None,
                ..spec::Limits::default()
            }
        );
        // The task's values.
        let task = Limits {
            cpus: Some(1.5),
            memory_mb: Some(512),
            storage_mb: Some(100),
            gpus: Some(1),
            gpu_types: None,
        };
        let l = task.resolve(&Overrides::default());
        assert_eq!(
            (l.cpus, l.memory_mb, l.storage_mb, l.gpus),
            (Some(1.5), Some(512), Some(100), Some(1))
        );
        assert_eq!(src(&l, "cpus"), Some(LimitSource::Task));
        assert_eq!(src(&l, "pids"), Some(LimitSource::Default));
        assert_eq!(l.spec().cpus_milli, Some(1500));
        assert_eq!(l.spec().memory, Some(512 << 20));
        assert_eq!(l.storage_mib(), 100);
        // Overrides replace the task's values, given or not (Harbor's
        // semantics), and --pids the cap.
        let o = Overrides {
            cpus: Some(0.25),
            memory_mb: Some(8192),
            storage_mb: Some(300),
            gpus: Some(0),
            pids: Some(64),
        };
        for t in [&task, &Limits::default()] {
            let l = t.resolve(&o);
            assert_eq!(
                (l.cpus, l.memory_mb, l.storage_mb, l.gpus, l.pids),
                (Some(0.25), Some(8192), Some(300), Some(0), Some(64))
            );
            assert!(
                l.source.values().all(|s| *s == LimitSource::Override),
                "{l:?}"
            );
            assert_eq!(l.spec().cpus_milli, Some(250));
            assert_eq!(l.spec().pids, Some(64));
        }
        // The record, as result.json holds it.
        let json = serde_json::to_value(task.resolve(&Overrides::default())).expect("json");
        assert_eq!(json["memory_mb"], 512);
        assert_eq!(json["pids"], 4096);
        assert_eq!(json["source"]["memory_mb"], "task");
        assert_eq!(json["source"]["pids"], "default");
    }

    #[test]
    fn overrides_are_checked() {
        assert!(Overrides::default().check().is_ok());
        let cases = [
            (
                Overrides {
                    cpus: Some(0.0),
                    ..Overrides::default()
                },
                "--override-cpus",
            ),
            (
                Overrides {
                    cpus: Some(f64::NAN),
                    ..Overrides::default()
                },
                "--override-cpus",
            ),
            (
                Overrides {
                    memory_mb: Some(0),
                    ..Overrides::default()
                },
                "--override-memory-mb",
            ),
            (
                Overrides {
                    storage_mb: Some(u64::MAX),
                    ..Overrides::default()
                },
                "--override-storage-mb",
            ),
            (
                Overrides {
                    pids: Some(0),
                    ..Overrides::default()
                },
                "--pids",
            ),
        ];
        for (o, flag) in cases {
            let e = o.check().expect_err(flag);
            assert!(e.is_bad_input() && e.to_string().contains(flag), "{e}");
        }
    }
}
