//! `sifbox build`: a Dockerfile build context into a store image, rootless
//! and daemonless (flags as `docker build` spells them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use sifbox_build::build::{BuildOptions, Built};
use sifbox_build::error::BuildError;
use sifbox_build::progress::{Mode, Progress};
use sifbox_engine::spec::UsernsMode;
use sifbox_engine::Error;
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
    #[arg(long = "host-ca", value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = sifbox_build::inputs::DEFAULT_CA)]
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

fn bad(what: impl Into<String>, why: impl Into<String>, fix: impl Into<String>) -> Error {
    Error::BadInput {
        what: what.into(),
        why: why.into(),
        fix: fix.into(),
    }
}

/// Resolves a `FROM` reference: the store first (name, digest), then a
/// registry.
pub(crate) fn resolve_image(store: &Store, reference: &str) -> Result<Digest, BuildError> {
    crate::cmd::image::resolve_reference(store, reference)
        .map_err(|e| BuildError::bad(format!("image {}", e.arg), e.kind.to_string(), e.fix()))
}

pub fn run(a: BuildArgs) -> crate::error::Result<ExitCode> {
    let mode = if a.quiet {
        Mode::Quiet
    } else {
        Mode::parse(&a.progress).ok_or_else(|| {
            bad(
                format!("--progress {}", a.progress),
                "unknown mode",
                "use auto, plain or quiet",
            )
        })?
    };
    let store = crate::cmd::image::open_store()?;
    let interrupted = Interruption::watch()?;
    let exe = std::env::current_exe().map_err(|e| Error::io("finding the sifbox binary", e))?;
    // The files of `--secret id=..,env=VAR`: in the store's tmp/, where
    // `sifbox gc` finds them if the build is killed (SIGKILL), not in /tmp.
    let scratch = store.work_dir("build-secrets")?;
    let host_ca = a
        .host_ca
        .clone()
        .or_else(sifbox_build::inputs::host_ca_from_config);
    if let Some(ca) = &host_ca {
        if !ca.is_file() {
            return Err(bad(
                format!("--host-ca {}", ca.display()),
                "no such file",
                "pass the host's CA bundle file",
            )
            .into());
        }
    }
    for t in &a.tags {
        sifbox_image::store::normalize_name(t).map_err(|e| {
            bad(
                format!("--tag {t}"),
                e.to_string(),
                "use NAME[:TAG] with lower-case letters, digits and . _ - /",
            )
        })?;
    }
    let userns = match a.userns.as_str() {
        "auto" => UsernsMode::Auto,
        "full" => UsernsMode::Full,
        "single" => UsernsMode::Single,
        other => {
            return Err(bad(
                format!("--userns {other}"),
                "unknown mode",
                "use auto, full or single",
            )
            .into())
        }
    };
    let opts = BuildOptions {
        userns,
        context: a.context.clone(),
        dockerfile: a.file.clone(),
        build_args: sifbox_build::inputs::build_args(&a.build_args),
        secrets: sifbox_build::inputs::secrets(&a.secrets, scratch.path()).map_err(
            |e| match e {
                BuildError::BadInput { what, why, fix } => bad(what, why, fix),
                other => Error::Setup(other.to_string()),
            },
        )?,
        target: a.target.clone(),
        no_cache: a.no_cache,
        layer_size: layer_size(&a.layer_size)?,
        host_ca,
        exe,
        confinement: a.confine.confinement(),
        interrupted: Some(Arc::clone(&interrupted.flag)),
        cache_scope: None,
    };
    let progress = Arc::new(Progress::new(mode));
    let resolver = |r: &str| resolve_image(&store, r);
    let result = sifbox_build::build::build(&store, &opts, &resolver, progress);
    // What the build made is gone by now (its error path, or the drops
    // above); the scratch dir goes with `scratch` below.
    if let Some(sig) = interrupted.stop() {
        drop(scratch);
        return Err(crate::error::CliError::Interrupted {
            signal: sig,
            report: Some(format!(
                "the build was interrupted by {}; nothing was stored, and what it made is removed",
                signal_name(sig)
            )),
        });
    }
    let built: Built = result?;
    for t in &a.tags {
        let name = store
            .tag(t, &built.digest)
            .map_err(|e| bad(format!("--tag {t}"), e.to_string(), "use NAME[:TAG]"))?;
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
struct Interruption {
    flag: Arc<AtomicBool>,
    signal: Arc<AtomicI32>,
    handle: signal_hook::iterator::Handle,
}

impl Interruption {
    fn watch() -> crate::error::Result<Interruption> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let flag = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicI32::new(0));
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| Error::io("installing signal handlers", e))?;
        let handle = signals.handle();
        // The builder runs on this thread: its sandboxes are this thread's
        // children.
        let builder = sifbox_engine::supervisor::current_tid();
        let (f, s) = (Arc::clone(&flag), Arc::clone(&signal));
        std::thread::spawn(move || {
            for sig in signals.forever() {
                let _ = s.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
                f.store(true, Ordering::SeqCst);
                // Again a little later: a step may have been starting.
                for _ in 0..3 {
                    sifbox_engine::supervisor::kill_sandboxes_of_thread(builder);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        });
        Ok(Interruption {
            flag,
            signal,
            handle,
        })
    }

    /// Stops watching; the signal that interrupted the build, if one did.
    fn stop(&self) -> Option<i32> {
        self.handle.close();
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT (Ctrl-C)",
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
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
        )
        .into()),
        Err(why) => Err(bad(
            format!("--layer-size {text}"),
            &why,
            "give a size such as 512m or 10g",
        )
        .into()),
    }
}
