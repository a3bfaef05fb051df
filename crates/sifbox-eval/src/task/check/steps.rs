//! The checks of `[[steps]]` (Harbor's multi-step tasks).

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::model::{RawMinReward, RawStep};
use super::super::{bad, Step, DEFAULT_AGENT_TIMEOUT_SEC, DEFAULT_VERIFIER_TIMEOUT_SEC};
use super::values::{check_env, check_user, timeout, valid_step_name};
use crate::error::Result;

/// The task's values a step falls back on.
pub(super) struct TaskDefaults {
    pub agent_timeout: Duration,
    pub agent_user: Option<String>,
    pub verifier_timeout: Duration,
    pub verifier_user: Option<String>,
}

/// The steps, checked, each with its own values, else the task's.
pub(super) fn steps(
    raw: Vec<RawStep>,
    task: &TaskDefaults,
    file: &str,
    unsupported: &mut Vec<String>,
) -> Result<Vec<Step>> {
    let TaskDefaults {
        agent_timeout,
        agent_user,
        verifier_timeout,
        verifier_user,
    } = task;
    let mut steps = Vec::new();
    for (i, st) in raw.into_iter().enumerate() {
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
                None => *agent_timeout,
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
                None => *verifier_timeout,
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
    Ok(steps)
}
