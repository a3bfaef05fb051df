//! One module per command.
//!
//! Commands print with `outln!` and `out!`, never `println!`: a closed
//! stdout (`sifbox image ls | head -1`) ends sifbox quietly, where
//! `println!` would panic.

use std::process::ExitCode;

/// `println!` to stdout, ending sifbox quietly when stdout is closed.
macro_rules! outln {
    () => {
        $crate::cmd::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cmd::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout, ending sifbox quietly when stdout is closed.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cmd::write_out(format_args!($($arg)*))
    };
}

/// Writes to stdout and flushes. A reader that went away (EPIPE) ends
/// sifbox at once with status 0, as `ripgrep | head` ends; any other
/// failure (a full disk) is an error of sifbox (125).
pub fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        stdout_failed(&e);
    }
}

/// Ends sifbox after a failed write to stdout (see [`write_out`]).
#[allow(clippy::exit, reason = "nothing is left to do once stdout is gone")]
pub fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("sifbox: error: writing to stdout: {e}\n"),
    );
    std::process::exit(i32::from(crate::EXIT_SIFBOX_ERROR));
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
pub mod run;
pub mod start;
pub mod stop;
pub mod tty;

/// The exit code for how an exec ended, printing why it could not start.
pub fn status_exit(status: &ExecStatus) -> ExitCode {
    if let ExecStatus::Failed { message, .. } = status {
        eprintln!("sifbox: {message}");
    }
    crate::exit_code(status.code())
}
