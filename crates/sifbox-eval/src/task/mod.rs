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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result};
use crate::template;

pub mod compose;
pub mod document;
mod keys;
mod yaml;

pub use document::TASK_MD;

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

/// A network mode of task.toml.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// The host's network.
    Public,
    /// Only a loopback interface of the sandbox's own.
    NoNetwork,
    /// Only the hosts of `allowed_hosts` (not enforced: such a task ends
    /// `unsupported`).
    Allowlist,
    /// All but `blocked_urls`/`blocked_hosts` (BenchFlow's; not enforced:
    /// such a task ends `unsupported`).
    Denylist,
}

/// A command of a healthcheck: a shell string or an argv.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HealthCommand {
    Shell(String),
    Argv(Vec<String>),
}

/// A user as task.toml names it: a name (or `UID[:GID]`) or a number
/// (Harbor and BenchFlow take `str | int`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawUser {
    Name(String),
    Id(i64),
}

impl<'de> Deserialize<'de> for RawUser {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawUser;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a user: a name (NAME, UID or UID:GID) or a UID number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Name(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Id(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Id(i64::try_from(v).unwrap_or(i64::MAX)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[environment.healthcheck]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawHealthcheck {
    pub command: Option<HealthCommand>,
    pub interval_sec: Option<f64>,
    pub timeout_sec: Option<f64>,
    pub start_period_sec: Option<f64>,
    pub start_interval_sec: Option<f64>,
    pub retries: Option<i64>,
}

/// One of BenchFlow's `[[environment.setup_commands]]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawSetupCommand {
    pub command: Option<String>,
    pub timeout_sec: Option<f64>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub user: Option<RawUser>,
    pub service: Option<String>,
    pub host_lock: Option<String>,
    pub capture_dir: Option<String>,
    pub capture_dir_b64_env: Option<String>,
    pub capture_dir_b64_env_file_var: Option<String>,
}

/// `[environment]` (BenchFlow: `[sandbox]`) as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawEnvironment {
    pub build_timeout_sec: Option<f64>,
    /// BenchFlow also spells it `image`.
    #[serde(alias = "image")]
    pub docker_image: Option<String>,
    pub os: Option<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub storage_mb: Option<u64>,
    pub gpus: Option<u64>,
    pub gpu_types: Option<Vec<String>>,
    pub network_mode: Option<NetworkMode>,
    pub allowed_hosts: Option<Vec<String>>,
    pub blocked_urls: Option<Vec<String>>,
    pub blocked_hosts: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub healthcheck: Option<RawHealthcheck>,
    pub mcp_servers: Option<Vec<toml::Value>>,
    pub setup_commands: Vec<RawSetupCommand>,
    /// Legacy: `false` means `network_mode = "no-network"`.
    pub allow_internet: Option<bool>,
    /// Legacy: `"2G"`, `"512M"`.
    pub memory: Option<String>,
    /// Legacy: `"10G"`.
    pub storage: Option<String>,
}

/// `[agent]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawAgent {
    pub timeout_sec: Option<f64>,
    pub user: Option<RawUser>,
    pub network_mode: Option<NetworkMode>,
}

/// `[verifier]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawVerifier {
    pub timeout_sec: Option<f64>,
    pub env: BTreeMap<String, String>,
    pub user: Option<RawUser>,
    pub network_mode: Option<NetworkMode>,
    /// BenchFlow's: `test-script` (the default) or `llm-judge`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Harbor's; BenchFlow spells it `sandbox_mode`.
    #[serde(alias = "sandbox_mode")]
    pub environment_mode: Option<VerifierMode>,
    /// `[verifier.environment]` (BenchFlow: `[verifier.sandbox]`): the
    /// verifier's own environment; implies `environment_mode = "separate"`.
    #[serde(alias = "sandbox")]
    pub environment: Option<RawVerifierEnvironment>,
}

/// Where the verifier runs (Harbor's `environment_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifierMode {
    /// In the agent's sandbox (the default).
    Shared,
    /// In a fresh sandbox of its own image.
    Separate,
}

/// `[verifier.environment]` as written: Harbor's `[environment]` schema,
/// of which sifbox reads the image (the other keys are warned about).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawVerifierEnvironment {
    /// BenchFlow also spells it `image`.
    #[serde(alias = "image")]
    pub docker_image: Option<String>,
    pub os: Option<String>,
}

/// `[solution]` (BenchFlow: `[oracle]`) as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawSolution {
    pub env: BTreeMap<String, String>,
    /// The other keys: BenchFlow takes `NAME = "value"` (a variable name
    /// with a string) as env; anything else is warned about.
    #[serde(flatten)]
    pub rest: BTreeMap<String, toml::Value>,
}

/// A `[[steps]]` entry as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawStep {
    pub name: Option<String>,
    pub agent: RawAgent,
    pub verifier: RawVerifier,
    pub min_reward: Option<RawMinReward>,
    pub healthcheck: Option<toml::Value>,
}

/// `min_reward`: a number (gating `reward`) or a table of numbers by key.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawMinReward {
    One(f64),
    Keys(BTreeMap<String, f64>),
}

/// How a multi-step task's reward comes from its steps' (Harbor's
/// `multi_step_reward_strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RewardStrategy {
    /// Each key's mean over the steps that have rewards (a key missing in
    /// a step counts 0).
    #[default]
    Mean,
    /// The last step run's rewards.
    Final,
}

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

/// task.toml as written (unknown keys are warned about and ignored, as
/// newer schema versions may add some; see [`keys`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawTaskToml {
    pub schema_version: Option<toml::Value>,
    pub version: Option<toml::Value>,
    pub metadata: toml::Table,
    #[serde(alias = "sandbox")]
    pub environment: RawEnvironment,
    pub agent: RawAgent,
    pub verifier: RawVerifier,
    #[serde(alias = "oracle")]
    pub solution: RawSolution,
    /// BenchFlow's legacy reward-expression metadata: recorded nowhere
    /// and read by nothing, in BenchFlow as here.
    pub reward: Option<toml::Table>,
    pub steps: Option<Vec<RawStep>>,
    pub multi_step_reward_strategy: Option<RewardStrategy>,
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

/// Parses and checks the text of a task.toml; `file` names it in errors.
pub fn parse_config(text: &str, file: &str) -> Result<TaskConfig> {
    let raw: RawTaskToml = toml::from_str(text).map_err(|e| {
        // toml's message spans lines (with a snippet): keep it on one.
        let msg = e.message().trim().replace('\n', " ");
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!(":{line}")
            })
            .unwrap_or_default();
        bad(
            format!("{file}{at}"),
            format!("not a valid task.toml: {msg}"),
            "fix the TOML (see the task format in README.md)",
        )
    })?;
    let mut config = check_config(raw, file)?;
    // The same text parsed once more as a plain table, for its keys (it
    // parsed above, so it parses here).
    if let Ok(doc) = toml::from_str::<toml::Table>(text) {
        config.warnings = keys::warnings(&doc, file);
    }
    Ok(config)
}

fn timeout(v: Option<f64>, default: f64, key: &str, file: &str) -> Result<Duration> {
    let s = v.unwrap_or(default);
    if !s.is_finite() || s <= 0.0 || s > MAX_TIMEOUT_SEC {
        return Err(bad(
            format!("{file}: {key} = {s}"),
            "not a positive number of seconds (at most a week)",
            format!("set {key} to e.g. {default}"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

fn check_env(
    map: BTreeMap<String, String>,
    key: &str,
    file: &str,
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        if !template::is_var_name(&k) {
            return Err(bad(
                format!("{file}: {key}.{k:?}"),
                "not a valid environment variable name",
                "use letters, digits and _ (not starting with a digit)",
            ));
        }
        if v.contains('\0') {
            return Err(bad(
                format!("{file}: {key}.{k}"),
                "the value contains a NUL byte",
                "remove it",
            ));
        }
        template::check(&v).map_err(|why| {
            bad(
                format!("{file}: {key}.{k}"),
                why,
                "write ${VAR} or ${VAR:-default} (a literal $ as $$)",
            )
        })?;
        out.push((k, v));
    }
    Ok(out)
}

fn check_user(u: Option<RawUser>, key: &str, file: &str) -> Result<Option<String>> {
    let bad_user = |shown: String| {
        bad(
            format!("{file}: {key} = {shown}"),
            "not a user",
            "name a user of the image (NAME, UID or UID:GID; a number is a UID), or leave it out for the image's user",
        )
    };
    match u {
        None => Ok(None),
        Some(RawUser::Id(n)) => u32::try_from(n)
            .map(|n| Some(n.to_string()))
            .map_err(|_| bad_user(n.to_string())),
        Some(RawUser::Name(u))
            if u.is_empty() || u.len() > 256 || u.chars().any(char::is_control) =>
        {
            Err(bad_user(format!("{u:?}")))
        }
        Some(RawUser::Name(u)) => Ok(Some(u)),
    }
}

/// Parses `2G`, `512M`, `1024K`, `1T` (powers of 1024) or a bare number
/// of bytes into MiB.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult): (&str, u64) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    let n: f64 = num.trim().parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a finite, non-negative size in MiB, clamped below"
    )]
    let mib = (n * mult as f64 / f64::from(1u32 << 20)).min(1e15).ceil() as u64;
    Some(mib)
}

/// `KEY_mb`, or the legacy `KEY = "2G"` (both: they must agree, as Harbor
/// requires), in MiB.
fn size_mb(mb: Option<u64>, legacy: Option<&str>, key: &str, file: &str) -> Result<Option<u64>> {
    let from_legacy = match legacy {
        None => None,
        Some(s) => Some(parse_memory(s).ok_or_else(|| {
            bad(
                format!("{file}: [environment] {key} = {s:?}"),
                "not a size",
                format!("write e.g. {key}_mb = 2048 (or {key} = \"2G\")"),
            )
        })?),
    };
    match (mb, from_legacy) {
        (Some(m), Some(l)) if m != l => Err(bad(
            format!(
                "{file}: [environment] {key}_mb = {m} and {key} = {:?}",
                legacy.unwrap_or("")
            ),
            format!("they disagree ({l} MiB against {m})"),
            format!("keep {key}_mb alone ({key} is its old spelling)"),
        )),
        (Some(m), _) => check_mb(Some(m), key, file),
        (None, l) => check_mb(l, key, file),
    }
}

fn check_mb(mb: Option<u64>, key: &str, file: &str) -> Result<Option<u64>> {
    match mb {
        Some(m) if m > MAX_MB => Err(bad(
            format!("{file}: [environment] {key}_mb = {m}"),
            "too large (at most 2^30 MiB)",
            format!("set {key}_mb to what the task needs, in MiB"),
        )),
        other => Ok(other),
    }
}

fn check_config(raw: RawTaskToml, file: &str) -> Result<TaskConfig> {
    let e = raw.environment;
    let mut unsupported = Vec::new();
    let network = match (e.network_mode, e.allow_internet) {
        (Some(m), _) => m,
        (None, Some(false)) => NetworkMode::NoNetwork,
        (None, _) => NetworkMode::Public,
    };
    let agent_network = raw.agent.network_mode.unwrap_or(network);
    let verifier_network = raw.verifier.network_mode.unwrap_or(network);
    for (key, mode, own) in [
        (
            "[environment] network_mode",
            network,
            e.network_mode.is_some(),
        ),
        (
            "[agent] network_mode",
            agent_network,
            raw.agent.network_mode.is_some(),
        ),
        (
            "[verifier] network_mode",
            verifier_network,
            raw.verifier.network_mode.is_some(),
        ),
    ] {
        // Said once, where it is written.
        if !own {
            continue;
        }
        match mode {
            NetworkMode::Allowlist => unsupported.push(format!(
                "{key} = \"allowlist\": sifbox cannot enforce a host allowlist (allowed_hosts); use \"public\" or \"no-network\", or run this task with another runtime"
            )),
            NetworkMode::Denylist => unsupported.push(format!(
                "{key} = \"denylist\": sifbox cannot enforce a denylist (blocked_urls, blocked_hosts); use \"public\" or \"no-network\", or run this task with another runtime"
            )),
            NetworkMode::Public | NetworkMode::NoNetwork => {}
        }
    }
    match e.os.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("linux") => {}
        Some("windows") => unsupported
            .push("[environment] os = \"windows\": sifbox runs Linux sandboxes only".to_string()),
        Some(_) => {
            return Err(bad(
                format!("{file}: [environment] os = {:?}", e.os.unwrap_or_default()),
                "not an operating system Harbor knows",
                "write os = \"linux\" (the default) or leave it out",
            ))
        }
    }
    // Harbor's rule (verifier_mode.py): the mode written, else separate
    // when the verifier has an environment of its own, else shared.
    let verifier_mode = match (raw.verifier.environment_mode, &raw.verifier.environment) {
        (Some(VerifierMode::Shared), Some(_)) => {
            return Err(bad(
                format!("{file}: [verifier] environment_mode = \"shared\""),
                "a shared verifier runs in the agent's sandbox, yet [verifier.environment] gives it one of its own",
                "leave out [verifier.environment], or set environment_mode = \"separate\"",
            ))
        }
        (Some(m), _) => m,
        (None, Some(_)) => VerifierMode::Separate,
        (None, None) => VerifierMode::Shared,
    };
    let verifier_image = match raw.verifier.environment.as_ref() {
        None => None,
        Some(v) => {
            match v.os.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None | Some("linux") => {}
                Some("windows") => unsupported.push(
                    "[verifier.environment] os = \"windows\": sifbox runs Linux sandboxes only"
                        .to_string(),
                ),
                Some(_) => {
                    return Err(bad(
                        format!(
                            "{file}: [verifier.environment] os = {:?}",
                            v.os.clone().unwrap_or_default()
                        ),
                        "not an operating system Harbor knows",
                        "write os = \"linux\" (the default) or leave it out",
                    ))
                }
            }
            match v.docker_image.clone() {
                Some(i) if i.trim().is_empty() || i.chars().any(char::is_control) => {
                    return Err(bad(
                        format!("{file}: [verifier.environment] docker_image = {i:?}"),
                        "not an image reference",
                        "name the verifier's image (a store name, docker://REF or a .sif file), or leave it out to build tests/Dockerfile",
                    ))
                }
                other => other,
            }
        }
    };
    match raw.verifier.kind.as_deref() {
        None | Some("test-script") => {}
        Some("llm-judge") => unsupported.push(
            "[verifier] type = \"llm-judge\": sifbox has no LLM judge; it runs tests/test.sh (type = \"test-script\")".to_string(),
        ),
        Some(other) => {
            return Err(bad(
                format!("{file}: [verifier] type = {other:?}"),
                "not a verifier type BenchFlow knows",
                "write type = \"test-script\" (the default) or leave it out",
            ))
        }
    }
    if e.mcp_servers.as_ref().is_some_and(|m| !m.is_empty()) {
        unsupported.push(
            "[environment] mcp_servers: sifbox starts no MCP servers for the agent".to_string(),
        );
    }
    if let Some(cpus) = e.cpus {
        if cpus_milli(cpus).is_none() {
            return Err(bad(
                format!("{file}: [environment] cpus = {cpus}"),
                "not a number of CPUs above 0",
                "set cpus to e.g. 1 or 0.5, or leave it out for no CPU limit",
            ));
        }
    }
    let memory_mb = size_mb(e.memory_mb, e.memory.as_deref(), "memory", file)?;
    let storage_mb = size_mb(e.storage_mb, e.storage.as_deref(), "storage", file)?;
    if memory_mb == Some(0) {
        return Err(bad(
            format!("{file}: [environment] memory_mb = 0"),
            "a sandbox needs some memory",
            "set memory_mb to e.g. 2048, or leave it out for the default",
        ));
    }
    if storage_mb == Some(0) {
        return Err(bad(
            format!("{file}: [environment] storage_mb = 0"),
            "the sandbox's writable layer needs some space",
            "set storage_mb to e.g. 10240, or leave it out",
        ));
    }
    if let Some(types) = &e.gpu_types {
        if types.len() > 64
            || types
                .iter()
                .any(|t| t.is_empty() || t.len() > 100 || t.chars().any(char::is_control))
        {
            return Err(bad(
                format!("{file}: [environment] gpu_types"),
                "not a list of GPU type names",
                "write e.g. gpu_types = [\"H100\", \"A100\"], or leave it out",
            ));
        }
    }
    let docker_image = match e.docker_image {
        Some(i) if i.trim().is_empty() || i.chars().any(char::is_control) => return Err(bad(
            format!("{file}: [environment] docker_image = {i:?}"),
            "not an image reference",
            "name an image (a store name, docker://REF or a .sif file), or leave it out to build environment/",
        )),
        other => other,
    };
    let workdir = match e.workdir {
        Some(w) if !w.starts_with('/') || w.contains('\0') || w.len() > 4096 => {
            return Err(bad(
                format!("{file}: [environment] workdir = {w:?}"),
                "not an absolute path",
                "write an absolute path inside the sandbox, e.g. /app",
            ))
        }
        other => other,
    };
    let healthcheck = match e.healthcheck {
        None => None,
        Some(h) => {
            let argv = match h.command {
                Some(HealthCommand::Shell(s)) if !s.trim().is_empty() => {
                    vec!["/bin/sh".to_string(), "-c".to_string(), s]
                }
                Some(HealthCommand::Argv(v)) if !v.is_empty() && !v[0].is_empty() => v,
                _ => {
                    return Err(bad(
                        format!("{file}: [environment.healthcheck]"),
                        "no command",
                        "set command = \"...\" (run by /bin/sh -c) or an argv list",
                    ))
                }
            };
            if argv.iter().any(|a| a.contains('\0')) {
                return Err(bad(
                    format!("{file}: [environment.healthcheck] command"),
                    "contains a NUL byte",
                    "remove it",
                ));
            }
            let key = "[environment.healthcheck]";
            // Harbor's: 0 retries fails at the first failure after the
            // start period, as 1 does.
            let retries = match h.retries.unwrap_or(3) {
                n @ 0..=10_000 => u32::try_from(n.max(1)).unwrap_or(1),
                n => {
                    return Err(bad(
                        format!("{file}: {key} retries = {n}"),
                        "must be 0 to 10000",
                        "set retries to e.g. 3",
                    ))
                }
            };
            let pause = |v: Option<f64>, name: &str| match v {
                Some(0.0) => Ok(Duration::ZERO),
                v => timeout(
                    v,
                    DEFAULT_HEALTH_INTERVAL_SEC,
                    &format!("{key} {name}"),
                    file,
                ),
            };
            let start_period = match h.start_period_sec {
                None | Some(0.0) => Duration::ZERO,
                v => timeout(v, 0.0, &format!("{key} start_period_sec"), file)?,
            };
            Some(Healthcheck {
                argv,
                interval: pause(h.interval_sec, "interval_sec")?,
                timeout: timeout(
                    h.timeout_sec,
                    DEFAULT_HEALTH_TIMEOUT_SEC,
                    &format!("{key} timeout_sec"),
                    file,
                )?,
                start_period,
                start_interval: pause(h.start_interval_sec, "start_interval_sec")?,
                retries,
            })
        }
    };
    let mut setup_commands = Vec::with_capacity(e.setup_commands.len());
    for (i, c) in e.setup_commands.into_iter().enumerate() {
        let key = format!("[environment] setup_commands[{i}]");
        let command = match c.command {
            Some(cmd) if !cmd.trim().is_empty() && !cmd.contains('\0') => cmd.trim().to_string(),
            _ => {
                return Err(bad(
                    format!("{file}: {key}"),
                    "no command",
                    "set command = \"...\" (run by /bin/sh -c in the sandbox)",
                ))
            }
        };
        let cwd = match c.cwd.map(|w| w.trim().to_string()) {
            Some(w) if !w.starts_with('/') || w.contains('\0') || w.len() > 4096 => {
                return Err(bad(
                    format!("{file}: {key} cwd = {w:?}"),
                    "not an absolute path",
                    "write an absolute path inside the sandbox, e.g. /app",
                ))
            }
            other => other,
        };
        match c.service.as_deref().map(str::trim) {
            None | Some("main") => {}
            Some(other) => unsupported.push(format!(
                "{key} service = {other:?}: sifbox runs no compose services; setup commands run in the task's one sandbox (service \"main\")"
            )),
        }
        if c.capture_dir.is_some() || c.capture_dir_b64_env.is_some() {
            unsupported.push(format!(
                "{key} capture_dir: sifbox does not copy a sandbox's files into the host's environment"
            ));
        }
        let host_lock = match c.host_lock.map(|l| l.trim().to_string()) {
            Some(l) if l.is_empty() || l.len() > 200 || l.chars().any(char::is_control) => {
                return Err(bad(
                    format!("{file}: {key} host_lock = {l:?}"),
                    "not a lock name",
                    "name the lock with letters, digits, '.', '_' and '-'",
                ))
            }
            other => other,
        };
        setup_commands.push(SetupCommand {
            command,
            timeout: timeout(
                c.timeout_sec,
                DEFAULT_SETUP_TIMEOUT_SEC,
                &format!("{key} timeout_sec"),
                file,
            )?,
            cwd,
            env: check_env(c.env, &format!("{key} env"), file)?,
            user: check_user(c.user, &format!("{key} user"), file)?,
            host_lock,
        });
    }
    // BenchFlow's shorthand: `[solution] NAME = "value"` is an env entry.
    let mut solution_env = raw.solution.env;
    for (k, v) in raw.solution.rest {
        if let (true, toml::Value::String(v)) = (is_env_shorthand(&k), v) {
            match solution_env.get(&k) {
                Some(old) if *old != v => {
                    return Err(bad(
                        format!("{file}: [solution] {k}"),
                        "set twice, to different values (in env and as a key of its own)",
                        "keep one of them",
                    ))
                }
                _ => {
                    solution_env.insert(k, v);
                }
            }
        }
    }
    let agent_timeout = timeout(
        raw.agent.timeout_sec,
        DEFAULT_AGENT_TIMEOUT_SEC,
        "[agent] timeout_sec",
        file,
    )?;
    let agent_user = check_user(raw.agent.user, "[agent] user", file)?;
    let verifier_timeout = timeout(
        raw.verifier.timeout_sec,
        DEFAULT_VERIFIER_TIMEOUT_SEC,
        "[verifier] timeout_sec",
        file,
    )?;
    let verifier_user = check_user(raw.verifier.user, "[verifier] user", file)?;
    let mut steps = Vec::new();
    for (i, st) in raw.steps.unwrap_or_default().into_iter().enumerate() {
        let key = format!("[[steps]] {}", i + 1);
        let name = st.name.ok_or_else(|| {
            bad(
                format!("{file}: {key}"),
                "no name",
                "give each step a name = \"...\" (its directory under steps/)",
            )
        })?;
        if !valid_step_name(&name) {
            return Err(bad(
                format!("{file}: {key} name = {name:?}"),
                "not a portable directory name",
                "name the step without '/', '\\', control characters, <>:\"|?*, a trailing dot or space, or a Windows device name (at most 255 bytes)",
            ));
        }
        if steps
            .iter()
            .any(|s: &Step| s.name.to_lowercase() == name.to_lowercase())
        {
            return Err(bad(
                format!("{file}: {key} name = {name:?}"),
                "another step has this name (names are compared without case)",
                "give each step a name of its own",
            ));
        }
        let key = format!("[[steps]] {name:?}");
        for (what, set) in [
            ("[agent] network_mode", st.agent.network_mode.is_some()),
            (
                "[verifier] network_mode",
                st.verifier.network_mode.is_some(),
            ),
            (
                "[verifier] environment_mode or environment",
                st.verifier.environment_mode.is_some() || st.verifier.environment.is_some(),
            ),
            ("[verifier] type", st.verifier.kind.is_some()),
            ("healthcheck", st.healthcheck.is_some()),
        ] {
            if set {
                unsupported.push(format!(
                    "{key} {what}: sifbox runs every step in the task's sandbox, network and verifier; a step cannot set its own"
                ));
            }
        }
        let min_reward = match st.min_reward {
            None => None,
            Some(RawMinReward::One(v)) => Some(BTreeMap::from([("reward".to_string(), v)])),
            Some(RawMinReward::Keys(k)) => Some(k),
        };
        if let Some((k, v)) = min_reward.iter().flatten().find(|(_, v)| !v.is_finite()) {
            return Err(bad(
                format!("{file}: {key} min_reward {k} = {v}"),
                "not a finite number",
                "set min_reward to a number, or a table of numbers by reward key",
            ));
        }
        steps.push(Step {
            agent_timeout: match st.agent.timeout_sec {
                None => agent_timeout,
                t => timeout(
                    t,
                    DEFAULT_AGENT_TIMEOUT_SEC,
                    &format!("{key} [agent] timeout_sec"),
                    file,
                )?,
            },
            agent_user: check_user(st.agent.user, &format!("{key} [agent] user"), file)?
                .or_else(|| agent_user.clone()),
            verifier_timeout: match st.verifier.timeout_sec {
                None => verifier_timeout,
                t => timeout(
                    t,
                    DEFAULT_VERIFIER_TIMEOUT_SEC,
                    &format!("{key} [verifier] timeout_sec"),
                    file,
                )?,
            },
            verifier_user: check_user(st.verifier.user, &format!("{key} [verifier] user"), file)?
                .or_else(|| verifier_user.clone()),
            verifier_env: check_env(st.verifier.env, &format!("{key} [verifier] env"), file)?,
            min_reward,
            name,
        });
    }
    if !steps.is_empty() && verifier_mode == VerifierMode::Separate {
        unsupported.push(
            "[[steps]] with a separate verifier: sifbox runs a multi-step task's verifiers in its sandbox only".to_string(),
        );
    }
    Ok(TaskConfig {
        build_timeout: timeout(
            e.build_timeout_sec,
            DEFAULT_BUILD_TIMEOUT_SEC,
            "[environment] build_timeout_sec",
            file,
        )?,
        docker_image,
        limits: Limits {
            cpus: e.cpus,
            memory_mb,
            storage_mb,
            gpus: e.gpus,
            gpu_types: e.gpu_types,
        },
        network,
        agent_network,
        verifier_network,
        env: check_env(e.env, "[environment] env", file)?,
        verifier_env: check_env(raw.verifier.env, "[verifier] env", file)?,
        solution_env: check_env(solution_env, "[solution] env", file)?,
        workdir,
        healthcheck,
        agent_timeout,
        agent_user,
        verifier_timeout,
        verifier_user,
        default_user: None,
        service: None,
        allow_userns: sifbox_flag(&raw.metadata, "allow_userns", file)?,
        setup_commands,
        verifier_mode,
        verifier_image,
        steps,
        reward_strategy: raw.multi_step_reward_strategy.unwrap_or_default(),
        unsupported,
        warnings: Vec::new(),
    })
}

/// Whether `k`, a key of `[solution]` with a string, is an env entry by
/// BenchFlow's shorthand (`[A-Z_][A-Z0-9_]*`).
fn is_env_shorthand(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_uppercase() || c == b'_')
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}

/// A boolean of `[metadata.sifbox]`; false when absent.
fn sifbox_flag(metadata: &toml::Table, key: &str, file: &str) -> Result<bool> {
    let Some(table) = metadata.get("sifbox") else {
        return Ok(false);
    };
    let wrong = |why: &str| {
        bad(
            format!("{file}: [metadata.sifbox]"),
            why.to_string(),
            format!("write it as a table: [metadata.sifbox] {key} = true"),
        )
    };
    let toml::Value::Table(t) = table else {
        return Err(wrong("not a table"));
    };
    match t.get(key) {
        None => Ok(false),
        Some(toml::Value::Boolean(b)) => Ok(*b),
        Some(_) => Err(wrong(&format!("{key} must be true or false"))),
    }
}

/// Whether `name` is a step name Harbor takes (`validate_step_name`): one
/// portable directory name.
pub fn valid_step_name(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or("").trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    let device = matches!(
        upper.as_str(),
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$"
    ) || ((upper.starts_with("COM") || upper.starts_with("LPT"))
        && upper.len() == 4
        && upper.as_bytes()[3].is_ascii_digit()
        && upper.as_bytes()[3] != b'0');
    !name.trim().is_empty()
        && name != "."
        && name != ".."
        && !name.ends_with(['.', ' '])
        && !name
            .chars()
            .any(|c| c.is_control() || "<>:\"/\\|?*".contains(c))
        && !device
        && name.len() <= 255
}

/// Whether `name` is usable as a task name (a path component of results,
/// part of a sandbox name).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The first of `names` that is a directory in `dir`.
fn first_dir(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.is_dir())
}

/// Reads a task's small text file (task.toml, task.md): a regular file
/// of at most 1 MiB, UTF-8.
fn read_small(path: &Path, task: &str) -> Result<String> {
    let file = path.display().to_string();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let meta = std::fs::metadata(path).map_err(|e| {
        bad(
            format!("task {task}"),
            format!("no readable {name} ({e})"),
            "pass a task directory (with task.toml and instruction.md, or task.md; environment/ and tests/), or a directory of them",
        )
    })?;
    if !meta.is_file() || meta.len() > MAX_TASK_TOML {
        return Err(bad(
            file,
            "not a regular file of at most 1 MiB",
            format!("make {name} a small text file"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| {
        bad(
            &file,
            format!("cannot read it as UTF-8 text: {e}"),
            format!("make {name} a UTF-8 text file"),
        )
    })
}

/// Lays a compose file's values under the task file's: the task file's
/// env entries win over the service's of the same name, and its workdir
/// and limits over the service's.
fn apply_compose(config: &mut TaskConfig, c: compose::Compose) {
    let mut env = c.env;
    env.retain(|(k, _)| !config.env.iter().any(|(t, _)| t == k));
    env.append(&mut config.env);
    config.env = env;
    if config.workdir.is_none() {
        config.workdir = c.workdir;
    }
    config.default_user = c.user;
    if c.entrypoint.is_some() || c.command.is_some() {
        config.service = Some(ServiceCommand {
            entrypoint: c.entrypoint,
            command: c.command,
        });
    }
    if config.limits.cpus.is_none() {
        config.limits.cpus = c.cpus;
    }
    if config.limits.memory_mb.is_none() {
        config.limits.memory_mb = c.memory_mb;
    }
    if let Some(n) = c.network {
        // The service's network is the environment's when the task file
        // says nothing of its own (the phases' follow it).
        if config.network == NetworkMode::Public && n == NetworkMode::NoNetwork {
            config.network = n;
            if config.agent_network == NetworkMode::Public {
                config.agent_network = n;
            }
            if config.verifier_network == NetworkMode::Public {
                config.verifier_network = n;
            }
        }
    }
    config.unsupported.extend(c.unsupported);
    config.warnings.extend(c.warnings);
}

/// Loads the task in `dir` (which holds task.md, or task.toml and
/// instruction.md: task.md wins, as in BenchFlow).
pub fn load(dir: &Path) -> Result<Task> {
    let dir = std::path::absolute(dir).map_err(|e| EvalError::io(dir.display().to_string(), e))?;
    let shown = dir.display().to_string();
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .unwrap_or_default();
    if !valid_name(&name) {
        return Err(bad(
            format!("task {shown}"),
            format!("the directory name {name:?} is not a usable task name"),
            "rename the directory with letters, digits, '.', '_' and '-' only (at most 100)",
        ));
    }
    let md_path = dir.join(TASK_MD);
    let (config_file, mut config, instruction, solution, tests, file) = if md_path.exists() {
        let file = md_path.display().to_string();
        let doc = document::parse(&read_small(&md_path, &shown)?, &file)?;
        // BenchFlow's dirs: oracle/ before solution/, verifier/ before
        // tests/, or the front matter's paths.
        let solution = match &doc.oracle_dir {
            Some(p) => Some(dir.join(p)).filter(|p| p.is_dir()),
            None => first_dir(&dir, &["oracle", "solution"]),
        };
        let tests = match &doc.verifier_dir {
            Some(p) => Some(dir.join(p)),
            None => first_dir(&dir, &["verifier", "tests"]),
        };
        (
            md_path,
            doc.config,
            Instruction::Text(doc.instruction),
            solution,
            tests,
            file,
        )
    } else {
        let toml_path = dir.join(TASK_TOML);
        let file = toml_path.display().to_string();
        let config = parse_config(&read_small(&toml_path, &shown)?, &file)?;
        (
            toml_path,
            config,
            Instruction::File(dir.join(INSTRUCTION)),
            first_dir(&dir, &["solution", "oracle"]),
            first_dir(&dir, &["tests", "verifier"]),
            file,
        )
    };
    let context = dir.join("environment");
    let (compose_path, several) = compose::find(&context);
    config.warnings.extend(several);
    let mut compose_image = None;
    if let Some(p) = &compose_path {
        let c = compose::load(p, config.docker_image.as_deref())?;
        compose_image = c.image.clone().filter(|_| !c.builds);
        apply_compose(&mut config, c);
    }
    for step in &config.steps {
        if dir.join("steps").join(&step.name).join("workdir").is_dir() {
            config.unsupported.push(format!(
                "steps/{}/workdir/: sifbox does not stage a step's workdir (nor run its setup.sh)",
                step.name
            ));
        }
    }
    if !config.unsupported.is_empty() {
        // Its rollouts end `unsupported` before anything runs: what it
        // needs (a Windows Dockerfile, a rubric instead of test.sh) is not
        // looked for.
        return Ok(Task {
            name,
            environment: EnvSource::Dockerfile { context },
            tests: tests.unwrap_or_else(|| dir.join("tests")),
            solution,
            dir,
            config_file,
            config,
            instruction,
            separate_verifier: None,
            steps: Vec::new(),
        });
    }
    // A multi-step task's instructions are its steps'.
    if let Instruction::File(p) = &instruction {
        if config.steps.is_empty() && !p.is_file() {
            return Err(bad(
                format!("task {shown}"),
                format!("no {INSTRUCTION}"),
                "write the task's instruction to instruction.md (or write task.md, with the prompt)",
            ));
        }
    }
    let environment = match config.docker_image.as_ref().or(compose_image.as_ref()) {
        Some(image) if is_sif_path(image) => {
            let path = dir.join(image);
            if !path.is_file() {
                return Err(bad(
                    format!("{file}: [environment] docker_image = {image:?}"),
                    format!("no such SIF file: {}", path.display()),
                    "name a .sif file relative to the task's directory (or absolute), or an image of the store",
                ));
            }
            EnvSource::Sif(path)
        }
        Some(image) => EnvSource::Image(image.clone()),
        None => {
            if !context.join("Dockerfile").is_file() {
                let why = match &compose_path {
                    Some(p) => format!(
                        "{} neither builds environment/Dockerfile (there is none) nor names an image",
                        p.display()
                    ),
                    None => "no environment/Dockerfile and no [environment] docker_image".to_string(),
                };
                return Err(bad(
                    format!("task {shown}"),
                    why,
                    "add environment/Dockerfile, or set docker_image in the task's file",
                ));
            }
            EnvSource::Dockerfile { context }
        }
    };
    let steps = step_files(&dir, &config, solution.as_ref())?;
    let tests = match tests {
        Some(t) => t,
        // Every step has its own tests.
        None if !steps.is_empty() => dir.join("tests"),
        None => {
            return Err(bad(
                format!("task {shown}"),
                "no tests/ (or verifier/) directory",
                "add tests/test.sh, which writes the reward to /logs/verifier/reward.txt",
            ))
        }
    };
    let separate_verifier = match config.verifier_mode {
        VerifierMode::Shared => None,
        VerifierMode::Separate => Some(match &config.verifier_image {
            Some(image) if is_sif_path(image) => {
                let path = dir.join(image);
                if !path.is_file() {
                    return Err(bad(
                        format!("{file}: [verifier.environment] docker_image = {image:?}"),
                        format!("no such SIF file: {}", path.display()),
                        "name a .sif file relative to the task's directory (or absolute), or an image of the store",
                    ));
                }
                SeparateVerifier {
                    environment: EnvSource::Sif(path),
                    bundled_tests: true,
                }
            }
            Some(image) => SeparateVerifier {
                environment: EnvSource::Image(image.clone()),
                bundled_tests: true,
            },
            None if tests.join("Dockerfile").is_file() => SeparateVerifier {
                environment: EnvSource::Dockerfile {
                    context: tests.clone(),
                },
                bundled_tests: true,
            },
            None => SeparateVerifier {
                environment: environment.clone(),
                bundled_tests: false,
            },
        }),
    };
    // A verifier image that holds its tests needs no test.sh here.
    let bundled = separate_verifier.as_ref().is_some_and(|v| v.bundled_tests);
    if !bundled && steps.is_empty() && !tests.join("test.sh").is_file() {
        return Err(bad(
            format!("task {shown}"),
            format!("no test.sh in {}", tests.display()),
            "add test.sh, which writes the reward to /logs/verifier/reward.txt",
        ));
    }
    if tests.join("verifier.md").is_file() {
        config.warnings.push(format!(
            "{}: sifbox reads no verifier strategy documents; it runs test.sh",
            tests.join("verifier.md").display()
        ));
    }
    Ok(Task {
        name,
        solution,
        dir,
        config_file,
        config,
        instruction,
        environment,
        tests,
        separate_verifier,
        steps,
    })
}

/// The files of `config`'s steps in the task `dir` (Harbor's
/// `TaskPaths.step_*`): each step's instruction.md, its tests (merged over
/// the task's) and its solution (else the task's). A step's dir must stay
/// in the task (no symlink out of it).
fn step_files(
    dir: &Path,
    config: &TaskConfig,
    solution: Option<&PathBuf>,
) -> Result<Vec<StepFiles>> {
    let shown = dir.display();
    let task_real = std::fs::canonicalize(dir).map_err(|e| EvalError::io(shown.to_string(), e))?;
    let shared_tests = first_dir(dir, &["tests", "verifier"]);
    let mut out = Vec::new();
    for step in &config.steps {
        let step_dir = dir.join("steps").join(&step.name);
        let within = std::fs::canonicalize(&step_dir)
            .map(|p| p.starts_with(&task_real))
            .unwrap_or(false);
        if !within {
            return Err(bad(
                format!("task {shown}: step {:?}", step.name),
                format!("no directory steps/{} in the task", step.name),
                "make steps/NAME/ (with instruction.md, and tests/test.sh unless tests/test.sh serves every step) for each [[steps]] name",
            ));
        }
        let instruction = step_dir.join(INSTRUCTION);
        if !instruction.is_file() {
            return Err(bad(
                format!("task {shown}: step {:?}", step.name),
                format!("no steps/{}/{INSTRUCTION}", step.name),
                "write the step's instruction to steps/NAME/instruction.md",
            ));
        }
        let own_tests = Some(step_dir.join("tests")).filter(|t| t.is_dir());
        let test_script = [own_tests.as_ref(), shared_tests.as_ref()]
            .into_iter()
            .flatten()
            .map(|t| t.join("test.sh"))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                bad(
                    format!("task {shown}: step {:?}", step.name),
                    format!("no steps/{}/tests/test.sh and no tests/test.sh", step.name),
                    "add the step's test.sh (or one in tests/ for every step), which writes the reward to /logs/verifier/reward.txt",
                )
            })?;
        out.push(StepFiles {
            instruction: Instruction::File(instruction),
            tests: [shared_tests.clone(), own_tests]
                .into_iter()
                .flatten()
                .collect(),
            test_script,
            solution: Some(step_dir.join("solution"))
                .filter(|s| s.is_dir())
                .or_else(|| solution.cloned()),
        });
    }
    Ok(out)
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

/// Checks `--filter` patterns (shell globs: `*`, `?`, `[...]`) before
/// anything runs.
pub fn check_filters(patterns: &[String]) -> Result<()> {
    for f in patterns {
        sifbox_build::glob::check(f)
            .map_err(|why| bad(format!("--filter {f}"), why, "fix the pattern"))?;
    }
    Ok(())
}

/// The tasks whose names match one of `patterns` (every task when there is
/// none); that none matches is bad input.
pub fn select(mut tasks: Vec<Task>, patterns: &[String]) -> Result<Vec<Task>> {
    check_filters(patterns)?;
    if patterns.is_empty() {
        return Ok(tasks);
    }
    tasks.retain(|t| {
        patterns
            .iter()
            .any(|f| sifbox_build::glob::matches(f, &t.name))
    });
    if tasks.is_empty() {
        return Err(bad(
            format!("--filter {}", patterns.join(" --filter ")),
            "no task matches",
            "check the pattern against the task directory names",
        ));
    }
    Ok(tasks)
}

/// How deep below a given dir tasks are looked for.
const MAX_DEPTH: usize = 32;

/// The task dirs at or below `dir`: `dir` itself when it holds task.toml
/// (nothing below a task is looked at), else the task dirs at any depth
/// below it (hidden dirs skipped), sorted by path, into `out`. `seen`
/// holds the canonical dirs walked so far, and whether tasks are at or
/// below them (a symlink loop, a dir given twice, nested dirs given both:
/// each is walked once). Returns whether tasks are at or below `dir`,
/// found now or before.
fn task_dirs(
    dir: &Path,
    depth: usize,
    seen: &mut HashMap<PathBuf, bool>,
    out: &mut Vec<PathBuf>,
) -> Result<bool> {
    let canon = std::fs::canonicalize(dir)
        .map_err(|e| EvalError::io(format!("reading {}", dir.display()), e))?;
    if let Some(had) = seen.get(&canon) {
        return Ok(*had);
    }
    seen.insert(canon.clone(), false);
    if dir.join(TASK_TOML).is_file() || dir.join(TASK_MD).is_file() {
        out.push(dir.to_path_buf());
        seen.insert(canon, true);
        return Ok(true);
    }
    if depth >= MAX_DEPTH {
        return Ok(false);
    }
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| EvalError::io(format!("listing {}", dir.display()), e))?
        .filter_map(std::result::Result::ok)
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    subdirs.sort();
    let mut any = false;
    for d in subdirs {
        any |= task_dirs(&d, depth + 1, seen, out)?;
    }
    seen.insert(canon, any);
    Ok(any)
}

/// The tasks that `paths` name: a task dir (with task.toml) is one task; a
/// dir without task.toml stands for the task dirs at any depth in it (a
/// task's own subdirs are not looked in). Each dir counts once, however
/// often it is named; task names (the dirs' names) must be unique.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<Task>> {
    let mut tasks: Vec<Task> = Vec::new();
    if paths.is_empty() {
        return Err(bad(
            "sifbox eval",
            "no task given",
            "pass task directories, or a directory of them (e.g. examples/tasks)",
        ));
    }
    // Task dirs first: a dir named inside another that was named is
    // walked once, and its tasks are the first dir's.
    let mut seen = HashMap::new();
    for p in paths {
        let shown = p.display().to_string();
        if !p.is_dir() {
            return Err(bad(
                format!("task {shown}"),
                "no such directory",
                "pass a task directory, or a directory of them",
            ));
        }
        let mut found = Vec::new();
        if !task_dirs(p, 0, &mut seen, &mut found)? {
            return Err(bad(
                format!("task {shown}"),
                format!("no {TASK_TOML} or {TASK_MD} in it or below it"),
                "pass a task directory (with task.toml or task.md), or a directory of them",
            ));
        }
        for d in found {
            tasks.push(load(&d)?);
        }
    }
    let mut seen = std::collections::BTreeMap::new();
    for t in &tasks {
        if let Some(other) = seen.insert(t.name.clone(), t.dir.clone()) {
            return Err(bad(
                format!("task {}", t.name),
                format!(
                    "two tasks have this name: {} and {}",
                    other.display(),
                    t.dir.display()
                ),
                "pass each task once; results are kept by task name",
            ));
        }
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TaskConfig> {
        parse_config(s, "t/task.toml")
    }

    #[test]
    fn a_full_task_toml() {
        let c = parse(
            r#"
version = "1.0"
[metadata]
author_name = "x"
difficulty = "easy"
tags = ["a", "b"]
[environment]
build_timeout_sec = 120
cpus = 2
memory_mb = 4096
storage_mb = 2048
network_mode = "no-network"
env = { API = "${KEY:-none}", PLAIN = "v" }
workdir = "/app"
healthcheck = { command = "test -f /ready", interval_sec = 0.5, timeout_sec = 2, retries = 5 }
[agent]
timeout_sec = 30.5
user = "agent"
network_mode = "public"
[verifier]
timeout_sec = 60
env = { MODE = "strict" }
user = "root"
[solution]
env = { HINT = "h" }
"#,
        )
        .expect("valid");
        assert_eq!(c.build_timeout, Duration::from_secs(120));
        assert_eq!(c.network, NetworkMode::NoNetwork);
        assert_eq!(c.agent_network, NetworkMode::Public);
        assert_eq!(c.verifier_network, NetworkMode::NoNetwork);
        assert_eq!(c.agent_timeout, Duration::from_secs_f64(30.5));
        assert_eq!(c.verifier_timeout, Duration::from_secs(60));
        assert_eq!(c.agent_user.as_deref(), Some("agent"));
        assert_eq!(c.workdir.as_deref(), Some("/app"));
        assert_eq!(
            c.env,
            vec![
                ("API".to_string(), "${KEY:-none}".to_string()),
                ("PLAIN".to_string(), "v".to_string())
            ]
        );
        assert_eq!(c.verifier_env, vec![("MODE".into(), "strict".into())]);
        assert_eq!(c.solution_env, vec![("HINT".into(), "h".into())]);
        assert_eq!(
            c.limits,
            Limits {
                cpus: Some(2.0),
                memory_mb: Some(4096),
                storage_mb: Some(2048),
                gpus: None,
                gpu_types: None,
            }
        );
        let h = c.healthcheck.expect("healthcheck");
        assert_eq!(h.argv, ["/bin/sh", "-c", "test -f /ready"]);
        assert_eq!(h.retries, 5);
        assert_eq!(h.interval, Duration::from_millis(500));
    }

    #[test]
    fn defaults_and_legacy_keys() {
        let c = parse("").expect("empty is valid");
        assert_eq!(c.network, NetworkMode::Public);
        assert_eq!(c.agent_timeout, Duration::from_secs(600));
        assert_eq!(c.verifier_timeout, Duration::from_secs(600));
        assert!(c.docker_image.is_none() && c.healthcheck.is_none());
        let c = parse("[environment]\nallow_internet = false\nmemory = \"2G\"").expect("legacy");
        assert_eq!(c.network, NetworkMode::NoNetwork);
        assert_eq!(c.agent_network, NetworkMode::NoNetwork);
        assert_eq!(c.limits.memory_mb, Some(2048));
        let c = parse("[environment]\nallow_internet = true").expect("legacy");
        assert_eq!(c.network, NetworkMode::Public);
        let c = parse("[verifier]\nnetwork_mode = \"no-network\"").expect("override");
        assert_eq!(
            (c.network, c.agent_network, c.verifier_network),
            (
                NetworkMode::Public,
                NetworkMode::Public,
                NetworkMode::NoNetwork
            )
        );
    }

    #[test]
    fn what_harbor_and_benchflow_accept() {
        // Users as numbers (Harbor and BenchFlow: str | int).
        let c = parse("[agent]\nuser = 1000\n[verifier]\nuser = 0\n").expect("numeric users");
        assert_eq!(c.agent_user.as_deref(), Some("1000"));
        assert_eq!(c.verifier_user.as_deref(), Some("0"));
        // BenchFlow's spellings: [oracle], [sandbox], image, the [solution]
        // env shorthand, [reward] metadata.
        let c = parse(
            "[sandbox]\nimage = \"busybox\"\n[oracle]\nenv = { A = \"1\" }\nTOKEN = \"${T:-x}\"\n[reward]\nexpr = \"mean(a)\"\n",
        )
        .expect("benchflow");
        assert_eq!(c.docker_image.as_deref(), Some("busybox"));
        assert_eq!(
            c.solution_env,
            vec![("A".into(), "1".into()), ("TOKEN".into(), "${T:-x}".into())]
        );
        assert!(c.warnings.is_empty() && c.unsupported.is_empty(), "{c:?}");
        // Legacy sizes.
        let c = parse("[environment]\nstorage = \"10G\"\nmemory = \"512M\"").expect("legacy");
        assert_eq!(
            (c.limits.storage_mb, c.limits.memory_mb),
            (Some(10240), Some(512))
        );
        // os, verifier type: the values that run.
        let c = parse("[environment]\nos = \"Linux\"\n[verifier]\ntype = \"test-script\"")
            .expect("linux");
        assert!(c.unsupported.is_empty());
        // Setup commands, with their defaults.
        let c = parse(
            "[[environment.setup_commands]]\ncommand = \" echo a \"\n[[environment.setup_commands]]\ncommand = \"b\"\ntimeout_sec = 5\ncwd = \"/srv\"\nuser = 1000\nenv = { K = \"${V:-d}\" }\nhost_lock = \"db\"\nservice = \"main\"\n",
        )
        .expect("setup");
        assert_eq!(
            c.setup_commands,
            vec![
                SetupCommand {
                    command: "echo a".into(),
                    timeout: Duration::from_secs(600),
                    cwd: None,
                    env: vec![],
                    user: None,
                    host_lock: None,
                },
                SetupCommand {
                    command: "b".into(),
                    timeout: Duration::from_secs(5),
                    cwd: Some("/srv".into()),
                    env: vec![("K".into(), "${V:-d}".into())],
                    user: Some("1000".into()),
                    host_lock: Some("db".into()),
                },
            ]
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_collected_per_field() {
        let cases = [
            ("[environment]\nos = \"windows\"", "[environment] os = \"windows\""),
            ("[environment]\nos = \"WINDOWS\"", "[environment] os = \"windows\""),
            ("[verifier]\ntype = \"llm-judge\"", "[verifier] type = \"llm-judge\""),
            (
                "[[environment.mcp_servers]]\nname = \"m\"\nurl = \"http://x\"",
                "[environment] mcp_servers",
            ),
            (
                "[environment]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\"example.com\"]",
                "[environment] network_mode = \"allowlist\"",
            ),
            ("[agent]\nnetwork_mode = \"allowlist\"", "[agent] network_mode = \"allowlist\""),
            (
                "[environment]\nnetwork_mode = \"denylist\"\nblocked_hosts = [\"x.com\"]",
                "[environment] network_mode = \"denylist\"",
            ),
            ("[verifier]\nnetwork_mode = \"denylist\"", "[verifier] network_mode = \"denylist\""),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\nservice = \"db\"",
                "setup_commands[0] service = \"db\"",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\ncapture_dir = \"/a\"\ncapture_dir_b64_env = \"A\"",
                "setup_commands[0] capture_dir",
            ),
        ];
        for (text, needle) in cases {
            let c = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(c.unsupported.len(), 1, "{text:?}: {:?}", c.unsupported);
            assert!(
                c.unsupported[0].contains(needle),
                "{text:?}: {:?}",
                c.unsupported
            );
            assert!(!c.unsupported[0].contains('\n'));
        }
        // An empty list of MCP servers asks for nothing.
        assert!(parse("[environment]\nmcp_servers = []")
            .expect("empty")
            .unsupported
            .is_empty());
        // Several at once: each named.
        let c = parse("[environment]\nos = \"windows\"\nnetwork_mode = \"allowlist\"\n[verifier]\ntype = \"llm-judge\"").expect("three");
        assert_eq!(c.unsupported.len(), 3, "{:?}", c.unsupported);
    }

    #[test]
    fn healthcheck_fields_and_defaults_are_harbors() {
        let h = parse("[environment.healthcheck]\ncommand = \"true\"")
            .expect("defaults")
            .healthcheck
            .expect("healthcheck");
        assert_eq!(h.interval, Duration::from_secs(5));
        assert_eq!(h.timeout, Duration::from_secs(30));
        assert_eq!(h.start_period, Duration::ZERO);
        assert_eq!(h.start_interval, Duration::from_secs(5));
        assert_eq!(h.retries, 3);
        let h = parse("[environment.healthcheck]\ncommand = \"true\"\ninterval_sec = 0\nstart_interval_sec = 0.25\nstart_period_sec = 2\ntimeout_sec = 1\nretries = 0")
            .expect("set")
            .healthcheck
            .expect("healthcheck");
        assert_eq!(h.interval, Duration::ZERO);
        assert_eq!(h.start_interval, Duration::from_millis(250));
        assert_eq!(h.start_period, Duration::from_secs(2));
        assert_eq!(h.timeout, Duration::from_secs(1));
        assert_eq!(
            h.retries, 1,
            "Harbor's 0 retries fail at the first failure, as 1"
        );
    }

    #[test]
    fn unknown_keys_are_warned_about_never_silently_dropped() {
        let c = parse("[agent]\ntimeout_secs = 5\n[verifer]\ntimeout_sec = 1\n")
            .expect("warnings only");
        assert_eq!(
            c.agent_timeout,
            Duration::from_secs(600),
            "the misspelt key is not used"
        );
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("did you mean `timeout_sec`?"),
            "{:?}",
            c.warnings
        );
        assert!(
            c.warnings[1].contains("did you mean `verifier`?"),
            "{:?}",
            c.warnings
        );
        assert!(c.warnings.iter().all(|w| w.starts_with("t/task.toml: ")));
    }

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
    fn bad_values_are_refused_with_where_and_what() {
        let cases = [
            (
                "[environment]\nnetwork_mode = \"bridge\"",
                "unknown variant",
            ),
            ("[agent]\ntimeout_sec = -1", "timeout_sec"),
            ("[agent]\ntimeout_sec = 1e300", "timeout_sec"),
            ("[agent]\ntimeout_sec = nan", "timeout_sec"),
            ("[agent]\ntimeout_sec = \"ten\"", "invalid type"),
            ("[verifier]\nenv = { \"1BAD\" = \"x\" }", "variable name"),
            ("[verifier]\nenv = { A = \"${B\" }", "unterminated"),
            ("[environment]\nworkdir = \"relative\"", "absolute"),
            ("[environment]\nmemory = \"lots\"", "memory"),
            ("[environment]\nstorage_mb = 0", "storage_mb"),
            ("[environment]\nstorage = \"0\"", "storage_mb"),
            ("[environment]\nstorage = \"big\"", "storage"),
            ("[environment]\nmemory_mb = 0", "memory_mb"),
            ("[environment]\nmemory = \"0G\"", "memory_mb"),
            ("[environment]\nmemory_mb = 2000000000000", "too large"),
            (
                "[environment]\nmemory_mb = 1024\nmemory = \"2G\"",
                "disagree",
            ),
            (
                "[environment]\nstorage_mb = 1024\nstorage = \"2G\"",
                "disagree",
            ),
            ("[environment]\ncpus = 0", "cpus"),
            ("[environment]\ncpus = -1", "cpus"),
            ("[environment]\ncpus = 1e300", "cpus"),
            ("[environment]\ncpus = nan", "cpus"),
            ("[environment]\ngpus = -1", "invalid value"),
            ("[environment]\ngpu_types = [\"\"]", "gpu_types"),
            ("[environment]\ndocker_image = \" \"", "docker_image"),
            (
                "[environment]\nhealthcheck = { interval_sec = 1 }",
                "no command",
            ),
            ("[agent]\nuser = \"\"", "user"),
            ("[agent]\nuser = -1", "user"),
            ("[verifier]\nuser = 4294967296", "user"),
            ("[agent]\nuser = 1.5", "expected a user"),
            ("[environment]\nos = \"plan9\"", "os"),
            ("[verifier]\ntype = \"vibes\"", "type"),
            ("[environment]\nmcp_servers = \"x\"", "expected a sequence"),
            (
                "[environment]\nhealthcheck = { command = \"true\", retries = -1 }",
                "retries",
            ),
            (
                "[environment]\nhealthcheck = { command = \"true\", interval_sec = -1 }",
                "interval_sec",
            ),
            ("[[environment.setup_commands]]\ncwd = \"/\"", "no command"),
            (
                "[[environment.setup_commands]]\ncommand = \"  \"",
                "no command",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\ncwd = \"rel\"",
                "absolute",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\ntimeout_sec = 0",
                "timeout_sec",
            ),
            (
                "[[environment.setup_commands]]\ncommand = \"x\"\nenv = { \"1X\" = \"a\" }",
                "variable name",
            ),
            (
                "[environment]\nsetup_commands = { command = \"x\" }",
                "invalid type",
            ),
            ("[solution]\nenv = { A = \"1\" }\nA = \"2\"", "set twice"),
            ("[solution]\nenv = {}\n[oracle]\nenv = {}", "duplicate"),
            (
                "[environment]\ndocker_image = \"a\"\nimage = \"b\"",
                "duplicate",
            ),
            ("[environment]\ncpus = 1\n[sandbox]\ncpus = 2", "duplicate"),
            ("reward = 1\n", "invalid type"),
            ("[environment\n", "not a valid task.toml"),
        ];
        for (text, needle) in cases {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.contains("t/task.toml"), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{text:?}: more than one line: {e}");
        }
    }

    #[test]
    fn resources_and_their_legacy_spellings() {
        let c = parse(
            "[environment]\ncpus = 0.5\nmemory = \"1.5G\"\nstorage = \"20G\"\ngpus = 2\ngpu_types = [\"H100\", \"A100\"]",
        )
        .expect("legacy sizes");
        assert_eq!(
            c.limits,
            Limits {
                cpus: Some(0.5),
                memory_mb: Some(1536),
                storage_mb: Some(20480),
                gpus: Some(2),
                gpu_types: Some(vec!["H100".into(), "A100".into()]),
            }
        );
        // Both spellings, agreeing: accepted (as Harbor does).
        let c = parse("[environment]\nmemory_mb = 2048\nmemory = \"2G\"\nstorage_mb = 512\nstorage = \"512M\"")
            .expect("agreeing");
        assert_eq!(
            (c.limits.memory_mb, c.limits.storage_mb),
            (Some(2048), Some(512))
        );
        // An integer number of CPUs, and none at all.
        assert_eq!(
            parse("[environment]\ncpus = 2").expect("int").limits.cpus,
            Some(2.0)
        );
        assert_eq!(parse("").expect("empty").limits, Limits::default());
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

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("2G"), Some(2048));
        assert_eq!(parse_memory("512m"), Some(512));
        assert_eq!(parse_memory("1.5G"), Some(1536));
        assert_eq!(parse_memory("1048576"), Some(1));
        assert_eq!(parse_memory("x"), None);
        assert_eq!(parse_memory("-1G"), None);
        assert_eq!(parse_memory(""), None);
    }

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    fn make_task(root: &Path, name: &str, solution: &str, tests: &str) -> PathBuf {
        let d = root.join(name);
        write(&d, "task.toml", "[agent]\ntimeout_sec = 5\n");
        write(&d, "instruction.md", "do it");
        write(&d, "environment/Dockerfile", "FROM base\n");
        write(&d, &format!("{solution}/solve.sh"), "true");
        write(
            &d,
            &format!("{tests}/test.sh"),
            "echo 1 > /logs/verifier/reward.txt",
        );
        d
    }

    #[test]
    fn verifier_modes_are_harbors() {
        // Default: shared. An environment implies separate.
        let c = parse("").expect("empty");
        assert_eq!(c.verifier_mode, VerifierMode::Shared);
        let c = parse("[verifier.environment]\ndocker_image = \"v\"\n").expect("env");
        assert_eq!(c.verifier_mode, VerifierMode::Separate);
        assert_eq!(c.verifier_image.as_deref(), Some("v"));
        let c = parse("[verifier]\nenvironment_mode = \"separate\"\n").expect("separate");
        assert_eq!(
            (c.verifier_mode, c.verifier_image),
            (VerifierMode::Separate, None)
        );
        // BenchFlow's spellings.
        let c =
            parse("[verifier]\nsandbox_mode = \"separate\"\n[verifier.sandbox]\nimage = \"w\"\n")
                .expect("benchflow");
        assert_eq!(c.verifier_image.as_deref(), Some("w"));
        // Shared with an environment of its own is Harbor's ValueError.
        let e = parse("[verifier]\nenvironment_mode = \"shared\"\n[verifier.environment]\n")
            .expect_err("shared + env");
        assert!(
            e.to_string().contains("environment_mode = \"shared\""),
            "{e}"
        );
        for bad in [
            "[verifier]\nenvironment_mode = \"apart\"\n",
            "[verifier.environment]\ndocker_image = \" \"\n",
            "[verifier.environment]\nos = \"plan9\"\n",
        ] {
            parse(bad).expect_err(bad);
        }
        let c = parse("[verifier.environment]\nos = \"windows\"\n").expect("windows");
        assert!(
            c.unsupported[0].contains("[verifier.environment] os"),
            "{c:?}"
        );
    }

    #[test]
    fn steps_are_parsed_as_harbor_writes_them() {
        let c = parse(
            "multi_step_reward_strategy = \"final\"\n[agent]\ntimeout_sec = 9\nuser = \"u\"\n[[steps]]\nname = \"one\"\nmin_reward = 1\n[[steps]]\nname = \"two\"\nmin_reward = { reward = 0.5, acc = 0 }\n[steps.agent]\ntimeout_sec = 3\n[steps.verifier]\nuser = 7\nenv = { K = \"v\" }\n",
        )
        .expect("steps");
        assert_eq!(c.reward_strategy, RewardStrategy::Final);
        assert_eq!(c.steps.len(), 2);
        let (one, two) = (&c.steps[0], &c.steps[1]);
        assert_eq!(one.name, "one");
        // The task's values where a step sets none.
        assert_eq!(one.agent_timeout, Duration::from_secs(9));
        assert_eq!(one.agent_user.as_deref(), Some("u"));
        assert_eq!(
            one.min_reward,
            Some(BTreeMap::from([("reward".into(), 1.0)]))
        );
        assert_eq!(two.agent_timeout, Duration::from_secs(3));
        assert_eq!(two.verifier_user.as_deref(), Some("7"));
        assert_eq!(two.verifier_env, vec![("K".into(), "v".into())]);
        assert_eq!(
            two.min_reward,
            Some(BTreeMap::from([
                ("reward".into(), 0.5),
                ("acc".into(), 0.0)
            ]))
        );
        assert!(c.unsupported.is_empty() && c.warnings.is_empty(), "{c:?}");
        // Mean by default.
        let c = parse("[[steps]]\nname = \"a\"\n").expect("default");
        assert_eq!(c.reward_strategy, RewardStrategy::Mean);
        // Harbor's refusals: no name, a name that is no portable dir name,
        // a name twice (without case), a bad strategy or threshold.
        for bad in [
            "[[steps]]\nmin_reward = 1\n",
            "[[steps]]\nname = \"a/b\"\n",
            "[[steps]]\nname = \"..\"\n",
            "[[steps]]\nname = \"x.\"\n",
            "[[steps]]\nname = \"CON\"\n",
            "[[steps]]\nname = \"a\"\n[[steps]]\nname = \"A\"\n",
            "multi_step_reward_strategy = \"max\"\n[[steps]]\nname = \"a\"\n",
            "[[steps]]\nname = \"a\"\nmin_reward = \"high\"\n",
            "[[steps]]\nname = \"a\"\n[steps.agent]\ntimeout_sec = 0\n",
        ] {
            parse(bad).expect_err(bad);
        }
        assert!(
            valid_step_name("setup.v2") && valid_step_name("com0") && !valid_step_name("lpt1.txt")
        );
        // What a step cannot set here is refused per task.
        let c = parse("[[steps]]\nname = \"a\"\n[steps.healthcheck]\ncommand = \"true\"\n")
            .expect("healthcheck");
        assert!(
            c.unsupported[0].contains("[[steps]] \"a\" healthcheck"),
            "{c:?}"
        );
        let c = parse("[verifier]\nenvironment_mode = \"separate\"\n[[steps]]\nname = \"a\"\n")
            .expect("separate");
        assert!(c.unsupported[0].contains("separate verifier"), "{c:?}");
    }

    #[test]
    fn a_steps_files_are_its_own_else_the_tasks() {
        let root = tempfile::tempdir().expect("tempdir");
        let d = make_task(root.path(), "m", "solution", "tests");
        write(
            &d,
            "task.toml",
            "[[steps]]\nname = \"a\"\n[[steps]]\nname = \"b\"\n",
        );
        std::fs::remove_file(d.join("instruction.md")).expect("rm");
        // No steps/a/instruction.md: refused, naming the step.
        let e = load(&d).expect_err("no step dir");
        assert!(e.to_string().contains("step \"a\""), "{e}");
        write(&d, "steps/a/instruction.md", "do a");
        write(
            &d,
            "steps/a/tests/test.sh",
            "echo 1 > /logs/verifier/reward.txt",
        );
        write(&d, "steps/a/solution/solve.sh", "true");
        write(&d, "steps/b/instruction.md", "do b");
        let t = load(&d).expect("load");
        let (a, b) = (&t.steps[0], &t.steps[1]);
        assert_eq!(a.tests, [d.join("tests"), d.join("steps/a/tests")]);
        assert_eq!(a.test_script, d.join("steps/a/tests/test.sh"));
        assert_eq!(a.solution, Some(d.join("steps/a/solution")));
        assert_eq!(b.tests, [d.join("tests")]);
        assert_eq!(b.test_script, d.join("tests/test.sh"));
        assert_eq!(b.solution, Some(d.join("solution")));
        // No test.sh for b at all: refused.
        std::fs::remove_file(d.join("tests/test.sh")).expect("rm");
        let e = load(&d).expect_err("no test for b");
        assert!(e.to_string().contains("step \"b\""), "{e}");
        // A step's workdir/ is not staged: the task is unsupported.
        write(&d, "tests/test.sh", "true");
        write(&d, "steps/b/workdir/setup.sh", "true");
        let t = load(&d).expect("load");
        assert!(
            t.config.unsupported[0].contains("steps/b/workdir/"),
            "{:?}",
            t.config
        );
    }

    #[test]
    fn a_separate_verifiers_image_by_harbors_precedence() {
        let root = tempfile::tempdir().expect("tempdir");
        // The task's environment, tests uploaded.
        let d = make_task(root.path(), "a", "solution", "tests");
        write(
            &d,
            "task.toml",
            "[verifier]\nenvironment_mode = \"separate\"\n",
        );
        let t = load(&d).expect("load");
        let v = t.separate_verifier.expect("separate");
        assert_eq!(v.environment, t.environment);
        assert!(!v.bundled_tests);
        // tests/Dockerfile: built from tests/, which holds the tests.
        write(&d, "tests/Dockerfile", "FROM base\nCOPY . /tests\n");
        let t = load(&d).expect("load");
        let v = t.separate_verifier.expect("separate");
        assert_eq!(
            v.environment,
            EnvSource::Dockerfile {
                context: d.join("tests")
            }
        );
        assert!(v.bundled_tests);
        // [verifier.environment] docker_image comes first; no test.sh
        // is needed on the host then.
        write(
            &d,
            "task.toml",
            "[verifier.environment]\ndocker_image = \"grader\"\n",
        );
        std::fs::remove_file(d.join("tests/test.sh")).expect("rm");
        let t = load(&d).expect("load");
        let v = t.separate_verifier.expect("separate");
        assert_eq!(v.environment, EnvSource::Image("grader".into()));
        assert!(v.bundled_tests);
        // A shared verifier still needs test.sh.
        write(&d, "task.toml", "");
        load(&d).expect_err("no test.sh");
    }

    #[test]
    fn layouts_and_discovery() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = make_task(root.path(), "b-task", "solution", "tests");
        let b = make_task(root.path(), "a-task", "oracle", "verifier");
        std::fs::create_dir(root.path().join("not-a-task")).expect("mkdir");
        let tasks = discover(&[root.path().to_path_buf()]).expect("discover");
        let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a-task", "b-task"]);
        assert_eq!(
            tasks[0].solution.as_deref(),
            Some(b.join("oracle").as_path())
        );
        assert_eq!(tasks[0].tests, b.join("verifier"));
        assert_eq!(tasks[1].tests, a.join("tests"));
        assert_eq!(
            tasks[1].environment,
            EnvSource::Dockerfile {
                context: a.join("environment")
            }
        );
        // One task by its own dir; the same dir twice, or a task and the
        // dir above it, count once.
        assert_eq!(discover(std::slice::from_ref(&a)).expect("one").len(), 1);
        assert_eq!(discover(&[a.clone(), a.clone()]).expect("twice").len(), 1);
        let both = discover(&[a.clone(), root.path().to_path_buf(), a.join(".")]).expect("nested");
        let names: Vec<&str> = both.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b-task", "a-task"]);
        // Any depth, not inside a task, hidden dirs skipped; two dirs of
        // one name are refused.
        let deep = root.path().join("suite/x/y");
        make_task(&deep, "deep-task", "solution", "tests");
        make_task(&a.join("tests"), "inside-a-task", "solution", "tests");
        make_task(
            &root.path().join(".hidden"),
            "hidden-task",
            "solution",
            "tests",
        );
        let all = discover(&[root.path().to_path_buf()]).expect("deep");
        let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a-task", "b-task", "deep-task"]);
        make_task(&root.path().join("suite"), "a-task", "solution", "tests");
        let e = discover(&[root.path().to_path_buf()]).expect_err("same name");
        assert!(e.to_string().contains("two tasks"), "{e}");
        // A dir with no task at all.
        let e = discover(&[root.path().join("not-a-task")]).expect_err("none");
        assert!(
            e.is_bad_input() && e.to_string().contains("task.toml"),
            "{e}"
        );
        // A task without tests, without a Dockerfile.
        std::fs::remove_file(a.join("tests/test.sh")).expect("rm");
        assert!(load(&a)
            .expect_err("no test.sh")
            .to_string()
            .contains("test.sh"));
        std::fs::remove_file(b.join("environment/Dockerfile")).expect("rm");
        assert!(load(&b)
            .expect_err("no env")
            .to_string()
            .contains("Dockerfile"));
        write(
            &b,
            "task.toml",
            "[environment]\ndocker_image = \"debian:bookworm\"\n",
        );
        assert_eq!(
            load(&b).expect("image").environment,
            EnvSource::Image("debian:bookworm".into())
        );
        // A .sif file: relative to the task's dir, or absolute; it must exist.
        write(
            &b,
            "task.toml",
            "[environment]\ndocker_image = \"img/base.sif\"\n",
        );
        let e = load(&b).expect_err("no sif").to_string();
        assert!(
            e.contains("no such SIF file") && e.contains("base.sif"),
            "{e}"
        );
        write(&b, "img/base.sif", "not really");
        assert_eq!(
            load(&b).expect("sif").environment,
            EnvSource::Sif(b.join("img/base.sif"))
        );
        let abs = b.join("img/base.sif").display().to_string();
        write(
            &b,
            "task.toml",
            &format!("[environment]\ndocker_image = {abs:?}\n"),
        );
        assert_eq!(
            load(&b).expect("abs").environment,
            EnvSource::Sif(b.join("img/base.sif"))
        );
        // An unsupported task loads without what it cannot use (here no
        // tests/test.sh: an LLM judge's task has a rubric instead).
        write(&a, "task.toml", "[verifier]\ntype = \"llm-judge\"\n");
        let t = load(&a).expect("unsupported loads");
        assert_eq!(t.config.unsupported.len(), 1);
        // The oracle's script.
        assert!(t.solve_script().is_some());
        std::fs::remove_file(a.join("solution/solve.sh")).expect("rm");
        assert!(t.solve_script().is_none());
    }

    #[test]
    fn task_md_and_compose_files() {
        let root = tempfile::tempdir().expect("tempdir");
        // task.md alone is a task, found by discovery; it wins over a
        // task.toml beside it, and its dirs are BenchFlow's (oracle/ and
        // verifier/ before solution/ and tests/).
        let d = root.path().join("md");
        write(
            &d,
            "task.md",
            "---\nimage: busybox\nagent: {timeout_sec: 5}\n---\n## prompt\nDo it.\n",
        );
        write(&d, "task.toml", "[environment]\ndocker_image = \"other\"\n");
        write(&d, "verifier/test.sh", "true");
        write(&d, "tests/test.sh", "true");
        write(&d, "oracle/solve.sh", "true");
        write(&d, "solution/solve.sh", "true");
        let tasks = discover(&[root.path().to_path_buf()]).expect("discover");
        assert_eq!(tasks.len(), 1);
        let t = &tasks[0];
        assert_eq!(t.environment, EnvSource::Image("busybox".into()));
        assert_eq!(t.instruction, Instruction::Text("Do it.".into()));
        assert_eq!(t.config_file, d.join("task.md"));
        assert_eq!(t.tests, d.join("verifier"));
        assert_eq!(t.solution.as_deref(), Some(d.join("oracle").as_path()));
        // A compose file of one service: under task.toml's values.
        let c = make_task(root.path(), "composed", "solution", "tests");
        write(
            &c,
            "task.toml",
            "[environment]\nenv = { A = \"toml\" }\nmemory_mb = 100\n",
        );
        write(
            &c,
            "environment/docker-compose.yaml",
            "services:\n  main:\n    build: .\n    environment: {A: compose, B: b}\n    working_dir: /w\n    user: agent\n    mem_limit: 1g\n    cpus: 2\n",
        );
        let t = load(&c).expect("compose");
        assert_eq!(
            t.config.env,
            [
                ("B".to_string(), "b".to_string()),
                ("A".into(), "toml".into())
            ]
        );
        assert_eq!(t.config.workdir.as_deref(), Some("/w"));
        assert_eq!(t.config.default_user.as_deref(), Some("agent"));
        assert_eq!(
            (t.config.limits.memory_mb, t.config.limits.cpus),
            (Some(100), Some(2.0))
        );
        assert!(
            t.config.unsupported.is_empty(),
            "{:?}",
            t.config.unsupported
        );
        // Two services: unsupported, not bad input, also without a
        // Dockerfile; a malformed compose file is bad input.
        std::fs::remove_file(c.join("environment/Dockerfile")).expect("rm");
        write(
            &c,
            "environment/compose.yaml",
            "services:\n  main: {build: .}\n  db: {image: pg}\n",
        );
        std::fs::remove_file(c.join("environment/docker-compose.yaml")).expect("rm");
        let t = load(&c).expect("unsupported loads");
        assert!(
            t.config.unsupported[0].contains("multi-service compose"),
            "{:?}",
            t.config.unsupported
        );
        write(&c, "environment/compose.yaml", "services: [\n");
        let e = load(&c).expect_err("malformed");
        assert!(
            e.is_bad_input() && e.to_string().contains("compose.yaml:"),
            "{e}"
        );
        // A service naming an image and no build, without a Dockerfile or
        // docker_image: the task's image.
        write(
            &c,
            "environment/compose.yaml",
            "services:\n  main: {image: busybox}\n",
        );
        assert_eq!(
            load(&c).expect("image").environment,
            EnvSource::Image("busybox".into())
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any text: an error or a config, never a panic.
        #[test]
        fn any_text_never_panics(s in "\\PC{0,400}") {
            let _ = parse(&s);
        }

        /// TOML-shaped text with the keys task.toml has and random values:
        /// never a panic, and errors are single lines naming the file.
        #[test]
        fn task_toml_shaped_text(
            section in proptest::sample::select(vec!["environment", "agent", "verifier", "solution", "environment.healthcheck", "metadata", "oracle", "sandbox", "reward", "[environment.setup_commands]", "verifer", "[environment.mcp_servers]"]),
            key in proptest::sample::select(vec![
                "timeout_sec", "build_timeout_sec", "network_mode", "allow_internet", "env",
                "workdir", "user", "cpus", "memory_mb", "memory", "storage_mb", "docker_image",
                "command", "interval_sec", "retries", "start_period_sec", "gpus", "healthcheck",
                "storage", "gpu_types", "os", "type", "image", "mcp_servers", "setup_commands",
                "start_interval_sec", "cwd", "host_lock", "service", "capture_dir", "TOKEN",
                "timeout_secs", "blocked_hosts",
            ]),
            value in proptest::sample::select(vec![
                "1", "-1", "0", "0.0", "1e308", "-0.0", "inf", "nan", "9223372036854775807",
                "\"no-network\"", "\"public\"", "\"allowlist\"", "\"2G\"", "\"/app\"", "\"x\"",
                "true", "false", "[]", "[\"a\"]", "{}", "{ A = \"${B:-c}\" }", "{ A = 1 }",
                "\"${\"", "\"\\u0000\"", "{ command = \"true\" }", "1979-05-27",
                "\"windows\"", "\"llm-judge\"", "\"denylist\"", "[{ command = \"x\", service = \"db\" }]",
                "-4294967297", "4294967296", "\"x.sif\"",
            ]),
        ) {
            let text = format!("[{section}]\n{key} = {value}\n");
            if let Err(e) = parse(&text) {
                let e = e.to_string();
                proptest::prop_assert!(e.contains("t/task.toml"), "{}", e);
                proptest::prop_assert!(!e.contains('\n'), "{}", e);
            }
        }
    }
}
