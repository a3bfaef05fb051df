//! From a parsed Dockerfile, build args and a target to what the executor
//! walks: the stages the target needs, in build order, each with its base
//! (scratch, an earlier stage, an image reference) and its instructions,
//! plus a [`StageEnv`] that applies ARG and ENV in order and expands words
//! the way Docker does.
//!
//! Docker's rules implemented here:
//! - ARGs before the first FROM are global: usable in FROM lines only; a
//!   stage sees one after `ARG NAME` (no default) re-declares it.
//! - `--build-arg` overrides any default; a stage default beats the global
//!   value; an ARG with no value anywhere is declared but unset.
//! - ENV overrides an ARG of the same name in substitution and in RUN's
//!   environment; ARG values reach RUN as environment variables but are not
//!   kept in the image.
//! - The proxy args (`HTTP_PROXY` & co, both cases) reach RUN without a
//!   declaration when given as build args, and are left out of the cache key
//!   unless declared; `TARGETPLATFORM`, `TARGETOS`, `TARGETARCH`,
//!   `TARGETVARIANT`, `BUILDPLATFORM`, `BUILDOS`, `BUILDARCH`, `BUILDVARIANT`
//!   are in the global scope automatically (a stage needs `ARG NAME`).
//! - Stages the target does not need (through FROM, `COPY --from`,
//!   `RUN --mount=from=`) are not built.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::dockerfile::{
    ArgDecl, Copy, Dockerfile, DockerfileError, Healthcheck, Instr, Instruction, KeyValue, Mount,
    Source, Stage,
};
use crate::lex::{expand_heredoc, expand_word, expand_words, LexError, Lookup};

type Result<T> = std::result::Result<T, DockerfileError>;

/// The build args Docker predefines: usable without an ARG, not in the
/// cache key unless declared.
pub const PROXY_ARGS: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "FTP_PROXY",
    "ftp_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The platform args Docker sets automatically in the global scope.
pub const PLATFORM_ARGS: &[&str] = &[
    "TARGETPLATFORM",
    "TARGETOS",
    "TARGETARCH",
    "TARGETVARIANT",
    "BUILDPLATFORM",
    "BUILDOS",
    "BUILDARCH",
    "BUILDVARIANT",
];

/// An OCI platform: `os/arch[/variant]` (the image store's, one for all
/// of sifbox).
pub use sifbox_image::layer::Platform;

/// The platform builds run on and target by default, as BuildKit names it
/// in `TARGETPLATFORM` and `BUILDPLATFORM`: the host's, with 32-bit ARM's
/// variant (`v7`) spelled out.
pub fn host_platform() -> Platform {
    let mut p = Platform::host();
    if p.architecture == "arm" && p.variant.is_none() {
        p.variant = Some("v7".into());
    }
    p
}

/// What to plan for.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// `--build-arg K=V`.
    pub build_args: BTreeMap<String, String>,
    /// `--target`: a stage name (case-insensitive); the last stage when
    /// `None`.
    pub target: Option<String>,
    /// The platform built for (`TARGET*`).
    pub target_platform: Platform,
    /// The platform building (`BUILD*`).
    pub build_platform: Platform,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            build_args: BTreeMap::new(),
            target: None,
            target_platform: host_platform(),
            build_platform: host_platform(),
        }
    }
}

/// What a stage starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Base {
    /// `FROM scratch`: an empty file system.
    Scratch,
    /// An earlier stage, by its index.
    Stage(usize),
    /// An image reference (store or registry), variables expanded.
    Image(String),
}

/// A stage the target needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedStage {
    /// Its index in the Dockerfile.
    pub index: usize,
    /// Its `AS` name.
    pub name: Option<String>,
    /// The FROM line.
    pub line: usize,
    /// The FROM instruction's text.
    pub original: String,
    /// Its base.
    pub base: Base,
    /// `FROM --platform`, expanded.
    pub platform: Option<String>,
    /// Its instructions, raw (expand with [`StageEnv::apply`]).
    pub instructions: Vec<Instruction>,
    /// Stages it needs (FROM, `COPY --from`, `RUN --mount=from=`), by index.
    pub stage_deps: Vec<usize>,
    /// Images named by `COPY --from` / `RUN --mount=from=` (not stages),
    /// expanded.
    pub image_deps: Vec<String>,
}

impl PlannedStage {
    /// The name, or `stage N`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => format!("stage {}", self.index),
        }
    }
}

/// The build plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The escape character (for expansion).
    pub escape: char,
    /// The target stage's index.
    pub target: usize,
    /// The needed stages in build order (dependencies first, the target
    /// last).
    pub stages: Vec<PlannedStage>,
    /// The global ARGs as resolved (name, value; `None` when unset).
    pub global_args: Vec<(String, Option<String>)>,
    /// Build args that no ARG of the global scope or a needed stage
    /// declares (proxy args excepted), sorted.
    pub unused_build_args: Vec<String>,
    build_args: BTreeMap<String, String>,
    /// The automatic platform args.
    builtins: Vec<(String, String)>,
}

impl Plan {
    /// The planned stage with Dockerfile index `index`, if needed.
    pub fn stage(&self, index: usize) -> Option<&PlannedStage> {
        self.stages.iter().find(|s| s.index == index)
    }

    /// Docker's warning about build args nobody used, if any.
    pub fn warnings(&self) -> Vec<String> {
        if self.unused_build_args.is_empty() {
            return Vec::new();
        }
        vec![format!(
            "[Warning] One or more build-args [{}] were not consumed",
            self.unused_build_args.join(" ")
        )]
    }

    /// The environment to walk `stage`'s instructions with, starting from
    /// the base's config env (an image's `Env`, or the parent stage's final
    /// [`StageEnv::env`]; empty for scratch).
    pub fn stage_env(&self, base_env: Vec<(String, String)>) -> StageEnv {
        StageEnv {
            escape: self.escape,
            env: base_env,
            args: Vec::new(),
            build_args: self.build_args.clone(),
            globals: self.global_args.clone(),
            builtins: self.builtins.clone(),
        }
    }
}

/// The variables of a stage while its instructions are walked in order.
#[derive(Debug, Clone)]
pub struct StageEnv {
    escape: char,
    env: Vec<(String, String)>,
    args: Vec<(String, Option<String>)>,
    build_args: BTreeMap<String, String>,
    globals: Vec<(String, Option<String>)>,
    builtins: Vec<(String, String)>,
}

impl Lookup for StageEnv {
    fn lookup(&self, name: &str) -> Option<&str> {
        if let Some((_, v)) = self.env.iter().rev().find(|(k, _)| k == name) {
            return Some(v);
        }
        self.args
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

fn lex_err(inst: &Instruction, e: LexError) -> DockerfileError {
    inst.error(e.to_string())
}

impl StageEnv {
    /// The image config env so far (the base's plus this stage's ENV).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The ARGs declared in this stage so far, with their values.
    pub fn args(&self) -> &[(String, Option<String>)] {
        &self.args
    }

    /// The value of a variable for substitution (ENV first, then ARG).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.lookup(name)
    }

    /// Expands one word (see [`crate::lex::expand_word`]).
    pub fn expand(&self, word: &str) -> std::result::Result<String, LexError> {
        expand_word(word, self, self.escape)
    }

    /// Expands and splits (see [`crate::lex::expand_words`]).
    pub fn expand_words(&self, s: &str) -> std::result::Result<Vec<String>, LexError> {
        expand_words(s, self, self.escape)
    }

    /// The environment of a RUN: ENV, then the ARGs with values that no
    /// ENV shadows, then proxy build args that are neither declared nor
    /// shadowed.
    pub fn run_env(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (k, v) in &self.env {
            match out.iter_mut().find(|(ok, _)| ok == k) {
                Some(e) => e.1.clone_from(v),
                None => out.push((k.clone(), v.clone())),
            }
        }
        let mut push = |k: &str, v: &str| {
            if !out.iter().any(|(ok, _)| ok == k) {
                out.push((k.to_owned(), v.to_owned()));
            }
        };
        for (k, v) in &self.args {
            if let Some(v) = v {
                push(k, v);
            }
        }
        for p in PROXY_ARGS {
            if let Some(v) = self.build_args.get(*p) {
                push(p, v);
            }
        }
        out
    }

    /// The ARG values that belong in a RUN step's cache key: declared ARGs
    /// with values, in declaration order (undeclared proxy args are left
    /// out, as Docker does).
    pub fn cache_args(&self) -> Vec<(String, String)> {
        self.args
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k.clone(), v.clone())))
            .collect()
    }

    /// Declares one ARG: `--build-arg` value, else the default (expanded
    /// now), else the global value (platform args: the automatic value).
    pub fn declare_arg(&mut self, decl: &ArgDecl) -> std::result::Result<Option<String>, LexError> {
        let value = if let Some((_, v)) = self.builtins.iter().find(|(k, _)| *k == decl.name) {
            Some(v.clone())
        } else if let Some(v) = self.build_args.get(&decl.name) {
            Some(v.clone())
        } else if let Some(d) = &decl.default {
            Some(self.expand(d)?)
        } else if let Some((_, Some(v))) = self.args.iter().find(|(k, _)| *k == decl.name) {
            // Declared again without a default: keeps its value.
            Some(v.clone())
        } else {
            self.globals
                .iter()
                .find(|(k, _)| *k == decl.name)
                .and_then(|(_, v)| v.clone())
        };
        self.args.retain(|(k, _)| *k != decl.name);
        self.args.push((decl.name.clone(), value.clone()));
        Ok(value)
    }

    /// Sets an ENV variable (the value already expanded).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    fn expand_kv(&self, inst: &Instruction, kvs: &[KeyValue]) -> Result<Vec<KeyValue>> {
        kvs.iter()
            .map(|kv| {
                Ok(KeyValue {
                    key: self.expand(&kv.key).map_err(|e| lex_err(inst, e))?,
                    value: self.expand(&kv.value).map_err(|e| lex_err(inst, e))?,
                })
            })
            .collect()
    }

    fn expand_opt(&self, inst: &Instruction, v: &Option<String>) -> Result<Option<String>> {
        v.as_deref()
            .map(|s| self.expand(s).map_err(|e| lex_err(inst, e)))
            .transpose()
    }

    fn expand_copy(&self, inst: &Instruction, c: &Copy) -> Result<Copy> {
        let mut sources = Vec::new();
        for s in &c.sources {
            sources.push(match s {
                Source::Path(p) => Source::Path(self.expand(p).map_err(|e| lex_err(inst, e))?),
                Source::Heredoc(h) => {
                    let mut h = h.clone();
                    if h.expand {
                        h.content = expand_heredoc(&h.content, self, self.escape)
                            .map_err(|e| lex_err(inst, e))?;
                    }
                    Source::Heredoc(h)
                }
            });
        }
        let mut exclude = Vec::new();
        for e in &c.exclude {
            exclude.push(self.expand(e).map_err(|e| lex_err(inst, e))?);
        }
        Ok(Copy {
            from: self.expand_opt(inst, &c.from)?,
            chown: self.expand_opt(inst, &c.chown)?,
            chmod: self.expand_opt(inst, &c.chmod)?,
            checksum: self.expand_opt(inst, &c.checksum)?,
            exclude,
            sources,
            dest: self.expand(&c.dest).map_err(|e| lex_err(inst, e))?,
            ..c.clone()
        })
    }

    /// Expands a RUN mount's values with this environment.
    pub fn expand_mount(&self, m: &Mount) -> std::result::Result<Mount, String> {
        Mount::parse(&m.spec, &|s| self.expand(s).map_err(|e| e.to_string()))
    }

    /// Applies one instruction in order: returns it with variables expanded
    /// where Docker expands them (ENV/LABEL keys and values, COPY/ADD
    /// sources, destination and flags, COPY heredoc bodies with an unquoted
    /// delimiter, WORKDIR, USER, EXPOSE (split into words), VOLUME,
    /// STOPSIGNAL, RUN mount values), and updates the environment for ENV
    /// (all values of one ENV see the environment before it) and ARG (the
    /// returned declarations carry the resolved value as `default`).
    /// RUN, CMD, ENTRYPOINT, SHELL, HEALTHCHECK and ONBUILD are returned as
    /// they are.
    pub fn apply(&mut self, inst: &Instruction) -> Result<Instruction> {
        let le = |e: LexError| lex_err(inst, e);
        let kind = match &inst.kind {
            Instr::Arg(decls) => {
                let mut out = Vec::new();
                for d in decls {
                    let v = self.declare_arg(d).map_err(le)?;
                    out.push(ArgDecl {
                        name: d.name.clone(),
                        default: v,
                    });
                }
                Instr::Arg(out)
            }
            Instr::Env(kvs) => {
                let kvs = self.expand_kv(inst, kvs)?;
                for kv in &kvs {
                    if kv.key.is_empty() {
                        return Err(inst.error("ENV names can not be blank"));
                    }
                    self.set_env(&kv.key, &kv.value);
                }
                Instr::Env(kvs)
            }
            Instr::Label(kvs) => {
                let kvs = self.expand_kv(inst, kvs)?;
                if kvs.iter().any(|kv| kv.key.is_empty()) {
                    return Err(inst.error("LABEL names can not be blank"));
                }
                Instr::Label(kvs)
            }
            Instr::Copy(c) => Instr::Copy(self.expand_copy(inst, c)?),
            Instr::Add(c) => Instr::Add(self.expand_copy(inst, c)?),
            Instr::Workdir(w) => {
                let w = self.expand(w).map_err(le)?;
                if w.is_empty() {
                    return Err(inst.error("WORKDIR is empty after variable expansion"));
                }
                Instr::Workdir(w)
            }
            Instr::User(u) => {
                let u = self.expand(u).map_err(le)?;
                if u.is_empty() {
                    return Err(inst.error("USER is empty after variable expansion"));
                }
                Instr::User(u)
            }
            Instr::Expose(ports) => {
                let mut out = Vec::new();
                for p in ports {
                    out.extend(self.expand_words(p).map_err(le)?);
                }
                Instr::Expose(out)
            }
            Instr::Volume(vs) => {
                let mut out = Vec::new();
                for v in vs {
                    let v = self.expand(v).map_err(le)?;
                    if v.trim().is_empty() {
                        return Err(inst.error("VOLUME specified can not be an empty string"));
                    }
                    out.push(v);
                }
                Instr::Volume(out)
            }
            Instr::StopSignal(s) => Instr::StopSignal(self.expand(s).map_err(le)?),
            Instr::Run(r) => {
                let mut r = r.clone();
                let mut mounts = Vec::new();
                for m in &r.mounts {
                    mounts.push(
                        self.expand_mount(m)
                            .map_err(|e| inst.error(format!("--mount={}: {e}", m.spec)))?,
                    );
                }
                r.mounts = mounts;
                Instr::Run(r)
            }
            k @ (Instr::Cmd(_)
            | Instr::Entrypoint(_)
            | Instr::Shell(_)
            | Instr::Healthcheck(Healthcheck::None | Healthcheck::Cmd { .. })
            | Instr::Onbuild(_)
            | Instr::Maintainer(_)) => k.clone(),
        };
        Ok(Instruction {
            kind,
            ..inst.clone()
        })
    }
}

/// Resolves args, stages, the target and what it needs.
pub fn plan(df: &Dockerfile, opts: &PlanOptions) -> Result<Plan> {
    let escape = df.directives.escape;
    let builtins = builtin_args(opts);

    // The global scope.
    let mut declared: BTreeSet<String> = BTreeSet::new();
    let globals = global_args(df, opts, &builtins, &mut declared)?;
    let global_env = global_lookup(&globals);

    // Stages: bases.
    let mut planned: Vec<PlannedStage> = Vec::new();
    for stage in &df.stages {
        planned.push(plan_stage(df, stage, &global_env, escape)?);
    }

    // Stages: `--from` dependencies, expanded with what the stage's own
    // ARG and ENV instructions give (the base image's env is not known yet).
    let proto = Plan {
        escape,
        target: 0,
        stages: Vec::new(),
        global_args: globals.clone(),
        unused_build_args: Vec::new(),
        build_args: opts.build_args.clone(),
        builtins: builtins.clone(),
    };
    for ps in &mut planned {
        let mut env = proto.stage_env(Vec::new());
        let mut stage_deps = Vec::new();
        let mut image_deps = Vec::new();
        if let Base::Stage(b) = ps.base {
            stage_deps.push(b);
        }
        for inst in &ps.instructions {
            let froms: Vec<String> = match &inst.kind {
                Instr::Arg(_) | Instr::Env(_) => {
                    env.apply(inst)?;
                    continue;
                }
                Instr::Copy(c) => c
                    .from
                    .iter()
                    .map(|f| env.expand(f).map_err(|e| lex_err(inst, e)))
                    .collect::<Result<_>>()?,
                Instr::Run(r) => {
                    let mut v = Vec::new();
                    for m in &r.mounts {
                        let m = env
                            .expand_mount(m)
                            .map_err(|e| inst.error(format!("--mount={}: {e}", m.spec)))?;
                        v.extend(m.from);
                    }
                    v
                }
                _ => continue,
            };
            for f in froms {
                match resolve_stage_ref(df, &f) {
                    StageRef::Stage(s) => {
                        if !stage_deps.contains(&s) {
                            stage_deps.push(s);
                        }
                    }
                    StageRef::Image => {
                        if !image_deps.contains(&f) {
                            image_deps.push(f);
                        }
                    }
                    StageRef::BadIndex => {
                        return Err(inst.error(format!(
                        "stage index {f} does not exist: the Dockerfile has {} stages (0 to {})",
                        df.stages.len(),
                        df.stages.len() - 1
                    )))
                    }
                }
            }
        }
        ps.stage_deps = stage_deps;
        ps.image_deps = image_deps;
    }

    // The target.
    let target = target_index(df, opts)?;

    // What the target needs, dependencies first.
    let mut order = Vec::new();
    let mut state = vec![0u8; planned.len()];
    visit(
        target,
        &planned,
        &mut state,
        &mut order,
        &mut Vec::new(),
        df,
    )?;

    // Build args nobody declares.
    for &i in &order {
        for inst in &df.stages[i].instructions {
            if let Instr::Arg(decls) = &inst.kind {
                declared.extend(decls.iter().map(|d| d.name.clone()));
            }
        }
    }
    let unused_build_args = opts
        .build_args
        .keys()
        .filter(|k| {
            !declared.contains(*k)
                && !PROXY_ARGS.contains(&k.as_str())
                && !PLATFORM_ARGS.contains(&k.as_str())
                // The build itself consumes it (the image's time clamp).
                && k.as_str() != "SOURCE_DATE_EPOCH"
        })
        .cloned()
        .collect();

    let stages = order.iter().map(|&i| planned[i].clone()).collect();
    Ok(Plan {
        stages,
        target,
        unused_build_args,
        ..proto
    })
}

/// The global scope: the builtin args, then the ARGs before the first
/// FROM (a build arg's value, else the default expanded), each noted in
/// `declared`.
fn global_args(
    df: &Dockerfile,
    opts: &PlanOptions,
    builtins: &[(String, String)],
    declared: &mut BTreeSet<String>,
) -> Result<Vec<(String, Option<String>)>> {
    let escape = df.directives.escape;
    let mut globals: Vec<(String, Option<String>)> = builtins
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    for arg in &df.args_before_from {
        for d in &arg.decls {
            declared.insert(d.name.clone());
            let value = if let Some(v) = opts.build_args.get(&d.name) {
                Some(v.clone())
            } else if let Some(def) = &d.default {
                let env = global_lookup(&globals);
                Some(
                    expand_word(def, &env, escape)
                        .map_err(|e| DockerfileError::new(arg.line, "ARG", e.to_string()))?,
                )
            } else {
                None
            };
            globals.retain(|(k, _)| *k != d.name);
            globals.push((d.name.clone(), value));
        }
    }
    Ok(globals)
}

/// A stage's base (scratch, an earlier stage or an image, expanded with
/// the global args), without its dependencies yet.
fn plan_stage(
    df: &Dockerfile,
    stage: &Stage,
    global_env: &dyn Lookup,
    escape: char,
) -> Result<PlannedStage> {
    let ferr = |e: LexError| DockerfileError::new(stage.line, "FROM", e.to_string());
    let image = expand_word(&stage.from.image, global_env, escape).map_err(ferr)?;
    if image.is_empty() {
        return Err(DockerfileError::new(
            stage.line,
            "FROM",
            format!("base name ({}) should not be blank", stage.from.image),
        )
        .hint("set the ARG it uses (--build-arg or a default)"));
    }
    let platform = stage
        .from
        .platform
        .as_deref()
        .map(|p| expand_word(p, global_env, escape))
        .transpose()
        .map_err(ferr)?;
    let base = if image == "scratch" {
        Base::Scratch
    } else if let Some(prev) = df.stages[..stage.index].iter().find(|s| {
        s.name
            .as_deref()
            .is_some_and(|n| n.eq_ignore_ascii_case(&image))
    }) {
        Base::Stage(prev.index)
    } else {
        Base::Image(image)
    };
    Ok(PlannedStage {
        index: stage.index,
        name: stage.name.clone(),
        line: stage.line,
        original: stage.original.clone(),
        base,
        platform,
        instructions: stage.instructions.clone(),
        stage_deps: Vec::new(),
        image_deps: Vec::new(),
    })
}

/// The target stage's index: `--target`'s, else the last.
fn target_index(df: &Dockerfile, opts: &PlanOptions) -> Result<usize> {
    Ok(match &opts.target {
        None => df.stages.len() - 1,
        Some(t) => df
            .stages
            .iter()
            .find(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(t)))
            .map(|s| s.index)
            .ok_or_else(|| {
                let names: Vec<&str> = df.stages.iter().filter_map(|s| s.name.as_deref()).collect();
                let hint = if names.is_empty() {
                    "no stage has a name (FROM IMAGE AS NAME)".to_owned()
                } else {
                    format!("stages: {}", names.join(", "))
                };
                DockerfileError::new(0, "", format!("--target {t}: no stage has that name"))
                    .hint(hint)
            })?,
    })
}

fn visit(
    i: usize,
    planned: &[PlannedStage],
    state: &mut [u8],
    order: &mut Vec<usize>,
    path: &mut Vec<usize>,
    df: &Dockerfile,
) -> Result<()> {
    match state[i] {
        2 => return Ok(()),
        1 => {
            let start = path.iter().position(|&p| p == i).unwrap_or(0);
            let mut names: Vec<String> = path[start..]
                .iter()
                .map(|&p| df.stages[p].label())
                .collect();
            names.push(df.stages[i].label());
            return Err(DockerfileError::new(
                df.stages[i].line,
                "",
                format!("circular dependency between stages: {}", names.join(" -> ")),
            ));
        }
        _ => {}
    }
    state[i] = 1;
    path.push(i);
    for &d in &planned[i].stage_deps {
        visit(d, planned, state, order, path, df)?;
    }
    path.pop();
    state[i] = 2;
    order.push(i);
    Ok(())
}

enum StageRef {
    Stage(usize),
    Image,
    BadIndex,
}

/// `--from=X`: a stage name (case-insensitive), a stage index, or an image.
fn resolve_stage_ref(df: &Dockerfile, f: &str) -> StageRef {
    if let Some(s) = df
        .stages
        .iter()
        .find(|s| s.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(f)))
    {
        return StageRef::Stage(s.index);
    }
    if !f.is_empty() && f.chars().all(|c| c.is_ascii_digit()) {
        return match f.parse::<usize>() {
            Ok(n) if n < df.stages.len() => StageRef::Stage(n),
            _ => StageRef::BadIndex,
        };
    }
    StageRef::Image
}

fn builtin_args(opts: &PlanOptions) -> Vec<(String, String)> {
    let t = &opts.target_platform;
    let b = &opts.build_platform;
    [
        ("TARGETPLATFORM", t.to_string()),
        ("TARGETOS", t.os.clone()),
        ("TARGETARCH", t.architecture.clone()),
        ("TARGETVARIANT", t.variant.clone().unwrap_or_default()),
        ("BUILDPLATFORM", b.to_string()),
        ("BUILDOS", b.os.clone()),
        ("BUILDARCH", b.architecture.clone()),
        ("BUILDVARIANT", b.variant.clone().unwrap_or_default()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn global_lookup(globals: &[(String, Option<String>)]) -> Vec<(String, String)> {
    globals
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k.clone(), v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dockerfile::{parse_str, Command, Run};

    fn opts(args: &[(&str, &str)], target: Option<&str>) -> PlanOptions {
        PlanOptions {
            build_args: args
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            target: target.map(str::to_owned),
            target_platform: "linux/arm/v7".parse::<Platform>().expect("platform"),
            build_platform: "linux/amd64".parse::<Platform>().expect("platform"),
        }
    }

    fn plan_of(src: &str, args: &[(&str, &str)], target: Option<&str>) -> Plan {
        let df = parse_str(src).expect("parse");
        plan(&df, &opts(args, target)).expect("plan")
    }

    fn plan_err(src: &str, args: &[(&str, &str)], target: Option<&str>) -> DockerfileError {
        let df = parse_str(src).expect("parse");
        plan(&df, &opts(args, target)).expect_err("should fail")
    }

    /// Walks the target stage and returns the final env, the RUN envs and
    /// the expanded instructions.
    type Walked = (StageEnv, Vec<Vec<(String, String)>>, Vec<Instruction>);

    fn walk(p: &Plan) -> Walked {
        let stage = p.stages.last().expect("a stage");
        let mut env = p.stage_env(vec![("PATH".into(), "/bin".into())]);
        let mut runs = Vec::new();
        let mut out = Vec::new();
        for inst in &stage.instructions {
            let e = env.apply(inst).expect("apply");
            if matches!(e.kind, Instr::Run(_)) {
                runs.push(env.run_env());
            }
            out.push(e);
        }
        (env, runs, out)
    }

    #[test]
    fn bases_and_global_args() {
        let p = plan_of(
            "ARG REG=docker.io\nARG TAG\nARG IMG=$REG/library/alpine\nFROM ${IMG}:${TAG:-3.19} AS base\nFROM base AS b2\nFROM scratch\nCOPY --from=b2 /a /a\n",
            &[("TAG", "3.20")],
            None,
        );
        let bases: Vec<(usize, Base)> =
            p.stages.iter().map(|s| (s.index, s.base.clone())).collect();
        assert_eq!(
            bases,
            vec![
                (0, Base::Image("docker.io/library/alpine:3.20".into())),
                (1, Base::Stage(0)),
                (2, Base::Scratch),
            ]
        );
        assert_eq!(p.target, 2);
        assert!(p.unused_build_args.is_empty());
        let p = plan_of("ARG TAG\nFROM alpine:${TAG:-3.19}\n", &[], None);
        assert_eq!(p.stages[0].base, Base::Image("alpine:3.19".into()));
        // FROM --platform with the automatic args.
        let p = plan_of(
            "FROM --platform=$BUILDPLATFORM golang AS b\nFROM --platform=$TARGETPLATFORM alpine\n",
            &[],
            Some("b"),
        );
        assert_eq!(p.stages.len(), 1);
        assert_eq!(p.stages[0].platform.as_deref(), Some("linux/amd64"));
        // A name that is only defined later is an image.
        let p = plan_of("FROM later\nFROM x AS later\n", &[], Some("later"));
        assert_eq!(p.stages.len(), 1);
        assert_eq!(p.stages[0].index, 1);
        let p = plan_of(
            "FROM later\nFROM x AS later\nFROM z\nCOPY --from=0 / /\n",
            &[],
            None,
        );
        assert_eq!(
            p.stage(0).map(|s| s.base.clone()),
            Some(Base::Image("later".into()))
        );
        assert!(p.stage(1).is_none());
        // Stage names are case-insensitive.
        let p = plan_of("FROM a AS Build\nFROM BUILD\n", &[], None);
        assert_eq!(p.stages[1].base, Base::Stage(0));
        // An empty FROM after expansion.
        let e = plan_err("ARG X\nFROM $X\n", &[], None);
        assert_eq!((e.line, e.instruction.as_str()), (2, "FROM"));
    }

    #[test]
    fn target_and_needed_stages() {
        let src = "FROM a AS one\nFROM b AS two\nCOPY --from=one /x /x\nFROM c AS three\nRUN --mount=type=bind,from=two,target=/t true\nFROM d AS four\nCOPY --from=0 /x /y\nCOPY --from=nginx:latest /etc /etc\n";
        let idx = |p: &Plan| p.stages.iter().map(|s| s.index).collect::<Vec<_>>();
        assert_eq!(idx(&plan_of(src, &[], None)), vec![0, 3]);
        assert_eq!(idx(&plan_of(src, &[], Some("three"))), vec![0, 1, 2]);
        assert_eq!(idx(&plan_of(src, &[], Some("TWO"))), vec![0, 1]);
        assert_eq!(idx(&plan_of(src, &[], Some("one"))), vec![0]);
        let p = plan_of(src, &[], None);
        assert_eq!(p.stages[1].image_deps, vec!["nginx:latest".to_owned()]);
        assert_eq!(p.stages[1].stage_deps, vec![0]);
        let e = plan_err(src, &[], Some("five"));
        assert_eq!(
            e.to_string(),
            "Dockerfile: --target five: no stage has that name; stages: one, two, three, four"
        );
        // --from with an ARG.
        let p = plan_of(
            "FROM a AS dev\nFROM a AS prod\nFROM z\nARG FLAVOR=dev\nCOPY --from=${FLAVOR} /x /x\n",
            &[("FLAVOR", "prod")],
            None,
        );
        assert_eq!(idx(&p), vec![1, 2]);
        // Forward --from references are fine; cycles are not.
        let p = plan_of(
            "FROM a\nCOPY --from=later /x /x\nFROM b AS later\nFROM c\nCOPY --from=0 / /\n",
            &[],
            None,
        );
        assert_eq!(idx(&p), vec![1, 0, 2]);
        let e = plan_err(
            "FROM a AS x\nCOPY --from=y / /\nFROM b AS y\nCOPY --from=x / /\n",
            &[],
            Some("y"),
        );
        assert!(
            e.message
                .contains("circular dependency between stages: y -> x -> y"),
            "{e}"
        );
        let e = plan_err("FROM a\nCOPY --from=0 / /\n", &[], None);
        assert!(e.message.contains("circular"), "{e}");
        let e = plan_err("FROM a\nCOPY --from=7 / /\n", &[], None);
        assert_eq!(e.line, 2);
    }

    #[test]
    fn unused_build_args() {
        let p = plan_of(
            "ARG G\nFROM a AS x\nARG USED_X\nFROM b\nARG USED\n",
            &[
                ("G", "1"),
                ("USED", "1"),
                ("USED_X", "1"),
                ("NOPE", "1"),
                ("HTTP_PROXY", "p"),
                ("TARGETARCH", "x"),
            ],
            None,
        );
        assert_eq!(
            p.unused_build_args,
            vec!["NOPE".to_owned(), "USED_X".to_owned()]
        );
        assert_eq!(
            p.warnings(),
            vec!["[Warning] One or more build-args [NOPE USED_X] were not consumed".to_owned()]
        );
    }

    #[test]
    fn arg_env_semantics() {
        let src = "ARG G=global\nARG ONLYG=og\nFROM a\nARG G\nARG ONLYG\nARG D=def\nARG O=def\nARG U\nARG TARGETARCH\nARG E=${D}-x\nENV D=envd X=$D\nRUN echo\nARG D\nENV Y=$D Z=$G-$O-${U:-unset}-$TARGETARCH\nWORKDIR /w/$Z\nRUN echo\n";
        let p = plan_of(
            src,
            &[
                ("O", "over"),
                ("G", "cli"),
                ("HTTP_PROXY", "http://p"),
                ("no_proxy", "x"),
            ],
            None,
        );
        let (env, runs, out) = walk(&p);
        // ENV overrides ARG of the same name in substitution; one ENV's
        // values see the environment before it.
        assert_eq!(env.get("X"), Some("def"));
        assert_eq!(env.get("Y"), Some("envd"));
        assert_eq!(env.get("Z"), Some("cli-over-unset-arm"));
        assert_eq!(env.get("E"), Some("def-x"));
        assert_eq!(env.get("ONLYG"), Some("og"));
        assert_eq!(env.get("U"), None);
        // Only ENV is in the image config.
        let keys: Vec<&str> = env.env().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["PATH", "D", "X", "Y", "Z"]);
        // RUN sees ENV, then ARGs not shadowed, then undeclared proxies.
        assert_eq!(
            runs[0],
            [
                ("PATH", "/bin"),
                ("D", "envd"),
                ("X", "def"),
                ("G", "cli"),
                ("ONLYG", "og"),
                ("O", "over"),
                ("TARGETARCH", "arm"),
                ("E", "def-x"),
                ("HTTP_PROXY", "http://p"),
                ("no_proxy", "x"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<Vec<_>>()
        );
        // The cache key has declared ARGs only.
        let cache: Vec<String> = env.cache_args().into_iter().map(|(k, _)| k).collect();
        assert_eq!(cache, ["G", "ONLYG", "O", "TARGETARCH", "E", "D"]);
        let Instr::Workdir(w) = &out[out.len() - 2].kind else {
            panic!()
        };
        assert_eq!(w, "/w/cli-over-unset-arm");
        // ARG declarations come back with their resolved values.
        let Instr::Arg(d) = &out[2].kind else {
            panic!()
        };
        assert_eq!(d[0].default.as_deref(), Some("def"));
        // Global ARGs are not visible in a stage without re-declaration.
        let p = plan_of("ARG G=1\nFROM a\nENV X=${G:-none}\n", &[], None);
        let (env, _, _) = walk(&p);
        assert_eq!(env.get("X"), Some("none"));
        // A declared proxy arg is in the cache key.
        let p = plan_of(
            "FROM a\nARG HTTP_PROXY\nRUN x\n",
            &[("HTTP_PROXY", "p")],
            None,
        );
        let (env, _, _) = walk(&p);
        assert_eq!(
            env.cache_args(),
            vec![("HTTP_PROXY".to_owned(), "p".to_owned())]
        );
    }

    #[test]
    fn expansion_where_docker_expands() {
        let src = "FROM a\nENV D=/data N=app P=\"80 443\"\nCOPY --chown=$N:$N --from=$N src/$N \"$D/\"\nADD <<EOF <<'RAW' $D/\nhome=$D\nEOF\nraw=$D\nRAW\nLABEL \"k.$N\"=\"v $D\"\nEXPOSE $P 8080/udp\nVOLUME $D /v\nUSER $N\nSTOPSIGNAL ${S:-SIGTERM}\nRUN --mount=type=cache,target=$D/cache echo $D\nCMD echo $D\nONBUILD COPY $D /x\n";
        let p = plan_of(src, &[], None);
        let (_, _, out) = walk(&p);
        let Instr::Copy(c) = &out[1].kind else {
            panic!()
        };
        assert_eq!(c.chown.as_deref(), Some("app:app"));
        assert_eq!(c.from.as_deref(), Some("app"));
        assert_eq!(c.sources, vec![Source::Path("src/app".into())]);
        assert_eq!(c.dest, "/data/");
        let Instr::Add(a) = &out[2].kind else {
            panic!()
        };
        let contents: Vec<&str> = a
            .sources
            .iter()
            .map(|s| match s {
                Source::Heredoc(h) => h.content.as_str(),
                Source::Path(p) => p.as_str(),
            })
            .collect();
        assert_eq!(contents, ["home=/data\n", "raw=$D\n"]);
        let Instr::Label(l) = &out[3].kind else {
            panic!()
        };
        assert_eq!(
            (l[0].key.as_str(), l[0].value.as_str()),
            ("k.app", "v /data")
        );
        assert_eq!(
            out[4].kind,
            Instr::Expose(vec!["80".into(), "443".into(), "8080/udp".into()])
        );
        assert_eq!(
            out[5].kind,
            Instr::Volume(vec!["/data".into(), "/v".into()])
        );
        assert_eq!(out[6].kind, Instr::User("app".into()));
        assert_eq!(out[7].kind, Instr::StopSignal("SIGTERM".into()));
        let Instr::Run(r) = &out[8].kind else {
            panic!()
        };
        assert_eq!(r.mounts[0].target.as_deref(), Some("/data/cache"));
        assert_eq!(r.command, Command::Shell("echo $D".into()));
        assert_eq!(out[9].kind, Instr::Cmd(Command::Shell("echo $D".into())));
        let Instr::Onbuild(o) = &out[10].kind else {
            panic!()
        };
        assert_eq!(o.expression, "COPY $D /x");
        let _ = Run {
            mounts: vec![],
            network: None,
            security: None,
            command: Command::Shell(String::new()),
            heredocs: vec![],
        };
    }

    #[test]
    fn expansion_errors_cite_the_line() {
        let p = plan_of("FROM a\n\nWORKDIR ${X:?need X}\n", &[], None);
        let mut env = p.stage_env(Vec::new());
        let e = env.apply(&p.stages[0].instructions[0]).expect_err("fails");
        assert_eq!(e.to_string(), "Dockerfile:3: WORKDIR: X: need X");
        let e = plan_err("ARG A=${B\nFROM x\n", &[], None);
        assert_eq!((e.line, e.instruction.as_str()), (1, "ARG"));
    }

    #[test]
    fn platforms() {
        assert_eq!(
            "linux/arm64"
                .parse::<Platform>()
                .ok()
                .map(|p| p.to_string())
                .as_deref(),
            Some("linux/arm64")
        );
        assert_eq!(
            "linux/arm/v7"
                .parse::<Platform>()
                .ok()
                .and_then(|p| p.variant)
                .as_deref(),
            Some("v7")
        );
        for bad in ["", "linux", "linux/", "/amd64", "a/b/c/d", "a/b/"] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
        let h = host_platform();
        assert_eq!(h.os, std::env::consts::OS);
        assert!(!h.architecture.is_empty());
    }
}
