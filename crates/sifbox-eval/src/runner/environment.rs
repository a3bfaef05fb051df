//! The environment of a task: its image, built from its Dockerfile (with
//! a build log and the build time limit) or resolved from its
//! `docker_image`, once per job and shared by the rollouts that need it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sifbox_build::build::BuildOptions;
use sifbox_build::progress::Progress;
use sifbox_image::store::Digest;
use sifbox_registry::Resolved;

use crate::cancel;
use crate::result::now_rfc3339;
use crate::task::{EnvSource, SeparateVerifier, Task};

use super::Ctx;

/// An environment's image, ready to run: the stored image opened as
/// every command opens one (`sifbox_registry::resolve::open`: its pin for
/// the job's life, which its rollouts' supervisors hold too, its metadata
/// and root file system, and the one rule for a foreign image), read
/// through `Deref`.
#[derive(Debug)]
pub(super) struct Image {
    pub(super) digest: Digest,
    pub(super) resolved: Resolved,
    pub(super) log: Option<PathBuf>,
}

impl std::ops::Deref for Image {
    type Target = Resolved;

    fn deref(&self) -> &Resolved {
        &self.resolved
    }
}

/// Why an environment has no image.
#[derive(Debug, Clone)]
pub(super) struct NoImage {
    pub(super) message: String,
    pub(super) log: Option<PathBuf>,
    pub(super) interrupted: bool,
}

pub(super) type Slot = Arc<OnceLock<std::result::Result<Arc<Image>, NoImage>>>;

/// Whose image: the agent's (the task's environment) or a separate
/// verifier's. A built one is tagged, and logged, by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Agent,
    Verifier,
}

impl Role {
    /// `eval/TASK`, or `eval/TASK-verifier`.
    fn tag(self, task: &Task) -> String {
        match self {
            Role::Agent => format!("eval/{}", task.name.to_lowercase()),
            Role::Verifier => format!("eval/{}-verifier", task.name.to_lowercase()),
        }
    }

    /// In `builds/`: `TASK.log`, or `TASK.verifier.log`.
    fn log_name(self, task: &Task) -> String {
        match self {
            Role::Agent => format!("{}.log", task.name),
            Role::Verifier => format!("{}.verifier.log", task.name),
        }
    }

    /// What the progress lines call the build.
    fn shown(self, task: &Task) -> String {
        match self {
            Role::Agent => task.name.clone(),
            Role::Verifier => format!("{} (verifier)", task.name),
        }
    }
}

impl Ctx<'_> {
    /// The image of `task`'s environment: built (or resolved) by the first
    /// rollout that asks, shared by the others.
    pub(super) fn image(&self, task: &Task) -> std::result::Result<Arc<Image>, NoImage> {
        self.image_of(task, &task.environment, Role::Agent)
    }

    /// The image of `task`'s separate verifier (`v`), made as the agent's.
    pub(super) fn verifier_image(
        &self,
        task: &Task,
        v: &SeparateVerifier,
    ) -> std::result::Result<Arc<Image>, NoImage> {
        self.image_of(task, &v.environment, Role::Verifier)
    }

    fn image_of(
        &self,
        task: &Task,
        source: &EnvSource,
        role: Role,
    ) -> std::result::Result<Arc<Image>, NoImage> {
        let key = match source {
            EnvSource::Dockerfile { context } => format!("build:{}", context.display()),
            EnvSource::Image(r) => format!("image:{r}"),
            EnvSource::Sif(p) => format!("sif:{}", p.display()),
        };
        let slot: Slot = Arc::clone(
            self.images
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(key)
                .or_default(),
        );
        let image = slot
            .get_or_init(|| self.make_image(task, source, role).map(Arc::new))
            .clone();
        self.sched.ready(&task.name);
        image
    }

    fn make_image(
        &self,
        task: &Task,
        source: &EnvSource,
        role: Role,
    ) -> std::result::Result<Image, NoImage> {
        let fail = |message: String, log: Option<PathBuf>| NoImage {
            message,
            log,
            interrupted: self.cancel.is_cancelled(),
        };
        let (digest, log) = match source {
            EnvSource::Image(reference) => {
                let d = (self.resolve.image)(reference)
                    .map_err(|e| fail(format!("image {reference}: {e}"), None))?;
                (d, None)
            }
            EnvSource::Sif(path) => {
                let d = (self.resolve.sif)(path)
                    .map_err(|e| fail(format!("image {}: {e}", path.display()), None))?;
                (d, None)
            }
            EnvSource::Dockerfile { context } => {
                let d = self.build(task, context, role)?;
                (d.0, Some(d.1))
            }
        };
        let reference = match source {
            EnvSource::Image(r) => r.clone(),
            EnvSource::Sif(p) => p.display().to_string(),
            EnvSource::Dockerfile { .. } => role.tag(task),
        };
        let resolved = sifbox_registry::resolve::open(self.store, digest.clone(), &reference)
            .map_err(|e| fail(format!("image {digest}: {}", e.kind), log.clone()))?;
        Ok(Image {
            digest,
            resolved,
            log,
        })
    }

    /// Builds `context` with its log in `builds/TASK.log`, within the
    /// task's build time limit.
    fn build(
        &self,
        task: &Task,
        context: &Path,
        role: Role,
    ) -> std::result::Result<(Digest, PathBuf), NoImage> {
        let builds = self.dir.join("builds");
        let log = builds.join(role.log_name(task));
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
            // The job's Cancel kills the step's sandbox; the build then fails.
            interrupted: None,
            // Each task's cache mounts are its own, `id=` or not: a task
            // plants nothing in another's (the audit: a wheel).
            cache_scope: Some(format!("eval task {}", task.dir.display())),
            layer_size: sifbox_build::layers::DEFAULT_LAYER_BYTES,
        };
        let shown = role.shown(task);
        self.observer.build_started(&shown);
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
                let tag = role.tag(task);
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
            &shown,
            result.as_ref().err().map(|e| e.message.as_str()),
            took,
        );
        result
    }
}
