//! The phases of a rollout in its running sandbox: set-up, the
//! healthcheck, the setup commands, the agent, the verifier and the
//! reward (or, for a multi-step task, each step's agent, verifier and
//! reward), each command measured and judged (time limit, killed for
//! memory).

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sifbox_engine::evidence::LogsDir;
use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::spec::NetMode;
use sifbox_engine::{ExecStatus, Sandbox};

use crate::result::{one_line, ErrorClass, Phase, RolloutResult, StepResult};
use crate::reward::{self, Reward};
use crate::rollout_dir;
use crate::task::{NetworkMode, RewardStrategy, Task};

use super::environment::Image;
use super::error::{HostAction, RolloutError};
use super::setup::{host_lock, last_lines, pause_unless_cancelled, short, SetupError, SETUP_LOG};
use super::usage::{killed_for_memory, note_oom_survived, oom_message, PhaseUsage, KILLED};
use super::{interrupted, ms, set_env, Agent, Ctx, TaskEnv};

/// Everything a rollout needs once its sandbox runs.
pub(super) struct Running<'a> {
    pub(super) sandbox: &'a Sandbox,
    pub(super) base_env: Vec<(String, String)>,
    pub(super) cwd: String,
    pub(super) env_scripts: bool,
    pub(super) sandbox_net: NetMode,
    pub(super) null: File,
    /// The sandbox has the guarded `/logs/verifier` (the agent's sandbox):
    /// the verifier's commands run where it is writable, and only they.
    pub(super) guarded: bool,
}

impl Running<'_> {
    /// Runs `argv` with its output (stdout and stderr) in `out`; with
    /// `guarded`, where the guarded `/logs/verifier` is writable.
    #[allow(clippy::too_many_arguments, reason = "one call site per phase")]
    fn exec(
        &self,
        cwd: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        user: Option<String>,
        timeout: Duration,
        (net, guarded): (NetMode, bool),
        out: &File,
    ) -> sifbox_engine::Result<(ExecStatus, Duration)> {
        let req = ExecRequest::command(argv)
            .env_scripts(self.env_scripts)
            .base_env(env)
            .cwd(Some(cwd.to_string()))
            .user(user)
            .timeout(Some(timeout))
            .isolate_net(self.sandbox_net == NetMode::Host && net == NetMode::None)
            .guarded(guarded)
            .build();
        let started = Instant::now();
        let st = self
            .sandbox
            .exec(req, [self.null.as_fd(), out.as_fd(), out.as_fd()])?;
        Ok((st, started.elapsed()))
    }

    /// [`Running::exec`], with what the sandbox used meanwhile: its CPU
    /// time, its memory peak (started afresh) and the processes killed for
    /// memory.
    #[allow(clippy::too_many_arguments, reason = "as exec")]
    fn measured_exec(
        &self,
        cwd: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        user: Option<String>,
        timeout: Duration,
        net: (NetMode, bool),
        out: &File,
    ) -> sifbox_engine::Result<(ExecStatus, Duration, PhaseUsage)> {
        self.sandbox.reset_memory_peak();
        let before = self.sandbox.usage();
        let (st, took) = self.exec(cwd, argv, env, user, timeout, net, out)?;
        let mut used = PhaseUsage::between(&before, &self.sandbox.usage());
        // A command killed by SIGKILL may have been the limit's victim
        // before the kill was counted: wait a moment for the count.
        if matches!(
            st,
            ExecStatus::Exited {
                code: KILLED,
                timed_out: false
            }
        ) && used.oom_kills == 0
            && self.sandbox.limits().how("memory").is_some()
        {
            let deadline = Instant::now() + Duration::from_millis(200);
            while used.oom_kills == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
                used = PhaseUsage::between(&before, &self.sandbox.usage());
            }
        }
        Ok((st, took, used))
    }
}

fn with_env(base: &[(String, String)], extra: &[&[(String, String)]]) -> Vec<(String, String)> {
    let mut env = base.to_vec();
    for list in extra {
        for (k, v) in *list {
            set_env(&mut env, k, v);
        }
    }
    env
}

fn as_mode(n: NetMode) -> NetworkMode {
    match n {
        NetMode::None => NetworkMode::NoNetwork,
        NetMode::Host => NetworkMode::Public,
    }
}

/// The phases of a rollout in `run`'s sandbox, up to the verifier, which
/// runs here too unless the task's verifier is separate: true then, when
/// it is to run (in its own sandbox, after this one stops).
#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
#[allow(clippy::too_many_lines, reason = "the phases of a rollout, in order")]
pub(super) fn phases(
    ctx: &Ctx<'_>,
    task: &Task,
    env: &TaskEnv,
    logs: &mut LogsDir,
    image: &Image,
    run: &Running<'_>,
    r: &mut RolloutResult,
    env_net: NetMode,
    agent_net: NetMode,
    verifier_net: NetMode,
) -> bool {
    let c = &task.config;
    let sb = run.sandbox;
    let image_user = c
        .default_user
        .clone()
        .or_else(|| image.meta.user.clone().filter(|u| !u.is_empty()));
    let agent_user = c.agent_user.clone().or_else(|| image_user.clone());
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        infra_failure(ctx, r, what, e)
    };
    // The agent's log, made while agent/ is still the caller's (after the
    // chown below, an unprivileged caller could not create files there).
    let agent_log = match &ctx.opts.agent {
        Agent::Nop => None,
        Agent::Oracle => Some("oracle.txt"),
        Agent::Command(_) => Some("command.txt"),
    };
    let agent_out = match agent_log
        .map(|name| rollout_dir::create_file(logs.agent.as_fd(), name).map_err(|e| (name, e)))
        .transpose()
    {
        Ok(f) => f,
        Err((name, e)) => return infra(r, &format!("creating agent/{name}"), &e),
    };
    // The setup commands' output, beside result.json: out of the sandbox's
    // reach.
    let setup_out = if c.setup_commands.is_empty() {
        None
    } else {
        match rollout_dir::create_file(logs.dir.as_fd(), SETUP_LOG) {
            Ok(f) => Some(f),
            Err(e) => return infra(r, &format!("creating {SETUP_LOG}"), &e),
        }
    };
    // The agent's logs subdirs go to its user before anything runs in the
    // sandbox (the sandbox's root does it: an unprivileged caller cannot
    // chown to the sandbox's other ids on the host). verifier/ stays
    // root's until it is re-made for the verifier.
    let t = Instant::now();
    for sub in ["agent", "artifacts"] {
        if let Some(u) = &agent_user {
            if let Err(e) = sb.chown(&format!("/logs/{sub}"), u) {
                return infra(r, &format!("giving /logs/{sub} to the user {u}"), &e);
            }
        }
    }
    r.timings_ms.setup += ms(t.elapsed());

    // Set-up: the task's workdir, the healthcheck, the instruction.
    let t = Instant::now();
    if !set_up(ctx, run, image, c, &image_user, env_net, r) {
        return false;
    }
    r.timings_ms.setup += ms(t.elapsed());
    if let Some(h) = &c.healthcheck {
        let t = Instant::now();
        let healthy = healthcheck(ctx, run, h, env_net);
        r.timings_ms.start += ms(t.elapsed());
        match healthy {
            Ok(()) => {}
            Err(e) => {
                if !interrupted(ctx, r) {
                    r.fail(ErrorClass::StartFailed, e);
                }
                return false;
            }
        }
    }
    if interrupted(ctx, r) {
        return false;
    }
    if let Some(out) = &setup_out {
        if !run_setup_commands(ctx, task, env, logs, run, &image_user, env_net, out, r) {
            return false;
        }
    }
    if interrupted(ctx, r) {
        return false;
    }
    if !c.steps.is_empty() {
        run_steps(
            ctx,
            task,
            env,
            logs,
            image,
            run,
            r,
            agent_net,
            verifier_net,
            (agent_log, agent_out),
        );
        return false;
    }
    let plan = AgentPlan {
        instruction: &task.instruction,
        solution: task.solution.as_deref(),
        root: &task.dir,
        user: agent_user,
        timeout: c.agent_timeout,
        fresh: false,
    };
    if !agent(ctx, env, run, r, &plan, agent_net, agent_out) {
        return false;
    }

    // The verifier: here, or (separate) in a sandbox of its own once this
    // one has stopped.
    if interrupted(ctx, r) {
        return false;
    }
    // verifier/ is as the rollout began, empty: the agent and all it left
    // running see it read-only (a guarded bind), so it is not re-made
    // here (a rename would take it from under its binds). A separate
    // verifier has it made afresh once this sandbox stops.
    if task.separate_verifier.is_some() {
        return true;
    }
    verify(
        ctx,
        task,
        logs,
        image,
        run,
        r,
        verifier_net,
        &task_verifier(task, env),
    );
    false
}

/// What a rollout that sifbox failed to run records (unless the job was
/// cancelled, which is why it failed then); false, to end the phases.
fn infra_failure(
    ctx: &Ctx<'_>,
    r: &mut RolloutResult,
    what: &str,
    e: &dyn std::fmt::Display,
) -> bool {
    if !interrupted(ctx, r) {
        r.fail(ErrorClass::Infra, format!("{what}: {e}"));
    }
    false
}

/// Set-up: the task's workdir made, and a compose service's own command
/// started; false when the rollout ends here (recorded in `r`).
fn set_up(
    ctx: &Ctx<'_>,
    run: &Running<'_>,
    image: &Image,
    c: &crate::task::TaskConfig,
    image_user: &Option<String>,
    env_net: NetMode,
    r: &mut RolloutResult,
) -> bool {
    let sb = run.sandbox;
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        infra_failure(ctx, r, what, e)
    };
    if let Some(w) = &c.workdir {
        if image.meta.workdir.as_deref() != Some(w.as_str()) {
            match run.exec(
                "/",
                vec!["mkdir".into(), "-p".into(), w.clone()],
                run.base_env.clone(),
                None,
                Duration::from_secs(30),
                (env_net, false),
                &run.null,
            ) {
                Ok((ExecStatus::Exited { code: 0, .. }, _)) => {}
                Ok((st, _)) => {
                    r.fail(
                        ErrorClass::StartFailed,
                        format!(
                            "creating the workdir {w}: mkdir -p exited with code {}",
                            st.code()
                        ),
                    );
                    return false;
                }
                Err(e) => return infra(r, "creating the workdir", &e),
            }
        }
    }
    // A compose service's own command, as its container's main process:
    // started detached, it runs until the sandbox stops.
    let service = c
        .service
        .as_ref()
        .and_then(|s| s.argv(image.meta.entrypoint.as_deref()));
    if let Some(argv) = service {
        let req = ExecRequest::command(argv.clone())
            .env_scripts(run.env_scripts)
            .base_env(run.base_env.clone())
            .cwd(Some(run.cwd.clone()))
            .user(image_user.clone())
            .isolate_net(run.sandbox_net == NetMode::Host && env_net == NetMode::None)
            .build();
        if let Err(e) = sb.exec_detached(req) {
            return infra(r, "starting the compose service's command", &e);
        }
        r.notes.push(format!(
            "the compose service's command runs detached in the sandbox: {}",
            argv.join(" ")
        ));
    }
    true
}

/// Runs the setup commands, with their output in `out` ([`SETUP_LOG`]);
/// false when the rollout ends here (recorded in `r`).
#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
fn run_setup_commands(
    ctx: &Ctx<'_>,
    task: &Task,
    env: &TaskEnv,
    logs: &LogsDir,
    run: &Running<'_>,
    image_user: &Option<String>,
    env_net: NetMode,
    out: &File,
    r: &mut RolloutResult,
) -> bool {
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        infra_failure(ctx, r, what, e)
    };
    let t = Instant::now();
    let done = setup_commands(ctx, task, env, run, image_user, env_net, out);
    r.timings_ms.setup += ms(t.elapsed());
    match done {
        Ok(()) => {}
        Err(SetupError::Infra(e)) => return infra(r, "running a setup command", &e),
        Err(SetupError::Failed(e)) => {
            if !interrupted(ctx, r) {
                let tail = rollout_dir::read_small(logs.dir.as_fd(), SETUP_LOG, 1 << 16)
                    .map(|d| last_lines(&String::from_utf8_lossy(&d), 5))
                    .filter(|t| !t.is_empty())
                    .map(|t| format!("; its output ends: {t}"))
                    .unwrap_or_default();
                r.fail(
                    ErrorClass::SetupFailed,
                    format!("{e} (see {SETUP_LOG}){tail}"),
                );
            }
            return false;
        }
    }
    true
}

/// What the agent of a rollout (or of one step) runs with.
struct AgentPlan<'p> {
    /// Uploaded to /instruction.md.
    instruction: &'p crate::task::Instruction,
    /// The oracle's: uploaded to /solution, runs solve.sh.
    solution: Option<&'p Path>,
    /// The task's dir: its files are read beneath it.
    root: &'p Path,
    user: Option<String>,
    timeout: Duration,
    /// What an earlier step left at /solution goes first.
    fresh: bool,
}

/// The instruction, then the agent's command; false when the verifier is
/// not to run (`r` says why).
fn agent(
    ctx: &Ctx<'_>,
    env: &TaskEnv,
    run: &Running<'_>,
    r: &mut RolloutResult,
    plan: &AgentPlan<'_>,
    agent_net: NetMode,
    agent_out: Option<File>,
) -> bool {
    let sb = run.sandbox;
    let agent_user = &plan.user;
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        if !interrupted(ctx, r) {
            r.fail(ErrorClass::Infra, format!("{what}: {e}"));
        }
        false
    };
    let t = Instant::now();
    if let Err(e) = upload_instruction(sb, plan.instruction, agent_user.as_deref()) {
        return infra(r, "uploading instruction.md", &e);
    }

    // The agent.
    let agent = match &ctx.opts.agent {
        Agent::Nop => None,
        Agent::Oracle => {
            // The rollout checked there is one before it started.
            let Some(solution) = plan.solution else {
                r.fail(ErrorClass::Unsupported, "the task has no solution");
                return false;
            };
            let script = solution.join("solve.sh");
            if plan.fresh {
                if let Err(e) = sb.remove("/solution") {
                    return infra(r, "removing the last step's /solution", &e);
                }
            }
            if let Err(e) = upload_with_script(
                sb,
                plan.root,
                solution,
                "/solution",
                "solve.sh",
                agent_user.as_deref(),
            ) {
                return infra(r, "uploading the solution", &e);
            }
            Some((
                crate::task::script_argv(plan.root, &script, "/solution/solve.sh"),
                with_env(&run.base_env, &[&env.solution]),
            ))
        }
        Agent::Command(cmd) => {
            let instruction = match plan.instruction.text() {
                Ok(s) => s,
                Err(e) => return infra(r, "reading instruction.md", &e),
            };
            let mut env = run.base_env.clone();
            set_env(&mut env, "SIFBOX_INSTRUCTION", &instruction);
            Some((
                vec!["/bin/sh".to_string(), "-c".to_string(), cmd.clone()],
                env,
            ))
        }
    };
    r.timings_ms.setup += ms(t.elapsed());
    if let (Some((argv, agent_env)), Some(out)) = (agent, agent_out) {
        if interrupted(ctx, r) {
            return false;
        }
        let ran = run.measured_exec(
            &run.cwd,
            argv,
            agent_env,
            agent_user.clone(),
            plan.timeout,
            (agent_net, false),
            &out,
        );
        match ran {
            Ok((st, took, used)) => {
                r.timings_ms.agent = ms(took);
                r.agent_run = Some(phase(&st, took, agent_net, agent_user, &used));
                if killed_for_memory(&st, &used) {
                    if !interrupted(ctx, r) {
                        r.fail(
                            ErrorClass::Oom,
                            oom_message("agent", &st, &used, &r.limits, sb.limits()),
                        );
                    }
                    // As Harbor (MemoryLimitExceededError: not graded),
                    // the verifier does not run: what the agent left is
                    // the work of a process tree cut short.
                    return false;
                }
                note_oom_survived(r, "agent", &used);
                match st {
                    ExecStatus::Exited {
                        timed_out: true, ..
                    } => r.fail(
                        ErrorClass::AgentTimeout,
                        format!(
                            "the agent ran past its time limit ({} s) and was killed",
                            plan.timeout.as_secs_f64()
                        ),
                    ),
                    ExecStatus::Exited { code: 0, .. } => {}
                    ExecStatus::Exited { code, .. } => r.fail(
                        ErrorClass::AgentFailed,
                        format!("the agent exited with code {code}"),
                    ),
                    ExecStatus::Failed { code, message } => r.fail(
                        ErrorClass::AgentFailed,
                        format!("the agent could not start ({code}): {message}"),
                    ),
                }
            }
            Err(e) => return infra(r, "running the agent", &e),
        }
    }

    true
}

/// What a verifier runs with.
pub(super) struct VerifierPlan {
    /// Uploaded to /tests, merged in order (unless the image holds them).
    tests: Vec<PathBuf>,
    /// The test.sh that runs, at /tests/test.sh.
    script: PathBuf,
    /// The task's dir: its files are read beneath it.
    root: PathBuf,
    user: Option<String>,
    timeout: Duration,
    env: Vec<(String, String)>,
    /// What an earlier step left at /tests goes first.
    fresh: bool,
}

/// The verifier of a single-step task.
pub(super) fn task_verifier(task: &Task, env: &TaskEnv) -> VerifierPlan {
    VerifierPlan {
        tests: vec![task.tests.clone()],
        script: task.tests.join("test.sh"),
        root: task.dir.clone(),
        user: task.config.verifier_user.clone(),
        timeout: task.config.verifier_timeout,
        env: env.verifier.clone(),
        fresh: false,
    }
}

/// A multi-step task's steps, as Harbor's `MultiStepTrial` runs them: in
/// order in this one sandbox, each its instruction, its agent, then its
/// verifier; each step's `agent/`, `verifier/` and `artifacts/` then move
/// to `JOB/.steps/ROLLOUT/STEP/` (out of the sandbox's sight; the rollout
/// moves them to `steps/` once the sandbox stopped) and are made afresh,
/// as /tests and /solution are. A step that failed without a reward, or
/// whose rewards are below its `min_reward`, ends the rollout; its reward
/// comes from the steps' by the task's strategy.
#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
#[allow(clippy::too_many_lines, reason = "the steps, in order")]
fn run_steps(
    ctx: &Ctx<'_>,
    task: &Task,
    env: &TaskEnv,
    logs: &mut LogsDir,
    image: &Image,
    run: &Running<'_>,
    r: &mut RolloutResult,
    agent_net: NetMode,
    verifier_net: NetMode,
    (agent_log, mut first_out): (Option<&str>, Option<File>),
) {
    let c = &task.config;
    let sb = run.sandbox;
    let image_user = image.meta.user.clone().filter(|u| !u.is_empty());
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        if !interrupted(ctx, r) {
            r.fail(ErrorClass::Infra, format!("{what}: {e}"));
        }
    };
    let archive = match steps_archive(ctx, &r.rollout) {
        Ok(fd) => fd,
        Err(e) => return infra(r, "making the steps' archive", &e),
    };
    let mut got = Vec::new();
    for (i, (step, files)) in c.steps.iter().zip(&task.steps).enumerate() {
        if interrupted(ctx, r) {
            return;
        }
        let mut sr = RolloutResult::new(&task.name, r.attempt, &r.job, &r.agent);
        sr.limits = r.limits.clone();
        let agent_user = step.agent_user.clone().or_else(|| image_user.clone());
        // The agent's log, made while agent/ is the caller's (the first
        // step's before the rollout's set-up gave agent/ away), then the
        // fresh dirs to the step's agent user.
        let out = if i == 0 {
            first_out.take()
        } else {
            match agent_log
                .map(|name| rollout_dir::create_file(logs.agent.as_fd(), name))
                .transpose()
            {
                Ok(f) => f,
                Err(e) => return infra(r, "creating the agent's log", &e),
            }
        };
        for sub in ["agent", "artifacts"] {
            if let Some(u) = &agent_user {
                if let Err(e) = sb.chown(&format!("/logs/{sub}"), u) {
                    return infra(r, &format!("giving /logs/{sub} to the user {u}"), &e);
                }
            }
        }
        let plan = AgentPlan {
            instruction: &files.instruction,
            solution: files.solution.as_deref(),
            root: &task.dir,
            user: agent_user,
            timeout: step.agent_timeout,
            fresh: i > 0,
        };
        let graded = agent(ctx, env, run, &mut sr, &plan, agent_net, out) && !interrupted(ctx, r);
        if graded {
            // verifier/ is empty: the last step's outputs were moved out.
            let vplan = VerifierPlan {
                tests: files.tests.clone(),
                script: files.test_script.clone(),
                root: task.dir.clone(),
                user: step.verifier_user.clone(),
                timeout: step.verifier_timeout,
                env: with_env(&env.verifier, &[&env.steps_verifier[i]]),
                fresh: true,
            };
            verify(ctx, task, logs, image, run, &mut sr, verifier_net, &vplan);
            if let Some(n) = sr.ended_agent_processes {
                r.ended_agent_processes = Some(r.ended_agent_processes.unwrap_or(0) + n);
            }
        }
        let rewards = crate::steps::rewards_of(sr.reward, sr.rewards.as_ref());
        // The step's record, and its part of the rollout's.
        r.timings_ms.setup += sr.timings_ms.setup;
        r.timings_ms.agent += sr.timings_ms.agent;
        r.timings_ms.verifier += sr.timings_ms.verifier;
        for n in &sr.notes {
            r.notes.push(format!("step {}: {n}", step.name));
        }
        if let (Some(class), Some(e)) = (sr.error_class, &sr.error) {
            r.fail(class, format!("step {}: {e}", step.name));
        }
        r.steps.push(StepResult {
            step: step.name.clone(),
            reward: sr.reward,
            rewards: sr.rewards.clone(),
            reward_source: sr.reward_source.clone(),
            error_class: sr.error_class,
            error: sr.error.clone(),
            agent_run: sr.agent_run.clone(),
            verifier_run: sr.verifier_run.clone(),
        });
        got.push(rewards.clone());
        if sr.status == crate::result::Status::Interrupted || interrupted(ctx, r) {
            return;
        }
        // Its outputs, out of the next steps' sight.
        if let Err(e) = archive_step(sb, logs, archive.as_fd(), &step.name) {
            return infra(r, &format!("keeping step {}'s outputs", step.name), &e);
        }
        let last = i + 1 == c.steps.len();
        if sr.error_class.is_some() && rewards.is_none() {
            if !last {
                r.notes.push(format!(
                    "step {} failed without a reward: the remaining steps were not run",
                    step.name
                ));
            }
            break;
        }
        if let Some(why) = step
            .min_reward
            .as_ref()
            .and_then(|m| crate::steps::below_min(rewards.as_ref(), m))
        {
            if !last {
                r.notes.push(format!(
                    "step {}: {why}: the remaining steps were not run",
                    step.name
                ));
            }
            break;
        }
    }
    // The rollout's reward, by the task's strategy.
    let strategy = match c.reward_strategy {
        RewardStrategy::Mean => "mean",
        RewardStrategy::Final => "final",
    };
    match crate::steps::combine(c.reward_strategy, &got) {
        Some(all) => {
            r.reward = crate::steps::headline(&all);
            r.rewards = serde_json::to_value(&all).ok();
            r.reward_source = Some(format!("steps ({strategy})"));
        }
        None => {
            if r.error_class.is_none() {
                r.fail(ErrorClass::VerifierFailed, "no step left a reward");
            }
        }
    }
}

/// `JOB/.steps/ROLLOUT/`, fresh and opened: where a multi-step rollout's
/// steps' outputs wait, out of its sandbox's sight, until it stops.
fn steps_archive(ctx: &Ctx<'_>, rollout: &str) -> std::result::Result<OwnedFd, RolloutError> {
    let at = |p: &Path| RolloutError::host(HostAction::Using, p);
    let root = ctx.dir.join(STEPS_ARCHIVE);
    std::fs::create_dir_all(&root).map_err(at(&root))?;
    let dir = root.join(rollout);
    super::fresh_dir(&ctx.dir, &dir).map_err(at(&dir))?;
    let fd = rollout_dir::open_dir_nofollow(&root).map_err(at(&root))?;
    rollout_dir::make_subdir(fd.as_fd(), rollout).map_err(at(&dir))
}

/// The dir of the job that holds [`steps_archive`]s.
pub(super) const STEPS_ARCHIVE: &str = ".steps";

/// Moves a step's `agent/`, `verifier/` and `artifacts/` into `archive`'s
/// `STEP/`, and makes them afresh in the rollout dir.
fn archive_step(
    sb: &Sandbox,
    logs: &mut LogsDir,
    archive: BorrowedFd<'_>,
    step: &str,
) -> std::result::Result<(), String> {
    // Moving a dir to another parent needs write access to it: each goes
    // back to the sandbox's root (the caller) first, unfollowed.
    for sub in ["agent", "artifacts"] {
        sb.chown(&format!("/logs/{sub}"), "0")
            .map_err(|e| format!("giving /logs/{sub} back to root: {e}"))?;
    }
    // verifier/ stays where its binds show it (only the verifier could
    // write it): what is in it moves, all of it given back to the
    // caller first (a dir moved to another parent needs write access to
    // itself), in the guarded namespace where it is writable.
    sb.give_back_guarded("/logs/verifier")
        .map_err(|e| format!("giving /logs/verifier back to root: {e}"))?;
    let to = rollout_dir::make_subdir(archive, step).map_err(|e| format!("{step}/: {e}"))?;
    logs.agent = rollout_dir::move_out_and_remake(logs.dir.as_fd(), "agent", to.as_fd())?;
    rollout_dir::move_entries(logs.verifier.as_fd(), "verifier", to.as_fd())?;
    logs.artifacts = rollout_dir::move_out_and_remake(logs.dir.as_fd(), "artifacts", to.as_fd())?;
    Ok(())
}

/// Makes `verifier/` of the rollout dir afresh (see
/// [`rollout_dir::remake_verifier`]); false when it failed (`r` says why).
pub(super) fn remake_verifier(
    ctx: &Ctx<'_>,
    logs: &mut LogsDir,
    r: &mut RolloutResult,
    remove_inside: &dyn Fn(&str) -> std::result::Result<(), String>,
) -> bool {
    match rollout_dir::remake_verifier(logs.dir.as_fd(), remove_inside) {
        Ok(remade) => {
            logs.verifier = remade.dir;
            for n in remade.notes {
                if !r.notes.contains(&n) {
                    r.notes.push(n);
                }
            }
            true
        }
        Err(e) => {
            if !interrupted(ctx, r) {
                r.fail(ErrorClass::VerifierFailed, e);
            }
            false
        }
    }
}

/// The verifier in `run`'s sandbox, whose image is `image` (the agent's,
/// or a separate verifier's), with `verifier/` of the rollout dir fresh
/// at /logs/verifier; then the reward it wrote.
#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
#[allow(clippy::too_many_lines, reason = "the verifier's steps, in order")]
pub(super) fn verify(
    ctx: &Ctx<'_>,
    task: &Task,
    logs: &mut LogsDir,
    image: &Image,
    run: &Running<'_>,
    r: &mut RolloutResult,
    verifier_net: NetMode,
    plan: &VerifierPlan,
) {
    let sb = run.sandbox;
    // The compose service's user (in the task's own sandbox), else the
    // image's.
    let image_user = task
        .config
        .default_user
        .clone()
        .filter(|_| task.separate_verifier.is_none())
        .or_else(|| image.meta.user.clone().filter(|u| !u.is_empty()));
    let verifier_user = plan.user.clone().or_else(|| image_user.clone());
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        if !interrupted(ctx, r) {
            r.fail(ErrorClass::Infra, format!("{what}: {e}"));
        }
    };
    let t = Instant::now();
    // What the agent left running ends first, when the caller asks (in the
    // agent's own sandbox; a separate verifier's has none of it).
    if run.guarded && ctx.opts.end_agent_processes {
        match sb.end_processes() {
            Ok(n) => r.ended_agent_processes = Some(n),
            Err(e) => return infra(r, "ending the agent's processes", &e),
        }
    }
    // The verifier's log, made while the dir is the caller's.
    let out = match rollout_dir::create_file(logs.verifier.as_fd(), "test-stdout.txt") {
        Ok(f) => f,
        Err(e) => return infra(r, "creating verifier/test-stdout.txt", &e),
    };
    if let Some(u) = &verifier_user {
        let given = if run.guarded {
            sb.chown_guarded("/logs/verifier", u)
        } else {
            sb.chown("/logs/verifier", u)
        };
        if let Err(e) = given {
            return infra(r, &format!("giving /logs/verifier to the user {u}"), &e);
        }
    }
    // A separate verifier's own image holds its tests at /tests (Harbor's
    // bundled tests): nothing is uploaded; as Harbor, the script is made
    // executable by root (where it can be) and executed.
    let bundled = task
        .separate_verifier
        .as_ref()
        .is_some_and(|v| v.bundled_tests);
    let argv = if bundled {
        let chmod = vec!["chmod".into(), "+x".into(), "/tests/test.sh".into()];
        let made = run.exec(
            "/",
            chmod,
            run.base_env.clone(),
            Some("0".into()),
            Duration::from_secs(30),
            (verifier_net, false),
            &run.null,
        );
        if let Err(e) = made {
            return infra(r, "making /tests/test.sh executable", &e);
        }
        vec!["/tests/test.sh".to_string()]
    } else {
        if plan.fresh {
            if let Err(e) = sb.remove("/tests") {
                return infra(r, "removing the last step's /tests", &e);
            }
        }
        if let Err(e) = upload_tests(
            sb,
            &plan.root,
            &plan.tests,
            &plan.script,
            verifier_user.as_deref(),
        ) {
            return infra(r, "uploading the tests", &e);
        }
        crate::task::script_argv(&plan.root, &plan.script, "/tests/test.sh")
    };
    r.timings_ms.setup += ms(t.elapsed());
    let ran = run.measured_exec(
        &run.cwd,
        argv,
        with_env(&run.base_env, &[&plan.env]),
        verifier_user.clone(),
        plan.timeout,
        (verifier_net, run.guarded),
        &out,
    );
    let (st, took, used) = match ran {
        Ok(x) => x,
        Err(e) => return infra(r, "running the verifier", &e),
    };
    r.timings_ms.verifier = ms(took);
    r.verifier_run = Some(phase(&st, took, verifier_net, &verifier_user, &used));
    if killed_for_memory(&st, &used) {
        // Whatever reward it left is the work of a test cut short.
        if !interrupted(ctx, r) {
            r.fail(
                ErrorClass::Oom,
                oom_message("verifier", &st, &used, &r.limits, sb.limits()),
            );
        }
        return;
    }
    note_oom_survived(r, "verifier", &used);
    match &st {
        ExecStatus::Exited {
            timed_out: true, ..
        } => {
            r.fail(
                ErrorClass::VerifierTimeout,
                format!(
                    "the verifier ran past its time limit ({} s) and was killed",
                    plan.timeout.as_secs_f64()
                ),
            );
            return;
        }
        ExecStatus::Failed { code, message } => {
            r.fail(
                ErrorClass::VerifierFailed,
                format!("test.sh could not start ({code}): {message}"),
            );
            return;
        }
        ExecStatus::Exited { .. } => {}
    }
    // From the dir opened before the sandbox started, whatever is at
    // verifier/ by now.
    match reward::read(logs.verifier.as_fd(), &ctx.ids) {
        Reward::Found { value, source, all } => {
            if value.is_none() {
                r.notes.push(
                    "reward.json has several rewards and no \"reward\" key: no headline reward (each is in rewards, and the summary's mean_rewards)".to_string(),
                );
            }
            r.reward = value;
            r.reward_source = Some(source.to_string());
            r.rewards = all;
        }
        Reward::Missing => r.fail(
            ErrorClass::VerifierFailed,
            format!(
                "no reward: test.sh exited with code {} and wrote neither /logs/verifier/reward.json nor reward.txt (see verifier/test-stdout.txt)",
                st.code()
            ),
        ),
        Reward::Invalid(why) => r.fail(ErrorClass::VerifierFailed, why),
    }
}

fn phase(
    st: &ExecStatus,
    took: Duration,
    net: NetMode,
    user: &Option<String>,
    used: &PhaseUsage,
) -> Phase {
    #[allow(clippy::cast_precision_loss, reason = "CPU time in ms, far below 2^52")]
    let cpu_seconds = used.cpu_ns.map(|ns| (ns / 1_000_000) as f64 / 1000.0);
    Phase {
        exit_code: match st {
            ExecStatus::Exited { code, .. } => Some(*code),
            ExecStatus::Failed { .. } => None,
        },
        timed_out: st.timed_out(),
        duration_ms: ms(took),
        network: Some(as_mode(net)),
        user: user.clone(),
        cpu_seconds,
        memory_peak_bytes: used.memory_peak,
        oom_kills: used.oom_kills,
    }
}

/// Runs the healthcheck until it passes, as Harbor 0.26 does: a check
/// that starts within the start period does not count when it fails (the
/// next comes `start_interval` later); after it, `retries` failures in a
/// row end it (the next check `interval` later).
fn healthcheck(
    ctx: &Ctx<'_>,
    run: &Running<'_>,
    h: &crate::task::Healthcheck,
    net: NetMode,
) -> std::result::Result<(), String> {
    let started = Instant::now();
    let mut failures = 0;
    loop {
        if ctx.cancel.is_cancelled() {
            return Err("interrupted".into());
        }
        let in_start_period = started.elapsed() < h.start_period;
        let req = ExecRequest::command(h.argv.clone())
            .env_scripts(run.env_scripts)
            .base_env(run.base_env.clone())
            .cwd(Some(run.cwd.clone()))
            .timeout(Some(h.timeout))
            .isolate_net(run.sandbox_net == NetMode::Host && net == NetMode::None)
            .build();
        let out = run
            .sandbox
            .exec_capture(req, None, 4096)
            .map_err(|e| format!("running the healthcheck: {e}"))?;
        if out.exit_code == 0 {
            return Ok(());
        }
        let last = one_line(&format!(
            "exit code {}{}{}",
            out.exit_code,
            if out.timed_out { " (timed out)" } else { "" },
            [
                out.stdout.trim(),
                out.stderr.trim(),
                out.error.as_deref().unwrap_or("")
            ]
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| format!(": {s}"))
            .collect::<String>()
        ));
        let pause = if in_start_period {
            h.start_interval
        } else {
            failures += 1;
            if failures >= h.retries {
                return Err(format!(
                    "the healthcheck failed {failures} times in a row after its start period; last: {last}"
                ));
            }
            h.interval
        };
        pause_unless_cancelled(ctx, pause);
    }
}

/// Runs the task's setup commands in order (BenchFlow's `setup_commands`:
/// after the healthcheck, before the agent), each as `/bin/sh -c COMMAND`
/// with its output in `out`; stops at the first that fails.
#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
fn setup_commands(
    ctx: &Ctx<'_>,
    task: &Task,
    env: &TaskEnv,
    run: &Running<'_>,
    image_user: &Option<String>,
    net: NetMode,
    out: &File,
) -> std::result::Result<(), SetupError> {
    for (i, c) in task.config.setup_commands.iter().enumerate() {
        if ctx.cancel.is_cancelled() {
            return Err(SetupError::Failed("interrupted".into()));
        }
        let _lock = match &c.host_lock {
            Some(name) => Some(host_lock(ctx, name).map_err(|e| SetupError::Infra(e.to_string()))?),
            None => None,
        };
        {
            use std::io::Write;
            let mut w = out;
            let _ = writeln!(w, "# setup_commands[{i}]: {}", c.command);
        }
        let no_env = Vec::new();
        let extra = env.setup.get(i).unwrap_or(&no_env);
        let (st, _) = run
            .exec(
                c.cwd.as_deref().unwrap_or(&run.cwd),
                vec!["/bin/sh".into(), "-c".into(), c.command.clone()],
                with_env(&run.base_env, &[extra]),
                c.user.clone().or_else(|| image_user.clone()),
                c.timeout,
                (net, false),
                out,
            )
            .map_err(|e| SetupError::Infra(e.to_string()))?;
        let what = format!("setup_commands[{i}] ({})", short(&c.command));
        match st {
            ExecStatus::Exited { code: 0, .. } => {}
            ExecStatus::Exited {
                timed_out: true, ..
            } => {
                return Err(SetupError::Failed(format!(
                    "{what} ran past its time limit ({} s) and was killed",
                    c.timeout.as_secs_f64()
                )))
            }
            ExecStatus::Exited { code, .. } => {
                return Err(SetupError::Failed(format!(
                    "{what} exited with code {code}"
                )))
            }
            ExecStatus::Failed { code, message } => {
                return Err(SetupError::Failed(format!(
                    "{what} could not start ({code}): {message}"
                )))
            }
        }
    }
    Ok(())
}

/// Uploads the task's `dir` to `dst` (see `Sandbox::upload`) and makes
/// `dst/script` executable, as Harbor's `chmod +x` does: the script is sent
/// once more, as a file of its own with the execute bits added (the
/// sandbox replaces the copy without them).
/// /instruction.md: instruction.md as it is, or task.md's prompt as a
/// file of its own (0644, the agent's).
fn upload_instruction(
    sb: &Sandbox,
    instruction: &crate::task::Instruction,
    owner: Option<&str>,
) -> std::result::Result<(), RolloutError> {
    let text = match instruction {
        crate::task::Instruction::File(p) => {
            return Ok(sb.upload(p, "/instruction.md", owner)?);
        }
        crate::task::Instruction::Text(t) => t.clone().into_bytes(),
    };
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(text.len() as u64);
    h.set_mode(0o644);
    sb.upload_tar("/", owner, move |w| {
        let mut b = tar::Builder::new(w);
        b.append_data(&mut h, "instruction.md", text.as_slice())?;
        std::io::Write::flush(&mut b.into_inner()?)
    })?;
    Ok(())
}

/// Uploads the test dirs `dirs` to /tests, merged in order (the first
/// makes it, the others' contents go into it), then `script` (the
/// test.sh that runs, in one of them) once more as /tests/test.sh with
/// the execute bits added.
fn upload_tests(
    sb: &Sandbox,
    root: &Path,
    dirs: &[PathBuf],
    script: &Path,
    owner: Option<&str>,
) -> std::result::Result<(), RolloutError> {
    // One transfer when test.sh is a file of the one dir (the usual case).
    if let [dir] = dirs {
        if script == dir.join("test.sh") && is_regular_file(script) {
            sb.upload_marking_executable(dir, "/tests", owner, Path::new("test.sh"))?;
            return Ok(());
        }
    }
    for (i, dir) in dirs.iter().enumerate() {
        if i == 0 {
            sb.upload(dir, "/tests", owner)?;
        } else {
            let dir = dir.clone();
            sb.upload_tar("/tests", owner, move |w| {
                let mut b = tar::Builder::new(w);
                b.follow_symlinks(false);
                b.append_dir_all(".", &dir)?;
                std::io::Write::flush(&mut b.into_inner()?)
            })?;
        }
    }
    upload_script(sb, root, script, "/tests", "test.sh", owner)
}

/// Whether `p` is a regular file itself (not a symlink to one).
fn is_regular_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

fn upload_with_script(
    sb: &Sandbox,
    root: &Path,
    dir: &std::path::Path,
    dst: &str,
    script: &str,
    owner: Option<&str>,
) -> std::result::Result<(), RolloutError> {
    if is_regular_file(&dir.join(script)) {
        sb.upload_marking_executable(dir, dst, owner, Path::new(script))?;
        return Ok(());
    }
    // A symlink: the file it names, once more, as the script.
    sb.upload(dir, dst, owner)?;
    upload_script(sb, root, &dir.join(script), dst, script, owner)
}

/// `host` (read beneath the task's dir `root`: see
/// `task::open_task_file`) uploaded once more as `dst/name`, with the
/// execute bits added.
fn upload_script(
    sb: &Sandbox,
    root: &Path,
    host: &Path,
    dst: &str,
    name: &str,
    owner: Option<&str>,
) -> std::result::Result<(), RolloutError> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt;
    let at = || RolloutError::host(HostAction::Using, host);
    let mut file = crate::task::open_task_file(root, host).map_err(RolloutError::TaskFile)?;
    let meta = file.metadata().map_err(at())?;
    let mut data = Vec::new();
    file.read_to_end(&mut data).map_err(at())?;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode((meta.mode() & 0o7777) | 0o111);
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    let name = name.to_string();
    sb.upload_tar(dst, owner, move |w| {
        let mut b = tar::Builder::new(w);
        b.append_data(&mut h, &name, data.as_slice())?;
        std::io::Write::flush(&mut b.into_inner()?)
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sifbox_engine::limits::{Applied, Enforcement, How};
    use sifbox_engine::Usage;

    use crate::task::Overrides;

    fn exited(code: i32) -> ExecStatus {
        ExecStatus::Exited {
            code,
            timed_out: false,
        }
    }

    fn used(oom_kills: u64, oom_total: u64) -> PhaseUsage {
        PhaseUsage {
            oom_kills,
            oom_total,
            ..PhaseUsage::default()
        }
    }

    #[test]
    fn a_phase_is_oom_when_its_command_dies_after_a_kill_for_memory() {
        // A kill during the phase, and the command failed or was killed.
        assert!(killed_for_memory(&exited(137), &used(1, 1)));
        assert!(killed_for_memory(&exited(1), &used(2, 3)));
        // Killed itself, the kill counted before the phase's start.
        assert!(killed_for_memory(&exited(137), &used(0, 1)));
        assert!(killed_for_memory(
            &ExecStatus::Failed {
                code: 125,
                message: "fork".into()
            },
            &used(1, 1)
        ));
        // Not: no kill at all, a command that carried on, a timeout, a
        // failure in a sandbox whose only kills came before the phase.
        assert!(!killed_for_memory(&exited(137), &used(0, 0)));
        assert!(!killed_for_memory(&exited(0), &used(3, 3)));
        assert!(!killed_for_memory(
            &ExecStatus::Exited {
                code: 124,
                timed_out: true
            },
            &used(1, 1)
        ));
        assert!(!killed_for_memory(&exited(1), &used(0, 4)));
    }

    #[test]
    fn phase_usage_is_the_difference_and_the_peak_after() {
        let before = Usage {
            cpu_ns: Some(1_000_000_000),
            memory_peak: Some(10),
            oom_kills: 1,
            ..Usage::default()
        };
        let after = Usage {
            cpu_ns: Some(3_500_000_000),
            memory_peak: Some(7 << 20),
            oom_kills: 3,
            ..Usage::default()
        };
        let u = PhaseUsage::between(&before, &after);
        assert_eq!(
            u,
            PhaseUsage {
                cpu_ns: Some(2_500_000_000),
                memory_peak: Some(7 << 20),
                oom_kills: 2,
                oom_total: 3,
            }
        );
        let p = phase(&exited(0), Duration::from_secs(3), NetMode::None, &None, &u);
        assert_eq!(p.cpu_seconds, Some(2.5));
        assert_eq!(p.memory_peak_bytes, Some(7 << 20));
        assert_eq!(p.oom_kills, 2);
        // Unknown before: unknown, never a made-up number.
        let none = PhaseUsage::between(&Usage::default(), &after);
        assert_eq!(none.cpu_ns, None);
    }

    fn rollout_with(limits: crate::task::Limits, o: &Overrides) -> RolloutResult {
        let mut r = RolloutResult::new("t", 1, "j", "oracle");
        r.limits = limits.resolve(o);
        r
    }

    #[test]
    fn the_oom_message_says_the_limit_what_enforced_it_and_what_to_do() {
        let e = Enforcement {
            applied: vec![Applied {
                limit: "memory".into(),
                value: 256 << 20,
                how: How::Watchdog,
                detail: String::new(),
            }],
            ..Enforcement::default()
        };
        let r = rollout_with(
            crate::task::Limits {
                memory_mb: Some(256),
                ..crate::task::Limits::default()
            },
            &Overrides::default(),
        );
        let u = PhaseUsage {
            memory_peak: Some((256 << 20) + 1),
            ..used(1, 1)
        };
        let m = oom_message("agent", &exited(137), &u, &r.limits, &e);
        for needle in [
            "the agent went over its 256 MiB memory limit",
            "enforced by watchdog",
            "1 process(es) of the sandbox killed",
            "peak 257 MiB",
            "killed (SIGKILL)",
            "--override-memory-mb",
        ] {
            assert!(m.contains(needle), "{needle:?} in {m}");
        }
        let m = oom_message("verifier", &exited(2), &used(0, 3), &r.limits, &e);
        assert!(
            m.contains("3 process(es) of the sandbox killed so far"),
            "{m}"
        );
        assert!(m.contains("exited with code 2"), "{m}");
    }
}
