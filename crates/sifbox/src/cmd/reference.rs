//! `sifbox completions SHELL` and `sifbox man [SUBCOMMAND...]`: shell
//! completions and man pages generated from the clap definitions, so that
//! they always say what the binary accepts.

use std::process::ExitCode;

use sifbox_engine::Error;

use crate::cmd::options::bad;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// A subcommand (`run`, `image ls`): its own page, sifbox-run(1);
    /// without one, sifbox(1).
    #[arg(value_name = "SUBCOMMAND")]
    pub subcommand: Vec<String>,
}

/// Prints the completion script of `shell` for `cli`.
pub fn completions(a: CompletionsArgs, mut cli: clap::Command) -> crate::error::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cli, "sifbox", &mut script);
    out!("{}", String::from_utf8_lossy(&script));
    Ok(ExitCode::SUCCESS)
}

/// Prints the man page of `cli` or of one of its subcommands, in roff.
pub fn man(a: ManArgs, cli: clap::Command) -> crate::error::Result<ExitCode> {
    let mut cmd = cli;
    cmd.build();
    let mut name = String::from("sifbox");
    let mut typed = String::from("sifbox");
    for sub in &a.subcommand {
        let Some(found) = cmd.find_subcommand(sub).cloned() else {
            let known: Vec<&str> = cmd
                .get_subcommands()
                .map(clap::Command::get_name)
                .filter(|n| *n != "help")
                .collect();
            return Err(bad(
                &format!("sifbox man {}", a.subcommand.join(" ")),
                &format!("{name} has no subcommand {sub:?}"),
                &format!("name one of: {}", known.join(", ")),
            ));
        };
        name = format!("{name}-{}", found.get_name());
        typed = format!("{typed} {}", found.get_name());
        cmd = found;
    }
    // The page's title is sifbox-SUB; its synopsis names the command as
    // typed (`sifbox image ls`).
    let cmd = cmd
        .name(name)
        .bin_name(typed)
        .version(env!("CARGO_PKG_VERSION"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut page)
        .map_err(|e| Error::io("rendering the man page", e))?;
    out!("{}", String::from_utf8_lossy(&page));
    Ok(ExitCode::SUCCESS)
}
