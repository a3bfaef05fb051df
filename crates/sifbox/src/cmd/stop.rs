//! `sifbox stop` and `sifbox rm`: end sandboxes and leave nothing behind.

use std::process::ExitCode;
use std::time::Duration;

use sifbox_engine::{runtime, spec, Sandbox};

use crate::cmd::options::bad;

#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// Seconds between SIGTERM to every process and SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub timeout: f64,
    /// The sandboxes.
    #[arg(value_name = "NAME", required = true)]
    pub names: Vec<String>,
}

/// Stops each sandbox; an unknown or already stopped one succeeds with a
/// note. Stopping removes its runtime state too (`rm` is the same, for
/// scripts that say what they mean); its logs dir stays.
pub fn run(a: StopArgs, verb: &str) -> crate::error::Result<ExitCode> {
    if !(a.timeout >= 0.0 && a.timeout.is_finite()) {
        return Err(bad(
            "--timeout",
            "must be zero or more seconds",
            "e.g. --timeout 10",
        ));
    }
    let grace = Duration::from_secs_f64(a.timeout);
    let root = runtime::root()?;
    for name in &a.names {
        spec::validate_name(name)?;
        match Sandbox::attach_to_stop(name) {
            Ok(sandbox) => {
                let state = runtime::read_state(&runtime::sandbox_dir(&root, name));
                let digest = state.as_ref().and_then(|s| s.digest.clone());
                // Its `--logs` dir: where its record, sandbox.json, is,
                // unless that is the runtime dir (no `--logs`), which goes.
                let logs = state
                    .and_then(|s| s.evidence)
                    .filter(|p| p.file_name().is_some_and(|n| n == "sandbox.json"))
                    .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
                    .filter(|p| !p.starts_with(root.path()));
                sandbox.stop(grace)?;
                outln!("{verb} {name}");
                if let Some(logs) = logs {
                    crate::cmd::options::give_back_logs(spec::UsernsMode::Auto, &logs);
                }
                if digest.is_some() {
                    remove_deferred_images();
                }
            }
            Err(_) => {
                // Not running: remove whatever a dead one left.
                let dir = runtime::sandbox_dir(&root, name);
                let existed = dir.exists();
                if existed && !runtime::remove_if_dead(&dir)? {
                    return Err(bad(
                        &format!("sandbox {name}"),
                        "it runs but does not answer",
                        "kill its supervisor (see `sifbox ps`), then run `sifbox gc`",
                    ));
                }
                if existed {
                    eprintln!("sifbox: {name} was not running; removed what it left");
                } else {
                    eprintln!("sifbox: {name} is not running (nothing to do)");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// After a sandbox of a store image stopped: images removed with `image rm
/// --force` while in use that nothing uses now go (as `gc` would).
fn remove_deferred_images() {
    if !sifbox_image::store::Store::default_root().is_dir() {
        return;
    }
    let removed = crate::cmd::image::open_store()
        .map_err(|e| e.to_string())
        .and_then(|s| s.remove_deferred().map_err(|e| e.to_string()));
    match removed {
        Ok(ds) => {
            for d in ds {
                tracing::debug!("removed image {d}, removed with --force while in use");
            }
        }
        Err(e) => tracing::debug!("removing images removed with --force: {e}"),
    }
}
