//! `sifbox run`: one command in a fresh sandbox (start + one exec + stop).

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::spec::{self, Bind, NetMode, UsernsMode, Writable};
use sifbox_engine::{idmap, Error, ExecStatus, Sandbox, SandboxSpec, StartOptions};

use crate::exit_code;

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

/// Options shared by every command that creates a sandbox.
#[derive(Debug, clap::Args)]
pub struct SandboxArgs {
    /// Root file system directory to use as the (read-only) image.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// Network: `host` shares the host's, `none` gives only loopback.
    #[arg(long, value_enum, default_value = "host")]
    pub net: NetArg,
    /// How ids are mapped into the sandbox's user namespace.
    #[arg(long, value_enum, default_value = "auto")]
    pub userns: UsernsArg,
    /// Keep writes in a tmpfs that disappears with the sandbox (the default).
    #[arg(long)]
    pub writable_tmpfs: bool,
    /// Size limit of the --writable-tmpfs layer in MiB.
    #[arg(long, value_name = "MIB", default_value_t = spec::DEFAULT_TMPFS_MIB)]
    pub tmpfs_size: u64,
    /// Keep writes in DIR/upper on the host, for inspection afterwards.
    #[arg(long, value_name = "DIR", conflicts_with = "writable_tmpfs")]
    pub overlay: Option<PathBuf>,
    /// Host name inside (default: the sandbox name).
    #[arg(long)]
    pub hostname: Option<String>,
    /// Sandbox name (default: run-<random>).
    #[arg(long)]
    pub name: Option<String>,
    /// Set an environment variable inside (repeatable; beats --env-file).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Read KEY=VALUE lines (no shell evaluation) into the environment.
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,
    /// Make a host path visible inside: SRC[:DST[:ro|rw]] (repeatable).
    #[arg(long, value_name = "SRC:DST[:ro]")]
    pub bind: Vec<String>,
}

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub cwd: String,
    /// Give the command a pty (when sifbox's stdin is a terminal).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// IMAGE (unless --rootfs is given), then the command and its arguments.
    #[arg(value_name = "[IMAGE] CMD", num_args = 0..)]
    pub args: Vec<String>,
}

fn bad(what: &str, why: &str, fix: &str) -> Error {
    Error::BadInput {
        what: what.into(),
        why: why.into(),
        fix: fix.into(),
    }
}

/// Turns the sandbox options into a spec; returns it with the environment
/// that commands start with.
pub fn build_spec(
    a: &SandboxArgs,
    rootfs: PathBuf,
) -> sifbox_engine::Result<(SandboxSpec, Vec<(String, String)>)> {
    let meta = std::fs::metadata(&rootfs).map_err(|e| {
        bad(
            &format!("image {}", rootfs.display()),
            &format!("cannot use it: {e}"),
            "pass an existing root file system directory (--rootfs DIR)",
        )
    })?;
    if !meta.is_dir() {
        return Err(bad(
            &format!("image {}", rootfs.display()),
            "not a directory",
            "pass an unpacked root file system directory; SIF files and store references come with the image store",
        ));
    }
    let rootfs = std::fs::canonicalize(&rootfs)
        .map_err(|e| Error::io(format!("resolving {}", rootfs.display()), e))?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => format!("run-{}", random_hex()),
    };
    spec::validate_name(&name)?;
    let mut extra = Vec::new();
    for f in &a.env_file {
        extra.extend(spec::parse_env_file(f)?);
    }
    for e in &a.env {
        extra.push(spec::parse_env_arg(e)?);
    }
    let env = spec::clean_env(std::env::vars(), &extra);
    let binds = a
        .bind
        .iter()
        .map(|b| Bind::parse(b))
        .collect::<Result<Vec<_>, _>>()?;
    let mode = match a.userns {
        UsernsArg::Auto => UsernsMode::Auto,
        UsernsArg::Single => UsernsMode::Single,
        UsernsArg::Full => UsernsMode::Full,
    };
    let ids = idmap::resolve(mode, &idmap::Caller::current())?;
    let writable = match &a.overlay {
        Some(dir) => {
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
        None => {
            if a.tmpfs_size == 0 {
                return Err(bad(
                    "--tmpfs-size 0",
                    "the writable layer needs some space",
                    "pass a size in MiB, e.g. 1024",
                ));
            }
            Writable::Tmpfs {
                size_mib: a.tmpfs_size,
            }
        }
    };
    let hostname = a.hostname.clone().unwrap_or_else(|| name.clone());
    if hostname.is_empty() || hostname.len() > 64 {
        return Err(bad(
            &format!("--hostname {hostname:?}"),
            "must be 1 to 64 bytes",
            "pass a shorter host name",
        ));
    }
    let spec = SandboxSpec {
        name,
        rootfs,
        hostname,
        net: match a.net {
            NetArg::Host => NetMode::Host,
            NetArg::None => NetMode::None,
        },
        ids,
        writable,
        binds,
        host_dns: true,
    };
    Ok((spec, env))
}

fn random_hex() -> String {
    let mut buf = [0u8; 6];
    if rustix::rand::getrandom(&mut buf, rustix::rand::GetRandomFlags::empty()).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        buf[..4].copy_from_slice(&nanos.to_le_bytes());
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn run(a: RunArgs) -> sifbox_engine::Result<ExitCode> {
    let mut args = a.args.clone();
    let rootfs = match &a.sandbox.rootfs {
        Some(r) => r.clone(),
        None if args.is_empty() => {
            return Err(bad(
                "sifbox run",
                "no image given",
                "usage: sifbox run [OPTIONS] (--rootfs DIR | IMAGE) [--] CMD [ARGS...]",
            ))
        }
        None => PathBuf::from(args.remove(0)),
    };
    if args.first().map(String::as_str) == Some("--") {
        args.remove(0);
    }
    if args.is_empty() {
        return Err(bad(
            "sifbox run",
            "no command given",
            "usage: sifbox run [OPTIONS] (--rootfs DIR | IMAGE) [--] CMD [ARGS...]",
        ));
    }
    let (spec, env) = build_spec(&a.sandbox, rootfs)?;
    let exe = std::env::current_exe().map_err(|e| Error::io("locating the sifbox binary", e))?;

    let sandbox = Sandbox::launch(
        spec,
        &StartOptions {
            oneshot: true,
            supervisor_exe: exe,
            fork_when_possible: true,
        },
    )?;
    // SIGINT/SIGTERM/SIGHUP: tear the sandbox down, then exit 128+N. (Set
    // up after the start so that the forked supervisor inherits no handler;
    // a signal during the start kills us, and the parent-death signal takes
    // the sandbox along.)
    let caught = Arc::new(AtomicI32::new(0));
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| Error::io("installing signal handlers", e))?;
    let signal_handle = signals.handle();
    if let Some(killer) = sandbox.kill_handle() {
        let caught = Arc::clone(&caught);
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                caught.store(sig, Ordering::SeqCst);
                killer.kill();
            }
        });
    }

    let req = ExecRequest {
        argv: args,
        env,
        cwd: a.cwd.clone(),
        stop_after: true,
        ..Default::default()
    };
    let use_tty = a.tty && rustix::termios::isatty(std::io::stdin());
    let status = if use_tty {
        crate::cmd::tty::exec(&sandbox, req)
    } else {
        let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
        sandbox.exec(req, [i.as_fd(), o.as_fd(), e.as_fd()])
    };
    let stopped = sandbox.stop(Duration::ZERO);
    signal_handle.close();
    let sig = caught.load(Ordering::SeqCst);
    if sig != 0 {
        return Ok(exit_code(128 + sig));
    }
    stopped?;
    match status? {
        ExecStatus::Exited(code) => Ok(exit_code(code)),
        ExecStatus::Failed { code, message } => {
            eprintln!("sifbox: {message}");
            Ok(exit_code(code))
        }
    }
}
