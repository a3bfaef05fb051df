//! One rollout: its fresh dir and result.json, the sandbox started with the
//! rollout's dir at /logs and stopped at the end (then a separate
//! verifier's own sandbox), and the record of which limits the sandbox
//! enforces and how.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sifbox_engine::evidence::LogsDir;
#[cfg(test)]
use sifbox_engine::spec::Writable;
use sifbox_engine::spec::{self, NetMode};
use sifbox_engine::{Sandbox, StartOptions};
use sifbox_launch::{Layer, LimitsFrom, SandboxOptions};

use crate::result::{
    now_rfc3339, AppliedLimit, ErrorClass, ImageInfo, RolloutResult, Status, VerifierSandbox,
    RESULT_FILE,
};
use crate::rollout_dir;
use crate::task::{NetworkMode, SeparateVerifier, Task};

use super::environment::Image;
use super::phases::{phases, remake_verifier, task_verifier, verify, Running, STEPS_ARCHIVE};
use super::{fresh_dir, how_name, interrupted, ms, Agent, Ctx, TaskEnv};

/// The network of a phase: `--net`, else what the task says.
fn phase_net(cli: Option<NetMode>, mode: NetworkMode) -> NetMode {
    cli.unwrap_or(match mode {
        NetworkMode::NoNetwork => NetMode::None,
        NetworkMode::Public | NetworkMode::Allowlist | NetworkMode::Denylist => NetMode::Host,
    })
}

/// One rollout of `task`, start to end; never fails (what went wrong is in
/// the result).
pub(super) fn rollout(ctx: &Ctx<'_>, task: &Task, env: &TaskEnv, attempt: u32) -> RolloutResult {
    let t0 = Instant::now();
    let mut r = RolloutResult::new(&task.name, attempt, &ctx.job, &ctx.agent_label);
    r.limits = task.config.limits.resolve(&ctx.opts.limits);
    r.notes.extend(task.config.warnings.iter().cloned());
    r.notes.extend(ctx.opts.userns_note(task));
    if !ctx.opts.pass_env.is_empty() {
        r.notes.push(format!(
            "the caller's environment variables its templates may see (--pass-env, names only): {}",
            ctx.opts.pass_env.join(", ")
        ));
    }
    let dir = ctx.dir.join(&r.rollout);
    ctx.observer.rollout_started(&r.rollout);
    let prepared = fresh_dir(&ctx.dir, &dir)
        .map_err(|e| format!("clearing {}: {e}", dir.display()))
        .and_then(|()| {
            sifbox_engine::evidence::prepare_logs_dir_in_private(&dir).map_err(|e| e.to_string())
        })
        .and_then(|logs| {
            // A placeholder, bound read-only: nothing in the sandbox can
            // plant a result.
            rollout_dir::write_json_at(logs.dir.as_fd(), RESULT_FILE, &r)
                .map(|()| logs)
                .map_err(|e| format!("writing {}/{RESULT_FILE}: {e}", dir.display()))
        });
    let mut logs = match prepared {
        Ok(logs) => logs,
        Err(e) => {
            r.fail(ErrorClass::Infra, e);
            let fd = rollout_dir::open_dir_nofollow(&dir).ok();
            return finish(ctx, r, &dir, fd.as_ref(), t0);
        }
    };
    run_rollout(ctx, task, env, &mut logs, &mut r);
    finish(ctx, r, &dir, Some(&logs.dir), t0)
}

/// Sets the final status and times, and writes result.json into the
/// rollout dir `fd` (at `dir`), when there is one.
fn finish(
    ctx: &Ctx<'_>,
    mut r: RolloutResult,
    dir: &Path,
    fd: Option<&OwnedFd>,
    t0: Instant,
) -> RolloutResult {
    r.timings_ms.total = ms(t0.elapsed());
    r.overhead_ms = r.timings_ms.overhead();
    r.finished_at = now_rfc3339();
    if r.status != Status::Interrupted {
        r.status = match r.error_class {
            None => Status::Ok,
            Some(ErrorClass::Infra) => Status::InfraError,
            Some(_) => Status::Failed,
        };
    }
    if r.status == Status::InfraError && ctx.cancel.is_cancelled() {
        r.status = Status::Interrupted;
    }
    if let Some(fd) = fd {
        if let Err(e) = rollout_dir::write_json_at(fd.as_fd(), RESULT_FILE, &r) {
            tracing::warn!("{}/{RESULT_FILE}: {e}", dir.display());
        }
    }
    r
}

fn run_rollout(
    ctx: &Ctx<'_>,
    task: &Task,
    env: &TaskEnv,
    logs: &mut LogsDir,
    r: &mut RolloutResult,
) {
    if interrupted(ctx, r) {
        return;
    }
    if !runnable(ctx, task, r) {
        return;
    }
    // The image.
    let Some(image) = task_image(ctx, task, logs, r) else {
        return;
    };
    if interrupted(ctx, r) {
        return;
    }

    // A separate verifier's image, made before the agent runs: one that
    // cannot be made fails the rollout (build_failed) without spending an
    // agent run on it.
    let verifier_image = match &task.separate_verifier {
        None => None,
        Some(v) => match verifier_image(ctx, task, v, logs, r) {
            Some(i) => Some(i),
            None => return,
        },
    };
    if interrupted(ctx, r) {
        return;
    }

    // The sandbox.
    let c = &task.config;
    let cli = ctx.opts.net;
    let (env_net, agent_net, verifier_net) = (
        phase_net(cli, c.network),
        phase_net(cli, c.agent_network),
        phase_net(cli, c.verifier_network),
    );
    // A separate verifier's network is its own sandbox's.
    let shared_nets: &[NetMode] = if task.separate_verifier.is_some() {
        &[env_net, agent_net]
    } else {
        &[env_net, agent_net, verifier_net]
    };
    let sandbox_net = if shared_nets.contains(&NetMode::Host) {
        NetMode::Host
    } else {
        NetMode::None
    };
    let name = sandbox_name(ctx, task);
    r.sandbox = Some(name.clone());
    let dir = logs.path.clone();
    let mut binds = ctx.opts.binds.clone();
    binds.extend(sifbox_engine::evidence::logs_binds(&dir));
    binds.push(spec::Bind {
        src: dir.join(RESULT_FILE),
        dst: PathBuf::from("/logs").join(RESULT_FILE),
        readonly: true,
    });
    // verifier/ is read-only to the agent and to all it leaves running;
    // only the verifier's commands see it writable (see
    // `spec::GuardedBind`).
    let guarded = vec![spec::GuardedBind {
        src: dir.join("verifier"),
        dst: PathBuf::from("/logs/verifier"),
    }];
    let t = Instant::now();
    let started = start_sandbox(
        ctx,
        task,
        &image,
        env,
        name,
        sandbox_net,
        (binds, guarded),
        Some(dir),
        r,
    );
    r.timings_ms.start += ms(t.elapsed());
    let Some(Started {
        sandbox,
        kill_id,
        base_env,
        layer,
    }) = started
    else {
        return;
    };
    record_limits(r, sandbox.limits());
    let cwd = c
        .workdir
        .clone()
        .or_else(|| image.meta.workdir.clone().filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".into());
    let running = match running(&sandbox, &image, base_env, cwd, sandbox_net) {
        Ok(run) => Running {
            guarded: true,
            ..run
        },
        Err(e) => {
            r.fail(ErrorClass::Infra, e);
            stop(ctx, sandbox, kill_id, layer, r);
            return;
        }
    };
    let verify_apart = phases(
        ctx,
        task,
        env,
        logs,
        &image,
        &running,
        r,
        env_net,
        agent_net,
        verifier_net,
    );
    drop(running);
    if task.steps.is_empty() {
        r.logs = Some(super::agent_logs::copy_out(&sandbox, &logs.path, &ctx.dir));
    }
    // As Harbor, the agent's sandbox stops before a separate verifier
    // starts: nothing of the agent runs while it is graded.
    stop(ctx, sandbox, kill_id, layer, r);
    if !task.steps.is_empty() {
        keep_steps(ctx, logs, r);
    }
    if let (true, Some(vimage)) = (verify_apart, verifier_image) {
        separate_verifier(ctx, task, env, logs, &vimage, r, verifier_net);
    }
}

/// Whether the task can run at all: what cannot be honoured, or an
/// oracle run without a solution, ends the rollout (`unsupported`) before
/// anything runs.
fn runnable(ctx: &Ctx<'_>, task: &Task, r: &mut RolloutResult) -> bool {
    // What cannot be honoured ends the rollout before anything runs.
    if !task.config.unsupported.is_empty() {
        r.fail(ErrorClass::Unsupported, task.config.unsupported.join("; "));
        return false;
    }
    let no_solution = if task.steps.is_empty() {
        task.solve_script().is_none()
    } else {
        task.steps.iter().any(|s| {
            s.solution
                .as_ref()
                .is_none_or(|d| !d.join("solve.sh").is_file())
        })
    };
    if ctx.opts.agent == Agent::Oracle && no_solution {
        r.fail(
            ErrorClass::Unsupported,
            "--agent oracle: the task has no solution/solve.sh (or oracle/solve.sh) to run; add one, or run the task with another --agent",
        );
        return false;
    }
    true
}

/// The task's image (its build log kept in the rollout dir); None when it
/// could not be made (recorded in `r`).
fn task_image(
    ctx: &Ctx<'_>,
    task: &Task,
    logs: &LogsDir,
    r: &mut RolloutResult,
) -> Option<std::sync::Arc<Image>> {
    let t = Instant::now();
    let image = ctx.image(task);
    r.timings_ms.build = ms(t.elapsed());
    let log = match &image {
        Ok(i) => i.log.clone(),
        Err(e) => e.log.clone(),
    };
    if let Some(log) = log {
        if rollout_dir::copy_in(logs.dir.as_fd(), "build.log", &log).is_ok() {
            r.build_log = Some("build.log".into());
        }
    }
    let image = match image {
        Ok(i) => i,
        Err(e) => {
            if e.interrupted || interrupted(ctx, r) {
                r.status = Status::Interrupted;
            } else {
                r.fail(ErrorClass::BuildFailed, e.message);
            }
            return None;
        }
    };
    r.image = ImageInfo {
        reference: image.reference.clone(),
        digest: Some(image.digest.to_string()),
    };
    Some(image)
}

/// A separate verifier's image, made before the agent runs (its build log
/// kept in the rollout dir): None when it cannot be made, which fails the
/// rollout (build_failed, recorded in `r`) without spending an agent run
/// on it.
fn verifier_image(
    ctx: &Ctx<'_>,
    task: &Task,
    v: &SeparateVerifier,
    logs: &LogsDir,
    r: &mut RolloutResult,
) -> Option<std::sync::Arc<Image>> {
    let t = Instant::now();
    let made = ctx.verifier_image(task, v);
    let build_ms = ms(t.elapsed());
    r.timings_ms.build += build_ms;
    let mut vs = VerifierSandbox {
        build_ms,
        ..VerifierSandbox::default()
    };
    let log = match &made {
        Ok(i) => i.log.clone(),
        Err(e) => e.log.clone(),
    };
    if let Some(log) = log {
        if rollout_dir::copy_in(logs.dir.as_fd(), VERIFIER_BUILD_LOG, &log).is_ok() {
            vs.build_log = Some(VERIFIER_BUILD_LOG.into());
        }
    }
    match made {
        Ok(i) => {
            vs.image = ImageInfo {
                reference: i.reference.clone(),
                digest: Some(i.digest.to_string()),
            };
            r.verifier_sandbox = Some(vs);
            Some(i)
        }
        Err(e) => {
            r.verifier_sandbox = Some(vs);
            if e.interrupted || interrupted(ctx, r) {
                r.status = Status::Interrupted;
            } else {
                r.fail(
                    ErrorClass::BuildFailed,
                    format!("the verifier's image: {}", e.message),
                );
            }
            None
        }
    }
}

/// Moves a multi-step rollout's steps' outputs, kept out of its sandbox's
/// sight while it ran, to its dir's `steps/` (the sandbox has stopped).
fn keep_steps(ctx: &Ctx<'_>, logs: &LogsDir, r: &mut RolloutResult) {
    let root = ctx.dir.join(STEPS_ARCHIVE);
    let Ok(fd) = rollout_dir::open_dir_nofollow(&root) else {
        return;
    };
    match rustix::fs::renameat_with(
        fd.as_fd(),
        r.rollout.as_str(),
        logs.dir.as_fd(),
        "steps",
        rustix::fs::RenameFlags::NOREPLACE,
    ) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => r.notes.push(format!(
            "the steps' outputs could not move to steps/ ({e}; did the agent leave /logs/steps?): they are in {}",
            root.join(&r.rollout).display()
        )),
    }
}

/// The build log of a separate verifier's image, in the rollout dir.
const VERIFIER_BUILD_LOG: &str = "verifier-build.log";

/// A fresh sandbox name for a rollout of `task`.
fn sandbox_name(ctx: &Ctx<'_>, task: &Task) -> String {
    let n = ctx.seq.fetch_add(1, Ordering::SeqCst);
    let short: String = task.name.chars().take(60).collect();
    format!("eval-{short}-{:x}-{n}", std::process::id())
}

/// A sandbox of a rollout, started.
struct Started {
    sandbox: Sandbox,
    /// Its registration with the job's cancellation.
    kill_id: Option<u64>,
    /// The environment its commands start with (`sifbox_launch::assemble`).
    base_env: Vec<(String, String)>,
    /// Its disk-backed layer on the worker's file system, removed after it.
    layer: Option<sifbox_engine::disk::Removal>,
}

/// Starts a sandbox `name` of `image` for a rollout of `task`, with
/// `binds` and guarded binds, until it answers; registered with the job's
/// cancellation. The spec and the environment (the image's, then the
/// task's, then the host CA's) are `sifbox_launch::assemble`'s, as for
/// `run` and `start`. None when it did not start (`r` says why).
#[allow(
    clippy::too_many_arguments,
    reason = "what a sandbox of a rollout is made of"
)]
fn start_sandbox(
    ctx: &Ctx<'_>,
    task: &Task,
    image: &Image,
    env: &TaskEnv,
    name: String,
    net: NetMode,
    (binds, guarded): (Vec<spec::Bind>, Vec<spec::GuardedBind>),
    evidence_dir: Option<PathBuf>,
    r: &mut RolloutResult,
) -> Option<Started> {
    let size_mib = r.limits.storage_mib();
    let opts = SandboxOptions {
        name: Some(name),
        hostname: Some(spec::hostname_for(&task.name)),
        net,
        userns: ctx.opts.userns,
        ids: Some(ctx.ids.clone()),
        layer: match &ctx.scratch {
            Some(scratch) => Layer::Disk {
                size_mib,
                scratch: Some(scratch.clone()),
            },
            None => Layer::Tmpfs { size_mib },
        },
        confinement: ctx.opts.confinement(task),
        limits: LimitsFrom::Exact(r.limits.spec()),
        env: env.env.clone(),
        binds,
        host_ca: ctx.opts.sandbox_host_ca.clone(),
        ..SandboxOptions::new()
    };
    let planned = match sifbox_launch::assemble(&image.resolved, &opts) {
        Ok(p) => p,
        Err(e @ sifbox_launch::LaunchError::HostCaMissing { .. }) => {
            r.fail(ErrorClass::Infra, e.to_string());
            return None;
        }
        Err(e) => {
            r.fail(ErrorClass::Infra, format!("starting the sandbox: {e}"));
            return None;
        }
    };
    let mut spec = planned.spec;
    // A directory on the worker's file system of that size, when it can.
    let (disk_layer, layer) = match &ctx.scratch {
        Some(scratch) => {
            let owner = (spec.ids.uid[0].outside, spec.ids.gid[0].outside);
            match super::disks::layer(scratch, size_mib, owner) {
                Some((mount, removal)) => (Some(std::sync::Arc::new(mount)), Some(removal)),
                None => (None, None),
            }
        }
        None => (None, None),
    };
    spec.guarded = guarded;
    // The agent's sandbox (the one with the rollout dir at /logs) keeps
    // /logs/agent and /logs/artifacts in its writable layer: bounded by
    // storage_mb, copied out after the agent (see `agent_logs`).
    // /logs itself is then read-only: its verifier/ is the guarded bind's
    // (writable to the verifier alone) and sandbox.json and result.json are
    // bound read-only, so nothing the agent writes reaches the host
    // unbounded.
    if task.steps.is_empty() && spec.binds.iter().any(|b| b.dst == Path::new("/logs")) {
        spec.layer_dirs = super::agent_logs::layer_dirs();
        if !spec.guarded.is_empty() {
            for b in spec
                .binds
                .iter_mut()
                .filter(|b| b.dst == Path::new("/logs"))
            {
                b.readonly = true;
            }
        }
    }
    let opts = StartOptions {
        oneshot: true,
        fork_when_possible: false,
        evidence_dir,
        image: Some(planned.image),
        holds: planned.holds,
        disk_layer,
        ..StartOptions::new(ctx.opts.exe.clone())
    };
    match Sandbox::launch(spec, &opts).and_then(|sb| sb.wait_ready().map(|()| sb)) {
        Ok(sb) => {
            let kill_id = sb.kill_handle().map(|h| ctx.cancel.register(h));
            Some(Started {
                sandbox: sb,
                kill_id,
                base_env: planned.env,
                layer,
            })
        }
        Err(e) => {
            if !interrupted(ctx, r) {
                r.fail(ErrorClass::Infra, format!("starting the sandbox: {e}"));
            }
            None
        }
    }
}

/// What the phases need of a started sandbox: its base env, `cwd`, and
/// /dev/null for stdin.
fn running<'a>(
    sandbox: &'a Sandbox,
    image: &Image,
    base_env: Vec<(String, String)>,
    cwd: String,
    sandbox_net: NetMode,
) -> Result<Running<'a>, String> {
    let null = File::open("/dev/null").map_err(|e| format!("opening /dev/null: {e}"))?;
    Ok(Running {
        sandbox,
        base_env,
        cwd,
        env_scripts: image.env_scripts,
        sandbox_net,
        null,
        guarded: false,
    })
}

/// The verifier in a sandbox of its own `image` (Harbor's separate
/// verifier), started once the agent's has stopped. It gets what Harbor
/// hands over: the rollout's `verifier/` (fresh) at /logs/verifier and
/// the agent's `/logs/artifacts`, read-only; nothing else of the agent's
/// sandbox (not /logs/agent, not its files, not `--bind`s).
#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
fn separate_verifier(
    ctx: &Ctx<'_>,
    task: &Task,
    env: &TaskEnv,
    logs: &mut LogsDir,
    image: &Image,
    r: &mut RolloutResult,
    verifier_net: NetMode,
) {
    if interrupted(ctx, r) {
        return;
    }
    let t = Instant::now();
    // verifier/ afresh once more, by the host alone: the agent's sandbox
    // has stopped, so nothing of it can touch the rollout dir now.
    let host_only = |_: &str| Err("the agent's sandbox has stopped".to_string());
    if !remake_verifier(ctx, logs, r, &host_only) {
        return;
    }
    let dir = logs.path.clone();
    let mut binds = vec![spec::Bind {
        src: dir.join("verifier"),
        dst: PathBuf::from("/logs/verifier"),
        readonly: false,
    }];
    let mut handed_over = Vec::new();
    // Only a real directory (not a symlink the agent left in its place);
    // nothing runs that could swap it now.
    let artifacts_dir = rustix::fs::statat(
        logs.dir.as_fd(),
        "artifacts",
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir());
    if artifacts_dir {
        binds.push(spec::Bind {
            src: dir.join("artifacts"),
            dst: PathBuf::from("/logs/artifacts"),
            readonly: true,
        });
        handed_over.push("/logs/artifacts".to_string());
    } else {
        r.notes.push(
            "the agent left no directory at /logs/artifacts: the separate verifier got none"
                .to_string(),
        );
    }
    r.timings_ms.setup += ms(t.elapsed());
    let name = sandbox_name(ctx, task);
    if let Some(vs) = &mut r.verifier_sandbox {
        vs.sandbox = name.clone();
        vs.handed_over = handed_over;
    }
    let t = Instant::now();
    let started = start_sandbox(
        ctx,
        task,
        image,
        env,
        name,
        verifier_net,
        (binds, Vec::new()),
        None,
        r,
    );
    let start_ms = ms(t.elapsed());
    r.timings_ms.start += start_ms;
    if let Some(vs) = &mut r.verifier_sandbox {
        vs.start_ms = start_ms;
    }
    let Some(Started {
        sandbox,
        kill_id,
        base_env,
        layer,
    }) = started
    else {
        return;
    };
    // Its image holds the tests (and names its workdir); with the task's
    // environment, the agent's workdir rule.
    let bundled = task
        .separate_verifier
        .as_ref()
        .is_some_and(|v| v.bundled_tests);
    let image_workdir = image.meta.workdir.clone().filter(|w| !w.is_empty());
    let cwd = if bundled {
        image_workdir
    } else {
        task.config.workdir.clone().or(image_workdir)
    }
    .unwrap_or_else(|| "/".into());
    match running(&sandbox, image, base_env, cwd, verifier_net) {
        Ok(run) => verify(
            ctx,
            task,
            logs,
            image,
            &run,
            r,
            verifier_net,
            &task_verifier(task, env),
        ),
        Err(e) => r.fail(ErrorClass::Infra, e),
    }
    let before = r.timings_ms.stop;
    stop(ctx, sandbox, kill_id, layer, r);
    let stop_ms = r.timings_ms.stop - before;
    if let Some(vs) = &mut r.verifier_sandbox {
        vs.stop_ms = stop_ms;
    }
}

/// Stops `sandbox`'s processes, counted in the rollout's `stop` time; the
/// job's reaper finishes the stop (a failure there is one of the job's
/// warnings).
fn stop(
    ctx: &Ctx<'_>,
    sandbox: Sandbox,
    kill_id: Option<u64>,
    layer: Option<sifbox_engine::disk::Removal>,
    r: &mut RolloutResult,
) {
    let t = Instant::now();
    // Once no process of it is left; the job finishes the rest (unmounts,
    // the runtime dir) beside the next rollouts.
    let stopping = sandbox.stop_processes(Duration::ZERO);
    sifbox_engine::denials::merge(&mut r.seccomp_denied, &stopping.denied());
    if let Some(id) = kill_id {
        ctx.cancel.unregister(id);
    }
    r.timings_ms.stop += ms(t.elapsed());
    ctx.reaper.finish_later(stopping, layer);
}

/// Records, after the sandbox started, exactly what of the rollout's
/// limits it enforces and how, with the writable layer's size; every limit
/// asked for that is not enforced (the engine's reasons, the GPUs, which
/// sifbox does not give) goes to the notes.
fn record_limits(r: &mut RolloutResult, e: &sifbox_engine::limits::Enforcement) {
    let unit = |limit: &str| match limit {
        "memory" | "memory_swap" | "storage" => "bytes",
        "pids" => "processes",
        "cpus" => "millicpus",
        _ => "",
    };
    for a in &e.applied {
        r.limits_applied.push(AppliedLimit {
            limit: a.limit.clone(),
            value: a.value,
            unit: unit(&a.limit).into(),
            how: how_name(a.how),
            detail: a.detail.clone(),
        });
    }
    for n in &e.not_enforced {
        // Eval asks for no swap limit of its own: the engine's is Docker's
        // default for a memory limit, which a reader may not expect.
        let n = match n.strip_prefix("memory_swap:") {
            Some(why) => format!(
                "memory_swap (Docker's default with a memory limit: memory plus swap at most twice memory_mb):{why}"
            ),
            None => n.clone(),
        };
        r.notes.push(format!("limit not enforced: {n}"));
    }
    // Whatever the engine says, no limit goes unmentioned.
    let asked = [
        ("memory", r.limits.memory_mb.is_some()),
        ("pids", r.limits.pids.is_some()),
        ("cpus", r.limits.cpus.is_some()),
        ("storage", true),
    ];
    for (limit, is_asked) in asked {
        let said = e.applied.iter().any(|a| a.limit == limit)
            || e.not_enforced
                .iter()
                .any(|n| n.starts_with(&format!("{limit}:")));
        if is_asked && !said {
            r.notes.push(format!(
                "limit not enforced: {limit}: the sandbox reported no mechanism for it"
            ));
        }
    }
    if let Some(g) = r.limits.gpus.filter(|g| *g > 0) {
        let types = r
            .limits
            .gpu_types
            .as_ref()
            .filter(|t| !t.is_empty())
            .map(|t| format!(" (gpu_types {})", t.join(", ")))
            .unwrap_or_default();
        r.notes.push(format!(
            "limit not enforced: gpus = {g}{types}: recorded only; sifbox gives sandboxes no GPU (no device of the host's is visible inside)"
        ));
    }
    let in_memory = e.how("storage") == Some(sifbox_engine::limits::How::Tmpfs);
    if let (true, Some(s), Some(m)) = (in_memory, r.limits.storage_mb, r.limits.memory_mb) {
        let asked = r.limits.source.get("storage_mb") != Some(&crate::task::LimitSource::Default);
        if asked && s > m {
            r.notes.push(format!(
                "storage_mb = {s} is above the memory limit ({m} MiB): the writable layer is in memory here and counts in that limit, so the rollout can write less than storage_mb"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sifbox_engine::limits::{Applied, Enforcement, How};

    use crate::task::Overrides;

    fn rollout_with(limits: crate::task::Limits, o: &Overrides) -> RolloutResult {
        let mut r = RolloutResult::new("t", 1, "j", "oracle");
        r.limits = limits.resolve(o);
        r
    }

    #[test]
    fn records_say_what_is_enforced_and_every_limit_that_is_not() {
        let mut e = Enforcement {
            applied: vec![
                Applied {
                    limit: "memory".into(),
                    value: 512 << 20,
                    how: How::Watchdog,
                    detail: "sampled".into(),
                },
                Applied {
                    limit: "cpus".into(),
                    value: 2000,
                    how: How::Affinity,
                    detail: "CPU affinity to [0, 1] (rounded up from 1.500)".into(),
                },
            ],
            not_enforced: vec![
                "memory_swap: without a cgroup swapped-out pages are not counted".into(),
            ],
            ..Enforcement::default()
        };
        let mut on_disk = e.clone();
        sifbox_engine::limits::plan_storage(&mut e, &Writable::Tmpfs { size_mib: 1024 });
        let task = crate::task::Limits {
            cpus: Some(1.5),
            memory_mb: Some(512),
            storage_mb: Some(1024),
            gpus: Some(1),
            gpu_types: Some(vec!["H100".into()]),
        };
        let mut r = rollout_with(task.clone(), &Overrides::default());
        record_limits(&mut r, &e);
        let names: Vec<(&str, &str, &str)> = r
            .limits_applied
            .iter()
            .map(|a| (a.limit.as_str(), a.how.as_str(), a.unit.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("memory", "watchdog", "bytes"),
                ("cpus", "affinity", "millicpus"),
                ("storage", "tmpfs", "bytes")
            ]
        );
        assert_eq!(r.limits_applied[2].value, 1024 << 20);
        let notes = r.notes.join("\n");
        assert!(notes.contains("limit not enforced: memory_swap"), "{notes}");
        // pids was asked for (the default cap) and the engine said nothing.
        assert!(
            notes.contains("limit not enforced: pids: the sandbox reported no mechanism"),
            "{notes}"
        );
        assert!(
            notes.contains("gpus = 1 (gpu_types H100): recorded only"),
            "{notes}"
        );
        assert!(
            notes.contains("storage_mb = 1024 is above the memory limit"),
            "{notes}"
        );
        assert!(
            r.limits_applied[2]
                .detail
                .contains("the watchdog counts its pages"),
            "{:?}",
            r.limits_applied[2]
        );
        // On disk the layer holds no memory: no note about the memory limit.
        sifbox_engine::limits::plan_storage(
            &mut on_disk,
            &Writable::Disk {
                size_mib: 1024,
                scratch: PathBuf::from("/scratch"),
            },
        );
        let mut r = rollout_with(task.clone(), &Overrides::default());
        record_limits(&mut r, &on_disk);
        assert_eq!(r.limits_applied[2].how, "disk");
        assert!(
            !r.notes.join("\n").contains("above the memory limit"),
            "{:?}",
            r.notes
        );
        // Defaults only: no note on storage (10240 > 4096 is the default's
        // doing), and nothing on GPUs.
        let mut r = rollout_with(crate::task::Limits::default(), &Overrides::default());
        let e = Enforcement {
            applied: vec![
                Applied {
                    limit: "memory".into(),
                    value: 4096 << 20,
                    how: How::CgroupV2,
                    detail: "memory.max".into(),
                },
                Applied {
                    limit: "pids".into(),
                    value: 4096,
                    how: How::Rlimit,
                    detail: "RLIMIT_NPROC".into(),
                },
            ],
            ..Enforcement::default()
        };
        let mut in_tmpfs = e.clone();
        sifbox_engine::limits::plan_storage(&mut in_tmpfs, &Writable::Tmpfs { size_mib: 10240 });
        record_limits(&mut r, &in_tmpfs);
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        // A sandbox that says nothing of its writable layer gets a note.
        let mut silent = rollout_with(crate::task::Limits::default(), &Overrides::default());
        record_limits(&mut silent, &e);
        assert!(
            silent
                .notes
                .iter()
                .any(|n| n.contains("storage: the sandbox reported no mechanism")),
            "{:?}",
            silent.notes
        );
        assert_eq!(r.limits_applied[0].how, "cgroup_v2");
        assert_eq!(r.limits_applied[1].how, "rlimit");
    }
}
