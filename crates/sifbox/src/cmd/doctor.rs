//! `sifbox doctor`: what this host allows, and what to do about what it does not.

use std::process::ExitCode;

use sifbox_engine::doctor;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> crate::error::Result<ExitCode> {
    let exe = std::env::current_exe()
        .map_err(|e| sifbox_engine::Error::io("locating the sifbox binary", e))?;
    let checks = doctor::run_checks(&exe);
    if args.json {
        // How each limit would be enforced here, as sandbox.json records it.
        let out = serde_json::json!({ "checks": checks, "limits": doctor::limits_plan() });
        outln!("{out}");
    } else {
        out!("{}", doctor::render_text(&checks));
    }
    // Only what `sifbox run` cannot do without (FAIL) makes the exit code
    // non-zero; what it does without (opt) does not.
    if doctor::any_failed(&checks) {
        return Err(crate::error::CliError::ChecksFailed);
    }
    Ok(ExitCode::SUCCESS)
}

/// Doctor's recommendations name only flags that exist.
///
/// Every `--flag` in the text that doctor prints (the string literals of
/// the engine's modules doctor's checks come from) is attributed to the
/// program named nearest before it in the same literal: `sifbox SUB...`
/// (then SUB must have that flag), or a program that is not sifbox
/// (`systemd-run`, `usermod`, `docker`, `apptainer`, or a `{}` standing for
/// one). A flag with no program before it fails: a recommendation must say
/// which command takes it.
#[cfg(test)]
pub(crate) mod recommended_flags {
    /// Whose flag a mention is.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Program {
        /// `sifbox` and the subcommand path after it (`["image", "ls"]`).
        Sifbox(Vec<String>),
        /// Another program's.
        Other,
        /// No program is named before it.
        Unnamed,
    }

    /// A flag doctor mentions (without its `--`), whose it is, and the text.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Mention {
        pub flag: String,
        pub program: Program,
        pub text: String,
    }

    const FOREIGN: [&str; 5] = [
        "systemd-run",
        "usermod",
        "docker",
        "apptainer",
        "singularity",
    ];

    /// The mentions of flags in `text` (one message, or one literal).
    /// `subcommands` says which words after `sifbox` name subcommands.
    pub fn mentions(text: &str, is_subcommand: &dyn Fn(&[String]) -> bool) -> Vec<Mention> {
        let words: Vec<&str> = text
            .split_whitespace()
            .map(|w| w.trim_matches(|c: char| "`()[],;:.\"'".contains(c)))
            .collect();
        let mut out = Vec::new();
        let mut program = Program::Unnamed;
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            if w == "sifbox" {
                let mut path = Vec::new();
                while let Some(next) = words.get(i + 1) {
                    let mut longer = path.clone();
                    longer.push((*next).to_string());
                    if !is_subcommand(&longer) {
                        break;
                    }
                    path = longer;
                    i += 1;
                }
                program = Program::Sifbox(path);
            } else if FOREIGN.contains(&w) || w.starts_with('{') {
                program = Program::Other;
            } else if let Some(rest) = w.strip_prefix("--") {
                let flag: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                if !flag.is_empty() && rest.starts_with(|c: char| c.is_ascii_lowercase()) {
                    out.push(Mention {
                        flag,
                        program: program.clone(),
                        text: text.to_string(),
                    });
                }
            }
            i += 1;
        }
        out
    }

    /// The string literals of Rust source `src` up to its tests, with
    /// escapes and line continuations resolved (comments left out). Enough
    /// for the sources it reads: raw strings are read as plain ones.
    pub fn literals(src: &str) -> Vec<String> {
        let code: String = src
            .lines()
            .take_while(|l| l.trim() != "#[cfg(test)]")
            .map(|l| format!("{l}\n"))
            .collect();
        let mut out = Vec::new();
        let mut chars = code.chars().peekable();
        let mut prev = ' ';
        while let Some(c) = chars.next() {
            // A comment after code runs to the end of its line.
            if c == '/' && chars.peek() == Some(&'/') {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                prev = '\n';
                continue;
            }
            // A char literal '"' is no string.
            if c == '"' && prev != '\'' {
                let mut lit = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some('\n') => {
                                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                                    chars.next();
                                }
                            }
                            Some('n') => lit.push('\n'),
                            Some('t') => lit.push('\t'),
                            Some(other) => lit.push(other),
                            None => {}
                        },
                        c => lit.push(c),
                    }
                }
                out.push(lit);
                prev = '"';
                continue;
            }
            prev = c;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::recommended_flags::{literals, mentions, Program};

    /// The sources of what `sifbox doctor` prints.
    const SOURCES: [(&str, &str); 11] = [
        (
            "doctor/mod.rs",
            include_str!("../../../sifbox-engine/src/doctor/mod.rs"),
        ),
        (
            "doctor/child.rs",
            include_str!("../../../sifbox-engine/src/doctor/child.rs"),
        ),
        (
            "doctor/host.rs",
            include_str!("../../../sifbox-engine/src/doctor/host.rs"),
        ),
        (
            "doctor/limits.rs",
            include_str!("../../../sifbox-engine/src/doctor/limits.rs"),
        ),
        (
            "doctor/overlay.rs",
            include_str!("../../../sifbox-engine/src/doctor/overlay.rs"),
        ),
        (
            "doctor/subids.rs",
            include_str!("../../../sifbox-engine/src/doctor/subids.rs"),
        ),
        (
            "doctor/userns.rs",
            include_str!("../../../sifbox-engine/src/doctor/userns.rs"),
        ),
        (
            "limits.rs",
            include_str!("../../../sifbox-engine/src/limits.rs"),
        ),
        (
            "limits/cgroup.rs",
            include_str!("../../../sifbox-engine/src/limits/cgroup.rs"),
        ),
        (
            "limits/cgroup/v2.rs",
            include_str!("../../../sifbox-engine/src/limits/cgroup/v2.rs"),
        ),
        (
            "disk.rs",
            include_str!("../../../sifbox-engine/src/disk.rs"),
        ),
    ];

    fn find<'a>(cmd: &'a clap::Command, path: &[String]) -> Option<&'a clap::Command> {
        path.iter().try_fold(cmd, |c, name| c.find_subcommand(name))
    }

    #[test]
    fn doctor_recommends_only_flags_that_exist() {
        let cli = crate::cli::full_command();
        let is_sub = |p: &[String]| find(&cli, p).is_some();
        let mut bad = Vec::new();
        let mut checked = 0;
        for (file, src) in SOURCES {
            for lit in literals(src) {
                // A literal that is one flag is a program's argument
                // (`cmd.arg("--version")`), not advice.
                if lit.starts_with("--") && !lit.contains(' ') {
                    continue;
                }
                for m in mentions(&lit, &is_sub) {
                    let why = match &m.program {
                        Program::Other => continue,
                        Program::Unnamed => {
                            "no command is named before it (write `sifbox SUB --flag`)".to_string()
                        }
                        Program::Sifbox(path) => {
                            checked += 1;
                            let exists = find(&cli, path).is_some_and(|c| {
                                c.get_arguments()
                                    .any(|a| a.get_long() == Some(m.flag.as_str()))
                            });
                            if exists {
                                continue;
                            }
                            format!("`sifbox {}` has no such flag", path.join(" "))
                        }
                    };
                    bad.push(format!("{file}: --{}: {why}\n    in {:?}", m.flag, m.text));
                }
            }
        }
        assert!(bad.is_empty(), "doctor recommends:\n  {}", bad.join("\n  "));
        assert!(
            checked >= 4,
            "only {checked} sifbox flags found: is the scan broken?"
        );
    }

    #[test]
    fn mentions_are_attributed_to_the_program_before_them() {
        let cli = crate::cli::full_command();
        let is_sub = |p: &[String]| find(&cli, p).is_some();
        let ms = mentions(
            "start sifbox in a delegated cgroup: `systemd-run --user --scope sifbox ...`; or \
             `sifbox image ls --json`, and --bogus alone",
            &is_sub,
        );
        let got: Vec<(String, Program)> = ms.into_iter().map(|m| (m.flag, m.program)).collect();
        let ls = Program::Sifbox(vec!["image".into(), "ls".into()]);
        assert_eq!(
            got,
            vec![
                ("user".into(), Program::Other),
                ("scope".into(), Program::Other),
                ("json".into(), ls.clone()),
                ("bogus".into(), ls),
            ]
        );
        assert_eq!(
            mentions("use --bogus", &is_sub)[0].program,
            Program::Unnamed
        );
        assert_eq!(
            literals("let a = \"x \\\n     y\"; // \"not\"\n// \"nor\"\nf('\"');"),
            vec!["x y".to_string()]
        );
    }
}
