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

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sifbox_build::build::BuildOptions;
use sifbox_build::error::BuildError;
use sifbox_build::progress::Progress;
use sifbox_engine::evidence::{ImageRef, LogsDir};
use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::spec::{self, IdMapping, NetMode, UsernsMode, Writable};
use sifbox_engine::{idmap, ExecStatus, Sandbox, SandboxSpec, StartOptions, Usage};
use sifbox_image::meta::ImageMeta;
use sifbox_image::store::{Digest, Store};

use crate::cancel::{self, Cancel};
use crate::error::{EvalError, Result};
use crate::result::{
    now_rfc3339, now_unix_ms, one_line, rollout_dir_name, write_json, AppliedLimit, ErrorClass,
    ImageInfo, Phase, RolloutResult, Status, Summary, RESULT_FILE, SUMMARY_FILE,
};
use crate::reward::{self, Reward};
use crate::rollout_dir;
use crate::task::{EnvSource, NetworkMode, Overrides, RolloutLimits, Task};
use crate::template;

/// The agent of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Agent {
    /// Runs the task's solution: `bash /solution/solve.sh`.
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
    /// The seccomp policy of every rollout and build step.
    pub seccomp: spec::SeccompMode,
    /// Every task's commands may create user namespaces (else only tasks
    /// that ask for it with `[metadata.sifbox] allow_userns`).
    pub allow_userns: bool,
    /// Limits set for every task (`--override-*`, `--pids`).
    pub limits: Overrides,
    /// Where rollouts' writable layers live.
    pub layer: Layer,
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
            allow_userns: self.allow_userns || task.config.allow_userns,
        }
    }
}

/// Turns an image reference into a store image.
pub type Resolver<'a> = dyn Fn(&str) -> std::result::Result<Digest, BuildError> + Sync + 'a;

/// How image references resolve: a Dockerfile's `FROM` (and `COPY
/// --from`), and a task's `docker_image`.
pub struct Resolvers<'a> {
    pub from: &'a Resolver<'a>,
    pub image: &'a Resolver<'a>,
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
}

fn resolve_env(task: &Task) -> Result<TaskEnv> {
    let lookup = |k: &str| std::env::var(k).ok();
    let one = |list: &[(String, String)], key: &str| -> Result<Vec<(String, String)>> {
        list.iter()
            .map(|(k, v)| {
                template::resolve(v, &lookup)
                    .map(|v| (k.clone(), v))
                    .map_err(|why| {
                        EvalError::bad(
                            format!("{}/task.toml: {key}.{k}", task.dir.display()),
                            why,
                            "export the variable before running sifbox eval, or give a default: ${VAR:-default}",
                        )
                    })
            })
            .collect()
    };
    Ok(TaskEnv {
        env: one(&task.config.env, "[environment] env")?,
        verifier: one(&task.config.verifier_env, "[verifier] env")?,
        solution: one(&task.config.solution_env, "[solution] env")?,
    })
}

/// An environment's image, ready to run.
#[derive(Debug)]
struct Image {
    digest: Digest,
    rootfs: PathBuf,
    meta: ImageMeta,
    reference: String,
    /// Commands must source the image's Apptainer env scripts.
    env_scripts: bool,
    log: Option<PathBuf>,
}

/// Why an environment has no image.
#[derive(Debug, Clone)]
struct NoImage {
    message: String,
    log: Option<PathBuf>,
    interrupted: bool,
}

type Slot = Arc<OnceLock<std::result::Result<Arc<Image>, NoImage>>>;

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
    if opts.agent == Agent::Oracle {
        for t in tasks {
            let ok = t
                .solution
                .as_ref()
                .is_some_and(|s| s.join("solve.sh").is_file());
            if !ok {
                return Err(EvalError::bad(
                    format!("task {}", t.dir.display()),
                    "the oracle agent needs solution/solve.sh (or oracle/solve.sh), and it has none",
                    "add the solution, or run another --agent",
                ));
            }
        }
    }
    // Everything that can be wrong with the input is found before the job
    // dir exists: bad input leaves nothing behind.
    let envs: Vec<TaskEnv> = tasks.iter().map(resolve_env).collect::<Result<_>>()?;
    let ids = idmap::resolve(opts.userns, &idmap::Caller::current())?;
    let scratch = layer_scratch(store, opts.layer)?;
    let (job, dir) = job_dir(opts)?;
    let _lock = lock_job(&dir)?;
    let agent_label = opts.agent.label();
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
            job: job.clone(),
            agent: agent_label.clone(),
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
    )?;

    // The plan: (task, attempt), with what an earlier run finished.
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
    };
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, u32, RolloutResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let tid = cancel::current_tid();
                cancel.add_thread(tid);
                loop {
                    if cancel.is_cancelled() {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&(ti, attempt)) = todo.get(i) else {
                        break;
                    };
                    let r = rollout(&ctx, &tasks[ti], &envs[ti], attempt);
                    observer.rollout_finished(&r);
                    done.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((ti, attempt, r));
                }
                cancel.remove_thread(tid);
            });
        }
    });
    let done = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ran_now = u32::try_from(done.len()).unwrap_or(u32::MAX);
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

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Sets `k` in `env`, replacing an earlier value.
fn set_env(env: &mut Vec<(String, String)>, k: &str, v: &str) {
    match env.iter_mut().find(|(key, _)| key == k) {
        Some(e) => e.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
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

impl Ctx<'_> {
    /// The image of `task`'s environment: built (or resolved) by the first
    /// rollout that asks, shared by the others.
    fn image(&self, task: &Task) -> std::result::Result<Arc<Image>, NoImage> {
        let key = match &task.environment {
            EnvSource::Dockerfile { context } => format!("build:{}", context.display()),
            EnvSource::Image(r) => format!("image:{r}"),
        };
        let slot: Slot = Arc::clone(
            self.images
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(key)
                .or_default(),
        );
        slot.get_or_init(|| self.make_image(task).map(Arc::new))
            .clone()
    }

    fn make_image(&self, task: &Task) -> std::result::Result<Image, NoImage> {
        let fail = |message: String, log: Option<PathBuf>| NoImage {
            message,
            log,
            interrupted: self.cancel.is_cancelled(),
        };
        let (digest, log) = match &task.environment {
            EnvSource::Image(reference) => {
                let d = (self.resolve.image)(reference)
                    .map_err(|e| fail(format!("image {reference}: {e}"), None))?;
                (d, None)
            }
            EnvSource::Dockerfile { context } => {
                let d = self.build(task, context)?;
                (d.0, Some(d.1))
            }
        };
        let reference = match &task.environment {
            EnvSource::Image(r) => r.clone(),
            EnvSource::Dockerfile { .. } => format!("eval/{}", task.name.to_lowercase()),
        };
        let meta = sifbox_image::import::image_meta(self.store, &digest)
            .map_err(|e| fail(format!("image {digest}: {e}"), log.clone()))?;
        let rootfs = sifbox_image::import::rootfs(self.store, &digest)
            .map_err(|e| fail(format!("unpacking image {digest}: {e}"), log.clone()))?;
        let foreign = meta == ImageMeta::default();
        Ok(Image {
            env_scripts: foreign && sifbox_image::meta::has_env_scripts(&rootfs),
            digest,
            rootfs,
            meta,
            reference,
            log,
        })
    }

    /// Builds `context` with its log in `builds/TASK.log`, within the
    /// task's build time limit.
    fn build(
        &self,
        task: &Task,
        context: &Path,
    ) -> std::result::Result<(Digest, PathBuf), NoImage> {
        let builds = self.dir.join("builds");
        let log = builds.join(format!("{}.log", task.name));
        let fail = |message: String| NoImage {
            message,
            log: Some(log.clone()),
            interrupted: self.cancel.is_cancelled(),
        };
        if self.cancel.is_cancelled() {
            return Err(fail("interrupted before the build".into()));
        }
        std::fs::create_dir_all(&builds)
            .map_err(|e| fail(format!("creating {}: {e}", builds.display())))?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| fail(format!("creating {}: {e}", log.display())))?;
        {
            use std::io::Write;
            let _ = writeln!(
                file,
                "# sifbox build {} at {}",
                context.display(),
                now_rfc3339()
            );
        }
        let sink = file
            .try_clone()
            .map_err(|e| fail(format!("{}: {e}", log.display())))?;
        let progress = Arc::new(Progress::to_file(sink));
        let opts = BuildOptions {
            context: context.to_path_buf(),
            dockerfile: None,
            build_args: std::collections::BTreeMap::new(),
            secrets: std::collections::BTreeMap::new(),
            target: None,
            no_cache: self.opts.force_build,
            host_ca: self.opts.host_ca.clone(),
            exe: self.opts.exe.clone(),
            userns: self.opts.userns,
            confinement: self.opts.confinement(task),
        };
        self.observer.build_started(&task.name);
        let started = Instant::now();
        let limit = task.config.build_timeout;
        // A watchdog ends the build at its time limit: it kills the build
        // step's sandbox (a child of this thread), and the build fails.
        let tid = cancel::current_tid();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let timed_out = std::sync::atomic::AtomicBool::new(false);
        let flag = &timed_out;
        let built = std::thread::scope(|s| {
            s.spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(limit)
                {
                    flag.store(true, Ordering::SeqCst);
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        done_rx.recv_timeout(Duration::from_millis(100))
                    {
                        cancel::kill_sandboxes_of_thread(tid);
                    }
                }
            });
            let r = sifbox_build::build::build(self.store, &opts, self.resolve.from, progress);
            drop(done_tx);
            r
        });
        let took = started.elapsed();
        let result = match built {
            Ok(b) => {
                let tag = format!("eval/{}", task.name.to_lowercase());
                if let Err(e) = self.store.tag(&tag, &b.digest) {
                    tracing::debug!("tagging {tag}: {e}");
                }
                Ok((b.digest, log.clone()))
            }
            Err(e) => {
                let message = if timed_out.load(Ordering::SeqCst) {
                    format!(
                        "the build ran past build_timeout_sec ({} s) and was stopped: {e}",
                        limit.as_secs_f64()
                    )
                } else if self.cancel.is_cancelled() {
                    format!("interrupted: {e}")
                } else {
                    e.to_string()
                };
                {
                    use std::io::Write;
                    let _ = writeln!(file, "ERROR: {message}");
                }
                Err(fail(message))
            }
        };
        self.observer.build_finished(
            &task.name,
            result.as_ref().err().map(|e| e.message.as_str()),
            took,
        );
        result
    }
}

/// The network of a phase: `--net`, else what the task says.
fn phase_net(cli: Option<NetMode>, mode: NetworkMode) -> NetMode {
    cli.unwrap_or(match mode {
        NetworkMode::NoNetwork => NetMode::None,
        NetworkMode::Public | NetworkMode::Allowlist => NetMode::Host,
    })
}

fn as_mode(n: NetMode) -> NetworkMode {
    match n {
        NetMode::None => NetworkMode::NoNetwork,
        NetMode::Host => NetworkMode::Public,
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

/// Everything a rollout needs once its sandbox runs.
struct Running<'a> {
    sandbox: &'a Sandbox,
    base_env: Vec<(String, String)>,
    cwd: String,
    env_scripts: bool,
    sandbox_net: NetMode,
    null: File,
}

impl Running<'_> {
    /// Runs `argv` with its output (stdout and stderr) in `out`.
    #[allow(clippy::too_many_arguments, reason = "one call site per phase")]
    fn exec(
        &self,
        cwd: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        user: Option<String>,
        timeout: Duration,
        net: NetMode,
        out: &File,
    ) -> sifbox_engine::Result<(ExecStatus, Duration)> {
        let argv = if self.env_scripts {
            sifbox_engine::request::with_env_scripts(&argv)
        } else {
            argv
        };
        let req = ExecRequest {
            argv,
            env,
            cwd: cwd.to_string(),
            user,
            default_home: true,
            timeout_ms: Some(ms(timeout).max(1)),
            isolate_net: self.sandbox_net == NetMode::Host && net == NetMode::None,
            ..ExecRequest::default()
        };
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
        net: NetMode,
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

/// One rollout of `task`, start to end; never fails (what went wrong is in
/// the result).
fn rollout(ctx: &Ctx<'_>, task: &Task, env: &TaskEnv, attempt: u32) -> RolloutResult {
    let t0 = Instant::now();
    let mut r = RolloutResult::new(&task.name, attempt, &ctx.job, &ctx.agent_label);
    r.limits = task.config.limits.resolve(&ctx.opts.limits);
    let dir = ctx.dir.join(&r.rollout);
    ctx.observer.rollout_started(&r.rollout);
    let prepared = fresh_dir(&ctx.dir, &dir)
        .map_err(|e| format!("clearing {}: {e}", dir.display()))
        .and_then(|()| sifbox_engine::evidence::prepare_logs_dir(&dir).map_err(|e| e.to_string()))
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

/// Marks `r` interrupted when the job was cancelled; returns whether.
fn interrupted(ctx: &Ctx<'_>, r: &mut RolloutResult) -> bool {
    if ctx.cancel.is_cancelled() {
        r.status = Status::Interrupted;
        true
    } else {
        false
    }
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
    // The image.
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
            return;
        }
    };
    r.image = ImageInfo {
        reference: image.reference.clone(),
        digest: Some(image.digest.to_string()),
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
    let sandbox_net = if [env_net, agent_net, verifier_net].contains(&NetMode::Host) {
        NetMode::Host
    } else {
        NetMode::None
    };
    let n = ctx.seq.fetch_add(1, Ordering::SeqCst);
    let short: String = task.name.chars().take(60).collect();
    let name = format!("eval-{short}-{:x}-{n}", std::process::id());
    r.sandbox = Some(name.clone());
    let dir = logs.path.clone();
    let mut binds = sifbox_engine::evidence::logs_binds(&dir);
    binds.push(spec::Bind {
        src: dir.join(RESULT_FILE),
        dst: PathBuf::from("/logs").join(RESULT_FILE),
        readonly: true,
    });
    let spec = SandboxSpec {
        name: name.clone(),
        rootfs: image.rootfs.clone(),
        layers: Vec::new(),
        hostname: task.name.chars().take(64).collect(),
        net: sandbox_net,
        ids: ctx.ids.clone(),
        writable: match &ctx.scratch {
            Some(scratch) => Writable::Disk {
                size_mib: r.limits.storage_mib(),
                scratch: scratch.clone(),
            },
            None => Writable::Tmpfs {
                size_mib: r.limits.storage_mib(),
            },
        },
        binds,
        host_dns: true,
        shm_bytes: spec::DEFAULT_SHM_BYTES,
        confinement: ctx.opts.confinement(task),
        limits: r.limits.spec(),
    };
    let opts = StartOptions {
        oneshot: true,
        fork_when_possible: false,
        evidence_dir: Some(dir.clone()),
        image: Some(ImageRef {
            reference: image.reference.clone(),
            digest: Some(image.digest.to_string()),
            rootfs: image.rootfs.clone(),
        }),
        ..StartOptions::new(ctx.opts.exe.clone())
    };
    let t = Instant::now();
    let sandbox = match Sandbox::launch(spec, &opts).and_then(|sb| sb.wait_ready().map(|()| sb)) {
        Ok(sb) => sb,
        Err(e) => {
            r.timings_ms.start = ms(t.elapsed());
            if !interrupted(ctx, r) {
                r.fail(ErrorClass::Infra, format!("starting the sandbox: {e}"));
            }
            return;
        }
    };
    let kill_id = sandbox.kill_handle().map(|h| ctx.cancel.register(h));
    r.timings_ms.start = ms(t.elapsed());
    record_limits(r, sandbox.limits());

    let null = match File::open("/dev/null") {
        Ok(f) => f,
        Err(e) => {
            r.fail(ErrorClass::Infra, format!("opening /dev/null: {e}"));
            stop(ctx, sandbox, kill_id, r);
            return;
        }
    };
    let mut base_env = spec::clean_env(std::env::vars(), &image.meta.env_pairs());
    for (k, v) in &env.env {
        set_env(&mut base_env, k, v);
    }
    let running = Running {
        sandbox: &sandbox,
        base_env,
        cwd: c
            .workdir
            .clone()
            .or_else(|| image.meta.workdir.clone().filter(|w| !w.is_empty()))
            .unwrap_or_else(|| "/".into()),
        env_scripts: image.env_scripts,
        sandbox_net,
        null,
    };
    phases(
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
    stop(ctx, sandbox, kill_id, r);
}

fn stop(ctx: &Ctx<'_>, sandbox: Sandbox, kill_id: Option<u64>, r: &mut RolloutResult) {
    let t = Instant::now();
    let stopped = sandbox.stop(Duration::ZERO);
    if let Some(id) = kill_id {
        ctx.cancel.unregister(id);
    }
    r.timings_ms.stop = ms(t.elapsed());
    if let Err(e) = stopped {
        if !interrupted(ctx, r) {
            r.fail(ErrorClass::Infra, format!("stopping the sandbox: {e}"));
        }
    }
}

#[allow(clippy::too_many_arguments, reason = "the rollout's parts, once")]
#[allow(clippy::too_many_lines, reason = "the phases of a rollout, in order")]
fn phases(
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
) {
    let c = &task.config;
    let sb = run.sandbox;
    let image_user = image.meta.user.clone().filter(|u| !u.is_empty());
    let agent_user = c.agent_user.clone().or_else(|| image_user.clone());
    let verifier_user = c.verifier_user.clone().or_else(|| image_user.clone());
    let infra = |r: &mut RolloutResult, what: &str, e: &dyn std::fmt::Display| {
        if !interrupted(ctx, r) {
            r.fail(ErrorClass::Infra, format!("{what}: {e}"));
        }
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
    if let Some(w) = &c.workdir {
        if image.meta.workdir.as_deref() != Some(w.as_str()) {
            match run.exec(
                "/",
                vec!["mkdir".into(), "-p".into(), w.clone()],
                run.base_env.clone(),
                None,
                Duration::from_secs(30),
                env_net,
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
                    return;
                }
                Err(e) => return infra(r, "creating the workdir", &e),
            }
        }
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
                return;
            }
        }
    }
    if interrupted(ctx, r) {
        return;
    }
    let t = Instant::now();
    if let Err(e) = sb.upload(&task.instruction, "/instruction.md", agent_user.as_deref()) {
        return infra(r, "uploading instruction.md", &e);
    }

    // The agent.
    let agent = match &ctx.opts.agent {
        Agent::Nop => None,
        Agent::Oracle => {
            let Some(solution) = &task.solution else {
                r.fail(ErrorClass::AgentFailed, "the task has no solution");
                return;
            };
            if let Err(e) = sb.upload(solution, "/solution", agent_user.as_deref()) {
                return infra(r, "uploading the solution", &e);
            }
            Some((
                vec!["bash".to_string(), "/solution/solve.sh".to_string()],
                with_env(&run.base_env, &[&env.solution]),
            ))
        }
        Agent::Command(cmd) => {
            let instruction = match std::fs::read_to_string(&task.instruction) {
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
            return;
        }
        let ran = run.measured_exec(
            &run.cwd,
            argv,
            agent_env,
            agent_user.clone(),
            c.agent_timeout,
            agent_net,
            &out,
        );
        match ran {
            Ok((st, took, used)) => {
                r.timings_ms.agent = ms(took);
                r.agent_run = Some(phase(&st, took, agent_net, &agent_user, &used));
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
                    return;
                }
                note_oom_survived(r, "agent", &used);
                match st {
                    ExecStatus::Exited {
                        timed_out: true, ..
                    } => r.fail(
                        ErrorClass::AgentTimeout,
                        format!(
                            "the agent ran past its time limit ({} s) and was killed",
                            c.agent_timeout.as_secs_f64()
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

    // The verifier.
    if interrupted(ctx, r) {
        return;
    }
    let t = Instant::now();
    // verifier/ afresh: whatever the agent left there (reward files, a
    // symlink out of the rollout dir, planted files) goes, unfollowed.
    let remove_inside = |p: &str| sb.remove(p).map_err(|e| e.to_string());
    match rollout_dir::remake_verifier(logs.dir.as_fd(), &remove_inside) {
        Ok(remade) => {
            logs.verifier = remade.dir;
            r.notes.extend(remade.notes);
        }
        Err(e) => {
            if !interrupted(ctx, r) {
                r.fail(ErrorClass::VerifierFailed, e);
            }
            return;
        }
    }
    // The verifier's log, made while the new dir is the caller's.
    let out = match rollout_dir::create_file(logs.verifier.as_fd(), "test-stdout.txt") {
        Ok(f) => f,
        Err(e) => return infra(r, "creating verifier/test-stdout.txt", &e),
    };
    if let Some(u) = &verifier_user {
        if let Err(e) = sb.chown("/logs/verifier", u) {
            return infra(r, &format!("giving /logs/verifier to the user {u}"), &e);
        }
    }
    if let Err(e) = sb.upload(&task.tests, "/tests", verifier_user.as_deref()) {
        return infra(r, "uploading the tests", &e);
    }
    r.timings_ms.setup += ms(t.elapsed());
    let ran = run.measured_exec(
        &run.cwd,
        vec!["bash".to_string(), "/tests/test.sh".to_string()],
        with_env(&run.base_env, &[&env.verifier]),
        verifier_user.clone(),
        c.verifier_timeout,
        verifier_net,
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
                    c.verifier_timeout.as_secs_f64()
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
    match reward::read(logs.dir.as_fd(), &ctx.ids) {
        Reward::Found { value, source, all } => {
            r.reward = Some(value);
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

/// What the sandbox used while one phase's command ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PhaseUsage {
    /// CPU time of the phase (None: the host could not tell).
    cpu_ns: Option<u64>,
    /// The phase's memory peak.
    memory_peak: Option<u64>,
    /// Processes killed for memory during the phase.
    oom_kills: u64,
    /// ... and since the sandbox started.
    oom_total: u64,
}

impl PhaseUsage {
    fn between(before: &Usage, after: &Usage) -> PhaseUsage {
        PhaseUsage {
            cpu_ns: after
                .cpu_ns
                .zip(before.cpu_ns)
                .map(|(a, b)| a.saturating_sub(b)),
            memory_peak: after.memory_peak,
            oom_kills: after.oom_kills.saturating_sub(before.oom_kills),
            oom_total: after.oom_kills,
        }
    }
}

/// The exit code of a command killed by SIGKILL.
const KILLED: i32 = 128 + 9;

/// Whether a phase's command died of the memory limit: it failed after a
/// process of the sandbox was killed for memory during the phase, or it
/// was itself killed (SIGKILL) in a sandbox that has had such kills. A
/// command that carried on to exit 0, or ran into its time limit, did not
/// (a note says what was killed).
fn killed_for_memory(st: &ExecStatus, used: &PhaseUsage) -> bool {
    match st {
        ExecStatus::Exited {
            timed_out: true, ..
        }
        | ExecStatus::Exited { code: 0, .. } => false,
        ExecStatus::Exited { code, .. } => {
            used.oom_kills > 0 || (*code == KILLED && used.oom_total > 0)
        }
        ExecStatus::Failed { .. } => used.oom_kills > 0,
    }
}

/// The error of a phase killed for memory: the limit, what enforced it,
/// what was killed, what to do.
fn oom_message(
    phase: &str,
    st: &ExecStatus,
    used: &PhaseUsage,
    limits: &RolloutLimits,
    e: &sifbox_engine::limits::Enforcement,
) -> String {
    let limit = limits
        .memory_mb
        .map_or_else(|| "its".to_string(), |m| format!("its {m} MiB"));
    let how = e
        .how("memory")
        .map(|h| format!(", enforced by {}", how_name(h)))
        .unwrap_or_default();
    let peak = used
        .memory_peak
        .map(|p| format!(", peak {} MiB", p.div_ceil(1 << 20)))
        .unwrap_or_default();
    let ended = match st {
        ExecStatus::Exited { code, .. } if *code == KILLED => "it was killed (SIGKILL)".to_string(),
        ExecStatus::Exited { code, .. } => format!("it exited with code {code}"),
        ExecStatus::Failed { code, message } => format!("it could not start ({code}): {message}"),
    };
    let killed = if used.oom_kills > 0 {
        format!("{} process(es) of the sandbox killed", used.oom_kills)
    } else {
        format!(
            "{} process(es) of the sandbox killed so far",
            used.oom_total
        )
    };
    format!(
        "the {phase} went over {limit} memory limit{how}: {killed}{peak}, and {ended}; give the task more memory ([environment] memory_mb, or --override-memory-mb)"
    )
}

/// A note when processes were killed for memory during a phase whose
/// command carried on.
fn note_oom_survived(r: &mut RolloutResult, phase: &str, used: &PhaseUsage) {
    if used.oom_kills > 0 {
        r.notes.push(format!(
            "{} process(es) of the sandbox were killed for going over the memory limit during the {phase}, which carried on",
            used.oom_kills
        ));
    }
}

/// The engine's name of a mechanism (`cgroup_v2`, `watchdog`...).
fn how_name(h: sifbox_engine::limits::How) -> String {
    serde_json::to_value(h)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{h:?}"))
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

/// Runs the healthcheck until it passes (Docker's rules: failures within
/// the start period do not count; `retries` failures after it do).
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
        let argv = if run.env_scripts {
            sifbox_engine::request::with_env_scripts(&h.argv)
        } else {
            h.argv.clone()
        };
        let req = ExecRequest {
            argv,
            env: run.base_env.clone(),
            cwd: run.cwd.clone(),
            default_home: true,
            timeout_ms: Some(ms(h.timeout).max(1)),
            isolate_net: run.sandbox_net == NetMode::Host && net == NetMode::None,
            ..ExecRequest::default()
        };
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
        if started.elapsed() >= h.start_period {
            failures += 1;
            if failures >= h.retries {
                return Err(format!(
                    "the healthcheck failed {failures} times; last: {last}"
                ));
            }
        }
        std::thread::sleep(h.interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sifbox_engine::limits::{Applied, Enforcement, How};

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
