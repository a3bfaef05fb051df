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
    /// Start a sandbox that runs until `sifbox stop`; prints its name once ready.
    Start(Box<cmd::start::StartArgs>),
    /// Run a command in a running sandbox.
    Exec(Box<cmd::exec::ExecArgs>),
    /// Copy files or directories into or out of a sandbox (NAME:/path on one side).
    Cp(cmd::cp::CpArgs),
    /// List sandboxes.
    Ps(cmd::ps::PsArgs),
    /// Stop sandboxes: SIGTERM to every process, SIGKILL after --timeout; nothing is left.
    Stop(cmd::stop::StopArgs),
    /// Stop sandboxes and remove their runtime state (their logs dirs stay).
    Rm(cmd::stop::StopArgs),
    /// Wait for a detached exec and exit with its code.
    Wait(cmd::detached::WaitArgs),
    /// Send a signal to a detached exec (default KILL: every process it started).
    Kill(cmd::detached::KillArgs),
    /// Print the output of a detached exec.
    Logs(cmd::detached::LogsArgs),
    /// Pull an image from a registry into the store: [docker://]REF.
    Pull(cmd::pull::PullArgs),
    /// Build a Dockerfile context into an image, rootless and daemonless; prints the digest.
    Build(Box<cmd::build::BuildArgs>),
    /// Run agent benchmark tasks (Harbor/BenchFlow layout) in sandboxes and sum up their rewards.
    Eval(Box<cmd::eval::EvalArgs>),
    /// Manage the image store: ls, inspect, rm, tag, import, export.
    #[command(subcommand)]
    Image(cmd::image::ImageCommand),
    /// Check what this host allows (user namespaces, id ranges, overlayfs, cgroups...).
    Doctor(cmd::doctor::DoctorArgs),
    /// Remove what dead sandboxes and interrupted imports left behind (after a crash or kill -9).
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
        Command::Start(a) => cmd::start::run(*a),
        Command::Exec(a) => cmd::exec::run(*a),
        Command::Cp(a) => cmd::cp::run(a),
        Command::Ps(a) => cmd::ps::run(a),
        Command::Stop(a) => cmd::stop::run(a, "stopped"),
        Command::Rm(a) => cmd::stop::run(a, "removed"),
        Command::Wait(a) => cmd::detached::wait(a),
        Command::Kill(a) => cmd::detached::kill(a),
        Command::Logs(a) => cmd::detached::logs(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Pull(a) => cmd::pull::run(a),
        Command::Image(c) => cmd::image::run(c),
        Command::Build(a) => cmd::build::run(*a),
        Command::Eval(a) => cmd::eval::run(*a),
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
