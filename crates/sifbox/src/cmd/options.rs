//! Options shared by the commands that create sandboxes or run commands in
//! them, and their translation into engine types.

use std::path::PathBuf;

use sifbox_engine::evidence::ImageRef;
use sifbox_engine::spec::{self, Bind, Confinement, NetMode, SeccompMode, UsernsMode, Writable};
use sifbox_engine::{idmap, Error, ExecDefaults, SandboxSpec};

use crate::cmd::image::Resolved;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum NetArg {
    /// Share the host's network.
    Host,
    /// Only a loopback interface of the sandbox's own.
    None,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum UsernsArg {
    /// `full` when you have a subordinate id range and newuidmap, else `single`.
    Auto,
    /// Map only your own uid/gid (to root inside).
    Single,
    /// Map your own id to root and your subordinate range from 1 (chown works).
    Full,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SeccompArg {
    /// sifbox's policy: an allow-list modelled on Docker's (SECURITY.md lists it).
    Default,
    /// No system call filter.
    Unconfined,
}

/// What commands may ask of the kernel: shared by run, start, build and eval.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfineArgs {
    /// System call filter of the commands: `default` denies what no
    /// ordinary program needs (keyctl, bpf, io_uring, userfaultfd,
    /// perf_event_open, kernel modules, new user namespaces...);
    /// `unconfined` turns the filter off.
    #[arg(long, value_enum, default_value = "default", value_name = "MODE")]
    pub seccomp: SeccompArg,
    /// Let commands create user namespaces (and other namespaces and mounts
    /// in them), which bubblewrap, Chromium's own sandbox and container
    /// tools inside need; denied by default.
    #[arg(long)]
    pub allow_userns: bool,
}

impl ConfineArgs {
    pub fn confinement(&self) -> Confinement {
        Confinement {
            seccomp: match self.seccomp {
                SeccompArg::Default => SeccompMode::Default,
                SeccompArg::Unconfined => SeccompMode::Unconfined,
            },
            allow_userns: self.allow_userns,
        }
    }
}

/// Resource limits of a sandbox, as Docker spells them.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Memory of all the sandbox's processes together, its tmpfs writes
    /// included: bytes, or with a unit (`512m`, `2g`); `unlimited` for
    /// none. Default: `[limits] memory` of ~/.config/sifbox/config.toml,
    /// else 4 GiB or half the host's RAM, whichever is less.
    #[arg(long, value_name = "SIZE", value_parser = memory_arg)]
    pub memory: Option<MemoryArg>,
    /// Memory plus swap (Docker's meaning): equal to --memory for no swap,
    /// -1 for unlimited swap; default twice --memory.
    #[arg(long, value_name = "SIZE", value_parser = swap_arg, allow_hyphen_values = true)]
    pub memory_swap: Option<spec::Swap>,
    /// Processes and threads at the same time (default 4096).
    #[arg(long, value_name = "N", default_value_t = spec::DEFAULT_PIDS)]
    pub pids: u64,
    /// CPUs the sandbox may use: a number, fractions allowed (`0.5`, `2`).
    #[arg(long, value_name = "N", value_parser = spec::parse_cpus)]
    pub cpus: Option<u32>,
    /// Open files per process: `nofile=SOFT[:HARD]` (default
    /// nofile=1024:524288, or `[limits] nofile` of the config file).
    #[arg(long, value_name = "nofile=SOFT[:HARD]", value_parser = spec::parse_ulimit)]
    pub ulimit: Option<spec::Nofile>,
}

/// `--memory`: a size, or no limit at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryArg {
    Size(u64),
    Unlimited,
}

fn memory_arg(s: &str) -> Result<MemoryArg, String> {
    if s.trim().eq_ignore_ascii_case("unlimited") {
        return Ok(MemoryArg::Unlimited);
    }
    spec::parse_size(s).map(MemoryArg::Size)
}

/// `[limits]` of the caller's config file: `memory` (a size or
/// "unlimited"), `user_pids` (a number), `nofile` ("SOFT[:HARD]").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LimitsConfig {
    memory: Option<MemoryArg>,
    user_pids: Option<u64>,
    nofile: Option<spec::Nofile>,
}

fn limits_config() -> sifbox_engine::Result<LimitsConfig> {
    let Some((file, table)) = crate::cmd::image::config_table() else {
        return Ok(LimitsConfig::default());
    };
    parse_limits_config(&file, &table)
}

fn parse_limits_config(
    file: &std::path::Path,
    table: &toml::Table,
) -> sifbox_engine::Result<LimitsConfig> {
    let mut c = LimitsConfig::default();
    let Some(limits) = table.get("limits") else {
        return Ok(c);
    };
    let bad = |key: &str, v: &dyn std::fmt::Display, why: String, fix: &str| Error::BadInput {
        what: if key.is_empty() {
            format!("limits = {v} in {}", file.display())
        } else {
            format!("limits.{key} = {v} in {}", file.display())
        },
        why,
        fix: fix.into(),
    };
    let Some(limits) = limits.as_table() else {
        return Err(bad(
            "",
            limits,
            "[limits] is not a table".into(),
            "write it as a [limits] section",
        ));
    };
    for (key, v) in limits {
        match (key.as_str(), v) {
            ("memory", toml::Value::String(t)) => {
                c.memory = Some(memory_arg(t).map_err(|why| {
                    bad(key, v, why, "give a size such as \"8g\", or \"unlimited\"")
                })?);
            }
            ("user_pids", toml::Value::Integer(n)) if *n > 0 => {
                c.user_pids = u64::try_from(*n).ok();
            }
            ("nofile", toml::Value::String(t)) => {
                c.nofile = Some(spec::parse_ulimit(&format!("nofile={t}")).map_err(|why| {
                    bad(key, v, why, "give \"SOFT:HARD\" such as \"1024:524288\"")
                })?);
            }
            ("memory" | "user_pids" | "nofile", _) => {
                return Err(bad(
                    key,
                    v,
                    "not a value of the right kind".into(),
                    "memory = \"8g\" or \"unlimited\"; user_pids = 16384; nofile = \"1024:524288\"",
                ))
            }
            _ => {
                return Err(bad(
                    key,
                    v,
                    "no such limit".into(),
                    "[limits] takes memory, user_pids and nofile",
                ))
            }
        }
    }
    Ok(c)
}

impl LimitArgs {
    /// The limits: flags first, then `[limits]` of the config file, then
    /// sifbox's defaults (marked as such in the record).
    pub fn limits(&self) -> sifbox_engine::Result<spec::Limits> {
        self.limits_with(&limits_config()?)
    }

    fn limits_with(&self, config: &LimitsConfig) -> sifbox_engine::Result<spec::Limits> {
        let mut defaults = spec::Defaulted::default();
        let memory = match self.memory.or(config.memory) {
            Some(MemoryArg::Size(m)) => Some(m),
            Some(MemoryArg::Unlimited) => None,
            None => {
                defaults.memory = true;
                Some(spec::default_memory())
            }
        };
        let user_pids = config.user_pids.unwrap_or_else(|| {
            defaults.user_pids = true;
            spec::default_user_pids()
        });
        let nofile = self.ulimit.or(config.nofile).unwrap_or_else(|| {
            defaults.nofile = true;
            spec::DEFAULT_NOFILE
        });
        defaults.pids = self.pids == spec::DEFAULT_PIDS;
        cpus_within_host(self.cpus, sifbox_engine::limits::allowed_cpus().len())?;
        let l = spec::Limits {
            memory,
            memory_swap: self.memory_swap,
            pids: Some(self.pids),
            cpus_milli: self.cpus,
            user_pids: Some(user_pids),
            nofile: Some(nofile),
            defaults,
        };
        l.validate()?;
        Ok(l)
    }
}

/// `--cpus` above the CPUs this process may use (`have`) is refused, as
/// Docker does: it would limit nothing, while saying it does.
fn cpus_within_host(milli: Option<u32>, have: usize) -> sifbox_engine::Result<()> {
    match milli {
        Some(m) if have > 0 && u64::from(m) > u64::try_from(have).unwrap_or(u64::MAX) * 1000 => {
            Err(sifbox_engine::Error::BadInput {
                what: format!("--cpus {}", f64::from(m) / 1000.0),
                why: format!("this host lets sifbox use {have} CPUs"),
                fix: format!("ask for at most --cpus {have}, or leave --cpus out for no CPU limit"),
            })
        }
        _ => Ok(()),
    }
}

fn swap_arg(s: &str) -> Result<spec::Swap, String> {
    if s.trim() == "-1" {
        return Ok(spec::Swap::Unlimited);
    }
    spec::parse_size(s).map(spec::Swap::Total)
}

/// Parses a `--shm-size`-style size (`64m`, `1g`, bytes).
pub fn size_arg(s: &str) -> Result<u64, String> {
    spec::parse_size(s)
}

/// Options shared by every command that creates a sandbox.
#[derive(Debug, clap::Args)]
pub struct SandboxArgs {
    /// Root file system directory to use as the (read-only) image.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// Run commands as this user of the image (default: the image's USER,
    /// else root): NAME, UID, UID:GID or NAME:GROUP.
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
    /// Network: `host` shares the host's, `none` gives only loopback.
    #[arg(long, value_enum, default_value = "host")]
    pub net: NetArg,
    /// How ids are mapped into the sandbox's user namespace.
    #[arg(long, value_enum, default_value = "auto")]
    pub userns: UsernsArg,
    /// Keep writes in a tmpfs that disappears with the sandbox (the default).
    #[arg(long)]
    pub writable_tmpfs: bool,
    /// Size limit of the --writable-tmpfs layer in MiB (/tmp inside is
    /// part of it).
    #[arg(long, value_name = "MIB", default_value_t = spec::DEFAULT_TMPFS_MIB)]
    pub tmpfs_size: u64,
    /// Size of /dev/shm (a tmpfs): bytes, or with a unit (`64m`, `1g`).
    #[arg(long, value_name = "SIZE", default_value = "64m", value_parser = size_arg)]
    pub shm_size: u64,
    #[command(flatten)]
    pub confine: ConfineArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Keep writes in DIR/upper on the host, for inspection afterwards.
    #[arg(long, value_name = "DIR", conflicts_with = "writable_tmpfs")]
    pub overlay: Option<PathBuf>,
    /// Keep writes on disk, in an ext4 file system of SIZE (`10g`) made for
    /// the sandbox and gone with it, instead of in memory (host root only;
    /// in $SIFBOX_SCRATCH, else <store>/scratch).
    #[arg(long, value_name = "SIZE", value_parser = size_arg, conflicts_with_all = ["overlay", "writable_tmpfs", "tmpfs_size"])]
    pub disk: Option<u64>,
    /// Host name inside (default: the sandbox name).
    #[arg(long)]
    pub hostname: Option<String>,
    /// Sandbox name (default: run-<random>).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub env: EnvArgs,
    /// Bind DIR at /logs, with agent/, verifier/ and artifacts/ in it
    /// (0700, owned by --logs-owner; DIR itself 0700, or 0711 when the
    /// owner is not root); sandbox.json is written there. DIR
    /// outlives the sandbox.
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// The user of the image that owns (and alone, besides root, may write)
    /// the --logs subdirs (default: --user, else the image's USER, else
    /// root).
    #[arg(long, value_name = "USER", requires = "logs")]
    pub logs_owner: Option<String>,
    /// Make a host path visible inside: SRC[:DST[:ro|rw]] (repeatable).
    #[arg(long, value_name = "SRC:DST[:ro]")]
    pub bind: Vec<String>,
    /// Show the host's CA bundle (default
    /// /etc/ssl/certs/ca-certificates.crt) at /run/sifbox/host-ca.crt, with
    /// SSL_CERT_FILE, REQUESTS_CA_BUNDLE, PIP_CERT, CURL_CA_BUNDLE,
    /// NODE_EXTRA_CA_CERTS and GIT_SSL_CAINFO pointing at it, for sites
    /// whose HTTPS goes through an intercepting proxy (also:
    /// SIFBOX_HOST_CA=1). Another file goes as `--host-ca=FILE`.
    #[arg(long = "host-ca", value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = sifbox_build::inputs::DEFAULT_CA)]
    pub host_ca: Option<PathBuf>,
}

/// Environment options of commands that run something.
#[derive(Debug, Clone, clap::Args)]
pub struct EnvArgs {
    /// Set a variable inside (repeatable; beats --env-file). `--env KEY`
    /// alone takes KEY's value from sifbox's own environment, which keeps
    /// secrets out of command lines.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VALUE]")]
    pub env: Vec<String>,
    /// Read KEY=VALUE lines (no shell evaluation) into the environment.
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,
}

impl EnvArgs {
    /// The variables given, in order (files first, then --env).
    pub fn resolve(&self) -> sifbox_engine::Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for f in &self.env_file {
            out.extend(spec::parse_env_file(f)?);
        }
        for e in &self.env {
            if e.contains('=') {
                out.push(spec::parse_env_arg(e)?);
            } else {
                let value = std::env::var(e).map_err(|_| {
                    bad(
                        &format!("--env {e}"),
                        "no value given and sifbox's environment has none",
                        "pass --env KEY=VALUE, or set KEY in the environment sifbox runs in",
                    )
                })?;
                out.push(spec::parse_env_arg(&format!("{e}={value}"))?);
            }
        }
        Ok(out)
    }
}

pub fn bad(what: &str, why: &str, fix: &str) -> Error {
    Error::BadInput {
        what: what.into(),
        why: why.into(),
        fix: fix.into(),
    }
}

/// A sandbox as the options describe it.
#[derive(Debug)]
pub struct Planned {
    pub spec: SandboxSpec,
    /// The environment commands start with.
    pub env: Vec<(String, String)>,
    /// The logs dir (absolute), when asked for.
    pub logs: Option<PathBuf>,
    /// The user of the image to give the logs subdirs to, once the
    /// sandbox runs (None: they stay root's).
    pub logs_owner: Option<String>,
    /// The image, for the evidence.
    pub image: ImageRef,
    /// What commands default to, from the image.
    pub defaults: ExecDefaults,
    /// How ids are mapped (`--userns`).
    pub userns: UsernsMode,
}

/// Turns the sandbox options and the resolved image into a spec.
pub fn build_spec(a: &SandboxArgs, image: &Resolved) -> sifbox_engine::Result<Planned> {
    let rootfs = image.rootfs.clone();
    let name = match &a.name {
        Some(n) => n.clone(),
        None => format!("run-{}", sifbox_engine::random_id(6)),
    };
    spec::validate_name(&name)?;
    // The image's environment first, then --env-file, then --env.
    let mut extra = image.meta.env_pairs();
    extra.extend(a.env.resolve()?);
    let mut env = spec::clean_env(std::env::vars(), &extra);
    let mut binds = a
        .bind
        .iter()
        .map(|b| Bind::parse(b))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(ca) = a
        .host_ca
        .clone()
        .or_else(sifbox_build::inputs::host_ca_from_env)
    {
        sifbox_build::inputs::show_host_ca(&ca, &mut binds, &mut env).map_err(|e| match e {
            sifbox_build::error::BuildError::BadInput { what, why, fix } => {
                Error::BadInput { what, why, fix }
            }
            other => Error::Setup(other.to_string()),
        })?;
    }
    // The logs dir is the caller's alone (0700) unless a user of the image
    // other than root gets its subdirs: that user must pass through /logs.
    let owner = a.logs_owner.as_deref().or(a.user.as_deref()).or(image
        .meta
        .user
        .as_deref()
        .filter(|u| !u.is_empty()));
    let passable = owner.is_some_and(|o| !matches!(o, "root" | "0" | "0:0" | "root:root"));
    let logs = a
        .logs
        .as_deref()
        .map(|d| sifbox_engine::evidence::prepare_logs_dir(d, passable))
        .transpose()?
        .map(|l| l.path);
    if let Some(dir) = &logs {
        binds.extend(sifbox_engine::evidence::logs_binds(dir));
    }
    let mode = match a.userns {
        UsernsArg::Auto => UsernsMode::Auto,
        UsernsArg::Single => UsernsMode::Single,
        UsernsArg::Full => UsernsMode::Full,
    };
    let ids = idmap::resolve(mode, &idmap::Caller::current())?;
    let writable = match (&a.overlay, a.disk) {
        (_, Some(bytes)) => Writable::Disk {
            size_mib: bytes.div_ceil(1 << 20),
            scratch: sifbox_engine::disk::scratch_dir(
                &sifbox_image::store::Store::default_root().join("scratch"),
            ),
        },
        (Some(dir), None) => {
            let dir = std::path::absolute(dir)
                .map_err(|e| Error::io(format!("--overlay {}", dir.display()), e))?;
            if dir.starts_with(&rootfs) {
                return Err(bad(
                    &format!("--overlay {}", dir.display()),
                    "it lies inside the image",
                    "choose a directory outside the root file system",
                ));
            }
            Writable::Overlay { dir }
        }
        (None, None) => Writable::Tmpfs {
            size_mib: a.tmpfs_size,
        },
    };
    let mut spec = SandboxSpec::new(name, rootfs, ids);
    if let Some(h) = &a.hostname {
        spec.hostname.clone_from(h);
    }
    spec.net = match a.net {
        NetArg::Host => NetMode::Host,
        NetArg::None => NetMode::None,
    };
    spec.writable = writable;
    spec.binds = binds;
    spec.shm_bytes = a.shm_size;
    spec.confinement = a.confine.confinement();
    spec.limits = a.limits.limits()?;
    spec.validate()?;
    let defaults = ExecDefaults {
        cwd: image.meta.workdir.clone().filter(|w| !w.is_empty()),
        user: a
            .user
            .clone()
            .or_else(|| image.meta.user.clone().filter(|u| !u.is_empty())),
        source_env_scripts: image.env_scripts,
    };
    let logs_owner = logs
        .as_ref()
        .and(a.logs_owner.clone().or_else(|| defaults.user.clone()));
    let image = ImageRef {
        reference: image.reference.clone(),
        digest: image.digest.as_ref().map(ToString::to_string),
        rootfs: image.rootfs.clone(),
    };
    Ok(Planned {
        spec,
        env,
        logs,
        logs_owner,
        image,
        defaults,
        userns: mode,
    })
}

/// Gives the logs subdirs of a sandbox started with `--logs` to their
/// owner (a user of the image; the sandbox's root chowns them, which an
/// unprivileged caller could not do on the host). Done before any command
/// runs, so that nothing inside has had a chance to replace them.
pub fn own_logs(
    sandbox: &sifbox_engine::Sandbox,
    owner: Option<&str>,
) -> sifbox_engine::Result<()> {
    let Some(owner) = owner else {
        return Ok(());
    };
    for sub in sifbox_engine::evidence::SUBDIRS {
        sandbox.chown(&format!("/logs/{sub}"), owner).map_err(|e| {
            bad(
                &format!("--logs-owner {owner}"),
                &format!("cannot give /logs/{sub} to it: {e}"),
                "name a user of the image (--logs-owner NAME|UID[:GID]), or leave the logs dir to root",
            )
        })?;
    }
    Ok(())
}

/// Resolves the image of a sandbox command: `--rootfs DIR` (a directory) or
/// the IMAGE argument.
pub fn resolve_image(a: &SandboxArgs, image: Option<&str>) -> crate::error::Result<Resolved> {
    match (&a.rootfs, image) {
        (Some(dir), None) => {
            if !dir.is_dir() {
                return Err(bad(
                    &format!("--rootfs {}", dir.display()),
                    "no such directory",
                    "pass an unpacked root file system directory, or an IMAGE without --rootfs",
                )
                .into());
            }
            crate::cmd::image::resolve(&dir.to_string_lossy())
        }
        (None, Some(i)) => crate::cmd::image::resolve(i),
        _ => Err(bad(
            "image",
            "give exactly one image (IMAGE or --rootfs DIR)",
            "e.g. --rootfs ./rootfs, or an image name from `sifbox image ls`",
        )
        .into()),
    }
}

/// What the image's other users wrote in a finished sandbox's logs dir
/// (files of other ids of the caller's mapping, unreadable and
/// unremovable for an unprivileged caller) is the caller's again (`run`,
/// `stop`), and no file there keeps a setuid or setgid bit or a file
/// capability (which the sandbox's root, the caller outside, could set
/// for other local users to run); a failure is a warning. The store opens
/// only when needed.
pub fn give_back_logs(userns: UsernsMode, logs: &std::path::Path) {
    if sifbox_build::layers::has_foreign_files(logs) {
        give_back_foreign(userns, logs);
    }
    match sifbox_image::setid::strip_tree(logs) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!(
            "sifbox: warning: setuid/setgid bits or file capabilities that the sandbox left in {} could not all be removed ({e}): keep other users out of that dir",
            logs.display()
        ),
    }
}

/// The give-back of [`give_back_logs`].
fn give_back_foreign(userns: UsernsMode, logs: &std::path::Path) {
    let given = std::env::current_exe()
        .map_err(|e| format!("locating the sifbox binary: {e}"))
        .and_then(|exe| {
            crate::cmd::image::open_store()
                .map_err(|e| e.to_string())
                .map(|store| (exe, store))
        })
        .and_then(|(exe, store)| {
            sifbox_build::layers::give_back_outputs(&store, exe, userns, logs)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = given {
        eprintln!(
            "sifbox: warning: files that the sandbox wrote in {} as other ids of your subordinate range could not all be given back to you ({e})",
            logs.display()
        );
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn cpus_above_the_host_are_refused() {
        assert!(cpus_within_host(Some(2000), 2).is_ok());
        assert!(cpus_within_host(Some(500), 2).is_ok());
        assert!(cpus_within_host(None, 2).is_ok());
        // Unknown CPUs (affinity unreadable): not refused.
        assert!(cpus_within_host(Some(99_000), 0).is_ok());
        let e = cpus_within_host(Some(2001), 2).expect_err("refused");
        assert!(e.is_bad_input());
        let text = e.to_string();
        assert!(text.contains("--cpus 2.001"), "{text}");
        assert!(text.contains("at most --cpus 2"), "{text}");
    }

    fn args(memory: Option<MemoryArg>) -> LimitArgs {
        LimitArgs {
            memory,
            memory_swap: None,
            pids: spec::DEFAULT_PIDS,
            cpus: None,
            ulimit: None,
        }
    }

    fn config(text: &str) -> sifbox_engine::Result<LimitsConfig> {
        parse_limits_config(
            std::path::Path::new("/c.toml"),
            &text.parse::<toml::Table>().expect("toml"),
        )
    }

    #[test]
    fn flags_beat_the_config_which_beats_the_defaults() {
        let l = args(None)
            .limits_with(&LimitsConfig::default())
            .expect("ok");
        assert_eq!(l.memory, Some(spec::default_memory()));
        assert!(l.defaults.memory && l.defaults.user_pids && l.defaults.nofile);
        assert_eq!(l.nofile, Some(spec::DEFAULT_NOFILE));
        let c = config("[limits]\nmemory = \"unlimited\"\nuser_pids = 50\nnofile = \"10:20\"")
            .expect("config");
        let l = args(None).limits_with(&c).expect("ok");
        assert_eq!(l.memory, None);
        assert_eq!(l.user_pids, Some(50));
        assert_eq!(l.nofile, Some(spec::Nofile { soft: 10, hard: 20 }));
        assert!(!l.defaults.memory && !l.defaults.user_pids && !l.defaults.nofile);
        let l = args(Some(MemoryArg::Size(1 << 30)))
            .limits_with(&c)
            .expect("ok");
        assert_eq!(l.memory, Some(1 << 30));
    }

    #[test]
    fn a_bad_config_names_the_key_and_the_file() {
        for bad in [
            "[limits]\nmemory = 5",
            "[limits]\nmemory = \"lots\"",
            "[limits]\nuser_pids = -1",
            "[limits]\nnofile = \"9:1\"",
            "[limits]\nswap = 1",
            "limits = 3",
        ] {
            let e = config(bad).expect_err(bad).to_string();
            assert!(e.contains("/c.toml") && e.contains("limits"), "{bad}: {e}");
        }
        assert_eq!(
            config("[store]\nshared = true").expect("ok"),
            LimitsConfig::default()
        );
    }
}
