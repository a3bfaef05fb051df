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
    // Only what `sifbox run` cannot do without makes the exit code non-zero.
    let essential = [
        "user namespaces",
        "overlayfs in a user namespace",
        "runtime dir",
    ];
    let broken = checks.iter().any(|c| !c.ok && essential.contains(&c.name));
    Ok(if broken {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
