//! `sifbox eval`: runs agent benchmark tasks (Harbor/BenchFlow layout) in
//! sandboxes and sums up their rewards. The work is sifbox-eval's; this is
//! its flags, Ctrl-C, and the display.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sifbox_engine::spec::NetMode;
use sifbox_eval::result::{RolloutResult, Status};
use sifbox_eval::runner::{self, Agent, EvalOptions, JobInfo, Observer};
use sifbox_eval::{cancel::Cancel, task};

use crate::cmd::options::{bad, value_of, NetArg, ProgressArg, UsernsArg};

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// The agent: `oracle` (the task's solution), `nop` (nothing), or a
    /// shell command run in the sandbox with the instruction at
    /// /instruction.md and in $SIFBOX_INSTRUCTION (`cmd:NAME` for a
    /// command without arguments).
    #[arg(long, default_value = "oracle", value_name = "oracle|nop|CMD")]
    pub agent: String,
    /// Rollouts per task.
    #[arg(short = 'k', long, default_value_t = 1, value_name = "K")]
    pub attempts: u32,
    /// Rollouts at the same time (default: the number of CPUs).
    #[arg(short = 'j', long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Where results go: OUT/JOB/TASK__ATTEMPT/.
    #[arg(short = 'o', long, default_value = "jobs", value_name = "DIR")]
    pub out: PathBuf,
    /// The job's name (default: the UTC time); needed by --resume.
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Run only the tasks whose name matches GLOB (repeatable: any).
    #[arg(long, value_name = "GLOB")]
    pub filter: Vec<String>,
    /// Every phase's network, whatever the tasks say (default: the
    /// task's network_mode).
    #[arg(long, value_enum)]
    pub net: Option<NetArg>,
    /// Continue the job --job NAME: keep its finished rollouts, run the rest.
    #[arg(long)]
    pub resume: bool,
    /// Rebuild the environments, ignoring the build cache.
    #[arg(long)]
    pub force_build: bool,
    /// Make a host path visible in every rollout's sandbox, for datasets
    /// and caches: SRC[:DST[:ro|rw]] (repeatable).
    #[arg(long, value_name = "SRC:DST[:ro]")]
    pub bind: Vec<String>,
    /// Show the host's CA bundle (default
    /// /etc/ssl/certs/ca-certificates.crt) to build steps, agents and
    /// verifiers at /run/sifbox/host-ca.crt, with SSL_CERT_FILE,
    /// REQUESTS_CA_BUNDLE, PIP_CERT and the like pointing at it, for sites
    /// whose HTTPS goes through an intercepting proxy (also:
    /// SIFBOX_HOST_CA=1). Another file goes as `--host-ca=FILE`.
    #[arg(long = "host-ca", value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = sifbox_launch::host_ca::DEFAULT_CA)]
    pub host_ca: Option<PathBuf>,
    /// How ids are mapped in the sandboxes and build steps.
    #[arg(long, value_enum, default_value = "auto")]
    pub userns: UsernsArg,
    /// The seccomp policy and user-namespace opt-in of every rollout. A
    /// task's `[metadata.sifbox] allow_userns = true` only asks: the caller
    /// grants it (here, or to named tasks with --allow-userns-task).
    #[command(flatten)]
    pub confine: crate::cmd::options::ConfineArgs,
    /// Let the commands of the task NAME create user namespaces (as
    /// --allow-userns does for every task); repeatable.
    #[arg(long, value_name = "NAME")]
    pub allow_userns_task: Vec<String>,
    /// Let `${NAME}` in task.toml env values see your environment's NAME
    /// (repeatable). A task sees no other variable of yours: without this,
    /// `${NAME}` counts as unset (its `:-default`, else an error).
    #[arg(long, value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// Let a task's `docker_image = "PATH.sif"` name a SIF file beneath
    /// DIR (repeatable; also `[eval] image_dirs` in the config file).
    /// Without it a task's SIF must be beneath a TASK_OR_DIR given here.
    #[arg(long, value_name = "DIR")]
    pub allow_image_dir: Vec<PathBuf>,
    /// Every task's CPUs, replacing task.toml's `cpus` (Harbor's flag;
    /// fractions allowed).
    #[arg(long, value_name = "N")]
    pub override_cpus: Option<f64>,
    /// Every task's memory limit in MiB, replacing `memory_mb` (default:
    /// the task's, else 4096); a tmpfs writable layer's files count in it.
    #[arg(long, value_name = "MB")]
    pub override_memory_mb: Option<u64>,
    /// Every task's writable layer in MiB, replacing `storage_mb`
    /// (default: the task's, else 10240).
    #[arg(long, value_name = "MB")]
    pub override_storage_mb: Option<u64>,
    /// Where the writable layers live: `disk` (an ext4 file system of
    /// storage_mb in $SIFBOX_SCRATCH, else <store>/scratch: host root
    /// only), `tmpfs` (memory, counted in the memory limit), or `auto`
    /// (disk where the host allows it).
    #[arg(long, value_enum, default_value = "auto")]
    pub layer: LayerArg,
    /// Every task's GPUs, replacing `gpus` (recorded; sifbox gives
    /// sandboxes no GPU).
    #[arg(long, value_name = "N")]
    pub override_gpus: Option<u64>,
    /// Processes and threads of a rollout at the same time (default 4096).
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// End every process the agent left running before the verifier runs
    /// (recorded in result.json as `ended_agent_processes`). Off by
    /// default, as in Harbor: an agent may start a service the verifier
    /// probes. Without it, what the agent left still cannot write the
    /// verifier's /logs/verifier (see SECURITY.md).
    #[arg(long)]
    pub end_agent_processes: bool,
    /// Output on stderr: auto (a live line on a terminal, else plain),
    /// plain (a line per event), quiet.
    #[arg(long, default_value = "auto", value_name = "auto|plain|quiet")]
    pub progress: String,
    /// Task directories, or directories of them.
    #[arg(value_name = "TASK_OR_DIR", required = true)]
    pub tasks: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LayerArg {
    Auto,
    Tmpfs,
    Disk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Live,
    Plain,
    Quiet,
}

/// The display: plain lines, or a live status line on a terminal.
#[derive(Debug)]
struct Display {
    mode: Mode,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    job: String,
    to_run: usize,
    done: usize,
    failed: usize,
    reward_sum: f64,
    rewarded: usize,
    running: BTreeSet<String>,
    building: BTreeSet<String>,
    started: Option<Instant>,
    /// Whether a status line is on the screen.
    line: sifbox_build::progress::StatusLine,
}

fn secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

impl Display {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Prints a line (above the status line when live).
    fn line(&self, st: &mut State, text: &str) {
        if self.mode == Mode::Quiet {
            return;
        }
        st.line.println(text);
        if self.mode == Mode::Live {
            self.status(st);
        }
    }

    fn status(&self, st: &mut State) {
        let Some(started) = st.started else {
            return;
        };
        let elapsed = started.elapsed();
        let mut text = format!(
            "eval {}: {}/{} done, {} running, {} failed",
            st.job,
            st.done,
            st.to_run,
            st.running.len(),
            st.failed
        );
        if st.rewarded > 0 {
            #[allow(clippy::cast_precision_loss, reason = "small counts")]
            let mean = st.reward_sum / st.rewarded as f64;
            text.push_str(&format!(", mean reward {mean:.3}"));
        }
        if !st.building.is_empty() {
            let b: Vec<&str> = st.building.iter().map(String::as_str).collect();
            text.push_str(&format!(", building {}", b.join(" ")));
        }
        if st.done > 0 && st.done < st.to_run {
            let per = elapsed.as_secs_f64() / st.done as f64;
            #[allow(clippy::cast_precision_loss, reason = "small counts")]
            let left = Duration::from_secs_f64(per * (st.to_run - st.done) as f64);
            text.push_str(&format!(", ETA {}", secs(left)));
        }
        text.push_str(&format!(" [{}]", secs(elapsed)));
        st.line.show(&text);
    }

    fn tick(&self) {
        if self.mode == Mode::Live {
            let mut st = self.lock();
            self.status(&mut st);
        }
    }

    fn clear(&self) {
        self.lock().line.clear();
    }
}

impl Observer for Display {
    fn job_started(&self, job: &JobInfo) {
        let mut st = self.lock();
        st.job = job.job.clone();
        st.to_run = job.to_run;
        st.started = Some(Instant::now());
        let kept = if job.kept > 0 {
            format!(", {} kept from before", job.kept)
        } else {
            String::new()
        };
        let text = format!(
            "eval {}: {} rollouts to run on {} workers{kept}; results in {}",
            job.job,
            job.to_run,
            job.workers,
            job.dir.display()
        );
        self.line(&mut st, &text);
    }

    fn build_started(&self, task: &str) {
        let mut st = self.lock();
        st.building.insert(task.to_string());
        if self.mode == Mode::Plain {
            self.line(&mut st, &format!("building {task}"));
        } else if self.mode == Mode::Live {
            self.status(&mut st);
        }
    }

    fn build_finished(&self, task: &str, error: Option<&str>, took: Duration) {
        let mut st = self.lock();
        st.building.remove(task);
        let text = match error {
            // On a terminal, a build from the cache is not news.
            None if self.mode == Mode::Live && took < Duration::from_secs(1) => {
                self.status(&mut st);
                return;
            }
            None => format!("built {task} in {:.1} s", took.as_secs_f64()),
            Some(e) => format!("build of {task} failed: {e}"),
        };
        self.line(&mut st, &text);
    }

    fn rollout_started(&self, rollout: &str) {
        let mut st = self.lock();
        st.running.insert(rollout.to_string());
        if self.mode == Mode::Live {
            self.status(&mut st);
        }
    }

    fn rollout_finished(&self, r: &RolloutResult) {
        let mut st = self.lock();
        st.running.remove(&r.rollout);
        st.done += 1;
        if r.status != Status::Ok {
            st.failed += 1;
        }
        // As the summary counts: finished rollouts, no reward as 0.
        if r.status.is_final() {
            st.reward_sum += r.reward.unwrap_or(0.0);
            st.rewarded += 1;
        }
        let reward = r.reward.map_or_else(|| "-".to_string(), |x| format!("{x}"));
        let status = match (r.status, r.error_class) {
            (Status::Ok, _) => "ok".to_string(),
            (Status::Interrupted, _) => "interrupted".to_string(),
            (_, Some(c)) => c.as_str().to_string(),
            (s, None) => format!("{s:?}").to_lowercase(),
        };
        let error = match (&r.error, r.status) {
            (Some(e), s) if s != Status::Interrupted => {
                let short: String = e.chars().take(160).collect();
                format!(": {short}")
            }
            _ => String::new(),
        };
        let text = format!(
            "[{}/{}] {} reward {reward} {status} {:.1} s{error}",
            st.done,
            st.to_run,
            r.rollout,
            r.timings_ms.total as f64 / 1000.0
        );
        self.line(&mut st, &text);
    }
}

fn usage(what: String, why: &str, fix: &str) -> crate::error::CliError {
    bad(&what, why, fix)
}

/// What task.toml says that sifbox ignores or cannot honour, before
/// anything runs (also in each rollout's result.json).
fn warn_tasks(tasks: &[task::Task]) {
    for t in tasks {
        for w in &t.config.warnings {
            eprintln!("sifbox: warning: {w}");
        }
        for u in &t.config.unsupported {
            eprintln!(
                "sifbox: warning: task {}: {u}; its rollouts end unsupported",
                t.name
            );
        }
    }
}

/// `docker_image`: the store, else a registry; a `.sif` file, imported.
pub fn run(a: EvalArgs) -> crate::error::Result<ExitCode> {
    let progress = match value_of::<ProgressArg>("--progress", &a.progress)? {
        ProgressArg::Auto if rustix::termios::isatty(std::io::stderr()) => Mode::Live,
        ProgressArg::Auto | ProgressArg::Plain => Mode::Plain,
        ProgressArg::Quiet => Mode::Quiet,
    };
    task::check_filters(&a.filter)?;
    let config = sifbox_launch::UserConfig::load();
    let sandbox_ca = sifbox_launch::host_ca::for_sandboxes(a.host_ca.as_deref())?;
    let binds = a
        .bind
        .iter()
        .map(|b| sifbox_engine::spec::Bind::parse(b))
        .collect::<Result<Vec<_>, _>>()?;
    let agent = Agent::parse(&a.agent)?;
    let tasks = task::discover(&a.tasks).and_then(|t| task::select(t, &a.filter))?;
    warn_tasks(&tasks);
    for name in &a.pass_env {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(usage(
                format!("--pass-env {name}"),
                "not a variable name",
                "give the name alone (letters, digits, _), not NAME=VALUE",
            ));
        }
    }
    let image_dirs = {
        let mut allowed = config.eval_image_dirs()?;
        allowed.extend(a.allow_image_dir.iter().cloned());
        task::ImageDirs::new(&a.tasks, &allowed).map_err(|e| {
            usage(
                format!("image dir {e}"),
                "cannot resolve this directory",
                "name an existing directory (in --allow-image-dir or [eval] image_dirs)",
            )
        })?
    };
    // A task's SIF is read only from beneath the dirs given (up front:
    // nothing runs when one is not).
    if let Err((name, what, why)) = image_dirs.check(&tasks) {
        return Err(usage(
            format!("task {name}: {what}"),
            &why,
            "keep the SIF file beneath the directory given to eval, or allow its directory with --allow-image-dir DIR (or [eval] image_dirs in ~/.config/sifbox/config.toml)",
        ));
    }
    for name in &a.allow_userns_task {
        if !tasks.iter().any(|t| &t.name == name) {
            return Err(usage(
                format!("--allow-userns-task {name}"),
                "no task of that name in the suite",
                "name a task of the suite by its name (its directory's name, as result.json's `task` gives it)",
            ));
        }
    }
    let store = crate::cmd::image::open_store()?;
    let exe = sifbox_launch::current_exe()?;
    let jobs = a.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(std::num::NonZeroUsize::get)
            .unwrap_or(1)
    });
    let opts = EvalOptions {
        agent,
        attempts: a.attempts,
        jobs,
        out: a.out.clone(),
        job: a.job.clone(),
        net: a.net.map(NetMode::from),
        resume: a.resume,
        force_build: a.force_build,
        exe,
        userns: a.userns.into(),
        host_ca: sifbox_launch::host_ca::for_builds(a.host_ca.as_deref(), config.build_host_ca()),
        sandbox_host_ca: sandbox_ca,
        binds,
        seccomp: a.confine.confinement().seccomp,
        allow_userns: a.confine.allow_userns,
        allow_userns_tasks: a.allow_userns_task.clone(),
        pass_env: a.pass_env.clone(),
        limits: task::Overrides {
            cpus: a.override_cpus,
            memory_mb: a.override_memory_mb,
            storage_mb: a.override_storage_mb,
            gpus: a.override_gpus,
            pids: a.pids,
        },
        layer: match a.layer {
            LayerArg::Auto => sifbox_eval::runner::Layer::Auto,
            LayerArg::Tmpfs => sifbox_eval::runner::Layer::Tmpfs,
            LayerArg::Disk => sifbox_eval::runner::Layer::Disk,
        },
        end_agent_processes: a.end_agent_processes,
    };

    // Ctrl-C, SIGTERM, SIGHUP: kill every sandbox of the job (again and
    // again, so that none started meanwhile survives) until the workers
    // have stopped and removed them.
    let cancel = Arc::new(Cancel::new());
    let finished = Arc::new(AtomicBool::new(false));
    let display = Arc::new(Display {
        mode: progress,
        state: Mutex::new(State::default()),
    });
    let interrupts = {
        let handled = AtomicBool::new(false);
        let cancel = Arc::clone(&cancel);
        let finished = Arc::clone(&finished);
        let display = Arc::clone(&display);
        crate::cmd::signals::Interrupts::watch(move |sig| {
            // The first signal ends the job; the handler keeps killing
            // until the workers are done, so later ones change nothing.
            if handled.swap(true, Ordering::SeqCst) {
                return;
            }
            {
                let mut st = display.lock();
                display.line(
                    &mut st,
                    "interrupted: stopping every sandbox of the job and writing what finished",
                );
            }
            cancel.cancel(sig);
            while !finished.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                cancel.kill_all();
            }
        })?
    };
    if progress == Mode::Live {
        let display = Arc::clone(&display);
        let finished = Arc::clone(&finished);
        std::thread::spawn(move || {
            while !finished.load(Ordering::SeqCst) {
                display.tick();
                std::thread::sleep(Duration::from_millis(250));
            }
        });
    }

    // FROM lines resolve as `sifbox build` resolves them; a task's
    // `docker_image` may also be pulled.
    let from = |r: &str| crate::cmd::build::resolve_image(&store, r);
    let task_image = |r: &str| crate::cmd::build::resolve_image(&store, r);
    // A task's SIF: opened beneath the dirs allowed (again: the check
    // above was before anything ran) and imported through that fd.
    let task_sif = |p: &std::path::Path| {
        let bad = |why: String| {
            sifbox_build::error::BuildError::bad(
                format!("image {}", p.display()),
                why,
                "keep the SIF file beneath the directory given to eval, or allow its directory with --allow-image-dir DIR",
            )
        };
        let file = image_dirs.open(p).map_err(bad)?;
        Ok(sifbox_image::import::import_sif_file(&store, &file, p)?.digest)
    };
    let outcome = runner::run(
        &store,
        &tasks,
        &opts,
        &runner::Resolvers {
            from: &from,
            image: &task_image,
            sif: &task_sif,
        },
        display.as_ref(),
        &cancel,
    );
    finished.store(true, Ordering::SeqCst);
    interrupts.stop();
    display.clear();
    let outcome = outcome?;
    out!("{}", outcome.summary.table());
    let _ = std::io::stdout().flush();
    if progress != Mode::Quiet {
        eprintln!(
            "results: {} (summary.json, TASK__N/result.json)",
            outcome.dir.display()
        );
    }
    if outcome.interrupted {
        return Err(crate::error::CliError::Interrupted {
            signal: cancel.signal(),
            report: None,
        });
    }
    if outcome.summary.infra_errors > 0 {
        return Err(crate::error::CliError::RolloutsFailed {
            count: outcome.summary.infra_errors,
            job: outcome.summary.job.clone(),
        });
    }
    Ok(ExitCode::SUCCESS)
}
