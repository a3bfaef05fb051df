//! `sifbox gc`: remove what dead sandboxes left behind.

use std::process::ExitCode;

use sifbox_engine::runtime;

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: GcArgs) -> sifbox_engine::Result<ExitCode> {
    let root = runtime::root()?;
    let removed = runtime::reap_dead(&root)?;
    if args.json {
        println!("{}", serde_json::json!({ "removed_sandboxes": removed }));
    } else if removed.is_empty() {
        println!("nothing to clean up");
    } else {
        for name in &removed {
            println!("removed dead sandbox {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
