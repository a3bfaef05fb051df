//! `sifbox run`: one command in a fresh sandbox (start + one exec + stop).

use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::Duration;

use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::{Sandbox, StartOptions};

use crate::cmd::options::{bad, build_spec, resolve_image, SandboxArgs, TimeoutArg};
use crate::cmd::status_exit;

#[derive(Debug, clap::Args)]
#[command(
    trailing_var_arg = true,
    override_usage = "sifbox run [OPTIONS] (--rootfs DIR | IMAGE) [--] [ARGS...]"
)]
pub struct RunArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Working directory inside the sandbox (default: the image's, else /).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Give the command a pty (when sifbox's stdin is a terminal).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    #[command(flatten)]
    pub timeout: TimeoutArg,
    /// Run CMD instead of the image's entrypoint; ARGS follow it and the
    /// image's cmd is dropped, as with `docker run --entrypoint`. An empty
    /// CMD (`--entrypoint ''`) runs ARGS alone.
    #[arg(long, value_name = "CMD")]
    pub entrypoint: Option<String>,
    /// Keep stdin attached, as Docker's -i does: `run` always hands
    /// sifbox's stdin to the command, so this is accepted for Docker's
    /// spelling (`-i`, `-it`) and changes nothing.
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    /// Remove the sandbox when the command ends, as Docker's --rm does:
    /// `run` always does, so this is accepted for Docker's spelling and
    /// changes nothing.
    #[arg(long = "rm")]
    pub rm: bool,
    /// IMAGE (unless --rootfs is given), then the arguments: they follow
    /// the image's entrypoint, or are the command when it has none.
    #[arg(value_name = "[IMAGE] ARGS", num_args = 0..)]
    pub args: Vec<String>,
}

const USAGE: &str = "usage: sifbox run [OPTIONS] (--rootfs DIR | IMAGE) [--] [ARGS...]";

/// What `run` runs, by Docker's rules: `--entrypoint` and ARGS; else the
/// image's entrypoint followed by ARGS (or by its cmd when no ARGS are
/// given); else ARGS, or the cmd. A foreign SIF, which has neither
/// entrypoint nor cmd, runs its Apptainer runscript with ARGS, as
/// `apptainer run` does.
fn command_line(
    entrypoint: Option<&str>,
    image: &sifbox_registry::Resolved,
    args: Vec<String>,
) -> Vec<String> {
    match entrypoint {
        Some("") => args,
        Some(ep) => std::iter::once(ep.to_string()).chain(args).collect(),
        None if image.runscript => std::iter::once(format!("/{}", sifbox_image::meta::RUNSCRIPT))
            .chain(args)
            .collect(),
        None => image.meta.command(&args),
    }
}

pub fn run(a: RunArgs) -> crate::error::Result<ExitCode> {
    let timeout = a.timeout.duration()?;
    let mut args = a.args.clone();
    let image_arg = match &a.sandbox.rootfs {
        Some(_) => None,
        None if args.is_empty() => return Err(bad("sifbox run", "no image given", USAGE)),
        None => Some(args.remove(0)),
    };
    if args.first().map(String::as_str) == Some("--") {
        args.remove(0);
    }
    let image = resolve_image(&a.sandbox, image_arg.as_deref())?;
    let args = command_line(a.entrypoint.as_deref(), &image, args);
    if args.is_empty() {
        return Err(bad(
            "sifbox run",
            "no command given (and the image names none)",
            USAGE,
        ));
    }
    let planned = build_spec(&a.sandbox, &image)?;
    let opts = StartOptions {
        oneshot: true,
        ..planned.start_options(sifbox_launch::current_exe()?)
    };
    // Requests queue while the sandbox sets itself up.
    let sandbox = Sandbox::launch(planned.spec, &opts)?;

    // SIGINT/SIGTERM/SIGHUP: tear the sandbox down, then exit 128+N. (Set
    // up after the launch so that the forked supervisor inherits no
    // handler; a signal during the launch kills us, and the parent-death
    // signal takes the sandbox along.)
    let killer = sandbox.kill_handle();
    let interrupts = crate::cmd::signals::Interrupts::watch(move |_| {
        if let Some(k) = &killer {
            k.kill();
        }
    })?;

    sifbox_launch::own_logs(&sandbox, planned.logs_owner.as_deref())?;
    let req = ExecRequest::command(args)
        .defaults(&planned.defaults)
        .base_env(planned.env)
        .cwd(a.cwd.clone())
        .timeout(timeout)
        .stop_after(true)
        .build();
    let use_tty = a.tty && rustix::termios::isatty(std::io::stdin());
    let status = if use_tty {
        crate::cmd::tty::exec(&sandbox, req)
    } else {
        let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
        let status = sandbox.exec_relayed(req, [i.as_fd(), o.as_fd(), e.as_fd()]);
        crate::cmd::report_denials(&sandbox.denied());
        status
    };
    let stopped = sandbox.stop(Duration::ZERO);
    let sig = interrupts.stop().unwrap_or(0);
    if sig != 0 {
        return Err(crate::error::CliError::Interrupted {
            signal: sig,
            report: None,
        });
    }
    stopped?;
    if let Some(logs) = &planned.logs {
        crate::cmd::options::give_back_logs(planned.userns, logs);
    }
    Ok(status_exit(&status?))
}
