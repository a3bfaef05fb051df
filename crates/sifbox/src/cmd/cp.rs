//! `sifbox cp`: files and directories into and out of a running sandbox.

use std::path::PathBuf;
use std::process::ExitCode;

use sifbox_engine::transfer::SetId;
use sifbox_engine::Sandbox;

use crate::cmd::options::bad;

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// For uploads: the user of the image that owns the copy (default root).
    #[arg(long, value_name = "USER")]
    pub owner: Option<String>,
    /// For downloads: keep setuid and setgid bits, which are dropped by
    /// default. Dangerous: a sandbox can plant a setuid file that then runs
    /// on the host as you (as root, when you are root).
    #[arg(long)]
    pub keep_setid: bool,
    /// Source: a host path or NAME:/path in a sandbox.
    pub src: String,
    /// Destination: a host path or NAME:/path in a sandbox.
    pub dst: String,
}

/// `NAME:/path` -> (NAME, /path); host paths (with no `:` before the first
/// `/`) -> None.
fn sandbox_side(arg: &str) -> Option<(&str, &str)> {
    let (name, path) = arg.split_once(':')?;
    (!name.is_empty() && !name.contains('/')).then_some((name, path))
}

pub fn run(a: CpArgs) -> crate::error::Result<ExitCode> {
    let usage = "usage: sifbox cp [--owner USER | --keep-setid] SRC DST, with NAME:/path on \
                 exactly one side";
    match (sandbox_side(&a.src), sandbox_side(&a.dst)) {
        (None, Some((name, path))) => {
            check_inside(path)?;
            if a.keep_setid {
                return Err(bad(
                    "--keep-setid",
                    "only applies to copies out of a sandbox (uploads keep the bits)",
                    usage,
                )
                .into());
            }
            let sandbox = Sandbox::attach(name)?;
            sandbox.upload(&PathBuf::from(&a.src), path, a.owner.as_deref())?;
        }
        (Some((name, path)), None) => {
            check_inside(path)?;
            if a.owner.is_some() {
                return Err(bad("--owner", "only applies to copies into a sandbox", usage).into());
            }
            let sandbox = Sandbox::attach(name)?;
            let setid = if a.keep_setid {
                SetId::Keep
            } else {
                SetId::Strip
            };
            sandbox.download_with(path, &PathBuf::from(&a.dst), setid)?;
        }
        _ => {
            return Err(bad(
                "sifbox cp",
                "one side must be NAME:/path and the other a host path",
                usage,
            )
            .into())
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check_inside(path: &str) -> sifbox_engine::Result<()> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(bad(
            &format!("sandbox path {path:?}"),
            "must be absolute",
            "write it as NAME:/absolute/path",
        ))
    }
}
