//! `sifbox build`: a Dockerfile build context into a store image, rootless
//! and daemonless (flags as `docker build` spells them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sifbox_build::build::{BuildOptions, Built};
use sifbox_build::error::BuildError;
use sifbox_build::progress::{Mode, Progress};

use crate::cmd::options::{value_of, ProgressArg, UsernsArg};
use crate::cmd::signals::Interrupts;
use sifbox_image::store::{Digest, Store};

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The Dockerfile (default: CONTEXT/Dockerfile; `-` reads it from stdin).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Name the image NAME[:TAG] (repeatable).
    #[arg(short = 't', long = "tag", value_name = "NAME[:TAG]")]
    pub tags: Vec<String>,
    /// Set a build arg (KEY alone takes the value from the environment).
    #[arg(long = "build-arg", value_name = "KEY[=VALUE]")]
    pub build_args: Vec<String>,
    /// Make a secret available to `RUN --mount=type=secret` (id=ID,src=PATH or id=ID,env=VAR).
    #[arg(long = "secret", value_name = "id=ID,src=PATH")]
    pub secrets: Vec<String>,
    /// Build this stage (default: the last one).
    #[arg(long)]
    pub target: Option<String>,
    /// Run every step, ignoring the cache.
    #[arg(long = "no-cache")]
    pub no_cache: bool,
    /// The most one step's layer may hold (at least 16m): a step that
    /// writes more fails with "No space left on device". As root the step
    /// writes on an ext4 image of this size; otherwise (no loop device
    /// without root) on a tmpfs of this size, in memory until it ends.
    #[arg(long, value_name = "SIZE", default_value = "10g")]
    pub layer_size: String,
    /// Output: auto (condensed on a terminal), plain (every line), quiet.
    #[arg(long, default_value = "auto", value_name = "auto|plain|quiet")]
    pub progress: String,
    /// Also write the image as a SIF file that Apptainer runs.
    #[arg(short = 'o', long = "output", value_name = "FILE.sif")]
    pub output: Option<PathBuf>,
    /// Make the host's CA bundle (default /etc/ssl/certs/ca-certificates.crt)
    /// visible to RUN steps, for sites whose HTTPS goes through an
    /// intercepting proxy (also: `build.host_ca = true` in
    /// ~/.config/sifbox/config.toml, or SIFBOX_HOST_CA=1). Another file
    /// goes as `--host-ca=FILE`: `--host-ca CONTEXT` builds CONTEXT.
    #[arg(long = "host-ca", value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = sifbox_launch::host_ca::DEFAULT_CA)]
    pub host_ca: Option<PathBuf>,
    /// Id mapping of build steps: auto (full when the caller has a
    /// subordinate range), full, or single (one id; chown and set*id
    /// succeed without effect under a seccomp filter).
    #[arg(long, default_value = "auto", value_name = "auto|full|single")]
    pub userns: String,
    #[command(flatten)]
    pub confine: crate::cmd::options::ConfineArgs,
    /// Print only the image digest (same as --progress quiet).
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// The build context directory.
    pub context: PathBuf,
}

fn bad(
    what: impl Into<String>,
    why: impl Into<String>,
    fix: impl Into<String>,
) -> crate::error::CliError {
    crate::error::CliError::usage(what, why, fix)
}

/// Resolves a `FROM` reference: the store first (name, digest), then a
/// registry (pulls shown on stderr).
pub(crate) fn resolve_image(store: &Store, reference: &str) -> Result<Digest, BuildError> {
    Ok(sifbox_launch::image::reference(
        store,
        reference,
        crate::cmd::progress::for_stderr(false),
    )?)
}

pub fn run(a: BuildArgs) -> crate::error::Result<ExitCode> {
    let progress: ProgressArg = value_of("--progress", &a.progress)?;
    let userns: UsernsArg = value_of("--userns", &a.userns)?;
    let mode = match (a.quiet, progress) {
        (true, _) | (_, ProgressArg::Quiet) => Mode::Quiet,
        (false, ProgressArg::Auto) => Mode::Auto,
        (false, ProgressArg::Plain) => Mode::Plain,
    };
    let store = crate::cmd::image::open_store()?;
    let interrupted_flag = Arc::new(AtomicBool::new(false));
    let interrupts = watch_interrupts(&interrupted_flag)?;
    let exe = sifbox_launch::current_exe()?;
    // The files of `--secret id=..,env=VAR`: in the store's tmp/, where
    // `sifbox gc` finds them if the build is killed (SIGKILL), not in /tmp.
    let scratch = store.work_dir("build-secrets")?;
    let host_ca = sifbox_launch::host_ca::checked(sifbox_launch::host_ca::for_builds(
        a.host_ca.as_deref(),
        sifbox_launch::UserConfig::load().build_host_ca(),
    ))?;
    for t in &a.tags {
        sifbox_image::store::normalize_name(t).map_err(|e| {
            bad(
                format!("--tag {t}"),
                e.to_string(),
                "use NAME[:TAG] with lower-case letters, digits and . _ - /",
            )
        })?;
    }
    let opts = BuildOptions {
        userns: userns.into(),
        context: a.context.clone(),
        dockerfile: a.file.clone(),
        build_args: sifbox_build::inputs::build_args(&a.build_args),
        secrets: sifbox_build::inputs::secrets(&a.secrets, scratch.path())?,
        target: a.target.clone(),
        no_cache: a.no_cache,
        layer_size: layer_size(&a.layer_size)?,
        host_ca,
        exe,
        confinement: a.confine.confinement(),
        interrupted: Some(Arc::clone(&interrupted_flag)),
        cache_scope: None,
    };
    let progress = Arc::new(Progress::new(mode));
    let resolver = |r: &str| resolve_image(&store, r);
    let result = sifbox_build::build::build(&store, &opts, &resolver, progress);
    // What the build made is gone by now (its error path, or the drops
    // above); the scratch dir goes with `scratch` below.
    if let Some(sig) = interrupts.stop() {
        drop(scratch);
        return Err(crate::error::CliError::Interrupted {
            signal: sig,
            report: Some(format!(
                "the build was interrupted by {}; nothing was stored, and what it made is removed",
                crate::cmd::signals::name(sig)
            )),
        });
    }
    let built: Built = result?;
    for t in &a.tags {
        let name = store.tag(t, &built.digest)?;
        if mode != Mode::Quiet {
            eprintln!("naming to {name}");
        }
    }
    if let Some(out) = &a.output {
        crate::cmd::image::export_to(&store, &built.digest, out, "--output")?;
        if mode != Mode::Quiet {
            eprintln!("wrote {}", out.display());
        }
    }
    outln!("{}", built.digest);
    Ok(ExitCode::SUCCESS)
}

/// Ctrl-C, SIGTERM and SIGHUP during a build: the signal is noted, the
/// running step's sandbox is killed (from a thread of its own; the step's
/// exec then fails and its error path removes what it made) and no step
/// starts after it.
fn watch_interrupts(flag: &Arc<AtomicBool>) -> crate::error::Result<Interrupts> {
    // The builder runs on this thread: its sandboxes are this thread's
    // children.
    let builder = sifbox_engine::supervisor::current_tid();
    let flag = Arc::clone(flag);
    Interrupts::watch(move |_| {
        flag.store(true, Ordering::SeqCst);
        // Again a little later: a step may have been starting.
        for _ in 0..3 {
            sifbox_engine::supervisor::kill_sandboxes_of_thread(builder);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    })
}

/// `--layer-size`: a size of at least 16 MiB.
fn layer_size(text: &str) -> crate::error::Result<u64> {
    let min = sifbox_build::layers::MIN_LAYER_BYTES;
    match sifbox_engine::spec::parse_size(text) {
        Ok(n) if n >= min => Ok(n),
        Ok(_) => Err(bad(
            format!("--layer-size {text}"),
            "is below 16 MiB, the least a step's layer may have",
            "give at least 16m",
        )),
        Err(why) => Err(bad(
            format!("--layer-size {text}"),
            &why,
            "give a size such as 512m or 10g",
        )),
    }
}
