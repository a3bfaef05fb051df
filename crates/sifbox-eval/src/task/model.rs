//! task.toml as written: the raw model serde reads, before any check
//! (see [`super::check`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
