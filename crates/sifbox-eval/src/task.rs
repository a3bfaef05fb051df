//! The task format (Harbor/BenchFlow layout):
//!
//! ```text
//! TASK/
//!   task.toml                 [environment] [agent] [verifier] [solution]
//!   instruction.md            -> /instruction.md
//!   environment/Dockerfile    the build context (or [environment] docker_image)
//!   solution/solve.sh         (or oracle/) -> /solution, for the oracle agent
//!   tests/test.sh             (or verifier/) -> /tests
//! ```
//!
//! task.toml is untrusted input: it is size-limited, every value is checked
//! here (types, ranges, names, paths), and nothing in it reaches a command
//! line of the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result};
use crate::template;

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
    /// Only the hosts of `allowed_hosts` (refused: not enforced yet).
    Allowlist,
}

/// A command of a healthcheck: a shell string or an argv.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HealthCommand {
    Shell(String),
    Argv(Vec<String>),
}

/// `[environment.healthcheck]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawHealthcheck {
    pub command: Option<HealthCommand>,
    pub interval_sec: Option<f64>,
    pub timeout_sec: Option<f64>,
    pub start_period_sec: Option<f64>,
    pub retries: Option<u32>,
}

/// `[environment]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawEnvironment {
    pub build_timeout_sec: Option<f64>,
    pub docker_image: Option<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub storage_mb: Option<u64>,
    pub gpus: Option<u64>,
    pub gpu_types: Option<Vec<String>>,
    pub network_mode: Option<NetworkMode>,
    pub allowed_hosts: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub healthcheck: Option<RawHealthcheck>,
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
    pub user: Option<String>,
    pub network_mode: Option<NetworkMode>,
}

/// `[verifier]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawVerifier {
    pub timeout_sec: Option<f64>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub network_mode: Option<NetworkMode>,
}

/// `[solution]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawSolution {
    pub env: BTreeMap<String, String>,
}

/// task.toml as written (unknown keys are ignored, as newer schema
/// versions may add some).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RawTaskToml {
    pub schema_version: Option<toml::Value>,
    pub version: Option<toml::Value>,
    pub metadata: toml::Table,
    pub environment: RawEnvironment,
    pub agent: RawAgent,
    pub verifier: RawVerifier,
    pub solution: RawSolution,
}

/// A healthcheck, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Healthcheck {
    /// The argv to run (`/bin/sh -c STRING` for a string).
    pub argv: Vec<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub start_period: Duration,
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
    /// `[metadata.sifbox] allow_userns = true`: the task's commands may
    /// create user namespaces (bubblewrap, Chromium's sandbox). Kept under
    /// `[metadata]`, which Harbor and BenchFlow leave free-form.
    pub allow_userns: bool,
}

/// Where a task's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSource {
    /// Built from this context (its `Dockerfile`).
    Dockerfile { context: PathBuf },
    /// A prebuilt image (`docker_image`): a store name or `docker://REF`.
    Image(String),
}

/// A task directory, loaded and checked.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    /// Absolute.
    pub dir: PathBuf,
    pub config: TaskConfig,
    pub instruction: PathBuf,
    pub environment: EnvSource,
    /// `solution/` (or `oracle/`), when there is one.
    pub solution: Option<PathBuf>,
    /// `tests/` (or `verifier/`), holding test.sh.
    pub tests: PathBuf,
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
    check_config(raw, file)
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

fn check_user(u: Option<String>, key: &str, file: &str) -> Result<Option<String>> {
    match u {
        Some(u) if u.is_empty() || u.len() > 256 || u.chars().any(char::is_control) => Err(bad(
            format!("{file}: {key} = {u:?}"),
            "not a user name",
            "name a user of the image (NAME, UID or UID:GID), or leave it out for the image's user",
        )),
        other => Ok(other),
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
    let allowlist = |key: &str| {
        bad(
            format!("{file}: {key} = \"allowlist\""),
            "sifbox cannot enforce a host allowlist yet",
            "use \"public\" or \"no-network\" (or run this task with another runtime)",
        )
    };
    let network = match (e.network_mode, e.allow_internet) {
        (Some(m), _) => m,
        (None, Some(false)) => NetworkMode::NoNetwork,
        (None, _) => NetworkMode::Public,
    };
    if network == NetworkMode::Allowlist {
        return Err(allowlist("[environment] network_mode"));
    }
    let agent_network = raw.agent.network_mode.unwrap_or(network);
    if agent_network == NetworkMode::Allowlist {
        return Err(allowlist("[agent] network_mode"));
    }
    let verifier_network = raw.verifier.network_mode.unwrap_or(network);
    if verifier_network == NetworkMode::Allowlist {
        return Err(allowlist("[verifier] network_mode"));
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
            "name an image (a store name or docker://REF), or leave it out to build environment/",
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
            let retries = h.retries.unwrap_or(3);
            if retries == 0 || retries > 10_000 {
                return Err(bad(
                    format!("{file}: {key} retries = {retries}"),
                    "must be 1 to 10000",
                    "set retries to e.g. 3",
                ));
            }
            let start_period = match h.start_period_sec {
                None => Duration::ZERO,
                Some(0.0) => Duration::ZERO,
                v => timeout(v, 0.0, &format!("{key} start_period_sec"), file)?,
            };
            Some(Healthcheck {
                argv,
                interval: timeout(h.interval_sec, 1.0, &format!("{key} interval_sec"), file)?,
                timeout: timeout(h.timeout_sec, 30.0, &format!("{key} timeout_sec"), file)?,
                start_period,
                retries,
            })
        }
    };
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
        solution_env: check_env(raw.solution.env, "[solution] env", file)?,
        workdir,
        healthcheck,
        agent_timeout: timeout(
            raw.agent.timeout_sec,
            DEFAULT_AGENT_TIMEOUT_SEC,
            "[agent] timeout_sec",
            file,
        )?,
        agent_user: check_user(raw.agent.user, "[agent] user", file)?,
        verifier_timeout: timeout(
            raw.verifier.timeout_sec,
            DEFAULT_VERIFIER_TIMEOUT_SEC,
            "[verifier] timeout_sec",
            file,
        )?,
        verifier_user: check_user(raw.verifier.user, "[verifier] user", file)?,
        allow_userns: sifbox_flag(&raw.metadata, "allow_userns", file)?,
    })
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

/// Loads the task in `dir` (which holds task.toml).
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
    let toml_path = dir.join(TASK_TOML);
    let file = toml_path.display().to_string();
    let meta = std::fs::metadata(&toml_path).map_err(|e| {
        bad(
            format!("task {shown}"),
            format!("no readable {TASK_TOML} ({e})"),
            "pass a task directory (with task.toml, instruction.md, environment/ and tests/), or a directory of them",
        )
    })?;
    if !meta.is_file() || meta.len() > MAX_TASK_TOML {
        return Err(bad(
            file,
            "not a regular file of at most 1 MiB",
            "make task.toml a small text file",
        ));
    }
    let text = std::fs::read_to_string(&toml_path).map_err(|e| {
        bad(
            &file,
            format!("cannot read it as UTF-8 text: {e}"),
            "make task.toml a UTF-8 text file",
        )
    })?;
    let config = parse_config(&text, &file)?;
    let instruction = dir.join(INSTRUCTION);
    if !instruction.is_file() {
        return Err(bad(
            format!("task {shown}"),
            format!("no {INSTRUCTION}"),
            "write the task's instruction to instruction.md",
        ));
    }
    let environment = match &config.docker_image {
        Some(image) => EnvSource::Image(image.clone()),
        None => {
            let context = dir.join("environment");
            if !context.join("Dockerfile").is_file() {
                let why = if context.join("docker-compose.yaml").is_file()
                    || context.join("docker-compose.yml").is_file()
                {
                    "environment/ has a docker-compose file, which sifbox does not run".to_string()
                } else {
                    "no environment/Dockerfile and no [environment] docker_image".to_string()
                };
                return Err(bad(
                    format!("task {shown}"),
                    why,
                    "add environment/Dockerfile, or set docker_image in task.toml",
                ));
            }
            EnvSource::Dockerfile { context }
        }
    };
    let tests = first_dir(&dir, &["tests", "verifier"]).ok_or_else(|| {
        bad(
            format!("task {shown}"),
            "no tests/ (or verifier/) directory",
            "add tests/test.sh, which writes the reward to /logs/verifier/reward.txt",
        )
    })?;
    if !tests.join("test.sh").is_file() {
        return Err(bad(
            format!("task {shown}"),
            format!("no test.sh in {}", tests.display()),
            "add test.sh, which writes the reward to /logs/verifier/reward.txt",
        ));
    }
    Ok(Task {
        name,
        solution: first_dir(&dir, &["solution", "oracle"]),
        dir,
        config,
        instruction,
        environment,
        tests,
    })
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

/// The tasks that `paths` name: a task dir (with task.toml) is one task; a
/// dir without task.toml stands for the task dirs directly in it. Sorted
/// by name within a dir; names must be unique.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<Task>> {
    let mut tasks: Vec<Task> = Vec::new();
    if paths.is_empty() {
        return Err(bad(
            "sifbox eval",
            "no task given",
            "pass task directories, or a directory of them (e.g. examples/tasks)",
        ));
    }
    for p in paths {
        let shown = p.display().to_string();
        if !p.is_dir() {
            return Err(bad(
                format!("task {shown}"),
                "no such directory",
                "pass a task directory, or a directory of them",
            ));
        }
        if p.join(TASK_TOML).exists() {
            tasks.push(load(p)?);
            continue;
        }
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| EvalError::io(format!("listing {shown}"), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|d| d.is_dir() && d.join(TASK_TOML).exists())
            .collect();
        if subdirs.is_empty() {
            return Err(bad(
                format!("task {shown}"),
                format!("no {TASK_TOML} in it or in its subdirectories"),
                "pass a task directory (with task.toml), or a directory of them",
            ));
        }
        subdirs.sort();
        for d in subdirs {
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
    fn bad_values_are_refused_with_where_and_what() {
        let cases = [
            ("[environment]\nnetwork_mode = \"allowlist\"", "allowlist"),
            ("[agent]\nnetwork_mode = \"allowlist\"", "allowlist"),
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
        // One task by its own dir; the same task twice is refused.
        assert_eq!(discover(std::slice::from_ref(&a)).expect("one").len(), 1);
        let e = discover(&[a.clone(), a.clone()]).expect_err("twice");
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
            section in proptest::sample::select(vec!["environment", "agent", "verifier", "solution", "environment.healthcheck", "metadata"]),
            key in proptest::sample::select(vec![
                "timeout_sec", "build_timeout_sec", "network_mode", "allow_internet", "env",
                "workdir", "user", "cpus", "memory_mb", "memory", "storage_mb", "docker_image",
                "command", "interval_sec", "retries", "start_period_sec", "gpus", "healthcheck",
                "storage", "gpu_types",
            ]),
            value in proptest::sample::select(vec![
                "1", "-1", "0", "0.0", "1e308", "-0.0", "inf", "nan", "9223372036854775807",
                "\"no-network\"", "\"public\"", "\"allowlist\"", "\"2G\"", "\"/app\"", "\"x\"",
                "true", "false", "[]", "[\"a\"]", "{}", "{ A = \"${B:-c}\" }", "{ A = 1 }",
                "\"${\"", "\"\\u0000\"", "{ command = \"true\" }", "1979-05-27",
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
