//! `sifbox build`: a Dockerfile build context into a store image, rootless
//! and daemonless (flags as `docker build` spells them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use sifbox_build::build::{BuildOptions, Built};
use sifbox_build::error::BuildError;
use sifbox_build::progress::{Mode, Progress};
use sifbox_engine::spec::UsernsMode;
use sifbox_engine::Error;
use sifbox_image::store::{Digest, Store};

/// The host's CA bundle on Debian and its relatives.
const DEFAULT_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

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
    /// Output: auto (condensed on a terminal), plain (every line), quiet.
    #[arg(long, default_value = "auto", value_name = "auto|plain|quiet")]
    pub progress: String,
    /// Also write the image as a SIF file that Apptainer runs.
    #[arg(short = 'o', long = "output", value_name = "FILE.sif")]
    pub output: Option<PathBuf>,
    /// Make the host's CA bundle (default /etc/ssl/certs/ca-certificates.crt)
    /// visible to RUN steps, for sites whose HTTPS goes through an
    /// intercepting proxy (also: `build.host_ca = true` in
    /// ~/.config/sifbox/config.toml, or SIFBOX_HOST_CA=1).
    #[arg(long = "host-ca", value_name = "FILE", num_args = 0..=1, default_missing_value = DEFAULT_CA)]
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

fn parse_build_args(args: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for a in args {
        match a.split_once('=') {
            Some((k, v)) => {
                out.insert(k.to_string(), v.to_string());
            }
            None => {
                // As Docker: KEY alone takes the value from the environment,
                // and is left out when the environment has none.
                if let Ok(v) = std::env::var(a) {
                    out.insert(a.clone(), v);
                }
            }
        }
    }
    out
}

/// `--secret id=ID,src=PATH` (or `env=VAR`, whose value goes to a 0600
/// file in `scratch`).
fn parse_secrets(
    args: &[String],
    scratch: &Path,
) -> sifbox_engine::Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    for (i, a) in args.iter().enumerate() {
        let mut id = None;
        let mut src = None;
        let mut env = None;
        for field in a.split(',') {
            match field.split_once('=') {
                Some(("id", v)) => id = Some(v.to_string()),
                Some(("src" | "source", v)) => src = Some(PathBuf::from(v)),
                Some(("env", v)) => env = Some(v.to_string()),
                Some(("type", "file" | "env")) => {}
                _ => {
                    return Err(bad(
                        format!("--secret {a}"),
                        format!("unknown field {field:?}"),
                        "use --secret id=ID,src=PATH or --secret id=ID,env=VAR",
                    ))
                }
            }
        }
        let id = id.or_else(|| env.clone()).ok_or_else(|| {
            bad(
                format!("--secret {a}"),
                "no id",
                "use --secret id=ID,src=PATH",
            )
        })?;
        let path = match (src, env) {
            (Some(p), _) => {
                if !p.is_file() {
                    return Err(bad(
                        format!("--secret {a}"),
                        format!("{} is not a file", p.display()),
                        "pass an existing file as src=",
                    ));
                }
                std::fs::canonicalize(&p).map_err(|e| {
                    bad(
                        format!("--secret {a}"),
                        e.to_string(),
                        "pass a readable file",
                    )
                })?
            }
            (None, Some(var)) => {
                let v = std::env::var(&var).map_err(|_| {
                    bad(
                        format!("--secret {a}"),
                        format!("${var} is not set"),
                        "export it or use src=PATH",
                    )
                })?;
                let p = scratch.join(format!("secret-{i}"));
                write_private(&p, v.as_bytes())
                    .map_err(|e| Error::io(p.display().to_string(), e))?;
                p
            }
            (None, None) => {
                return Err(bad(
                    format!("--secret {a}"),
                    "no src= or env=",
                    "use --secret id=ID,src=PATH",
                ))
            }
        };
        out.insert(id, path);
    }
    Ok(out)
}

fn write_private(p: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)?;
    f.write_all(data)
}

/// Whether the config file or the environment asks for the host CA.
pub(crate) fn host_ca_from_config() -> Option<PathBuf> {
    if let Ok(v) = std::env::var("SIFBOX_HOST_CA") {
        return match v.as_str() {
            "" | "0" | "false" | "no" => None,
            "1" | "true" | "yes" => Some(PathBuf::from(DEFAULT_CA)),
            path => Some(PathBuf::from(path)),
        };
    }
    let dir = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let text = std::fs::read_to_string(dir.join("sifbox/config.toml")).ok()?;
    let v: toml::Table = text.parse().ok()?;
    match v.get("build")?.get("host_ca")? {
        toml::Value::Boolean(true) => Some(PathBuf::from(DEFAULT_CA)),
        toml::Value::String(p) => Some(PathBuf::from(p)),
        _ => None,
    }
}

/// Resolves a `FROM` reference: the store first (name, digest), then a
/// registry.
pub(crate) fn resolve_image(store: &Store, reference: &str) -> Result<Digest, BuildError> {
    crate::cmd::image::resolve_reference(store, reference)
        .map_err(|e| BuildError::bad(format!("image {}", e.arg), e.kind.to_string(), e.fix()))
}

pub fn run(a: BuildArgs) -> sifbox_engine::Result<ExitCode> {
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
    let exe = std::env::current_exe().map_err(|e| Error::io("finding the sifbox binary", e))?;
    let scratch = tempfile::Builder::new()
        .prefix("sifbox-build.")
        .tempdir()
        .map_err(|e| Error::io("creating a temporary dir", e))?;
    let host_ca = a.host_ca.clone().or_else(host_ca_from_config);
    if let Some(ca) = &host_ca {
        if !ca.is_file() {
            return Err(bad(
                format!("--host-ca {}", ca.display()),
                "no such file",
                "pass the host's CA bundle file",
            ));
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
            ))
        }
    };
    let opts = BuildOptions {
        userns,
        context: a.context.clone(),
        dockerfile: a.file.clone(),
        build_args: parse_build_args(&a.build_args),
        secrets: parse_secrets(&a.secrets, scratch.path())?,
        target: a.target.clone(),
        no_cache: a.no_cache,
        host_ca,
        exe,
        confinement: a.confine.confinement(),
    };
    let progress = Arc::new(Progress::new(mode));
    let resolver = |r: &str| resolve_image(&store, r);
    let built: Built = match sifbox_build::build::build(&store, &opts, &resolver, progress) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sifbox: error: {e}");
            return Ok(ExitCode::from(if e.is_bad_input() { 125 } else { 1 }));
        }
    };
    for t in &a.tags {
        let name = store
            .tag(t, &built.digest)
            .map_err(|e| bad(format!("--tag {t}"), e.to_string(), "use NAME[:TAG]"))?;
        if mode != Mode::Quiet {
            eprintln!("naming to {name}");
        }
    }
    if let Some(out) = &a.output {
        sifbox_image::import::export(&store, &built.digest, out).map_err(|e| {
            bad(
                format!("--output {}", out.display()),
                e.to_string(),
                "pass a writable path",
            )
        })?;
        if mode != Mode::Quiet {
            eprintln!("wrote {}", out.display());
        }
    }
    outln!("{}", built.digest);
    Ok(ExitCode::SUCCESS)
}
