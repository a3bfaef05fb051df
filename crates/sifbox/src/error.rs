//! The CLI's one error type. The libraries' errors stay typed up to here
//! (a full disk importing an image reads as a full disk, not as a bad
//! reference); [`CliError::fix`] says what to do (the advice that names a
//! command or its flags is given here, from the library's typed variant)
//! and [`CliError::exit_code`] what sifbox exits with: the whole exit table
//! is that function's.

use sifbox_build::error::BuildError;
use sifbox_engine::SandboxError;
use sifbox_eval::EvalError;
use sifbox_image::import::ImportError;
use sifbox_image::store::StoreError;
use sifbox_registry::{PullError, ResolveError};

/// An error of a sifbox command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Pull(#[from] PullError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// Boxed: the assembly's errors carry paths and keys.
    #[error(transparent)]
    Launch(Box<sifbox_launch::LaunchError>),
    /// A flag, argument or config value the command was given is unusable
    /// (`what`: the flag or value; `why`; `fix`: what to give instead):
    /// exit 125.
    #[error("{what}: {why}; {fix}")]
    Usage {
        what: String,
        why: String,
        fix: String,
    },
    /// Whoever read stdout went away (`sifbox ... | head`): the command
    /// stops, quietly, with status 0.
    #[error("stdout was closed")]
    StdoutClosed,
    /// SIGINT, SIGTERM or SIGHUP (`signal`; 0 where it is not known, taken
    /// as SIGINT) stopped the command after it cleaned up: exit 128+N.
    /// `report` is what to print, if anything.
    #[error("{}", .report.as_deref().unwrap_or("interrupted"))]
    Interrupted { signal: i32, report: Option<String> },
    /// Rollouts of a job failed for reasons of sifbox or the host: exit 1.
    #[error("{count} rollouts failed for reasons of sifbox or the host (see their result.json)")]
    RolloutsFailed { count: u32, job: String },
    /// `doctor` found a check that `sifbox run` cannot do without; its
    /// report said which: exit 1, nothing more printed.
    #[error("a check that `sifbox run` needs failed")]
    ChecksFailed,
}

impl From<sifbox_launch::LaunchError> for CliError {
    fn from(e: sifbox_launch::LaunchError) -> Self {
        CliError::Launch(Box::new(e))
    }
}

/// A command's result.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    /// A refused flag, argument or config value.
    pub fn usage(what: impl Into<String>, why: impl Into<String>, fix: impl Into<String>) -> Self {
        CliError::Usage {
            what: what.into(),
            why: why.into(),
            fix: fix.into(),
        }
    }

    /// What to do about it, where the message does not already say.
    pub fn fix(&self) -> Option<String> {
        match self {
            CliError::Engine(e) => engine_fix(e),
            // Its messages carry the fix (`what: why; fix`).
            CliError::Eval(_)
            | CliError::Usage { .. }
            | CliError::StdoutClosed
            | CliError::Interrupted { .. }
            | CliError::ChecksFailed => None,
            CliError::RolloutsFailed { job, .. } => {
                Some(format!("`--job {job} --resume` runs them again"))
            }
            CliError::Store(e) => e.fix(),
            CliError::Import(e) => e.fix(),
            CliError::Resolve(e) => Some(e.fix()),
            CliError::Launch(e) => e.fix(),
            CliError::Pull(e) => Some(e.fix()),
            CliError::Build(e) => match e {
                BuildError::Store(s) => s.fix(),
                BuildError::Import(i) => i.fix(),
                _ => None,
            },
        }
    }

    /// The exit status (see README's exit codes): 0 for a closed stdout;
    /// 128+N for a signal N (130 when not known); 1 for a build step that
    /// failed, rollouts that failed, or a failed check of `doctor`; else
    /// 125, an error of sifbox itself or of the caller's input.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::StdoutClosed => 0,
            CliError::Interrupted { signal, .. } => {
                let n = if *signal > 0 { 128 + signal } else { 130 };
                u8::try_from(n).unwrap_or(crate::EXIT_SIFBOX_ERROR)
            }
            CliError::Build(e) if e.is_step_failure() => 1,
            CliError::RolloutsFailed { .. } | CliError::ChecksFailed => 1,
            _ => crate::EXIT_SIFBOX_ERROR,
        }
    }

    /// Whether sifbox exits without printing this (what happened was said
    /// already, or needs no saying).
    pub fn is_quiet(&self) -> bool {
        matches!(
            self,
            CliError::StdoutClosed
                | CliError::ChecksFailed
                | CliError::Interrupted { report: None, .. }
        )
    }

    /// The line sifbox prints: the error, then what to do. A full disk
    /// says so first, whatever was being done.
    pub fn line(&self) -> String {
        // (A failed build step's message is its command's output.)
        let step = matches!(self, CliError::Build(BuildError::RunFailed { .. }));
        if !step && is_disk_full(self) {
            return disk_full_line(&self.to_string());
        }
        match self.fix() {
            Some(fix) => format!("{self}; {fix}"),
            None => self.to_string(),
        }
    }
}

/// The advice for an engine error that names a command or its flags (the
/// engine says what went wrong; what to type instead is the CLI's).
fn engine_fix(e: &sifbox_engine::Error) -> Option<String> {
    use sifbox_engine::idmap::{IdMapError, SubidsMissing};
    let e = match e {
        sifbox_engine::Error::Sandbox(e) => e,
        sifbox_engine::Error::IdMap(e) => {
            return Some(
                match e {
                    IdMapError::NoSubids(SubidsMissing::Tool(_)) => {
                        "install the uidmap package, or map a single id (`--userns single`)"
                    }
                    IdMapError::NoSubids(_) => {
                        "ask an admin for a subordinate id range (usermod --add-subuids/--add-subgids) and install uidmap, or map a single id (`--userns single`); `sifbox doctor` shows what this host offers"
                    }
                    IdMapError::ToolFailed { .. } => {
                        "check /etc/subuid and /etc/subgid for your user, or map a single id (`--userns single`)"
                    }
                    IdMapError::Write { .. } => return None,
                }
                .to_string(),
            )
        }
        _ => return None,
    };
    Some(match e {
        SandboxError::NoSuchSandbox(_) | SandboxError::SupervisorGone(_) | SandboxError::BadState(_) => {
            "start it with `sifbox start --name NAME IMAGE`; `sifbox ps` lists running sandboxes"
        }
        SandboxError::OneShot(_) => "use `sifbox start --name NAME IMAGE` for a sandbox to exec into",
        SandboxError::BadExecId(_) | SandboxError::NoSuchExec { .. } => {
            "pass the id printed by `sifbox exec --detach`"
        }
        SandboxError::DiskUnavailable { .. } => {
            "leave out --disk: the writable layer is then a tmpfs of --tmpfs-size MIB (the \
             default), whose pages count in the memory limit"
        }
        _ => return None,
    }
    .to_string())
}

/// Whether `e` or any error under it is ENOSPC or EDQUOT. Errors that
/// crossed a process boundary (a sandbox's reply, a build step's message)
/// arrive as text: those are recognised by the OS's own wording.
pub fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    fn io_full(e: &std::io::Error) -> bool {
        matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
            || e.get_ref().is_some_and(|inner| is_disk_full(inner))
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = cur {
        if e.downcast_ref::<std::io::Error>().is_some_and(io_full) {
            return true;
        }
        let text = e.to_string();
        if text.contains("(os error 28)") || text.contains("(os error 122)") {
            return true;
        }
        cur = e.source();
    }
    false
}

const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// The line for a full disk: which of sifbox's file systems is short of
/// space (the image store, the scratch dir or the temporary dir: the one
/// with the least free, as what failed has already removed its partial
/// files), with what it has free, then the error and what to do.
pub fn disk_full_line(error: &str) -> String {
    let mut places = vec![(
        "the image store",
        sifbox_image::store::Store::default_root(),
    )];
    if let Some(scratch) = std::env::var_os("SIFBOX_SCRATCH").filter(|s| !s.is_empty()) {
        places.push(("the scratch dir", scratch.into()));
    }
    places.push(("the temporary dir", std::env::temp_dir()));
    let fullest = places
        .into_iter()
        .filter_map(|(what, path)| free_space(&path).map(|free| (free, what, path)))
        .min_by_key(|(free, ..)| *free);
    let place = match fullest {
        Some((free, what, path)) => {
            format!("{what} ({}, {} MB free)", path.display(), free / 1_000_000)
        }
        None => "the disk".to_string(),
    };
    format!(
        "no space left on {place}: {error}; free space there (`sifbox gc` removes what no image \
         needs, `sifbox image rm` unused images), or set SIFBOX_CACHE to a store on a larger disk"
    )
}

/// The bytes free to unprivileged users on the file system holding `path`
/// (or its nearest existing parent).
fn free_space(path: &std::path::Path) -> Option<u64> {
    let mut p = path;
    loop {
        if let Ok(st) = rustix::fs::statvfs(p) {
            return Some(st.f_bavail.saturating_mul(st.f_frsize));
        }
        p = p.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_reads_as_one_and_says_what_to_do() {
        let e = CliError::from(StoreError::Io {
            path: "/store/images".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        let line = e.line();
        assert!(
            line.starts_with("no space left on the image store ("),
            "{line}"
        );
        assert!(line.contains(" MB free"), "{line}");
        assert!(line.contains("No space left on device"), "{line}");
        assert!(!line.contains("check the reference"), "{line}");
        assert!(line.contains("sifbox gc"), "{line}");
        assert_eq!(e.exit_code(), 125);
    }

    #[test]
    fn a_full_disk_is_found_under_other_errors_and_in_text() {
        // An io::Error wrapping a layer error wrapping ENOSPC.
        #[derive(Debug, thiserror::Error)]
        #[error("layer entry x: cannot write the file: {0}")]
        struct Inner(#[source] std::io::Error);
        let wrapped = std::io::Error::other(Inner(std::io::Error::from_raw_os_error(28)));
        assert!(is_disk_full(&wrapped));
        // A sandbox's reply, as text.
        let e = CliError::Engine(sifbox_engine::Error::from(
            sifbox_engine::SupervisorError::Reported {
                message: "writing /x: No space left on device (os error 28)".into(),
            },
        ));
        assert!(is_disk_full(&e));
        assert!(e.line().starts_with("no space left on "), "{}", e.line());
        // Quota too; other errors not.
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(122)));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(32)));
        let e = CliError::Engine(sifbox_engine::Error::from(
            sifbox_engine::SupervisorError::Reported {
                message: "bad".into(),
            },
        ));
        assert!(!is_disk_full(&e));
    }

    #[test]
    fn the_exit_table_is_decided_by_the_error() {
        let int = |signal, report: Option<&str>| CliError::Interrupted {
            signal,
            report: report.map(str::to_string),
        };
        assert_eq!(int(15, None).exit_code(), 143);
        assert_eq!(int(2, None).exit_code(), 130);
        assert_eq!(
            int(0, None).exit_code(),
            130,
            "an unknown signal is SIGINT's"
        );
        assert!(int(1, None).is_quiet());
        let said = int(1, Some("the build was interrupted by SIGHUP"));
        assert_eq!(said.exit_code(), 129);
        assert!(!said.is_quiet());
        assert_eq!(said.line(), "the build was interrupted by SIGHUP");
        let failed = CliError::RolloutsFailed {
            count: 3,
            job: "j1".into(),
        };
        assert_eq!(failed.exit_code(), 1);
        assert_eq!(
            failed.line(),
            "3 rollouts failed for reasons of sifbox or the host (see their result.json); \
             `--job j1 --resume` runs them again"
        );
        assert_eq!(CliError::ChecksFailed.exit_code(), 1);
        assert!(CliError::ChecksFailed.is_quiet());
        assert_eq!(CliError::StdoutClosed.exit_code(), 0);
        let step = CliError::Build(BuildError::RunFailed {
            file: "Dockerfile".into(),
            line: 2,
            instruction: "RUN false".into(),
            code: 1,
            tail: String::new(),
        });
        assert_eq!(
            step.exit_code(),
            1,
            "a failed step is the build's own failure"
        );
        let bad = CliError::Engine(sifbox_engine::SpecError::Name("a/b".into()).into());
        assert_eq!(bad.exit_code(), 125, "bad input");
    }

    #[test]
    fn advice_naming_commands_is_the_clis() {
        let e = |s: SandboxError| CliError::Engine(s.into());
        let gone = e(SandboxError::NoSuchSandbox("box".into()));
        assert_eq!(
            gone.line(),
            "sandbox \"box\": no such sandbox is running; start it with `sifbox start --name \
             NAME IMAGE`; `sifbox ps` lists running sandboxes"
        );
        let one = e(SandboxError::OneShot("box".into())).line();
        assert!(
            one.ends_with("; use `sifbox start --name NAME IMAGE` for a sandbox to exec into"),
            "{one}"
        );
        let id = e(SandboxError::BadExecId("x/y".into())).line();
        assert!(id.starts_with("exec id \"x/y\": "), "{id}");
        assert!(
            id.ends_with("; pass the id printed by `sifbox exec --detach`"),
            "{id}"
        );
        // The engine's own text names no command.
        let text = SandboxError::NoSuchExec {
            id: "a1".into(),
            name: "box".into(),
        }
        .to_string();
        assert!(!text.contains("sifbox"), "{text}");
        // Every flag the advice names is one of the command's.
        let cli = crate::cli::full_command();
        for (sub, flag) in [("start", "name"), ("exec", "detach")] {
            let c = cli.find_subcommand(sub).expect(sub);
            assert!(
                c.get_arguments().any(|a| a.get_long() == Some(flag)),
                "sifbox {sub} --{flag}"
            );
        }
    }

    #[test]
    fn the_id_map_advice_names_userns_at_the_cli_only() {
        use sifbox_engine::idmap::{IdMapError, SubidsMissing};
        let e = IdMapError::NoSubids(SubidsMissing::Subuid);
        assert!(!e.to_string().contains("--"), "{e}");
        let line = CliError::from(sifbox_engine::Error::from(e)).line();
        assert_eq!(
            line,
            "the full id mapping (subordinate ids): no range for you in /etc/subuid; ask an admin \
             for a subordinate id range (usermod --add-subuids/--add-subgids) and install uidmap, \
             or map a single id (`--userns single`); `sifbox doctor` shows what this host offers"
        );
        let e = CliError::from(sifbox_engine::Error::from(IdMapError::NoSubids(
            SubidsMissing::Tool("newgidmap"),
        )));
        assert_eq!(
            e.line(),
            "the full id mapping (subordinate ids): newgidmap is not installed; install the \
             uidmap package, or map a single id (`--userns single`)"
        );
        assert_eq!(e.exit_code(), crate::EXIT_SIFBOX_ERROR);
        let e = CliError::from(sifbox_engine::Error::from(IdMapError::ToolFailed {
            tool: "newuidmap",
            pid: 7,
            args: "0 1000 1".into(),
            stderr: "no".into(),
        }));
        assert!(
            e.line().ends_with(
                "newuidmap 7 0 1000 1: no; check /etc/subuid and /etc/subgid for your user, \
                 or map a single id (`--userns single`)"
            ),
            "{}",
            e.line()
        );
        let e = CliError::usage("--tag x", "not a name", "give NAME[:TAG]");
        assert_eq!(e.line(), "--tag x: not a name; give NAME[:TAG]");
        assert_eq!(e.exit_code(), crate::EXIT_SIFBOX_ERROR);
    }
}
