//! `sifbox exec`: a command in a running sandbox.

use std::io::Write;
use std::os::fd::AsFd;
use std::process::ExitCode;

use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::Sandbox;

use crate::cmd::options::{bad, EnvArgs, TimeoutArg};
use crate::cmd::status_exit;

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct ExecArgs {
    /// Working directory inside the sandbox (default: the image's, else /).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    #[command(flatten)]
    pub env: EnvArgs,
    /// Run as this user of the image: NAME, UID, UID:GID or NAME:GROUP.
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
    #[command(flatten)]
    pub timeout: TimeoutArg,
    /// Capture output, keeping the last BYTES of each stream (reports truncation).
    #[arg(long, value_name = "BYTES")]
    pub max_output: Option<usize>,
    /// Pass stdin to the command (without it, the command reads /dev/null).
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    /// Give the command a pty (when sifbox's stdin is a terminal).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Start the command and print its exec id; see `sifbox wait|kill|logs`.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// Capture output and print {stdout, stderr, exit_code, timed_out, truncated, duration_ms}.
    #[arg(long)]
    pub json: bool,
    /// The sandbox.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The command and its arguments.
    #[arg(value_name = "CMD", num_args = 0..)]
    pub command: Vec<String>,
}

/// Captured output is limited to this much per stream unless asked otherwise.
const DEFAULT_MAX_OUTPUT: usize = 16 << 20;

pub fn run(a: ExecArgs) -> crate::error::Result<ExitCode> {
    let mut argv = a.command.clone();
    if argv.first().map(String::as_str) == Some("--") {
        argv.remove(0);
    }
    if argv.is_empty() {
        return Err(bad(
            "sifbox exec",
            "no command given",
            "usage: sifbox exec [OPTIONS] NAME [--] CMD [ARGS...]",
        ));
    }
    let timeout = a.timeout.duration()?;
    let sandbox = Sandbox::attach(&a.name)?;
    let req = ExecRequest::command(argv)
        .defaults(&sandbox.exec_defaults()?)
        .base_env(sandbox.base_env()?)
        .envs(a.env.resolve()?)
        .cwd(a.cwd.clone())
        .user(a.user.clone())
        .timeout(timeout)
        .build();
    if a.detach {
        let id = sandbox.exec_detached(req)?;
        outln!("{id}");
        Ok(ExitCode::SUCCESS)
    } else if a.json || a.max_output.is_some() {
        let stdin = std::io::stdin();
        let input = a.interactive.then(|| stdin.as_fd());
        let out = sandbox.exec_capture(req, input, a.max_output.unwrap_or(DEFAULT_MAX_OUTPUT))?;
        if a.json {
            outln!("{}", serde_json::to_string(&out).unwrap_or_default());
        } else {
            let _ = std::io::stdout().write_all(out.stdout.as_bytes());
            let _ = std::io::stderr().write_all(out.stderr.as_bytes());
            if out.truncated {
                eprintln!(
                    "sifbox: warning: output truncated to the last {} bytes per stream",
                    a.max_output.unwrap_or(DEFAULT_MAX_OUTPUT)
                );
            }
            if let Some(e) = &out.error {
                eprintln!("sifbox: error: {e}");
            }
        }
        crate::cmd::report_denials(&out.denied);
        Ok(crate::exit_code(out.exit_code))
    } else if a.tty && rustix::termios::isatty(std::io::stdin()) {
        Ok(status_exit(&crate::cmd::tty::exec(&sandbox, req)?))
    } else {
        let null = std::fs::File::open("/dev/null")
            .map_err(|e| sifbox_engine::Error::io("opening /dev/null", e))?;
        let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
        let input = if a.interactive {
            i.as_fd()
        } else {
            null.as_fd()
        };
        let status = sandbox.exec_relayed(req, [input, o.as_fd(), e.as_fd()])?;
        crate::cmd::report_denials(&sandbox.denied());
        Ok(status_exit(&status))
    }
}
