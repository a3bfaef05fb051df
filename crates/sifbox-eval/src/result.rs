//! What a rollout and a job leave behind: `result.json` per rollout,
//! `summary.json` per job, and the summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EvalError, Result};
use crate::task::{NetworkMode, RolloutLimits};

/// Why a rollout did not give a clean reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The environment's image could not be built (or found).
    BuildFailed,
    /// The task asks for what sifbox cannot honour (`os = "windows"`, an
    /// LLM judge, MCP servers, a host allow- or denylist...), or the
    /// agent cannot run it (the oracle, without a solution): nothing ran.
    Unsupported,
    /// The sandbox did not start, or its healthcheck never passed.
    StartFailed,
    /// A setup command of the task (BenchFlow's `setup_commands`) failed
    /// or ran past its time limit; the agent did not run.
    SetupFailed,
    /// The agent ran past its time limit (the verifier still ran).
    AgentTimeout,
    /// The agent exited non-zero or could not start (the verifier still ran).
    AgentFailed,
    /// A phase's command died after processes of the sandbox were killed
    /// for going over its memory limit (after the agent's, the verifier
    /// does not run: as Harbor, an out-of-memory rollout is not graded).
    Oom,
    /// The verifier ran past its time limit.
    VerifierTimeout,
    /// The verifier left no usable reward.
    VerifierFailed,
    /// sifbox itself failed (the host, the store, the sandbox protocol).
    Infra,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::BuildFailed => "build_failed",
            ErrorClass::Unsupported => "unsupported",
            ErrorClass::StartFailed => "start_failed",
            ErrorClass::SetupFailed => "setup_failed",
            ErrorClass::AgentTimeout => "agent_timeout",
            ErrorClass::AgentFailed => "agent_failed",
            ErrorClass::Oom => "oom",
            ErrorClass::VerifierTimeout => "verifier_timeout",
            ErrorClass::VerifierFailed => "verifier_failed",
            ErrorClass::Infra => "infra",
        }
    }
}

/// How a rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Ran through with a reward and no error.
    Ok,
    /// Ran through with a task-level error (build, start, agent,
    /// verifier): a final result.
    Failed,
    /// sifbox failed: `--resume` runs it again.
    InfraError,
    /// Stopped by Ctrl-C: `--resume` runs it again.
    Interrupted,
    /// Under way (the placeholder a running rollout's dir holds).
    Running,
}

impl Status {
    /// Whether `--resume` keeps this result.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Ok | Status::Failed)
    }
}

/// How one phase (agent, verifier) ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// The exit code (128+N for signal N, 124 at the timeout); none when it
    /// could not start.
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub network: Option<NetworkMode>,
    pub user: Option<String>,
    /// CPU time the sandbox's processes used during the phase (null: this
    /// host could not tell).
    #[serde(default)]
    pub cpu_seconds: Option<f64>,
    /// The most memory the sandbox held at once during the phase, its
    /// tmpfs pages included, in bytes (null: not measured).
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    /// Processes killed for going over the memory limit during the phase.
    #[serde(default)]
    pub oom_kills: u64,
}

/// One limit of a rollout as it was enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedLimit {
    /// `memory`, `memory_swap`, `pids`, `cpus` or `storage`.
    pub limit: String,
    pub value: u64,
    /// `bytes`, `processes` or `millicpus` (thousandths of a CPU).
    pub unit: String,
    /// What enforces it: `cgroup_v2`, `cgroup_v1`, `rlimit`, `watchdog`,
    /// `affinity` (the engine's mechanisms) or `tmpfs` (the writable
    /// layer's size).
    pub how: String,
    /// What exactly does it.
    pub detail: String,
}

/// `limits_applied` as written: older sifbox wrote names (`"storage_mb"`).
fn applied_limits<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<AppliedLimit>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        Applied(AppliedLimit),
        Name(String),
    }
    let entries = Vec::<Entry>::deserialize(d)?;
    Ok(entries
        .into_iter()
        .map(|e| match e {
            Entry::Applied(a) => a,
            Entry::Name(limit) => AppliedLimit {
                limit,
                value: 0,
                unit: String::new(),
                how: "unknown".into(),
                detail: "recorded by an older sifbox, which said no more".into(),
            },
        })
        .collect())
}

/// Milliseconds spent in each part of a rollout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// Waiting for the environment's image (a build, or its cache).
    pub build: u64,
    /// Starting the sandbox until it answers, and its healthcheck.
    pub start: u64,
    /// Uploads (instruction, solution, tests) and other set-up.
    pub setup: u64,
    /// The agent's command.
    pub agent: u64,
    /// The verifier's command.
    pub verifier: u64,
    /// Stopping and removing the sandbox.
    pub stop: u64,
    /// The whole rollout.
    pub total: u64,
}

impl Timings {
    /// sifbox's own time in the rollout: everything but the agent's and
    /// the verifier's commands and the wait for the environment's image
    /// (a build is the task's cost, not sifbox's per-rollout overhead).
    pub fn overhead(&self) -> u64 {
        self.total
            .saturating_sub(self.agent + self.verifier + self.build)
    }
}

/// The image a rollout ran in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub reference: String,
    pub digest: Option<String>,
}

/// A separate verifier's sandbox (Harbor's `environment_mode =
/// "separate"`): its own image, started after the agent's sandbox stopped.
/// Its parts are also counted in the rollout's `build`, `start` and
/// `stop` timings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifierSandbox {
    pub sandbox: String,
    pub image: ImageInfo,
    /// Its image's build log, relative to the rollout's dir.
    #[serde(default)]
    pub build_log: Option<String>,
    /// Waiting for its image.
    #[serde(default)]
    pub build_ms: u64,
    /// Starting it until it answers.
    #[serde(default)]
    pub start_ms: u64,
    /// Stopping and removing it.
    #[serde(default)]
    pub stop_ms: u64,
    /// What of the agent's sandbox it was given: `/logs/artifacts`
    /// (read-only), when the agent left that directory.
    #[serde(default)]
    pub handed_over: Vec<String>,
}

/// One step of a multi-step task's rollout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub step: String,
    /// Its headline reward, and all of them (as reward.json had them).
    pub reward: Option<f64>,
    #[serde(default)]
    pub rewards: Option<serde_json::Value>,
    #[serde(default)]
    pub reward_source: Option<String>,
    #[serde(default)]
    pub error_class: Option<ErrorClass>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub agent_run: Option<Phase>,
    #[serde(default)]
    pub verifier_run: Option<Phase>,
}

/// `result.json` of a rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutResult {
    pub task: String,
    pub attempt: u32,
    /// The rollout's dir name (`TASK__ATTEMPT`).
    pub rollout: String,
    pub job: String,
    /// The agent: `oracle`, `nop` or the command.
    pub agent: String,
    pub status: Status,
    pub reward: Option<f64>,
    /// `reward.json` or `reward.txt`.
    #[serde(default)]
    pub reward_source: Option<String>,
    /// reward.json's whole content.
    #[serde(default)]
    pub rewards: Option<serde_json::Value>,
    #[serde(default)]
    pub error_class: Option<ErrorClass>,
    /// What went wrong, in one line (a build's error cites FILE:LINE).
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub image: ImageInfo,
    #[serde(default)]
    pub agent_run: Option<Phase>,
    #[serde(default)]
    pub verifier_run: Option<Phase>,
    #[serde(default)]
    pub timings_ms: Timings,
    /// sifbox's time in the rollout: the whole, less the agent's and the
    /// verifier's commands and the build (see [`Timings::overhead`]).
    #[serde(default)]
    pub overhead_ms: u64,
    #[serde(default)]
    pub started_at: String,
    #[serde(default)]
    pub finished_at: String,
    #[serde(default)]
    pub sandbox: Option<String>,
    /// A multi-step task's steps, in the order they ran (those after a
    /// step that stopped the rollout are not there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepResult>,
    /// The verifier's own sandbox, when it ran separately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_sandbox: Option<VerifierSandbox>,
    /// What the task asked for, after sifbox's defaults and the job's
    /// overrides.
    #[serde(default)]
    pub limits: RolloutLimits,
    /// Exactly what of it was enforced, and how; what was not is in
    /// `notes`.
    #[serde(default, deserialize_with = "applied_limits")]
    pub limits_applied: Vec<AppliedLimit>,
    /// The build's log, relative to the rollout's dir.
    #[serde(default)]
    pub build_log: Option<String>,
    #[serde(default)]
    pub notes: Vec<String>,
    /// The calls the default seccomp policy denied in the rollout's
    /// sandboxes, counted (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seccomp_denied: Vec<sifbox_engine::denials::Denied>,
    /// The sifbox that ran the rollout.
    #[serde(default)]
    pub sifbox_version: String,
}

impl RolloutResult {
    /// A result with nothing recorded yet.
    pub fn new(task: &str, attempt: u32, job: &str, agent: &str) -> RolloutResult {
        RolloutResult {
            task: task.to_string(),
            attempt,
            rollout: rollout_dir_name(task, attempt),
            job: job.to_string(),
            agent: agent.to_string(),
            status: Status::Running,
            reward: None,
            reward_source: None,
            rewards: None,
            error_class: None,
            error: None,
            image: ImageInfo::default(),
            agent_run: None,
            verifier_run: None,
            timings_ms: Timings::default(),
            overhead_ms: 0,
            started_at: now_rfc3339(),
            finished_at: String::new(),
            sandbox: None,
            limits: RolloutLimits::default(),
            limits_applied: Vec::new(),
            build_log: None,
            verifier_sandbox: None,
            steps: Vec::new(),
            notes: Vec::new(),
            seccomp_denied: Vec::new(),
            sifbox_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Records a failure (the first one recorded is kept as the class).
    pub fn fail(&mut self, class: ErrorClass, message: impl Into<String>) {
        let message = one_line(&message.into());
        if self.error_class.is_none() {
            self.error_class = Some(class);
            self.error = Some(message);
        } else {
            self.notes.push(format!("{}: {message}", class.as_str()));
        }
    }

    /// Reads a rollout's result.json (None when absent or unreadable).
    pub fn load(dir: &Path) -> Option<RolloutResult> {
        let data = std::fs::read(dir.join(RESULT_FILE)).ok()?;
        serde_json::from_slice(&data).ok()
    }
}

/// The file name of a rollout's result.
pub const RESULT_FILE: &str = "result.json";
/// The file name of a job's summary.
pub const SUMMARY_FILE: &str = "summary.json";

/// `TASK__ATTEMPT`.
pub fn rollout_dir_name(task: &str, attempt: u32) -> String {
    format!("{task}__{attempt}")
}

/// `s` on one line (newlines become `; `), at most 4000 characters.
pub fn one_line(s: &str) -> String {
    let joined = s
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if joined.chars().count() > 4000 {
        let mut t: String = joined.chars().take(4000).collect();
        t.push_str(" ...");
        t
    } else {
        joined
    }
}

/// Writes `value` as pretty JSON to `path` atomically: a temporary file in
/// the same dir, renamed over `path` (a symlink there is replaced, never
/// followed).
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut data = serde_json::to_vec_pretty(value)
        .map_err(|e| EvalError::io("encoding JSON", std::io::Error::other(e)))?;
    data.push(b'\n');
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(|e| EvalError::io(format!("writing {}", path.display()), e))?;
    tmp.write_all(&data)
        .map_err(|e| EvalError::io(format!("writing {}", path.display()), e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path)
        .map_err(|e| EvalError::io(format!("writing {}", path.display()), e.error))?;
    Ok(())
}

/// Unix milliseconds now.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// UTC `YYYY-MM-DDTHH:MM:SS.mmmZ` for Unix milliseconds.
pub fn rfc3339(unix_ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(unix_ms / 1000);
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        unix_ms % 1000
    )
}

/// UTC `YYYY-MM-DDTHH:MM:SSZ` (ISO 8601) for Unix seconds.
pub fn rfc3339_secs(unix_secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(unix_secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Now as [`rfc3339`].
pub fn now_rfc3339() -> String {
    rfc3339(now_unix_ms())
}

/// UTC `YYYY-MM-DD__HH-MM-SS` now: the default job name.
pub fn timestamp_name() -> String {
    let (y, mo, d, h, mi, s) = civil(now_unix_ms() / 1000);
    format!("{y:04}-{mo:02}-{d:02}__{h:02}-{mi:02}-{s:02}")
}

/// (year, month, day, hour, minute, second) of a Unix time, UTC.
fn civil(secs: u64) -> (u64, u64, u64, u64, u64, u64) {
    let days = secs / 86400;
    let rem = secs % 86400;
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian
    // calendar, in 400-year eras of 146097 days starting in March).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// One task's line of the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSummary {
    pub task: String,
    /// Rollouts planned.
    pub attempts: u32,
    /// Rollouts with a final result (ok or failed).
    pub finished: u32,
    /// Mean reward over the finished rollouts (no reward counts as 0).
    pub mean_reward: Option<f64>,
    /// Rewards of the finished rollouts, by attempt (null: none).
    pub rewards: Vec<Option<f64>>,
    /// When reward.json gave several rewards: the mean of each key over
    /// the finished rollouts (a rollout without it counts as 0), as
    /// Harbor's mean metric makes it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mean_rewards: BTreeMap<String, f64>,
    /// Finished rollouts by error class.
    pub failures: BTreeMap<ErrorClass, u32>,
    pub infra_errors: u32,
    pub interrupted: u32,
}

/// `summary.json` of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub job: String,
    pub agent: String,
    pub started_at: String,
    pub finished_at: String,
    /// Wall time of this run of the job (a resumed job: the last run).
    pub duration_ms: u64,
    /// Rollouts planned, finished (ok or failed), run in this run.
    pub rollouts: u32,
    pub finished: u32,
    pub ran_now: u32,
    pub ok: u32,
    pub failed: u32,
    pub infra_errors: u32,
    pub interrupted: u32,
    /// Mean reward over every finished rollout (no reward counts as 0).
    pub mean_reward: Option<f64>,
    /// How `mean_reward` counts, in words ([`MEAN_REWARD_RULE`]).
    #[serde(default)]
    pub mean_reward_rule: String,
    /// Harbor's mean: over the rollouts whose verifier gave a reward only
    /// (a rollout that failed before it counts nowhere).
    #[serde(default)]
    pub mean_reward_verified: Option<f64>,
    /// pass@k as Harbor 0.26 reports it: for k = 2, 4, 8... and 5, 10,
    /// 15... up to the fewest rewarded rollouts of a task, the mean over
    /// tasks of the unbiased estimator 1 - C(n-c, k)/C(n, k) (n rollouts
    /// with a reward, c of them 1); empty unless every reward is 0 or 1.
    #[serde(default)]
    pub pass_at_k: BTreeMap<u32, f64>,
    /// [`TaskSummary::mean_rewards`] over every finished rollout.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mean_rewards: BTreeMap<String, f64>,
    pub failures: BTreeMap<ErrorClass, u32>,
    /// Rollouts run in this run per second of its wall time.
    pub rollouts_per_second: f64,
    pub tasks: Vec<TaskSummary>,
}

/// What `mean_reward` means, as summary.json says it.
pub const MEAN_REWARD_RULE: &str = "the mean over finished rollouts (ok or failed); a finished rollout without a reward (its agent or verifier failed, timed out or ran out of memory) counts as 0; rollouts with infra errors and interrupted ones are left out (see mean_reward_verified for Harbor's mean over rewarded rollouts only)";

/// Harbor's pass@k over `per_task` (each task's rewards of the rollouts
/// that have one): see [`Summary::pass_at_k`].
fn pass_at_k(per_task: &[Vec<f64>]) -> BTreeMap<u32, f64> {
    let tasks: Vec<&Vec<f64>> = per_task.iter().filter(|r| !r.is_empty()).collect();
    if tasks.is_empty()
        || tasks
            .iter()
            .any(|r| r.iter().any(|v| *v != 0.0 && *v != 1.0))
    {
        return BTreeMap::new();
    }
    let fewest = tasks.iter().map(|r| r.len()).min().unwrap_or(0);
    let fewest = u32::try_from(fewest).unwrap_or(u32::MAX);
    let mut ks: Vec<u32> = std::iter::successors(Some(2u32), |k| k.checked_mul(2))
        .take_while(|k| *k <= fewest)
        .chain((1..).map(|i| i * 5).take_while(|k| *k <= fewest))
        .collect();
    ks.sort_unstable();
    ks.dedup();
    ks.into_iter()
        .map(|k| {
            let sum: f64 = tasks
                .iter()
                .map(|r| {
                    let n = r.len() as f64;
                    let c = r.iter().filter(|v| **v == 1.0).count() as f64;
                    let k = f64::from(k);
                    if n - c < k {
                        return 1.0;
                    }
                    let mut miss = 1.0;
                    let mut i = 0.0;
                    while i < k {
                        miss *= (n - c - i) / (n - i);
                        i += 1.0;
                    }
                    1.0 - miss
                })
                .sum();
            (k, sum / tasks.len() as f64)
        })
        .collect()
}

/// A finished rollout's rewards by key: reward.json's, else `reward`.
fn keyed(r: &RolloutResult) -> BTreeMap<String, f64> {
    match r.rewards.as_ref().and_then(serde_json::Value::as_object) {
        Some(m) => m
            .iter()
            .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
            .collect(),
        None => r
            .reward
            .map(|x| BTreeMap::from([("reward".to_string(), x)]))
            .unwrap_or_default(),
    }
}

/// The mean of each key over `rows` (a row without it counts as 0); empty
/// when the rows have one key or none (the mean reward says it all).
fn key_means(rows: &[BTreeMap<String, f64>]) -> BTreeMap<String, f64> {
    let keys: std::collections::BTreeSet<&String> = rows.iter().flat_map(|m| m.keys()).collect();
    if keys.len() <= 1 {
        return BTreeMap::new();
    }
    keys.into_iter()
        .filter_map(|k| {
            let xs: Vec<f64> = rows
                .iter()
                .map(|m| m.get(k).copied().unwrap_or(0.0))
                .collect();
            mean(&xs).map(|m| (k.clone(), m))
        })
        .collect()
}

fn mean(xs: &[f64]) -> Option<f64> {
    #[allow(
        clippy::cast_precision_loss,
        reason = "counts of rollouts are far below 2^52"
    )]
    let n = xs.len() as f64;
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / n)
}

impl Summary {
    /// Sums up `results` (each planned rollout's result, by task in order;
    /// None: not run).
    pub fn compute(
        job: &str,
        agent: &str,
        tasks: &[(String, Vec<Option<RolloutResult>>)],
        started_ms: u64,
        ran_now: u32,
    ) -> Summary {
        let finished_ms = now_unix_ms();
        let mut s = Summary {
            job: job.to_string(),
            agent: agent.to_string(),
            started_at: rfc3339(started_ms),
            finished_at: rfc3339(finished_ms),
            duration_ms: finished_ms.saturating_sub(started_ms),
            ran_now,
            ..Summary::default()
        };
        let mut all_rewards = Vec::new();
        let mut verified = Vec::new();
        let mut per_task = Vec::new();
        let mut all_keyed = Vec::new();
        for (task, results) in tasks {
            let mut t = TaskSummary {
                task: task.clone(),
                attempts: u32::try_from(results.len()).unwrap_or(u32::MAX),
                ..TaskSummary::default()
            };
            let mut rewards = Vec::new();
            let mut rewarded = Vec::new();
            let mut by_key = Vec::new();
            for r in results.iter().flatten() {
                match r.status {
                    Status::Ok | Status::Failed => {
                        t.finished += 1;
                        by_key.push(keyed(r));
                        t.rewards.push(r.reward);
                        rewards.push(r.reward.unwrap_or(0.0));
                        rewarded.extend(r.reward);
                        if r.status == Status::Ok {
                            s.ok += 1;
                        } else {
                            s.failed += 1;
                        }
                        if let Some(c) = r.error_class {
                            *t.failures.entry(c).or_default() += 1;
                            *s.failures.entry(c).or_default() += 1;
                        }
                    }
                    Status::InfraError => t.infra_errors += 1,
                    Status::Interrupted | Status::Running => t.interrupted += 1,
                }
            }
            t.mean_reward = mean(&rewards);
            t.mean_rewards = key_means(&by_key);
            all_rewards.extend(rewards);
            verified.extend(rewarded.iter().copied());
            per_task.push(rewarded);
            all_keyed.extend(by_key);
            s.rollouts += t.attempts;
            s.finished += t.finished;
            s.infra_errors += t.infra_errors;
            s.interrupted += t.interrupted;
            s.tasks.push(t);
        }
        s.mean_reward = mean(&all_rewards);
        s.mean_reward_rule = MEAN_REWARD_RULE.to_string();
        s.mean_reward_verified = mean(&verified);
        s.pass_at_k = pass_at_k(&per_task);
        s.mean_rewards = key_means(&all_keyed);
        let secs = s.duration_ms as f64 / 1000.0;
        s.rollouts_per_second = if secs > 0.0 {
            f64::from(ran_now) / secs
        } else {
            0.0
        };
        s
    }

    /// The summary as a table for a terminal.
    pub fn table(&self) -> String {
        fn failures(f: &BTreeMap<ErrorClass, u32>, infra: u32, interrupted: u32) -> String {
            let mut parts: Vec<String> = f
                .iter()
                .map(|(c, n)| format!("{} {n}", c.as_str()))
                .collect();
            if infra > 0 {
                parts.push(format!("infra_error {infra}"));
            }
            if interrupted > 0 {
                parts.push(format!("interrupted {interrupted}"));
            }
            if parts.is_empty() {
                "-".into()
            } else {
                parts.join(", ")
            }
        }
        let reward = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"));
        let rows: Vec<[String; 4]> = self
            .tasks
            .iter()
            .map(|t| {
                [
                    t.task.clone(),
                    reward(t.mean_reward),
                    format!("{}/{}", t.finished, t.attempts),
                    failures(&t.failures, t.infra_errors, t.interrupted),
                ]
            })
            .collect();
        let total = [
            "total".to_string(),
            reward(self.mean_reward),
            format!("{}/{}", self.finished, self.rollouts),
            failures(&self.failures, self.infra_errors, self.interrupted),
        ];
        let head = [
            "task".to_string(),
            "mean reward".to_string(),
            "finished".to_string(),
            "failures".to_string(),
        ];
        let mut w = [0usize; 4];
        for r in std::iter::once(&head)
            .chain(&rows)
            .chain(std::iter::once(&total))
        {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, r: &[String; 4]| {
            let _ = writeln!(
                out,
                "{:<w0$}  {:>w1$}  {:>w2$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2]
            );
        };
        line(&mut out, &head);
        for r in &rows {
            line(&mut out, r);
        }
        let _ = writeln!(out, "{}", "-".repeat(w[0] + w[1] + w[2] + w[3] + 6));
        line(&mut out, &total);
        let _ = writeln!(
            out,
            "job {}: {} rollouts finished in {:.1} s ({:.2}/s)",
            self.job,
            self.ran_now,
            self.duration_ms as f64 / 1000.0,
            self.rollouts_per_second
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(
        task: &str,
        attempt: u32,
        status: Status,
        reward: Option<f64>,
        class: Option<ErrorClass>,
    ) -> RolloutResult {
        let mut r = RolloutResult::new(task, attempt, "job", "oracle");
        r.status = status;
        r.reward = reward;
        r.error_class = class;
        r
    }

    #[test]
    fn pass_at_k_is_harbors() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // n = 4, c = 2: pass@2 = 1 - (2/4)(1/3); pass@4 = 1. n = 4, c = 0: 0.
        let p = pass_at_k(&[vec![1.0, 0.0, 0.0, 1.0], vec![0.0; 4]]);
        assert_eq!(p.keys().copied().collect::<Vec<_>>(), vec![2, 4]);
        assert!(close(p[&2], (1.0 - 1.0 / 6.0) / 2.0), "{p:?}");
        assert!(close(p[&4], 0.5), "{p:?}");
        // k runs to the fewest rewarded rollouts of a task: 5 and 10 too.
        let p = pass_at_k(&[vec![1.0; 10], vec![0.0; 12]]);
        assert_eq!(p.keys().copied().collect::<Vec<_>>(), vec![2, 4, 5, 8, 10]);
        assert!(p.values().all(|v| close(*v, 0.5)), "{p:?}");
        // One rollout each: no k; a reward other than 0 or 1: none at all.
        assert!(pass_at_k(&[vec![1.0]]).is_empty());
        assert!(pass_at_k(&[vec![1.0, 0.5]]).is_empty());
        assert!(pass_at_k(&[]).is_empty());
    }

    #[test]
    fn overhead_leaves_out_the_build() {
        let t = Timings {
            build: 12_944,
            start: 10,
            setup: 3,
            agent: 100,
            verifier: 50,
            stop: 4,
            total: 12_944 + 10 + 3 + 100 + 50 + 4,
        };
        assert_eq!(t.overhead(), 17);
    }

    #[test]
    fn summary_counts_and_means() {
        let tasks = vec![
            (
                "a".to_string(),
                vec![
                    Some(result("a", 1, Status::Ok, Some(1.0), None)),
                    Some(result(
                        "a",
                        2,
                        Status::Failed,
                        None,
                        Some(ErrorClass::VerifierTimeout),
                    )),
                    Some(result("a", 3, Status::Interrupted, None, None)),
                ],
            ),
            (
                "b".to_string(),
                vec![Some(result("b", 1, Status::Ok, Some(0.5), None)), None],
            ),
            (
                "c".to_string(),
                vec![Some(result(
                    "c",
                    1,
                    Status::InfraError,
                    None,
                    Some(ErrorClass::Infra),
                ))],
            ),
        ];
        let s = Summary::compute("job", "oracle", &tasks, now_unix_ms(), 4);
        assert_eq!((s.rollouts, s.finished, s.ok, s.failed), (6, 3, 2, 1));
        assert_eq!((s.infra_errors, s.interrupted), (1, 1));
        assert_eq!(s.tasks[0].mean_reward, Some(0.5));
        assert_eq!(s.tasks[0].rewards, vec![Some(1.0), None]);
        assert_eq!(s.tasks[1].mean_reward, Some(0.5));
        assert_eq!(s.tasks[2].mean_reward, None);
        assert_eq!(s.mean_reward, Some(0.5));
        // Harbor's: the rewarded rollouts only (1.0 and 0.5).
        assert_eq!(s.mean_reward_verified, Some(0.75));
        assert!(s.mean_reward_rule.contains("counts as 0"));
        assert!(s.pass_at_k.is_empty(), "0.5 is not a pass/fail reward");
        assert_eq!(s.failures.get(&ErrorClass::VerifierTimeout), Some(&1));
        let table = s.table();
        assert!(
            table.contains("verifier_timeout 1, interrupted 1"),
            "{table}"
        );
        assert!(table.contains("infra_error 1"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("total") && l.contains("3/6")),
            "{table}"
        );
    }

    #[test]
    fn results_round_trip_and_write_atomically() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut r = result("t", 2, Status::Failed, None, None);
        r.fail(ErrorClass::BuildFailed, "Dockerfile:2: RUN false\nexited 1");
        r.fail(ErrorClass::Infra, "later");
        assert_eq!(
            r.error.as_deref(),
            Some("Dockerfile:2: RUN false; exited 1")
        );
        assert_eq!(r.notes, vec!["infra: later"]);
        // A symlink planted at the name is replaced, not followed.
        let victim = d.path().join("victim");
        std::fs::write(&victim, "keep").expect("write");
        std::os::unix::fs::symlink(&victim, d.path().join(RESULT_FILE)).expect("symlink");
        write_json(&d.path().join(RESULT_FILE), &r).expect("write");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep");
        assert_eq!(RolloutResult::load(d.path()), Some(r));
        let text = std::fs::read_to_string(d.path().join(RESULT_FILE)).expect("read");
        assert!(text.contains("\"error_class\": \"build_failed\""), "{text}");
    }

    #[test]
    fn oom_is_its_own_class_in_results_and_summaries() {
        let tasks = vec![(
            "hog".to_string(),
            vec![
                Some(result(
                    "hog",
                    1,
                    Status::Failed,
                    None,
                    Some(ErrorClass::Oom),
                )),
                Some(result("hog", 2, Status::Ok, Some(1.0), None)),
            ],
        )];
        let s = Summary::compute("job", "oracle", &tasks, now_unix_ms(), 2);
        assert_eq!(s.failures.get(&ErrorClass::Oom), Some(&1), "{s:?}");
        assert_eq!(s.tasks[0].failures.get(&ErrorClass::Oom), Some(&1));
        assert!(s.table().contains("oom 1"), "{}", s.table());
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["failures"]["oom"], 1, "{json}");
        assert_eq!(ErrorClass::Oom.as_str(), "oom");
    }

    #[test]
    fn limits_and_usage_are_recorded_and_old_results_still_load() {
        let mut r = result("t", 1, Status::Ok, Some(1.0), None);
        r.limits = crate::task::Limits::default().resolve(&crate::task::Overrides::default());
        r.limits_applied.push(AppliedLimit {
            limit: "memory".into(),
            value: 4096 << 20,
            unit: "bytes".into(),
            how: "watchdog".into(),
            detail: "sampled".into(),
        });
        r.agent_run = Some(Phase {
            cpu_seconds: Some(1.25),
            memory_peak_bytes: Some(1 << 20),
            oom_kills: 2,
            ..Phase::default()
        });
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["limits_applied"][0]["how"], "watchdog");
        assert_eq!(json["limits"]["memory_mb"], 4096);
        assert_eq!(json["agent_run"]["cpu_seconds"], 1.25);
        assert_eq!(json["agent_run"]["memory_peak_bytes"], 1 << 20);
        let back: RolloutResult = serde_json::from_value(json).expect("back");
        assert_eq!(back, r);
        // A result.json of an older sifbox: limits as task.toml had them,
        // limits_applied as names, phases without usage. --resume keeps it.
        let mut old =
            serde_json::to_value(result("t", 1, Status::Ok, Some(1.0), None)).expect("json");
        old["limits"] =
            serde_json::json!({"cpus": 2.0, "memory_mb": null, "storage_mb": null, "gpus": null});
        old["limits_applied"] = serde_json::json!(["storage_mb"]);
        old["agent_run"] = serde_json::json!({"exit_code": 0, "timed_out": false, "duration_ms": 5, "network": "public", "user": null});
        let loaded: RolloutResult = serde_json::from_value(old).expect("an old result loads");
        assert_eq!(loaded.limits.cpus, Some(2.0));
        assert_eq!(loaded.limits_applied.len(), 1);
        assert_eq!(loaded.limits_applied[0].limit, "storage_mb");
        assert_eq!(loaded.agent_run.expect("agent").cpu_seconds, None);
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_767_225_599_000), "2025-12-31T23:59:59.000Z");
        assert_eq!(timestamp_name().len(), "2025-01-01__00-00-00".len());
    }
}
