//! `sifbox ps`: the sandboxes of this user on this node.

use std::process::ExitCode;

use sifbox_engine::runtime;

#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// Print the list as JSON.
    #[arg(long)]
    json: bool,
    /// Also list the sandboxes sifbox commands make for their own work
    /// (the steps of a running build).
    #[arg(short, long)]
    all: bool,
}

pub fn run(a: PsArgs) -> crate::error::Result<ExitCode> {
    let root = runtime::root()?;
    let entries: Vec<_> = runtime::scan(&root)?
        .into_iter()
        .filter(|e| a.all || !e.state.as_ref().is_some_and(|s| s.hidden))
        .map(|e| {
            let s = e.state.as_ref();
            serde_json::json!({
                "name": e.name,
                "status": if e.alive { "running" } else { "dead" },
                "supervisor_pid": s.map(|s| s.supervisor_pid),
                "created": s.map(|s| s.created),
                "image": s.map(|s| s.image.clone()),
                "rootfs": s.map(|s| s.rootfs.clone()),
                "evidence": s.and_then(|s| s.evidence.clone()),
                "oneshot": s.map(|s| s.oneshot),
                "hidden": s.is_some_and(|s| s.hidden),
            })
        })
        .collect();
    if a.json {
        outln!("{}", serde_json::json!({ "sandboxes": entries }));
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{:<28} {:<8} {:>8}  IMAGE", "NAME", "STATUS", "PID");
    for e in &entries {
        outln!(
            "{:<28} {:<8} {:>8}  {}",
            e["name"].as_str().unwrap_or_default(),
            e["status"].as_str().unwrap_or_default(),
            e["supervisor_pid"]
                .as_i64()
                .map(|p| p.to_string())
                .unwrap_or_default(),
            e["image"].as_str().unwrap_or_default(),
        );
    }
    Ok(ExitCode::SUCCESS)
}
