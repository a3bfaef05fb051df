//! Command-line definition and dispatch.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::EXIT_SIFBOX_ERROR;

#[derive(Debug, Parser)]
#[command(
    name = "sifbox",
    version,
    about = "Rootless, daemonless sandboxes for running and evaluating AI agents",
    long_about = None,
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one command in a fresh sandbox, then tear it down.
    Run(Box<cmd::run::RunArgs>),
    /// Check what this host allows (user namespaces, id ranges, overlayfs, cgroups...).
    Doctor(cmd::doctor::DoctorArgs),
    /// Remove what dead sandboxes left behind (after a crash or kill -9).
    Gc(cmd::gc::GcArgs),
}

/// Parses the command line and runs the command.
pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => EXIT_SIFBOX_ERROR,
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_tracing();
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(*a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Gc(a) => cmd::gc::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sifbox: error: {e}");
            ExitCode::from(EXIT_SIFBOX_ERROR)
        }
    }
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SIFBOX_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .try_init();
}
