//! sifbox: rootless, daemonless sandboxes for evaluating AI agents.
//!
//! The binary is thin: each command in `cmd/` parses its flags into engine
//! types and makes a few library calls. The same binary doubles as the
//! sandbox supervisor (`__supervisor`), which must be dispatched before
//! anything else runs so that it stays single-threaded.

mod cli;
mod cmd;
mod error;

use std::process::ExitCode;

/// Exit code for errors of sifbox itself.
pub const EXIT_SIFBOX_ERROR: u8 = 125;

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let first = args.nth(1);
    if first.as_deref()
        == Some(std::ffi::OsStr::new(
            sifbox_engine::supervisor::SUPERVISOR_ARG,
        ))
    {
        return exit_code(sifbox_engine::supervisor::main());
    }
    if first.as_deref() == Some(std::ffi::OsStr::new(sifbox_engine::doctor::CHILD_ARG)) {
        let kind = args.next().unwrap_or_default();
        return exit_code(sifbox_engine::doctor::child_main(&kind.to_string_lossy()));
    }
    cli::run()
}

/// Converts an i32 status into an ExitCode (out-of-range values become 125).
pub fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(EXIT_SIFBOX_ERROR))
}
