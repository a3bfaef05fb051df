//! A job: every task `attempts` times on a pool of worker threads.
//!
//! ```text
//! OUT/JOB/
//!   job.json              what was asked (agent, attempts, tasks)
//!   builds/TASK.log       each environment's build log
//!   TASK__N/              one rollout, bound at /logs in its sandbox
//!     result.json         reward, status, error class, timings, image
//!     sandbox.json        how it was sandboxed
//!     build.log           a copy of the build log
//!     agent/ verifier/ artifacts/
//!   summary.json
//! ```
//!
//! OUT/JOB is the caller's alone (0700). A rollout dir is 0755; `agent/`
//! and `artifacts/` belong to the agent's user inside the sandbox,
//! `verifier/` to the verifier's, so only the sandbox's ids write there.
//! Everything below a rollout dir is touched by fd only (see
//! [`crate::rollout_dir`]), and `verifier/` is re-made before the verifier
//! runs.
//!
//! A rollout: the environment's image (built once per job and shared by
//! the rollouts that need it; sifbox-build's step cache makes an unchanged
//! build a cache hit), a sandbox with the rollout's dir at /logs, the
//! instruction at /instruction.md, the agent, the tests at /tests, the
//! verifier, the reward, then the sandbox is stopped and removed.

mod agent_logs;
mod disks;
mod environment;
mod error;
mod job;
mod phases;
mod reaper;
mod rollout;
mod schedule;
mod setup;
mod usage;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::Duration;

use sifbox_build::error::BuildError;
use sifbox_engine::spec::{self, IdMapping, NetMode, UsernsMode};
use sifbox_image::store::{Digest, Store};

use crate::cancel::Cancel;
use crate::error::{EvalError, Result};
use crate::result::{now_unix_ms, RolloutResult, Status, Summary};
use crate::task::{Overrides, Task};
use environment::Slot;
pub use job::run;

/// The agent of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Agent {
    /// Runs the task's solution, `/solution/solve.sh` (executed: its
    /// shebang decides; `bash` without one).
    Oracle,
    /// Does nothing (the verifier sees the environment as built).
    Nop,
    /// A shell command run in the sandbox (`/bin/sh -c CMD`), with the
    /// instruction at /instruction.md and in `$SIFBOX_INSTRUCTION`.
    Command(String),
}

impl Agent {
    /// `oracle`, `nop`, `cmd:COMMAND`, or a command with a space in it; a
    /// bare word is taken for an agent name sifbox does not have.
    pub fn parse(s: &str) -> Result<Agent> {
        match s {
            "oracle" => return Ok(Agent::Oracle),
            "nop" => return Ok(Agent::Nop),
            _ => {}
        }
        let cmd = s.strip_prefix("cmd:").unwrap_or(s);
        if cmd.trim().is_empty() || cmd.contains('\0') {
            return Err(EvalError::bad(
                format!("--agent {s:?}"),
                "no command",
                "pass --agent oracle, --agent nop, or a shell command to run in the sandbox",
            ));
        }
        if !s.starts_with("cmd:") && !s.chars().any(char::is_whitespace) {
            return Err(EvalError::bad(
                format!("--agent {s}"),
                "not an agent sifbox knows (it has oracle and nop)",
                format!(
                    "to run a command of that name in the sandbox, write --agent 'cmd:{s}' (or a command line with arguments)"
                ),
            ));
        }
        Ok(Agent::Command(cmd.to_string()))
    }

    /// How results name the agent.
    pub fn label(&self) -> String {
        match self {
            Agent::Oracle => "oracle".into(),
            Agent::Nop => "nop".into(),
            Agent::Command(c) => format!("cmd:{c}"),
        }
    }
}

/// How to run a job.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub agent: Agent,
    /// Rollouts per task.
    pub attempts: u32,
    /// Rollouts at the same time.
    pub jobs: usize,
    /// Where jobs go (`OUT/JOB/...`).
    pub out: PathBuf,
    /// The job's name (default: the UTC time, `YYYY-MM-DD__HH-MM-SS`).
    pub job: Option<String>,
    /// Every phase's network, whatever the tasks say.
    pub net: Option<NetMode>,
    /// Continue the job: keep its finished rollouts, run the others.
    pub resume: bool,
    /// Rebuild the environments without their build cache.
    pub force_build: bool,
    /// The sifbox binary that serves as the sandboxes' supervisor.
    pub exe: PathBuf,
    pub userns: UsernsMode,
    /// The host's CA bundle for build steps (see `sifbox build --host-ca`).
    pub host_ca: Option<PathBuf>,
    /// The host's CA bundle shown to agents and verifiers (see `sifbox run
    /// --host-ca`).
    pub sandbox_host_ca: Option<PathBuf>,
    /// Host paths bound into every rollout's sandbox (`eval --bind`).
    pub binds: Vec<spec::Bind>,
    /// The seccomp policy of every rollout and build step.
    pub seccomp: spec::SeccompMode,
    /// Every task's commands may create user namespaces.
    pub allow_userns: bool,
    /// The tasks whose commands may create user namespaces. A task's own
    /// `[metadata.sifbox] allow_userns` grants nothing: a suite is
    /// untrusted, and only the caller lifts a restriction.
    pub allow_userns_tasks: Vec<String>,
    /// The names of the caller's environment variables that task.toml's
    /// `${VAR}` templates may see (`--pass-env`); every other counts as
    /// unset. Recorded (names only) in every result.json's notes.
    pub pass_env: Vec<String>,
    /// Limits set for every task (`--override-*`, `--pids`).
    pub limits: Overrides,
    /// Where rollouts' writable layers live.
    pub layer: Layer,
    /// End every process the agent left running before the verifier runs
    /// in its sandbox (`--end-agent-processes`); recorded in result.json.
    /// Off by default: a task's agent may start a service its verifier
    /// probes.
    pub end_agent_processes: bool,
}

/// Where a rollout's writable layer (its `storage_mb`) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layer {
    /// On disk where this host allows it (host root), else in a tmpfs.
    #[default]
    Auto,
    /// A tmpfs: memory, counted in the rollout's memory limit.
    Tmpfs,
    /// An ext4 file system on a loop device over a nameless file in the
    /// scratch dir (host root only; see `sifbox_engine::disk`).
    Disk,
}

impl EvalOptions {
    /// What the commands of `task`'s rollouts may ask of the kernel.
    pub fn confinement(&self, task: &Task) -> spec::Confinement {
        spec::Confinement {
            seccomp: self.seccomp,
            allow_userns: self.userns_granted(task),
        }
    }

    /// Whether the caller lets `task`'s commands create user namespaces.
    pub fn userns_granted(&self, task: &Task) -> bool {
        self.allow_userns || self.allow_userns_tasks.contains(&task.name)
    }

    /// The note a rollout of `task` gets when the task asks for nested
    /// user namespaces: what it asked and whether the caller granted it.
    pub fn userns_note(&self, task: &Task) -> Option<String> {
        if !task.config.allow_userns {
            return None;
        }
        Some(if self.userns_granted(task) {
            "the task asks for nested user namespaces ([metadata.sifbox] allow_userns): granted by the caller".to_string()
        } else {
            format!(
                "the task asks for nested user namespaces ([metadata.sifbox] allow_userns): not granted (a task cannot lift its own confinement; the caller grants it with --allow-userns-task {} or --allow-userns)",
                task.name
            )
        })
    }
}

/// Turns an image reference into a store image.
pub type Resolver<'a> = dyn Fn(&str) -> std::result::Result<Digest, BuildError> + Sync + 'a;

/// Turns a SIF file on the host into a store image (imported once).
pub type FileResolver<'a> =
    dyn Fn(&std::path::Path) -> std::result::Result<Digest, BuildError> + Sync + 'a;

/// How image references resolve: a Dockerfile's `FROM` (and `COPY
/// --from`), a task's `docker_image`, and its `docker_image` that names a
/// `.sif` file.
pub struct Resolvers<'a> {
    pub from: &'a Resolver<'a>,
    pub image: &'a Resolver<'a>,
    pub sif: &'a FileResolver<'a>,
}

impl std::fmt::Debug for Resolvers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolvers")
    }
}

/// What a job is about to do.
#[derive(Debug, Clone)]
pub struct JobInfo {
    pub job: String,
    pub dir: PathBuf,
    /// Rollouts in the job, kept from an earlier run, to run now.
    pub total: usize,
    pub kept: usize,
    pub to_run: usize,
    pub workers: usize,
}

/// Hears what a job does, from its worker threads (for a live display).
pub trait Observer: Sync {
    fn job_started(&self, _job: &JobInfo) {}
    fn build_started(&self, _task: &str) {}
    /// `error`: the build's error, when it failed.
    fn build_finished(&self, _task: &str, _error: Option<&str>, _took: Duration) {}
    fn rollout_started(&self, _rollout: &str) {}
    fn rollout_finished(&self, _result: &RolloutResult) {}
}

/// An observer that ignores everything.
#[derive(Debug)]
pub struct Quiet;
impl Observer for Quiet {}

/// How a job ended.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub summary: Summary,
    /// `OUT/JOB`.
    pub dir: PathBuf,
    pub interrupted: bool,
}

/// A task's env for each phase, resolved from the host's environment.
#[derive(Debug, Clone, Default)]
struct TaskEnv {
    env: Vec<(String, String)>,
    verifier: Vec<(String, String)>,
    solution: Vec<(String, String)>,
    /// Each setup command's.
    setup: Vec<Vec<(String, String)>>,
    /// Each step's verifier env (on top of `verifier`).
    steps_verifier: Vec<Vec<(String, String)>>,
}

/// Everything the workers share.
struct Ctx<'a> {
    store: &'a Store,
    opts: &'a EvalOptions,
    resolve: &'a Resolvers<'a>,
    observer: &'a dyn Observer,
    cancel: &'a Cancel,
    job: String,
    dir: PathBuf,
    ids: IdMapping,
    agent_label: String,
    images: Mutex<HashMap<String, Slot>>,
    seq: AtomicUsize,
    /// The scratch dir of disk-backed layers; `None`: tmpfs layers.
    scratch: Option<PathBuf>,
    /// The queue of rollouts, told when a task's image is ready.
    sched: &'a schedule::Scheduler,
    /// Finishes the stops of the rollouts' sandboxes.
    reaper: &'a reaper::Reaper,
}

/// `d` in whole milliseconds, rounded to the nearest: truncated, the
/// overhead (the total less the agent's and the verifier's times, each cut
/// down by half a millisecond on average) came out half a millisecond too
/// high on average.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().saturating_add(500) / 1000).unwrap_or(u64::MAX)
}

/// Sets `k` in `env`, replacing an earlier value.
fn set_env(env: &mut Vec<(String, String)>, k: &str, v: &str) {
    match env.iter_mut().find(|(key, _)| key == k) {
        Some(e) => e.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
    }
}

/// A rollout's dir, fresh: what an earlier, unfinished run left is
/// removed (or, when a sandbox left files this user cannot remove, moved
/// to `.trash/`).
fn fresh_dir(job_dir: &Path, dir: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(dir).is_ok() && std::fs::remove_dir_all(dir).is_err() {
        let trash = job_dir.join(".trash");
        std::fs::create_dir_all(&trash)?;
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        std::fs::rename(dir, trash.join(format!("{name}.{}", now_unix_ms())))?;
    }
    Ok(())
}

/// Marks `r` interrupted when the job was cancelled; returns whether.
fn interrupted(ctx: &Ctx<'_>, r: &mut RolloutResult) -> bool {
    if ctx.cancel.is_cancelled() {
        r.status = Status::Interrupted;
        true
    } else {
        false
    }
}

/// The engine's name of a mechanism (`cgroup_v2`, `watchdog`...).
fn how_name(h: sifbox_engine::limits::How) -> String {
    serde_json::to_value(h)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{h:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ms_rounds_to_the_nearest_millisecond() {
        assert_eq!(ms(Duration::from_micros(1499)), 1);
        assert_eq!(ms(Duration::from_micros(1500)), 2);
        assert_eq!(ms(Duration::from_micros(499)), 0);
        assert_eq!(ms(Duration::MAX), u64::MAX);
        // A total of 10 ms with an agent and a verifier of 2.9 ms each
        // is 4.2 ms of overhead: 4, not the 6 that truncation gave.
        let t = crate::result::Timings {
            agent: ms(Duration::from_micros(2900)),
            verifier: ms(Duration::from_micros(2900)),
            total: ms(Duration::from_micros(10_000)),
            ..Default::default()
        };
        assert_eq!(t.overhead(), 4);
    }
}
