//! `sifbox start`: a sandbox that runs until `sifbox stop`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use sifbox_engine::Sandbox;

use crate::cmd::options::{bad, build_spec, resolve_image, SandboxArgs};

#[derive(Debug, clap::Args)]
// `--name` is optional for `run` (which names its sandbox run-<random>) but
// a long-lived sandbox is reached by its name: clap requires it here, so
// help and usage say so.
#[command(override_usage = "sifbox start [OPTIONS] --name <NAME> (--rootfs DIR | IMAGE)")]
#[command(mut_arg("name", |a| a
    .required(true)
    .value_name("NAME")
    .help("Sandbox name (required): what exec, cp, stop and rm name it by.")))]
pub struct StartArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Give up (and clean up) if the sandbox is not ready after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub ready_timeout: f64,
    /// Print the sandbox as JSON.
    #[arg(long)]
    pub json: bool,
    /// The image (unless --rootfs is given).
    #[arg(value_name = "IMAGE")]
    pub image: Option<String>,
}

pub fn run(a: StartArgs) -> crate::error::Result<ExitCode> {
    if a.ready_timeout.is_nan() || a.ready_timeout <= 0.0 {
        return Err(bad(
            "--ready-timeout",
            "must be a positive number of seconds",
            "e.g. --ready-timeout 60",
        ));
    }
    let image = resolve_image(&a.sandbox, a.image.as_deref())?;
    let planned = build_spec(&a.sandbox, &image)?;
    // The supervisor holds the image's pin too, for the sandbox's life.
    let opts = planned.start_options(sifbox_launch::current_exe()?);
    let started = Instant::now();
    let sandbox = Sandbox::launch(planned.spec, &opts)?;
    // Readiness: the supervisor reports it, then a round trip through the
    // control socket proves the sandbox serves requests. A sandbox that is
    // not ready in time is torn down (dropping it stops it).
    let deadline = started + Duration::from_secs_f64(a.ready_timeout);
    sandbox.wait_ready_until(deadline)?;
    sandbox.ping()?;
    sifbox_launch::own_logs(&sandbox, planned.logs_owner.as_deref())?;
    sandbox.set_base_env(&planned.env)?;
    sandbox.set_exec_defaults(&planned.defaults)?;
    let name = sandbox.name().to_string();
    let evidence = sandbox.evidence_path();
    let pid = sandbox.supervisor_pid();
    // Printed first, detached last: a start killed before it detached
    // takes its sandbox along (the supervisor sees its control pipe close),
    // so one that did not print the name started nothing. A closed stdout
    // still detaches (and then ends the command quietly).
    let printed = if a.json {
        crate::cmd::write_out(format_args!(
            "{}\n",
            serde_json::json!({
                "name": name,
                "supervisor_pid": pid,
                "evidence": evidence,
                "ready_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            })
        ))
    } else {
        crate::cmd::write_out(format_args!("{name}\n"))
    };
    sandbox.detach();
    printed?;
    Ok(ExitCode::SUCCESS)
}
