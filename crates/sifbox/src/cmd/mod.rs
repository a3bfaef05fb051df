//! One module per command.

use std::process::ExitCode;

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
