//! One module per command.
//!
//! Commands print with `outln!` and `out!`, never `println!`: a closed
//! stdout (`sifbox image ls | head -1`) ends the command quietly with
//! status 0 (as [`CliError::StdoutClosed`], so that what it holds is
//! cleaned up on the way out), where `println!` would panic.
//!
//! [`CliError::StdoutClosed`]: crate::error::CliError::StdoutClosed

use std::process::ExitCode;

/// `println!` to stdout; a closed stdout returns from the command (`?`).
macro_rules! outln {
    () => {
        $crate::cmd::write_out(format_args!("\n"))?
    };
    ($($arg:tt)*) => {
        $crate::cmd::write_out(format_args!("{}\n", format_args!($($arg)*)))?
    };
}

/// `print!` to stdout; a closed stdout returns from the command (`?`).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cmd::write_out(format_args!($($arg)*))?
    };
}

/// Writes to stdout and flushes. A reader that went away (EPIPE) is
/// [`CliError::StdoutClosed`]: the command ends quietly with status 0, as
/// `ripgrep | head` ends; any other failure (a full disk) is an error of
/// sifbox (125).
///
/// [`CliError::StdoutClosed`]: crate::error::CliError::StdoutClosed
pub fn write_out(args: std::fmt::Arguments<'_>) -> crate::error::Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_fmt(args).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            Err(crate::error::CliError::StdoutClosed)
        }
        Err(e) => Err(sifbox_engine::Error::io("writing to stdout", e).into()),
    }
}

use sifbox_engine::ExecStatus;

pub mod build;
pub mod cp;
pub mod detached;
pub mod doctor;
pub mod eval;
pub mod exec;
pub mod gc;
pub mod image;
pub mod options;
pub mod progress;
pub mod ps;
pub mod pull;
pub mod reference;
pub mod run;
pub mod signals;
pub mod start;
pub mod stop;
pub mod tty;

/// Says on stderr, a line each, which calls the sandbox's default seccomp
/// policy denied during a command, how often, and where that is explained
/// (Docker's denials are silent: a program just fails with EPERM).
pub fn report_denials(denied: &[sifbox_engine::denials::Denied]) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for line in sifbox_engine::denials::lines(denied) {
        let _ = writeln!(err, "{line}");
    }
}

/// The exit code for how an exec ended, printing why it could not start.
pub fn status_exit(status: &ExecStatus) -> ExitCode {
    if let ExecStatus::Failed { message, .. } = status {
        eprintln!("sifbox: error: {message}");
    }
    if status.timed_out() {
        eprintln!(
            "sifbox: the command ran past its --timeout: it and every process it started were killed (exit 124)"
        );
    }
    crate::exit_code(status.code())
}
