//! The build executor: walks a [`Plan`] stage by stage, running each step
//! in a sandbox over the layers of the steps before it, with a cache key per
//! step, and turns the target stage into a store image.

mod copy;
mod export;
mod run;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest as _, Sha256};
use sifbox_engine::spec::UsernsMode;
use sifbox_image::import;
use sifbox_image::meta::ImageMeta;
use sifbox_image::store::{Digest, Store};

use crate::context::{clean_abs, Context};
use crate::dockerfile::{self, Command, Healthcheck, Instr, Instruction};
use crate::error::{BuildError, Result};
use crate::layers::{chain_key, FsState, Layers, StepOptions};
use crate::plan::{self, Base, Plan, PlanOptions, PlannedStage, StageEnv};
use crate::progress::Progress;
pub use sifbox_launch::host_ca::HOST_CA_PATH;

/// The default shell of shell-form commands.
const DEFAULT_SHELL: [&str; 2] = ["/bin/sh", "-c"];

/// What to build and how.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The build context directory.
    pub context: PathBuf,
    /// The Dockerfile (default: `CONTEXT/Dockerfile`).
    pub dockerfile: Option<PathBuf>,
    /// `--build-arg K=V`.
    pub build_args: BTreeMap<String, String>,
    /// `--secret id=ID,src=PATH`.
    pub secrets: BTreeMap<String, PathBuf>,
    /// `--target`.
    pub target: Option<String>,
    /// `--no-cache`.
    pub no_cache: bool,
    /// The host's CA bundle, made visible to build steps (`--host-ca`).
    pub host_ca: Option<PathBuf>,
    /// The sifbox binary that serves build sandboxes.
    pub exe: PathBuf,
    /// How ids are mapped in build steps: `full` (the caller's subordinate
    /// range: real ownership), `single` (one id; `chown` and `set*id` made
    /// to succeed without effect), `auto` (full when possible).
    pub userns: UsernsMode,
    /// What RUN steps may ask of the kernel (seccomp policy, nested user
    /// namespaces).
    pub confinement: sifbox_engine::spec::Confinement,
    /// Set by whoever stops the build (Ctrl-C): no step starts after it is
    /// set, and the build ends with [`BuildError::Interrupted`]. (The step
    /// running when it is set must be stopped by its caller:
    /// `sifbox_engine::supervisor::kill_sandboxes_of_thread`.)
    pub interrupted: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// What `RUN --mount=type=cache` dirs are kept apart by. `None` (`sifbox
    /// build`): a mount without `id=` gets a dir of its build context (its
    /// canonical path) and target, one with `id=` the store-wide dir of that
    /// id, as the Dockerfile's author asked. `Some(scope)` (eval: the task):
    /// every cache mount, `id=` or not, gets a dir of that scope, so that no
    /// task plants a file in another's cache.
    pub cache_scope: Option<String>,
    /// The most one step's layer may hold, in bytes (`--layer-size`; see
    /// `Layers::with_layer_size`).
    pub layer_size: u64,
}

/// What a build made.
#[derive(Debug, Clone)]
pub struct Built {
    pub digest: Digest,
    /// Steps run and steps taken from the cache.
    pub steps_run: usize,
    pub steps_cached: usize,
    /// The image itself came from the cache (nothing changed).
    pub image_cached: bool,
}

/// Turns an image reference (`FROM`, `COPY --from`) into a store image,
/// pulling it when needed.
pub type ImageResolver<'a> = dyn Fn(&str) -> Result<Digest> + 'a;

/// The result of a stage: its file system and its config.
#[derive(Debug, Clone)]
struct StageResult {
    state: FsState,
    meta: ImageMeta,
    /// The time of the stage's base image (its squashfs time; 0 for
    /// scratch): without SOURCE_DATE_EPOCH, the clamp for the times of
    /// what the stage's steps wrote (see [`Builder::clamp`]).
    time: u32,
    /// The stored image the stage's file system started from (`None` for
    /// scratch): while `state` is still that image's, with no layer on
    /// it, the export remakes the image from that one's SIF.
    image: Option<Digest>,
}

struct Builder<'a> {
    store: &'a Store,
    layers: Layers<'a>,
    opts: &'a BuildOptions,
    ctx: Context,
    file: String,
    resolve: &'a ImageResolver<'a>,
    progress: Arc<Progress>,
    fake_ids: bool,
    steps_run: usize,
    steps_cached: usize,
    total: usize,
    done: usize,
    /// Images named by `COPY --from` and `RUN --mount=from=`, by reference.
    images: HashMap<String, StageResult>,
    /// The store's pins of the images the build starts from or copies
    /// from, for the build's life: `image rm` leaves them alone meanwhile.
    pins: Vec<sifbox_image::store::ImagePin>,
    /// Stage names (lower case) to their indexes.
    stage_names: HashMap<String, usize>,
    /// Whether the stage being built set CMD itself.
    cmd_in_stage: bool,
    /// The build's own dir in the store's `tmp/` (not the host's /tmp),
    /// where its scratch dirs go ([`Builder::scratch_dir`]): locked while
    /// the build lives, so a build killed with SIGKILL leaves nothing that
    /// `sifbox gc` does not remove.
    scratch: sifbox_image::store::WorkDir,
}

impl Drop for Builder<'_> {
    /// The build's scratch goes with it, what its steps' other ids wrote
    /// there too (a tmpfs mount's files: removed from a sandbox with the
    /// same id mapping when the caller cannot remove them on the host).
    fn drop(&mut self) {
        let _ = self
            .layers
            .remove_trees(&[self.scratch.path().to_path_buf()]);
    }
}

impl Builder<'_> {
    /// A fresh scratch dir (named `PREFIX.XXXXXX`) in the build's own dir,
    /// removed when the returned handle is dropped.
    fn scratch_dir(&self, prefix: &str) -> Result<tempfile::TempDir> {
        let under = self.scratch.path();
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(under)
            .map_err(|e| BuildError::io(under, e))
    }
}

/// Builds the Dockerfile of `opts` into a store image.
pub fn build(
    store: &Store,
    opts: &BuildOptions,
    resolve: &ImageResolver<'_>,
    progress: Arc<Progress>,
) -> Result<Built> {
    let ctx = Context::open(&opts.context)?;
    let df_path = opts
        .dockerfile
        .clone()
        .unwrap_or_else(|| ctx.root().join("Dockerfile"));
    let from_stdin = df_path == Path::new("-");
    let file = if from_stdin {
        "<stdin>".to_string()
    } else {
        df_path.display().to_string()
    };
    let unreadable = |why: String| {
        BuildError::bad(
            format!("Dockerfile {file}"),
            why,
            "pass the Dockerfile with -f FILE, or put one named Dockerfile in the context",
        )
    };
    let bytes = if from_stdin {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| unreadable(e.to_string()))?;
        b
    } else if opts.dockerfile.is_some() {
        // The caller's own path.
        std::fs::read(&df_path).map_err(|e| unreadable(e.to_string()))?
    } else {
        // The context's: looked up inside it, as BuildKit does.
        ctx.read_file("Dockerfile")?
            .ok_or_else(|| unreadable("No such file or directory (os error 2)".into()))?
    };
    let df = dockerfile::parse(&bytes).map_err(|e| instruction_error(e.in_file(&file)))?;
    let plan = plan::plan(
        &df,
        &PlanOptions {
            build_args: opts.build_args.clone(),
            target: opts.target.clone(),
            ..PlanOptions::default()
        },
    )
    .map_err(|e| instruction_error(e.in_file(&file)))?;
    for w in plan.warnings() {
        progress.warn(&w);
    }
    let layers = Layers::new(store, opts.exe.clone(), opts.userns)?
        .with_confinement(opts.confinement)
        .with_layer_size(opts.layer_size);
    let fake_ids = layers.ids().mode == UsernsMode::Single;
    let total = plan.stages.iter().map(|s| s.instructions.len() + 1).sum();
    let mut b = Builder {
        store,
        layers,
        opts,
        ctx,
        file,
        resolve,
        progress,
        fake_ids,
        steps_run: 0,
        steps_cached: 0,
        total,
        done: 0,
        images: HashMap::new(),
        pins: Vec::new(),
        stage_names: df
            .stages
            .iter()
            .filter_map(|s| s.name.as_ref().map(|n| (n.to_lowercase(), s.index)))
            .collect(),
        cmd_in_stage: false,
        scratch: store.work_dir("build")?,
    };
    let mut results: HashMap<usize, StageResult> = HashMap::new();
    for stage in &plan.stages {
        let r = b.stage(&plan, stage, &results)?;
        results.insert(stage.index, r);
    }
    let target = results.remove(&plan.target).ok_or_else(|| {
        BuildError::bad(
            "--target",
            "the target stage was not built",
            "report this as a bug",
        )
    })?;
    let (digest, image_cached) = b.export(&target)?;
    Ok(Built {
        digest,
        steps_run: b.steps_run,
        steps_cached: b.steps_cached,
        image_cached,
    })
}

fn instruction_error(e: dockerfile::DockerfileError) -> BuildError {
    let mut message = e.message.clone();
    if let Some(h) = &e.hint {
        let _ = write!(message, "; {h}");
    }
    BuildError::Instruction {
        file: e.file,
        line: e.line,
        instruction: e.instruction,
        message,
    }
}

fn hash_json(v: &impl serde::Serialize) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(v).unwrap_or_default());
    hex::encode(h.finalize())
}

impl Builder<'_> {
    /// A step on `state` whose sandbox has the default options (no
    /// network, no binds) and `f` alone changes the tree.
    fn plain_step(
        &self,
        state: &FsState,
        key: &str,
        f: impl FnOnce(&sifbox_engine::Sandbox) -> Result<()>,
    ) -> Result<(FsState, bool)> {
        self.layers.step(
            state,
            key,
            self.opts.no_cache,
            &StepOptions::default(),
            f,
            &[],
        )
    }

    /// [`BuildError::Interrupted`] once the build was asked to stop.
    fn check_interrupted(&self) -> Result<()> {
        match &self.opts.interrupted {
            Some(flag) if flag.load(std::sync::atomic::Ordering::SeqCst) => {
                Err(BuildError::Interrupted)
            }
            _ => Ok(()),
        }
    }

    fn err(&self, inst: &Instruction, message: impl Into<String>) -> BuildError {
        self.err_at(inst.line, &inst.original, message)
    }

    fn err_at(&self, line: usize, text: &str, message: impl Into<String>) -> BuildError {
        BuildError::Instruction {
            file: self.file.clone(),
            line,
            instruction: text.to_string(),
            message: message.into(),
        }
    }

    /// `e` with the Dockerfile line of `inst`, unless it already has one.
    fn cite(&self, inst: &Instruction, e: BuildError) -> BuildError {
        self.cite_at(inst.line, &inst.original, e)
    }

    /// `e` citing `line` and its `text`, unless it already cites one.
    fn cite_at(&self, line: usize, text: &str, e: BuildError) -> BuildError {
        match e {
            e @ (BuildError::Instruction { .. }
            | BuildError::RunFailed { .. }
            | BuildError::StepFailed(_)
            | BuildError::Interrupted) => e,
            BuildError::BadInput { what, why, fix } => {
                self.err_at(line, text, format!("{what}: {why}; {fix}"))
            }
            other => {
                let bad = other.is_bad_input();
                let e = self.err_at(line, text, other.to_string());
                if bad {
                    e
                } else {
                    BuildError::StepFailed(Box::new(e))
                }
            }
        }
    }

    /// A store image as a stage base: its rootfs and its config.
    fn image_base(&mut self, reference: &str) -> Result<StageResult> {
        if let Some(r) = self.images.get(reference) {
            return Ok(r.clone());
        }
        let digest = (self.resolve)(reference)?;
        self.pins.extend(self.store.pin(&digest)?);
        // With its setuid bits also in a shared store: the image built
        // from it keeps them.
        let rootfs = import::build_rootfs(self.store, &digest)?;
        let meta = import::image_meta(self.store, &digest)?;
        let time = import::image_time(self.store, &digest)?;
        let r = StageResult {
            state: FsState {
                base: rootfs,
                layers: Vec::new(),
                key: chain_key("image", digest.as_str()),
            },
            meta,
            time,
            image: Some(digest),
        };
        self.images.insert(reference.to_string(), r.clone());
        Ok(r)
    }

    fn stage(
        &mut self,
        plan: &Plan,
        stage: &PlannedStage,
        results: &HashMap<usize, StageResult>,
    ) -> Result<StageResult> {
        let started = Instant::now();
        self.cmd_in_stage = false;
        self.done += 1;
        self.progress
            .step(&stage.label(), self.done, self.total, &stage.original);
        let base = match &stage.base {
            Base::Scratch => StageResult {
                state: FsState {
                    base: self.layers.empty_base()?,
                    layers: Vec::new(),
                    key: chain_key("scratch", ""),
                },
                meta: ImageMeta::default(),
                time: 0,
                image: None,
            },
            Base::Stage(i) => results.get(i).cloned().ok_or_else(|| {
                BuildError::bad(
                    format!("stage {i}"),
                    "not built before its use",
                    "report this as a bug",
                )
            })?,
            Base::Image(r) => {
                let mut base = self
                    .image_base(r)
                    .map_err(|e| self.cite_at(stage.line, &stage.original, e))?;
                // Triggers run in the stage that builds FROM the image and
                // are not inherited further.
                base.meta.onbuild.clear();
                base
            }
        };
        self.progress.done(false, started.elapsed());
        let mut cur = base.clone();
        // A base whose config has no PATH (scratch, a rootfs tarball) gets
        // Docker's default, for `$PATH` in the Dockerfile and in the image.
        let mut base_env = base.meta.env_pairs();
        if !base_env.iter().any(|(k, _)| k == "PATH") {
            base_env.push(("PATH".into(), sifbox_engine::spec::DEFAULT_PATH.into()));
        }
        let mut env = plan.stage_env(base_env);
        let mut insts: Vec<Instruction> = Vec::new();
        if let Base::Image(r) = &stage.base {
            let triggers = self.image_base(r)?.meta.onbuild;
            for (i, t) in triggers.iter().enumerate() {
                let inst = dockerfile::parse_trigger(t, plan.escape, i + 1)
                    .map_err(|e| instruction_error(e.in_file(format!("ONBUILD of {r}"))))?;
                self.total += 1;
                insts.push(inst);
            }
        }
        insts.extend(stage.instructions.iter().cloned());
        for raw in &insts {
            self.check_interrupted()?;
            let inst = env
                .apply(raw)
                .map_err(|e| instruction_error(e.in_file(&self.file)))?;
            self.done += 1;
            self.progress
                .step(&stage.label(), self.done, self.total, &raw.original);
            let t = Instant::now();
            let cached = self
                .instruction(&inst, &mut env, &mut cur, results)
                .map_err(|e| self.cite(&inst, e))?;
            if let Some(c) = cached {
                if c {
                    self.steps_cached += 1;
                } else {
                    self.steps_run += 1;
                }
            }
            if let Some(c) = cached {
                self.progress.done(c, t.elapsed());
            }
        }
        cur.meta.env = env.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
        Ok(cur)
    }

    fn workdir(cur: &StageResult) -> String {
        cur.meta
            .workdir
            .clone()
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "/".into())
    }

    fn shell(cur: &StageResult) -> Vec<String> {
        cur.meta
            .shell
            .clone()
            .unwrap_or_else(|| DEFAULT_SHELL.iter().map(|s| s.to_string()).collect())
    }

    fn command_argv(cur: &StageResult, c: &Command) -> Vec<String> {
        match c {
            Command::Exec(v) => v.clone(),
            Command::Shell(s) => {
                let mut v = Self::shell(cur);
                v.push(s.clone());
                v
            }
        }
    }

    /// Runs one instruction; returns `Some(cached)` for steps that make a
    /// layer, `None` for config-only instructions.
    fn instruction(
        &mut self,
        inst: &Instruction,
        env: &mut StageEnv,
        cur: &mut StageResult,
        results: &HashMap<usize, StageResult>,
    ) -> Result<Option<bool>> {
        match &inst.kind {
            Instr::Arg(_) => Ok(None),
            Instr::Env(_) => {
                cur.meta.env = env.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
                Ok(None)
            }
            Instr::Label(kvs) => {
                for kv in kvs {
                    cur.meta.labels.insert(kv.key.clone(), kv.value.clone());
                }
                Ok(None)
            }
            Instr::Maintainer(m) => {
                cur.meta.labels.insert("maintainer".into(), m.clone());
                Ok(None)
            }
            Instr::Workdir(w) => {
                let dir = if w.starts_with('/') {
                    clean_abs(w)
                } else {
                    clean_abs(&format!("{}/{w}", Self::workdir(cur)))
                };
                cur.meta.workdir = Some(dir.clone());
                if cur.state.lookup(&dir).is_some() {
                    return Ok(None);
                }
                let key = chain_key(&cur.state.key, &format!("WORKDIR\n{dir}"));
                let (state, cached) = self.plain_step(&cur.state, &key, |sb| {
                    sb.extract(&dir, None, |w| tar::Builder::new(w).finish())?;
                    Ok(())
                })?;
                cur.state = state;
                Ok(Some(cached))
            }
            Instr::User(u) => {
                cur.meta.user = Some(u.clone());
                Ok(None)
            }
            Instr::Cmd(c) => {
                self.cmd_in_stage = true;
                cur.meta.cmd = Some(Self::command_argv(cur, c));
                Ok(None)
            }
            Instr::Entrypoint(c) => {
                cur.meta.entrypoint = Some(Self::command_argv(cur, c));
                // As Docker: a new ENTRYPOINT drops the CMD it inherited.
                if !self.cmd_in_stage {
                    cur.meta.cmd = None;
                }
                Ok(None)
            }
            Instr::Shell(s) => {
                if s.is_empty() {
                    return Err(self.err(inst, "SHELL needs at least one element"));
                }
                cur.meta.shell = Some(s.clone());
                Ok(None)
            }
            Instr::Expose(ports) => {
                for p in ports {
                    let p = if p.contains('/') {
                        p.to_lowercase()
                    } else {
                        format!("{p}/tcp")
                    };
                    if !cur.meta.exposed_ports.contains(&p) {
                        cur.meta.exposed_ports.push(p);
                    }
                }
                Ok(None)
            }
            Instr::Volume(vs) => {
                for v in vs {
                    if !cur.meta.volumes.contains(v) {
                        cur.meta.volumes.push(v.clone());
                    }
                }
                Ok(None)
            }
            Instr::StopSignal(s) => {
                cur.meta.stop_signal = Some(s.clone());
                Ok(None)
            }
            Instr::Healthcheck(h) => {
                cur.meta.healthcheck = Some(healthcheck_json(h));
                Ok(None)
            }
            Instr::Onbuild(o) => {
                cur.meta.onbuild.push(o.expression.clone());
                Ok(None)
            }
            Instr::Run(r) => self.run(inst, r, env, cur, results).map(Some),
            Instr::Copy(c) => self.copy(inst, c, false, cur, results).map(Some),
            Instr::Add(c) => self.copy(inst, c, true, cur, results).map(Some),
        }
    }

    /// A state of another stage or an image, for `--from`.
    fn state_of(
        &mut self,
        inst: &Instruction,
        from: &str,
        results: &HashMap<usize, StageResult>,
    ) -> Result<StageResult> {
        if let Ok(i) = from.parse::<usize>() {
            return results
                .get(&i)
                .cloned()
                .ok_or_else(|| self.err(inst, format!("stage {i} is not an earlier stage")));
        }
        if let Some(i) = self.stage_names.get(&from.to_lowercase()) {
            return results.get(i).cloned().ok_or_else(|| {
                self.err(inst, format!("stage {from} is not built before this step"))
            });
        }
        self.image_base(from)
    }
}

fn healthcheck_json(h: &Healthcheck) -> serde_json::Value {
    match h {
        Healthcheck::None => serde_json::json!({ "Test": ["NONE"] }),
        Healthcheck::Cmd {
            command,
            interval,
            timeout,
            start_period,
            start_interval,
            retries,
        } => {
            let test: Vec<String> = match command {
                Command::Exec(v) => std::iter::once("CMD".to_string())
                    .chain(v.iter().cloned())
                    .collect(),
                Command::Shell(s) => vec!["CMD-SHELL".into(), s.clone()],
            };
            let ns = |d: &Option<std::time::Duration>| d.map(|d| d.as_nanos());
            serde_json::json!({
                "Test": test,
                "Interval": ns(interval),
                "Timeout": ns(timeout),
                "StartPeriod": ns(start_period),
                "StartInterval": ns(start_interval),
                "Retries": retries,
            })
        }
    }
}
