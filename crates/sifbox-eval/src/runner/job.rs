//! The job: checking the input, the job dir (private, locked, `job.json`),
//! planning the rollouts (what a resumed job keeps), the worker threads,
//! and `summary.json`.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use sifbox_engine::idmap;
use sifbox_image::store::Store;

use crate::cancel::{self, Cancel};
use crate::error::{EvalError, Result};
use crate::result::{
    now_rfc3339, now_unix_ms, rollout_dir_name, write_json, RolloutResult, Summary, SUMMARY_FILE,
};
use crate::rollout_dir;
use crate::task::Task;
use crate::template;

use super::rollout::rollout;
use super::schedule::Scheduler;
use super::{Ctx, EvalOptions, JobInfo, JobOutcome, Layer, Observer, Resolvers, TaskEnv};

/// `task`'s env templates resolved: a `${VAR}` sees the caller's VAR only
/// when the caller passes it (`pass_env`): a suite is untrusted and must
/// not take API keys or `SSH_AUTH_SOCK` by naming them. Any other name
/// counts as unset (Harbor's rules then: `${VAR:-default}` gives the
/// default, with a warning when the caller does have VAR; `${VAR}` is an
/// error naming it).
fn resolve_env(task: &Task, pass_env: &[String]) -> Result<TaskEnv> {
    let lookup = |k: &str| {
        if pass_env.iter().any(|p| p == k) {
            return std::env::var(k).ok();
        }
        if std::env::var_os(k).is_some() {
            tracing::warn!(
                "task {}: ${{{k}}} counts as unset: your environment's {k} is not passed to tasks (--pass-env {k} passes it)",
                task.name
            );
        }
        None
    };
    let one = |list: &[(String, String)], key: &str| -> Result<Vec<(String, String)>> {
        list.iter()
            .map(|(k, v)| {
                template::resolve(v, &lookup)
                    .map(|v| (k.clone(), v))
                    .map_err(|why| {
                        EvalError::bad(
                            format!("{}: {key}.{k}", task.config_file.display()),
                            why,
                            "pass the variable from your environment with --pass-env NAME (a task sees none it is not given), or give a default: ${VAR:-default}",
                        )
                    })
            })
            .collect()
    };
    Ok(TaskEnv {
        env: one(&task.config.env, "[environment] env")?,
        verifier: one(&task.config.verifier_env, "[verifier] env")?,
        solution: one(&task.config.solution_env, "[solution] env")?,
        setup: task
            .config
            .setup_commands
            .iter()
            .enumerate()
            .map(|(i, c)| one(&c.env, &format!("[environment] setup_commands[{i}] env")))
            .collect::<Result<_>>()?,
        steps_verifier: task
            .config
            .steps
            .iter()
            .map(|st| {
                one(
                    &st.verifier_env,
                    &format!("[[steps]] {:?} [verifier] env", st.name),
                )
            })
            .collect::<Result<_>>()?,
    })
}

/// `job.json`: what the job was asked to do.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct JobFile {
    job: String,
    agent: String,
    attempts: u32,
    tasks: Vec<JobTask>,
    created_at: String,
    sifbox_version: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct JobTask {
    name: String,
    dir: PathBuf,
}

fn valid_job_name(s: &str) -> bool {
    crate::task::valid_name(s)
}

/// Makes a dir of the caller's alone (0700).
fn private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

/// Makes (or, resuming, opens) the job's dir, private to the caller (0700,
/// and so is `--out` when sifbox makes it); returns its name and path.
fn job_dir(opts: &EvalOptions) -> Result<(String, PathBuf)> {
    if let Some(name) = &opts.job {
        if !valid_job_name(name) {
            return Err(EvalError::bad(
                format!("--job {name:?}"),
                "not a usable job name",
                "use letters, digits, '.', '_' and '-' (at most 100)",
            ));
        }
    } else if opts.resume {
        return Err(EvalError::bad(
            "--resume",
            "no job named",
            "pass --job NAME with the name of the job to continue (a directory in --out)",
        ));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&opts.out)
        .map_err(|e| {
            EvalError::bad(
                format!("--out {}", opts.out.display()),
                format!("cannot create it: {e}"),
                "pass a directory you can write",
            )
        })?;
    let out = std::path::absolute(&opts.out)
        .map_err(|e| EvalError::io(format!("--out {}", opts.out.display()), e))?;
    if let Some(name) = &opts.job {
        let dir = out.join(name);
        match private_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && opts.resume => {
                // A job of an older sifbox may be open to others.
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| EvalError::io(format!("making {} private", dir.display()), e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(EvalError::bad(
                    format!("job {}", dir.display()),
                    "it exists already",
                    "pass --resume to continue it, or another --job NAME",
                ))
            }
            Err(e) => return Err(EvalError::io(format!("creating {}", dir.display()), e)),
        }
        return Ok((name.clone(), dir));
    }
    let base = crate::result::timestamp_name();
    for n in 1..1000 {
        let name = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let dir = out.join(&name);
        match private_dir(&dir) {
            Ok(()) => return Ok((name, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(EvalError::io(format!("creating {}", dir.display()), e)),
        }
    }
    Err(EvalError::bad(
        format!("--out {}", out.display()),
        "too many jobs started this second",
        "pass --job NAME",
    ))
}

/// Holds the job's lock for as long as it lives.
#[derive(Debug)]
struct JobLock(#[allow(dead_code, reason = "held for its lock")] File);

fn lock_job(dir: &Path) -> Result<JobLock> {
    let path = dir.join(".lock");
    let f = File::create(&path)
        .map_err(|e| EvalError::io(format!("creating {}", path.display()), e))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(JobLock(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(EvalError::bad(
            format!("job {}", dir.display()),
            "another sifbox eval is running it",
            "wait for it to end, or pass another --job NAME",
        )),
        Err(e) => Err(EvalError::io(format!("locking {}", path.display()), e)),
    }
}

/// The scratch dir of disk-backed layers for `layer` on this host, made if
/// missing; `None` for tmpfs layers.
fn layer_scratch(store: &Store, layer: Layer) -> Result<Option<PathBuf>> {
    let why_not = sifbox_engine::disk::unavailable();
    let dir = sifbox_engine::disk::scratch_dir(&store.root().join("scratch"));
    match (layer, why_not) {
        (Layer::Tmpfs, _) | (Layer::Auto, Some(_)) => Ok(None),
        (Layer::Disk, Some(why)) => Err(EvalError::bad(
            "--layer disk",
            why,
            "pass --layer tmpfs (or auto), or run as root",
        )),
        (Layer::Auto | Layer::Disk, None) => {
            sifbox_engine::disk::prepare_scratch(&dir)?;
            Ok(Some(dir))
        }
    }
}

/// Runs the job: every task in `tasks` `opts.attempts` times.
pub fn run(
    store: &Store,
    tasks: &[Task],
    opts: &EvalOptions,
    resolve: &Resolvers<'_>,
    observer: &dyn Observer,
    cancel: &Cancel,
) -> Result<JobOutcome> {
    let started_ms = now_unix_ms();
    check_input(tasks, opts)?;
    // Everything that can be wrong with the input is found before the job
    // dir exists: bad input leaves nothing behind.
    let envs: Vec<TaskEnv> = tasks
        .iter()
        .map(|t| resolve_env(t, &opts.pass_env))
        .collect::<Result<_>>()?;
    let ids = idmap::resolve(opts.userns, &idmap::Caller::current())?;
    let scratch = layer_scratch(store, opts.layer)?;
    let (job, dir) = job_dir(opts)?;
    let _lock = lock_job(&dir)?;
    let agent_label = opts.agent.label();
    write_job_file(&dir, &job, &agent_label, tasks, opts)?;

    // The plan: (task, attempt), with what an earlier run finished.
    let (mut results, todo) = plan(tasks, opts, &dir, &agent_label);
    let workers = opts.jobs.min(todo.len()).max(1);
    let total = tasks.len() * opts.attempts as usize;
    observer.job_started(&JobInfo {
        job: job.clone(),
        dir: dir.clone(),
        total,
        kept: total - todo.len(),
        to_run: todo.len(),
        workers,
    });

    let sched = Scheduler::new(tasks.iter().map(|t| t.name.clone()).collect(), &todo);
    let (reaper, stops) = super::reaper::Reaper::new();
    let ctx = Ctx {
        store,
        opts,
        resolve,
        observer,
        cancel,
        job: job.clone(),
        dir: dir.clone(),
        ids,
        agent_label: agent_label.clone(),
        images: Mutex::new(HashMap::new()),
        seq: AtomicUsize::new(0),
        scratch,
        sched: &sched,
        reaper: &reaper,
    };
    let done: Mutex<Vec<(usize, u32, RolloutResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let reaping = &reaper;
        s.spawn(move || reaping.run(stops));
        let mut running = Vec::new();
        for _ in 0..workers {
            running.push(s.spawn(|| {
                let tid = cancel::current_tid();
                cancel.add_thread(tid);
                while let Some((ti, attempt)) = sched.next(|| cancel.is_cancelled()) {
                    let r = rollout(&ctx, &tasks[ti], &envs[ti], attempt);
                    sched.finished(ti);
                    observer.rollout_finished(&r);
                    done.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((ti, attempt, r));
                }
                // The supervisors this thread started die with it.
                reaper.wait_idle();
                cancel.remove_thread(tid);
            }));
        }
        for w in running {
            if let Err(panic) = w.join() {
                reaper.close();
                std::panic::resume_unwind(panic);
            }
        }
        // The scope ends once the reaper has finished the last stop.
        reaper.close();
    });
    for f in reaper.failures() {
        tracing::warn!("{f}");
    }
    // What a task's user wrote there as another id of the caller's
    // mapping is the caller's again (else unreadable, unremovable).
    if let Err(e) =
        sifbox_launch::give_back::give_back_outputs(store, opts.exe.clone(), opts.userns, &dir)
    {
        tracing::warn!(
            "files that sandboxes wrote in {} as other ids of your subordinate range could not all be given back to you ({e}): some of them may stay unreadable and unremovable for you",
            dir.display()
        );
    }
    // And nothing a task's root left there runs setuid or with file
    // capabilities for whoever the job's results are shared with.
    if let Err(e) = sifbox_image::setid::strip_tree(&dir) {
        tracing::warn!(
            "setuid/setgid bits or file capabilities that sandboxes left in {} could not all be removed ({e}): keep other users out of that dir",
            dir.display()
        );
    }
    let done = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Only the rollouts that finished (ok or failed) count as run.
    let finished = done
        .iter()
        .filter(|(_, _, r)| {
            matches!(
                r.status,
                crate::result::Status::Ok | crate::result::Status::Failed
            )
        })
        .count();
    let ran_now = u32::try_from(finished).unwrap_or(u32::MAX);
    for (ti, attempt, r) in done {
        results[ti][attempt as usize - 1] = Some(r);
    }
    let rows: Vec<(String, Vec<Option<RolloutResult>>)> =
        tasks.iter().map(|t| t.name.clone()).zip(results).collect();
    let summary = Summary::compute(&job, &agent_label, &rows, started_ms, ran_now);
    write_json(&dir.join(SUMMARY_FILE), &summary)?;
    Ok(JobOutcome {
        summary,
        dir,
        interrupted: cancel.is_cancelled(),
    })
}

/// The options and tasks, checked before anything is made.
fn check_input(tasks: &[Task], opts: &EvalOptions) -> Result<()> {
    if opts.attempts == 0 || opts.attempts > 100_000 {
        return Err(EvalError::bad(
            format!("--attempts {}", opts.attempts),
            "must be 1 to 100000",
            "pass e.g. --attempts 3",
        ));
    }
    if opts.jobs == 0 || opts.jobs > 4096 {
        return Err(EvalError::bad(
            format!("--jobs {}", opts.jobs),
            "must be 1 to 4096",
            "pass e.g. --jobs 4",
        ));
    }
    opts.limits.check()?;
    if tasks.is_empty() {
        return Err(EvalError::bad(
            "sifbox eval",
            "no task to run",
            "pass task directories (check --filter)",
        ));
    }
    Ok(())
}

/// Writes the job dir's `job.json`; a resumed job must run the agent it
/// ran before.
fn write_job_file(
    dir: &Path,
    job: &str,
    agent_label: &str,
    tasks: &[Task],
    opts: &EvalOptions,
) -> Result<()> {
    let job_file = dir.join("job.json");
    if opts.resume {
        if let Some(prev) = std::fs::read(&job_file)
            .ok()
            .and_then(|d| serde_json::from_slice::<JobFile>(&d).ok())
        {
            if prev.agent != agent_label {
                return Err(EvalError::bad(
                    format!("--resume of job {job}"),
                    format!("the job ran agent {:?}, not {agent_label:?}", prev.agent),
                    "resume with the same --agent, or start another --job",
                ));
            }
        }
    }
    write_json(
        &job_file,
        &JobFile {
            job: job.to_string(),
            agent: agent_label.to_string(),
            attempts: opts.attempts,
            tasks: tasks
                .iter()
                .map(|t| JobTask {
                    name: t.name.clone(),
                    dir: t.dir.clone(),
                })
                .collect(),
            created_at: now_rfc3339(),
            sifbox_version: env!("CARGO_PKG_VERSION").to_string(),
        },
    )
}

/// The plan: (task, attempt) to run, with what an earlier run finished
/// (kept when resuming), by task and attempt.
#[allow(clippy::type_complexity, reason = "the job's table of results")]
fn plan(
    tasks: &[Task],
    opts: &EvalOptions,
    dir: &Path,
    agent_label: &str,
) -> (Vec<Vec<Option<RolloutResult>>>, Vec<(usize, u32)>) {
    let mut results: Vec<Vec<Option<RolloutResult>>> = Vec::with_capacity(tasks.len());
    let mut todo: Vec<(usize, u32)> = Vec::new();
    for (ti, t) in tasks.iter().enumerate() {
        let mut row = Vec::new();
        for attempt in 1..=opts.attempts {
            let kept = if opts.resume {
                rollout_dir::load_result(&dir.join(rollout_dir_name(&t.name, attempt)))
                    .filter(|r| r.status.is_final() && r.agent == agent_label)
            } else {
                None
            };
            if kept.is_none() {
                todo.push((ti, attempt));
            }
            row.push(kept);
        }
        results.push(row);
    }
    (results, todo)
}
