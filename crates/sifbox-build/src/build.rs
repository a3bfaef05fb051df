//! The build executor: walks a [`Plan`] stage by stage, running each step
//! in a sandbox over the layers of the steps before it, with a cache key per
//! step, and turns the target stage into a store image.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest as _, Sha256};
use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::spec::{Bind, NetMode, UsernsMode};
use sifbox_engine::transfer::SetId;
use sifbox_engine::ExecStatus;
use sifbox_image::import;
use sifbox_image::meta::ImageMeta;
use sifbox_image::store::{Digest, Store};

use crate::context::{clean_abs, Context, CopyPlan, Entry, Kind};
use crate::dockerfile::{
    self, Command, Copy, Healthcheck, Instr, Instruction, MountType, Network, Source,
};
use crate::error::{BuildError, Result};
use crate::layers::{chain_key, FsState, Layers, StepOptions};
use crate::plan::{self, Base, Plan, PlanOptions, PlannedStage, StageEnv};
use crate::progress::Progress;
use crate::steps::{self, OutputSink};

/// The default shell of shell-form commands.
const DEFAULT_SHELL: [&str; 2] = ["/bin/sh", "-c"];
/// Where `--host-ca` puts the host's CA bundle in build steps.
pub const HOST_CA_PATH: &str = "/run/sifbox/host-ca.crt";
/// Where build steps with faked ids find apt's configuration.
const APT_CONF_PATH: &str = "/run/sifbox/apt.conf";
/// Environment variables that point common tools at the host CA bundle.
const CA_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

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
    /// Stage names (lower case) to their indexes.
    stage_names: HashMap<String, usize>,
    /// Whether the stage being built set CMD itself.
    cmd_in_stage: bool,
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
    let layers =
        Layers::new(store, opts.exe.clone(), opts.userns)?.with_confinement(opts.confinement);
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
        stage_names: df
            .stages
            .iter()
            .filter_map(|s| s.name.as_ref().map(|n| (n.to_lowercase(), s.index)))
            .collect(),
        cmd_in_stage: false,
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
            e @ (BuildError::Instruction { .. } | BuildError::RunFailed { .. }) => e,
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
        // With its setuid bits also in a shared store: the image built
        // from it keeps them.
        let rootfs = import::build_rootfs(self.store, &digest)?;
        let meta = import::image_meta(self.store, &digest)?;
        let r = StageResult {
            state: FsState {
                base: rootfs,
                layers: Vec::new(),
                key: chain_key("image", digest.as_str()),
            },
            meta,
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
        let mut env = plan.stage_env(base.meta.env_pairs());
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
                let (state, cached) = self.layers.step(
                    &cur.state,
                    &key,
                    self.opts.no_cache,
                    &StepOptions::default(),
                    |sb| {
                        sb.extract(&dir, None, |w| tar::Builder::new(w).finish())?;
                        Ok(())
                    },
                    &[],
                )?;
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

    fn run(
        &mut self,
        inst: &Instruction,
        r: &dockerfile::Run,
        env: &StageEnv,
        cur: &mut StageResult,
        results: &HashMap<usize, StageResult>,
    ) -> Result<bool> {
        let argv = match (
            &r.command,
            r.script_heredoc(),
            r.shell_script_with_heredocs(),
        ) {
            (Command::Exec(v), _, _) => v.clone(),
            // `RUN <<EOF` alone: the body is the script.
            (_, Some(h), _) => {
                let mut v = Self::shell(cur);
                v.push(h.content.clone());
                v
            }
            (Command::Shell(s), None, script) => {
                let mut v = Self::shell(cur);
                v.push(script.unwrap_or_else(|| s.clone()));
                v
            }
        };
        let mut run_env = env.run_env();
        if !run_env.iter().any(|(k, _)| k == "PATH") {
            run_env.push(("PATH".into(), sifbox_engine::spec::DEFAULT_PATH.into()));
        }
        if cur.meta.user.is_none() && !run_env.iter().any(|(k, _)| k == "HOME") {
            run_env.push(("HOME".into(), "/root".into()));
        }
        let workdir = Self::workdir(cur);
        let net = match r.network {
            Some(Network::None) => NetMode::None,
            _ => NetMode::Host,
        };
        let mut binds = Vec::new();
        let mut mount_keys = Vec::new();
        let mut scratch: Vec<tempfile::TempDir> = Vec::new();
        for m in &r.mounts {
            if let Some((bind, key)) = self.mount(inst, m, cur, results, &mut scratch)? {
                binds.push(bind);
                mount_keys.push(key);
            }
        }
        if self.fake_ids {
            // apt drops privileges to _apt and checks that it did, which
            // faked set*id calls cannot pass: tell it to stay root (as
            // Charliecloud's builder does), without touching the image.
            let t = tempfile::Builder::new()
                .prefix("sifbox-apt.")
                .tempdir()
                .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
            let conf = t.path().join("apt.conf");
            std::fs::write(&conf, "APT::Sandbox::User \"root\";\n")
                .map_err(|e| BuildError::io(&conf, e))?;
            binds.push(Bind {
                src: conf,
                dst: PathBuf::from(APT_CONF_PATH),
                readonly: true,
            });
            scratch.push(t);
            if !run_env.iter().any(|(e, _)| e == "APT_CONFIG") {
                run_env.push(("APT_CONFIG".into(), APT_CONF_PATH.into()));
            }
        }
        if let Some(ca) = &self.opts.host_ca {
            binds.push(Bind {
                src: ca.clone(),
                dst: PathBuf::from(HOST_CA_PATH),
                readonly: true,
            });
            for k in CA_ENV {
                if !run_env.iter().any(|(e, _)| e == k) {
                    run_env.push(((*k).into(), HOST_CA_PATH.into()));
                }
            }
        }
        let key = chain_key(
            &cur.state.key,
            &format!(
                "RUN\n{}\n{}\n{}\n{}\n{:?}\n{}\n{}",
                hash_json(&argv),
                hash_json(&env.env()),
                hash_json(&env.cache_args()),
                hash_json(&mount_keys),
                net,
                cur.meta.user.clone().unwrap_or_default(),
                workdir,
            ),
        );
        let req = ExecRequest {
            argv,
            env: run_env,
            cwd: workdir,
            user: cur.meta.user.clone(),
            default_home: true,
            fake_ids: self.fake_ids,
            ..ExecRequest::default()
        };
        let stubs = mount_stubs(&cur.state, &binds);
        let progress = Arc::clone(&self.progress);
        let mut outcome: Option<(ExecStatus, steps::Output)> = None;
        let result = self.layers.step(
            &cur.state,
            &key,
            self.opts.no_cache,
            &StepOptions { net, binds },
            |sb| {
                let sink = Sink(progress);
                let (status, out) = steps::run_command(sb, req, sink)?;
                let failed = status.code() != 0;
                outcome = Some((status, out));
                if failed {
                    // Filled in below, once the sandbox is gone.
                    return Err(BuildError::RunFailed {
                        file: String::new(),
                        line: 0,
                        instruction: String::new(),
                        code: 0,
                        tail: String::new(),
                    });
                }
                Ok(())
            },
            &stubs,
        );
        drop(scratch);
        let tail = outcome.map(|(st, out)| (st, out.finish()));
        match result {
            Ok((state, cached)) => {
                cur.state = state;
                Ok(cached)
            }
            Err(BuildError::RunFailed { .. }) => {
                let (status, lines) = tail.unwrap_or((
                    ExecStatus::Failed {
                        code: 125,
                        message: "no status".into(),
                    },
                    Vec::new(),
                ));
                let mut t = String::new();
                if let ExecStatus::Failed { message, .. } = &status {
                    let _ = write!(t, ": {message}");
                }
                if !lines.is_empty() {
                    t.push_str("; its last lines of output:");
                    for l in &lines {
                        let _ = write!(t, "\n  | {l}");
                    }
                }
                Err(BuildError::RunFailed {
                    file: self.file.clone(),
                    line: inst.line,
                    instruction: inst.original.clone(),
                    code: status.code(),
                    tail: t,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// A `RUN --mount`: the bind it makes and what of it goes in the cache
    /// key.
    fn mount(
        &mut self,
        inst: &Instruction,
        m: &dockerfile::Mount,
        cur: &StageResult,
        results: &HashMap<usize, StageResult>,
        scratch: &mut Vec<tempfile::TempDir>,
    ) -> Result<Option<(Bind, String)>> {
        let target = || -> Result<String> {
            let t = m
                .effective_target()
                .ok_or_else(|| self.err(inst, format!("--mount={}: no target", m.spec)))?;
            Ok(if t.starts_with('/') {
                clean_abs(&t)
            } else {
                clean_abs(&format!("{}/{t}", Self::workdir(cur)))
            })
        };
        match m.kind {
            MountType::Cache => {
                let dst = target()?;
                let id = m.effective_id().unwrap_or_else(|| dst.clone());
                let dir = self
                    .store
                    .root()
                    .join("build-cache")
                    .join(&chain_key("cache", &id)[..24]);
                std::fs::create_dir_all(&dir).map_err(|e| BuildError::io(&dir, e))?;
                Ok(Some((
                    Bind {
                        src: dir,
                        dst: dst.into(),
                        readonly: m.readonly,
                    },
                    format!("cache:{id}:{}", m.readonly),
                )))
            }
            MountType::Tmpfs => {
                let dst = target()?;
                let t = tempfile::Builder::new()
                    .prefix("sifbox-tmpfs.")
                    .tempdir()
                    .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
                let src = t.path().to_path_buf();
                scratch.push(t);
                Ok(Some((
                    Bind {
                        src,
                        dst: dst.into(),
                        readonly: false,
                    },
                    "tmpfs".into(),
                )))
            }
            MountType::Secret => {
                let id = m
                    .effective_id()
                    .ok_or_else(|| self.err(inst, "a secret mount needs id= or target="))?;
                let dst = target()?;
                let Some(src) = self.opts.secrets.get(&id) else {
                    if !m.required {
                        // As Docker: a secret that was not given is left out.
                        return Ok(None);
                    }
                    return Err(self.err(
                        inst,
                        format!("secret {id:?} was not given; pass --secret id={id},src=FILE"),
                    ));
                };
                Ok(Some((
                    Bind {
                        src: src.clone(),
                        dst: dst.into(),
                        readonly: true,
                    },
                    format!("secret:{id}"),
                )))
            }
            MountType::Bind => {
                let dst = target()?;
                let source = m.source.clone().unwrap_or_default();
                let (src, key) = match &m.from {
                    None => {
                        // A private copy, made as BuildKit shows the context:
                        // the source looked up inside it, .dockerignore
                        // applied. Writes to it (rw) are thrown away with it.
                        let rel = crate::context::clean_rel(&source);
                        let t = tempfile::Builder::new()
                            .prefix("sifbox-bind.")
                            .tempdir()
                            .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
                        let copy = t.path().join("src");
                        let hash = self
                            .ctx
                            .copy_out(&rel, &copy)
                            .map_err(|e| self.err(inst, e.to_string()))?;
                        scratch.push(t);
                        (copy, format!("bind:ctx:{rel}:{hash}"))
                    }
                    Some(from) => {
                        let st = self.state_of(inst, from, results)?;
                        let t = tempfile::Builder::new()
                            .prefix("sifbox-bind.")
                            .tempdir()
                            .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
                        let dest = t.path().join("src");
                        let path = clean_abs(&source);
                        let sb = self.layers.reader(&st.state)?;
                        // A private temp dir: the stage's setuid bits stay.
                        sb.download_with(&path, &dest, SetId::Keep)?;
                        sb.stop(std::time::Duration::ZERO)?;
                        scratch.push(t);
                        (dest, format!("bind:{}:{path}", st.state.key))
                    }
                };
                // Either source is a private copy, removed after the step:
                // writes to a rw bind are thrown away with it.
                let readonly = m.readonly;
                Ok(Some((
                    Bind {
                        src,
                        dst: dst.into(),
                        readonly,
                    },
                    key,
                )))
            }
            other => Err(self.err(
                inst,
                format!("--mount type {other:?} is not supported by sifbox"),
            )),
        }
    }

    fn copy(
        &mut self,
        inst: &Instruction,
        c: &Copy,
        is_add: bool,
        cur: &mut StageResult,
        results: &HashMap<usize, StageResult>,
    ) -> Result<bool> {
        if c.parents {
            return Err(self.err(inst, "--parents is not supported by sifbox yet"));
        }
        let dest = if c.dest.starts_with('/') {
            c.dest.clone()
        } else {
            format!("{}/{}", Self::workdir(cur), c.dest)
        };
        let dest = if c.dest.ends_with('/') && !dest.ends_with('/') {
            format!("{dest}/")
        } else {
            dest
        };
        let dest_is_dir = cur
            .state
            .lookup(&clean_abs(&dest))
            .and_then(|p| std::fs::symlink_metadata(p).ok())
            .is_some_and(|m| m.is_dir());
        let chmod = match &c.chmod {
            None => None,
            Some(m) => Some(
                u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        self.err(
                            inst,
                            format!("--chmod={m}: give an octal mode such as 0755"),
                        )
                    })?,
            ),
        };
        let owner = match &c.chown {
            None => None,
            Some(spec) => Some(self.resolve_owner(inst, &cur.state, spec)?),
        };
        let mut scratch: Vec<tempfile::TempDir> = Vec::new();
        let mut paths: Vec<String> = Vec::new();
        let mut heredocs = Vec::new();
        for s in &c.sources {
            match s {
                Source::Path(p) => paths.push(p.clone()),
                Source::Heredoc(h) => heredocs.push(h.clone()),
            }
        }
        let urls: Vec<String> = paths.iter().filter(|p| is_url(p)).cloned().collect();
        if !urls.is_empty() && !is_add {
            return Err(self.err(inst, "COPY takes no URLs; use ADD"));
        }
        if !urls.is_empty() && c.from.is_some() {
            return Err(self.err(inst, "ADD --from takes no URLs"));
        }
        paths.retain(|p| !is_url(p));
        let mut fetched = Vec::new();
        if !urls.is_empty() {
            let t = tempfile::Builder::new()
                .prefix("sifbox-add.")
                .tempdir()
                .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
            for (i, u) in urls.iter().enumerate() {
                let slot = t.path().join(i.to_string());
                std::fs::create_dir(&slot).map_err(|e| BuildError::io(&slot, e))?;
                self.progress.output(&format!("downloading {u}"));
                fetched.push(crate::remote::fetch(u, &slot, c.checksum.as_deref())?);
            }
            scratch.push(t);
        }
        if paths.is_empty() && heredocs.is_empty() && !fetched.is_empty() {
            // Only URLs: where they go follows the rules for local files.
            if fetched.len() > 1 && !dest.ends_with('/') && !dest_is_dir {
                return Err(self.err(
                    inst,
                    format!("destination {dest:?}: several sources are copied, so it must end with a slash"),
                ));
            }
        }
        let (plan, from_key) = match &c.from {
            None if heredocs.is_empty() && paths.is_empty() => {
                let clean = clean_abs(&dest);
                let into_dir = dest.ends_with('/') || dest_is_dir || fetched.len() > 1;
                let dest_dir = if into_dir {
                    clean.clone()
                } else {
                    Path::new(&clean)
                        .parent()
                        .map_or("/".into(), |p| p.display().to_string())
                };
                let entries = fetched
                    .iter()
                    .map(|f| {
                        let name = if into_dir {
                            PathBuf::from(&f.name)
                        } else {
                            PathBuf::from(Path::new(&clean).file_name().unwrap_or_default())
                        };
                        Entry::own_file(&f.path, name, chmod.unwrap_or(0o600), f.mtime)
                    })
                    .collect::<Result<_>>()?;
                (CopyPlan { dest_dir, entries }, String::new())
            }
            None if heredocs.is_empty() => {
                let ctx = self.ctx.with_excludes(&c.exclude)?;
                (
                    ctx.plan_copy(&paths, &dest, dest_is_dir, chmod)?,
                    String::new(),
                )
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("sifbox-heredoc.")
                    .tempdir()
                    .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
                let mut names = Vec::new();
                for h in &heredocs {
                    // The name becomes a file name here and in the image:
                    // one plain component, never a path.
                    if h.name.is_empty()
                        || h.name == "."
                        || h.name == ".."
                        || h.name.contains(['/', '\0'])
                    {
                        return Err(self.err(
                            inst,
                            format!("heredoc <<{}: the name must be a file name", h.name),
                        ));
                    }
                    let p = t.path().join(&h.name);
                    std::fs::write(&p, &h.content).map_err(|e| BuildError::io(&p, e))?;
                    names.push(h.name.clone());
                }
                let hctx = Context::open_plain(t.path())?;
                let mut plan = hctx.plan_copy(&names, &dest, dest_is_dir, chmod.or(Some(0o644)))?;
                if !paths.is_empty() {
                    let ctx = self.ctx.with_excludes(&c.exclude)?;
                    let more = ctx.plan_copy(&paths, &dest, true, chmod)?;
                    plan.entries.extend(more.entries);
                }
                scratch.push(t);
                (plan, String::new())
            }
            Some(from) => {
                let st = self.state_of(inst, from, results)?;
                let t = tempfile::Builder::new()
                    .prefix("sifbox-from.")
                    .tempdir()
                    .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
                let sb = self.layers.reader(&st.state)?;
                let mut names = Vec::new();
                for (i, p) in paths.iter().enumerate() {
                    let abs = clean_abs(p);
                    let slot = t.path().join(i.to_string());
                    std::fs::create_dir(&slot).map_err(|e| BuildError::io(&slot, e))?;
                    // A private temp dir, copied on into the image: setuid
                    // bits stay, as `COPY --from` keeps them.
                    let name = Self::download_followed(&sb, &abs, &slot)
                        .map_err(|e| self.err(inst, format!("{abs} in {from}: {e}")))?;
                    names.push(format!("{i}/{name}"));
                }
                sb.stop(std::time::Duration::ZERO)?;
                let fctx = Context::open_plain(t.path())?.with_excludes(&c.exclude)?;
                let plan = fctx.plan_copy(&names, &dest, dest_is_dir, chmod)?;
                scratch.push(t);
                (plan, st.state.key.clone())
            }
        };
        let mut plan = plan;
        if is_add && c.from.is_none() {
            Self::expand_archives(&mut plan)?;
        }
        if !paths.is_empty() || !heredocs.is_empty() {
            // URLs beside local sources: into the destination directory.
            for f in &fetched {
                plan.entries.push(Entry::own_file(
                    &f.path,
                    PathBuf::from(&f.name),
                    chmod.unwrap_or(0o600),
                    f.mtime,
                )?);
            }
        }
        let key = chain_key(
            &cur.state.key,
            &format!(
                "{}\n{}\n{}\n{:?}\n{from_key}",
                if is_add { "ADD" } else { "COPY" },
                plan.content_hash()?,
                plan.dest_dir,
                owner,
            ),
        );
        let dest_dir = plan.dest_dir.clone();
        let (state, cached) = self.layers.step(
            &cur.state,
            &key,
            self.opts.no_cache,
            &StepOptions::default(),
            |sb| {
                let archives: Vec<Entry> = plan
                    .entries
                    .iter()
                    .filter(|e| {
                        matches!(e.kind, Kind::File { .. }) && e.name.as_os_str().is_empty()
                    })
                    .cloned()
                    .collect();
                let files = CopyPlan {
                    dest_dir: plan.dest_dir.clone(),
                    entries: plan
                        .entries
                        .iter()
                        .filter(|e| !e.name.as_os_str().is_empty())
                        .cloned()
                        .collect(),
                };
                if !files.entries.is_empty() || archives.is_empty() {
                    sb.extract(&dest_dir, owner, move |w| files.write_tar(w))?;
                }
                for a in archives {
                    sb.extract(&dest_dir, owner, move |w| {
                        let f = a.src.open()?;
                        let mut d = crate::archive::open(f.try_clone()?)?;
                        let mut w = w;
                        std::io::copy(&mut d, &mut w)?;
                        a.src.check(&f)
                    })?;
                }
                Ok(())
            },
            &[],
        )?;
        drop(scratch);
        cur.state = state;
        Ok(cached)
    }

    /// ADD: local tar archives (plain, gzip, zstd, bzip2, xz) named as
    /// sources are unpacked into the destination instead of copied (not
    /// those inside a copied directory, as Docker); they are marked by an
    /// empty name.
    fn expand_archives(plan: &mut CopyPlan) -> Result<()> {
        for e in &mut plan.entries {
            if e.top && matches!(e.kind, Kind::File { .. }) {
                let f = e
                    .src
                    .open()
                    .map_err(|err| BuildError::io(&e.src.shown(), err))?;
                if crate::archive::is_tar(f) {
                    e.name = PathBuf::new();
                }
            }
        }
        Ok(())
    }

    /// Downloads `abs` from the stage `sb` into `slot` as `COPY --from`
    /// reads it: the path is resolved inside the stage (by its own kernel
    /// walk, the stage's root as `/`), and when it is itself a symlink its
    /// target is copied, as Docker does. Returns the name it has in `slot`
    /// (the source's own name).
    fn download_followed(
        sb: &sifbox_engine::Sandbox,
        abs: &str,
        slot: &Path,
    ) -> std::result::Result<String, String> {
        let name = Path::new(abs)
            .file_name()
            .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned());
        let mut path = abs.to_string();
        for _ in 0..=crate::tree::MAX_LINKS {
            sb.download_with(&path, slot, SetId::Keep)
                .map_err(|e| e.to_string())?;
            // The slot is the build's own private dir: one entry in it.
            let got = std::fs::read_dir(slot)
                .map_err(|e| e.to_string())?
                .next()
                .ok_or("nothing was downloaded")?
                .map_err(|e| e.to_string())?;
            let at = got.path();
            let meta = std::fs::symlink_metadata(&at).map_err(|e| e.to_string())?;
            if !meta.file_type().is_symlink() {
                if got.file_name().to_string_lossy() != name {
                    std::fs::rename(&at, slot.join(&name)).map_err(|e| e.to_string())?;
                }
                return Ok(name);
            }
            let target = std::fs::read_link(&at).map_err(|e| e.to_string())?;
            std::fs::remove_file(&at).map_err(|e| e.to_string())?;
            let target = target.to_string_lossy();
            // Relative to the link's directory, as the stage's kernel walks
            // it (not cleaned here: `..` after a symlinked dir is physical).
            path = if target.starts_with('/') {
                target.into_owned()
            } else {
                let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
                format!("{dir}/{target}")
            };
        }
        Err(format!(
            "more than {} symlinks (a loop?)",
            crate::tree::MAX_LINKS
        ))
    }

    /// `--chown=USER[:GROUP]` as numeric ids, from the image's
    /// /etc/passwd and /etc/group (Docker: a user alone gives its uid as
    /// the gid too).
    fn resolve_owner(&self, inst: &Instruction, state: &FsState, spec: &str) -> Result<(u32, u32)> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let read = |p: &str| self.read_image_file(state, p);
        let field = |text: &str, name: &str| -> Option<u32> {
            text.lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == name)
                .and_then(|f| f[2].parse().ok())
        };
        let uid = match user.parse::<u32>() {
            Ok(n) => n,
            Err(_) => field(&read("/etc/passwd")?, user).ok_or_else(|| {
                self.err(
                    inst,
                    format!("--chown: user {user:?} is not in the image's /etc/passwd"),
                )
            })?,
        };
        let gid = match group {
            None => uid,
            Some(g) => match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => field(&read("/etc/group")?, g).ok_or_else(|| {
                    self.err(
                        inst,
                        format!("--chown: group {g:?} is not in the image's /etc/group"),
                    )
                })?,
            },
        };
        Ok((uid, gid))
    }

    /// The text of the image file `path` in `state` (empty when there is
    /// none), at most 16 MiB. Read on the host without following symlinks;
    /// when a step made one on the way (`/etc/passwd -> ...`), a sandbox of
    /// the state resolves it inside the image, so that no host file is
    /// ever read in its place.
    fn read_image_file(&self, state: &FsState, path: &str) -> Result<String> {
        const LIMIT: u64 = 16 << 20;
        let bytes = match state.read_file(path, LIMIT) {
            Ok(b) => b,
            Err(_) => {
                let t = tempfile::Builder::new()
                    .prefix("sifbox-read.")
                    .tempdir()
                    .map_err(|e| BuildError::io(Path::new("/tmp"), e))?;
                let sb = self.layers.reader(state)?;
                let got = Self::download_followed(&sb, path, t.path());
                sb.stop(std::time::Duration::ZERO)?;
                // The download is in the build's own private dir.
                got.ok()
                    .map(|name| t.path().join(name))
                    .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
                    .and_then(|p| {
                        let mut b = Vec::new();
                        std::fs::File::open(p)
                            .and_then(|f| {
                                std::io::Read::read_to_end(
                                    &mut std::io::Read::take(f, LIMIT),
                                    &mut b,
                                )
                            })
                            .ok()
                            .map(|_| b)
                    })
            }
        };
        Ok(bytes
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default())
    }

    /// Turns the target stage into a store image (cached by its state and
    /// config).
    fn export(&mut self, target: &StageResult) -> Result<(Digest, bool)> {
        let meta = target.meta.clone();
        let key = chain_key(&target.state.key, &format!("IMAGE\n{}", hash_json(&meta)));
        let source_key = format!("build:{key}");
        let _lock = self.store.lock(&format!("build-image-{key}"))?;
        if !self.opts.no_cache {
            if let Some(d) = self.store.recall_source(&source_key) {
                if self.store.sif_path(&d).is_file() {
                    return Ok((d, true));
                }
            }
        }
        let started = Instant::now();
        self.progress.note("exporting the image");
        let clamp = sifbox_image::squash::PackOptions::from_env().clamp_mtime;
        let d = steps::export(&self.layers, &target.state, &meta, clamp)?;
        self.store.remember_source(&source_key, &d)?;
        self.progress.done(false, started.elapsed());
        Ok((d, false))
    }
}

struct Sink(Arc<Progress>);

impl OutputSink for Sink {
    fn line(&mut self, line: &str) {
        self.0.output(line);
    }
}

fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://") || s.starts_with("git@")
}

/// The mount points a step's sandbox will create that the state does not
/// have: removed from its layer afterwards, so that they do not end up in
/// the image.
fn mount_stubs(state: &FsState, binds: &[Bind]) -> Vec<String> {
    let mut out = Vec::new();
    let fixed = ["/proc", "/dev", "/sys", "/etc/resolv.conf", "/etc/hosts"];
    let all = fixed
        .iter()
        .map(|s| (*s).to_string())
        .chain(binds.iter().map(|b| b.dst.display().to_string()));
    for p in all {
        // The path and every missing parent.
        let mut cur = PathBuf::from(&p);
        loop {
            let s = cur.display().to_string();
            if s == "/" || state.lookup(&s).is_some() {
                break;
            }
            out.push(s);
            if !cur.pop() {
                break;
            }
        }
    }
    out
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
