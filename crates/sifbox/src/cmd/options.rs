//! Options shared by the commands that create sandboxes or run commands in
//! them, and their translation into engine types.

use std::path::PathBuf;

use sifbox_engine::spec::{self, Confinement, NetMode, SeccompMode, UsernsMode};
use sifbox_launch::{Layer, LimitOptions, LimitsFrom, Logs, Memory, Planned, SandboxOptions};
use sifbox_registry::Resolved;

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

impl From<NetArg> for NetMode {
    fn from(n: NetArg) -> NetMode {
        match n {
            NetArg::Host => NetMode::Host,
            NetArg::None => NetMode::None,
        }
    }
}

impl From<UsernsArg> for UsernsMode {
    fn from(u: UsernsArg) -> UsernsMode {
        match u {
            UsernsArg::Auto => UsernsMode::Auto,
            UsernsArg::Single => UsernsMode::Single,
            UsernsArg::Full => UsernsMode::Full,
        }
    }
}

/// `--progress` of `build` and `eval`: what they report on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressArg {
    /// Condensed, or a live line, on a terminal; else plain.
    #[value(alias = "tty")]
    Auto,
    /// A line per event.
    Plain,
    /// Nothing but the result.
    Quiet,
}

/// A flag's value as one of `E`'s (by its clap names and aliases), for
/// the commands whose every bad input is one line of sifbox's (`build`,
/// `eval`): `--progress loud: unknown mode; use auto, plain or quiet`.
pub fn value_of<E: clap::ValueEnum>(flag: &str, s: &str) -> crate::error::Result<E> {
    E::from_str(s, false).map_err(|_| {
        let names: Vec<String> = E::value_variants()
            .iter()
            .filter_map(E::to_possible_value)
            .map(|p| p.get_name().to_string())
            .collect();
        let list = match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        bad(
            &format!("{flag} {s}"),
            "unknown mode",
            &format!("use {list}"),
        )
    })
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
    pub memory: Option<Memory>,
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

/// `--memory`: a size, or `unlimited`.
fn memory_arg(s: &str) -> Result<Memory, String> {
    Memory::parse(s)
}

impl LimitArgs {
    /// The limits as the flags ask for them (the rest is the config
    /// file's, else sifbox's defaults: `sifbox_launch::LimitOptions`);
    /// `--cpus` above the host's CPUs is refused.
    pub fn options(&self) -> crate::error::Result<LimitOptions> {
        cpus_within_host(self.cpus, sifbox_engine::limits::allowed_cpus().len())?;
        Ok(LimitOptions {
            memory: self.memory,
            memory_swap: self.memory_swap,
            pids: self.pids,
            cpus_milli: self.cpus,
            nofile: self.ulimit,
        })
    }
}

/// `--cpus` above the CPUs this process may use (`have`) is refused, as
/// Docker does: it would limit nothing, while saying it does.
fn cpus_within_host(milli: Option<u32>, have: usize) -> crate::error::Result<()> {
    match milli {
        Some(m) if have > 0 && u64::from(m) > u64::try_from(have).unwrap_or(u64::MAX) * 1000 => {
            Err(crate::error::CliError::usage(
                format!("--cpus {}", f64::from(m) / 1000.0),
                format!("this host lets sifbox use {have} CPUs"),
                format!("ask for at most --cpus {have}, or leave --cpus out for no CPU limit"),
            ))
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
    #[arg(long = "host-ca", value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = sifbox_launch::host_ca::DEFAULT_CA)]
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
    pub fn resolve(&self) -> crate::error::Result<Vec<(String, String)>> {
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

/// `--timeout SECONDS`, as `run` and `exec` take it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TimeoutArg {
    /// Kill every process the command started after this many seconds; exit 124.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
}

impl TimeoutArg {
    /// The limit, checked: a positive, finite number of seconds.
    pub fn duration(&self) -> Result<Option<std::time::Duration>, crate::error::CliError> {
        match self.timeout {
            None => Ok(None),
            Some(t) if t > 0.0 && t.is_finite() => Ok(Some(std::time::Duration::from_secs_f64(t))),
            Some(_) => Err(bad(
                "--timeout",
                "must be a positive number of seconds",
                "e.g. --timeout 30",
            )),
        }
    }
}

pub fn bad(what: &str, why: &str, fix: &str) -> crate::error::CliError {
    crate::error::CliError::usage(what, why, fix)
}

impl SandboxArgs {
    /// The options of the one assembly (`sifbox_launch::assemble`).
    pub fn options(&self) -> crate::error::Result<SandboxOptions> {
        let binds = self
            .bind
            .iter()
            .map(|b| spec::Bind::parse(b))
            .collect::<Result<Vec<_>, _>>()?;
        let layer = match (&self.overlay, self.disk) {
            (_, Some(bytes)) => Layer::Disk {
                size_mib: bytes.div_ceil(1 << 20),
                scratch: None,
            },
            (Some(dir), None) => Layer::Overlay { dir: dir.clone() },
            (None, None) => Layer::Tmpfs {
                size_mib: self.tmpfs_size,
            },
        };
        Ok(SandboxOptions {
            name: self.name.clone(),
            hostname: self.hostname.clone(),
            user: self.user.clone(),
            net: self.net.into(),
            userns: self.userns.into(),
            ids: None,
            layer,
            shm_bytes: Some(self.shm_size),
            confinement: self.confine.confinement(),
            limits: LimitsFrom::Options(self.limits.options()?),
            env: self.env.resolve()?,
            binds,
            host_ca: sifbox_launch::host_ca::for_sandboxes(self.host_ca.as_deref())?,
            logs: self.logs.as_ref().map(|dir| Logs {
                dir: dir.clone(),
                owner: self.logs_owner.clone(),
            }),
        })
    }
}

/// Turns the sandbox options and the resolved image into a spec.
pub fn build_spec(a: &SandboxArgs, image: &Resolved) -> crate::error::Result<Planned> {
    Ok(sifbox_launch::assemble(image, &a.options()?)?)
}

/// Resolves the image of a sandbox command: `--rootfs DIR` (a directory) or
/// the IMAGE argument.
pub fn resolve_image(a: &SandboxArgs, image: Option<&str>) -> crate::error::Result<Resolved> {
    Ok(sifbox_launch::image::for_sandbox(
        a.rootfs.as_deref(),
        image,
        crate::cmd::progress::for_stderr(false),
    )?)
}

/// What the image's other users wrote in a finished sandbox's logs dir
/// (files of other ids of the caller's mapping, unreadable and
/// unremovable for an unprivileged caller) is the caller's again (`run`,
/// `stop`), and no file there keeps a setuid or setgid bit or a file
/// capability (which the sandbox's root, the caller outside, could set
/// for other local users to run); a failure is a warning. The store opens
/// only when needed.
pub fn give_back_logs(userns: UsernsMode, logs: &std::path::Path) {
    if sifbox_launch::give_back::has_foreign_files(logs) {
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
    let given = (|| -> crate::error::Result<()> {
        let exe = sifbox_launch::current_exe()?;
        let store = sifbox_launch::store::open()?;
        sifbox_launch::give_back::give_back_outputs(&store, exe, userns, logs)?;
        Ok(())
    })();
    if let Err(e) = given {
        eprintln!(
            "sifbox: warning: files that the sandbox wrote in {} as other ids of your subordinate range could not all be given back to you ({e})",
            logs.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_above_the_host_are_refused() {
        assert!(cpus_within_host(Some(2000), 2).is_ok());
        assert!(cpus_within_host(Some(500), 2).is_ok());
        assert!(cpus_within_host(None, 2).is_ok());
        // Unknown CPUs (affinity unreadable): not refused.
        assert!(cpus_within_host(Some(99_000), 0).is_ok());
        let e = cpus_within_host(Some(2001), 2).expect_err("refused");
        assert_eq!(e.exit_code(), crate::EXIT_SIFBOX_ERROR);
        let text = e.to_string();
        assert!(text.contains("--cpus 2.001"), "{text}");
        assert!(text.contains("at most --cpus 2"), "{text}");
    }

    #[test]
    fn a_flags_value_is_one_of_its_enums_or_one_line_that_lists_them() {
        assert_eq!(
            value_of::<ProgressArg>("--progress", "tty").ok(),
            Some(ProgressArg::Auto)
        );
        assert!(matches!(
            value_of::<UsernsArg>("--userns", "full"),
            Ok(UsernsArg::Full)
        ));
        let e = value_of::<ProgressArg>("--progress", "loud").expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "--progress loud: unknown mode; use auto, plain or quiet"
        );
    }
}
