//! Command-line definition and dispatch.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::EXIT_SIFBOX_ERROR;

/// The exit-code contract, one table for every command (README's
/// "Exit status" has the same).
const EXIT_CODES: &str = "\
Exit status:
  run, exec, wait   the command's own; 124 after --timeout; 126 not executable;
                    127 not found; 128+N killed by signal N (137 also after
                    going over --memory, with a warning)
  build             0 built; 1 a build step (RUN) failed;
                    125 every other error (bad input, a full disk, an
                    unknown USER)
  eval              0 every rollout ran, whatever the rewards and failure
                    classes; 1 a rollout hit an infra error;
                    125 bad input, before anything ran; 130 interrupted
  doctor            1 a check says FAIL: sifbox run cannot work here (the
                    report says which); 0 also with optional things missing
  every command     125 an error of sifbox itself (bad input, the host),
                    with one line saying what, where and what to do, or a
                    usage error (clap's message); 0 done";

#[derive(Debug, Parser)]
#[command(
    name = "sifbox",
    version,
    about = "Rootless, daemonless sandboxes for running and evaluating AI agents",
    long_about = None,
    after_help = EXIT_CODES,
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
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    Completions(cmd::reference::CompletionsArgs),
    /// Print a man page (roff): sifbox(1), or a subcommand's (`sifbox man run`).
    Man(cmd::reference::ManArgs),
}

/// `sifbox exec` alone, parsed exactly as the subcommand of [`Cli`].
#[derive(Debug, Parser)]
#[command(
    name = "sifbox exec",
    bin_name = "sifbox exec",
    after_long_help = EXIT_CODES,
    about = "Run a command in a running sandbox",
    long_about = None,
)]
struct ExecCli {
    #[command(flatten)]
    args: cmd::exec::ExecArgs,
}

/// `sifbox run` alone, parsed exactly as the subcommand of [`Cli`].
#[derive(Debug, Parser)]
#[command(
    name = "sifbox run",
    bin_name = "sifbox run",
    after_long_help = EXIT_CODES,
    about = "Run one command in a fresh sandbox, then tear it down",
    long_about = None,
)]
struct RunCli {
    #[command(flatten)]
    args: cmd::run::RunArgs,
}

/// `sifbox start` alone, parsed exactly as the subcommand of [`Cli`].
#[derive(Debug, Parser)]
#[command(
    name = "sifbox start",
    bin_name = "sifbox start",
    after_long_help = EXIT_CODES,
    about = "Start a sandbox that runs until `sifbox stop`; prints its name once ready",
    long_about = None,
)]
struct StartCli {
    #[command(flatten)]
    args: cmd::start::StartArgs,
}

/// The whole command tree, which completions and man pages are made from.
pub(crate) fn full_command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Parses a command line; help and usage errors print here.
fn parse<P: Parser>(args: Vec<std::ffi::OsString>) -> Result<P, ExitCode> {
    P::try_parse_from(args).map_err(|e| {
        let code = match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
            _ => EXIT_SIFBOX_ERROR,
        };
        let _ = e.print();
        ExitCode::from(code)
    })
}

/// Parses the command line and runs the command.
pub fn run() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The hot paths (an agent harness's every step, a rollout's sandbox, a
    // job array's one-shot runs) build only their own parser rather than
    // every subcommand's, a measurable part of their time; the name of the
    // subcommand takes the place of the program name.
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or_default();
    let command = if first == "exec" {
        args.remove(0);
        parse::<ExecCli>(args).map(|c| Command::Exec(Box::new(c.args)))
    } else if first == "run" {
        args.remove(0);
        parse::<RunCli>(args).map(|c| Command::Run(Box::new(c.args)))
    } else if first == "start" {
        args.remove(0);
        parse::<StartCli>(args).map(|c| Command::Start(Box::new(c.args)))
    } else {
        parse::<Cli>(args).map(|c| c.command)
    };
    let command = match command {
        Ok(c) => c,
        Err(code) => return code,
    };
    init_tracing();
    let result = match command {
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
        Command::Completions(a) => cmd::reference::completions(a, full_command()),
        Command::Man(a) => cmd::reference::man(a, full_command()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if !e.is_quiet() {
                eprintln!("sifbox: error: {}", e.line());
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// Diagnostics go to stderr: with `SIFBOX_LOG` set (e.g. `debug`,
/// `sifbox_registry=debug`), through tracing-subscriber with that filter;
/// else warnings and errors only, one line each, through [`Warnings`],
/// which costs a short-lived command such as `sifbox exec` next to nothing
/// to set up.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    if std::env::var_os("SIFBOX_LOG").is_some_and(|v| !v.is_empty()) {
        let filter =
            EnvFilter::try_from_env("SIFBOX_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .without_time()
            .try_init();
    } else {
        let _ = tracing::subscriber::set_global_default(Warnings);
    }
}

/// The default subscriber: `sifbox: warning: MESSAGE` for each warning or
/// error event; spans and quieter events are off.
struct Warnings;

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = EventLine(String::new());
        event.record(&mut line);
        let kind = if *event.metadata().level() == tracing::Level::ERROR {
            "error"
        } else {
            "warning"
        };
        eprintln!("sifbox: {kind}: {}", line.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// An event's message, then its other fields as ` name=value`.
struct EventLine(String);

impl tracing::field::Visit for EventLine {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every argument, option and subcommand below `cmd`, named by its
    /// path (`sifbox image ls --json`), that has no help or an empty one.
    fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        let text = |s: Option<&clap::builder::StyledStr>| {
            s.map(|s| s.to_string().trim().to_string())
                .unwrap_or_default()
        };
        for arg in cmd.get_arguments() {
            // clap's own --help and --version have theirs.
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            if text(arg.get_help()).is_empty() && text(arg.get_long_help()).is_empty() {
                let name = match (arg.get_long(), arg.get_short()) {
                    (Some(l), _) => format!("--{l}"),
                    (None, Some(s)) => format!("-{s}"),
                    (None, None) => arg.get_id().to_string().to_uppercase(),
                };
                out.push(format!("{path} {name}"));
            }
        }
        for sub in cmd.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_name() != "help"
                && text(sub.get_about()).is_empty()
                && text(sub.get_long_about()).is_empty()
            {
                out.push(format!("{sub_path} (the subcommand)"));
            }
            missing_help(sub, &sub_path, out);
        }
    }

    #[test]
    fn every_argument_of_every_subcommand_has_help() {
        let mut missing = Vec::new();
        missing_help(&Cli::command(), "sifbox", &mut missing);
        // The hot paths' own parsers take the same args; check them too.
        missing_help(&ExecCli::command(), "sifbox exec", &mut missing);
        missing_help(&RunCli::command(), "sifbox run", &mut missing);
        missing_help(&StartCli::command(), "sifbox start", &mut missing);
        assert!(
            missing.is_empty(),
            "without help text (a /// doc comment on the field):\n  {}",
            missing.join("\n  ")
        );
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
        ExecCli::command().debug_assert();
        RunCli::command().debug_assert();
        StartCli::command().debug_assert();
    }
}
