//! One rollout as an agent harness runs it with the tokio API: start a
//! sandbox, upload a file, run a command, talk to a line-based process
//! (newline-delimited JSON, as ACP agents speak on stdio), stop.
//!
//! Usage:
//!   cargo build -p sifbox
//!   cargo run -p sifbox-engine --example agent_loop -- ROOTFS [SIFBOX_BIN]
//!
//! ROOTFS is an unpacked root file system with a shell (e.g. the test rootfs
//! from scripts/make-test-rootfs.sh); SIFBOX_BIN is the sifbox binary
//! (default: $SIFBOX_BIN, else `sifbox` on PATH).

use std::error::Error;
use std::path::PathBuf;
use std::time::Duration;

use sifbox_engine::aio::{self, AsyncSandbox};
use sifbox_engine::StartOptions;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args_os().skip(1);
    let rootfs = PathBuf::from(args.next().ok_or("usage: agent_loop ROOTFS [SIFBOX_BIN]")?);
    let sifbox = args
        .next()
        .or_else(|| std::env::var_os("SIFBOX_BIN"))
        .map_or_else(|| PathBuf::from("sifbox"), PathBuf::from);

    let name = format!("agent-loop-{}", std::process::id());
    let spec = aio::default_spec(&name, &rootfs)?;
    let sb = AsyncSandbox::start(spec, StartOptions::new(sifbox)).await?;
    println!("started {name}");
    // Whatever happens in the rollout, the sandbox is stopped.
    let result = rollout(&sb).await;
    sb.stop(Duration::from_secs(5)).await?;
    println!("stopped {name}");
    result
}

async fn rollout(sb: &AsyncSandbox) -> Result<(), Box<dyn Error>> {
    // Upload a task file.
    let task = std::env::temp_dir().join(format!("{}-task.txt", sb.name()));
    std::fs::write(&task, "count the words in this sentence\n")?;
    let uploaded = sb.upload(&task, "/tmp/task.txt", None).await;
    std::fs::remove_file(&task)?;
    uploaded?;

    // Run a command; a timeout would kill everything it started (exit 124).
    let out = sb
        .command("wc")
        .args(["-w", "/tmp/task.txt"])
        .timeout(Duration::from_secs(10))
        .output()
        .await?;
    println!("wc exited {}: {}", out.exit_code, out.stdout.trim());

    // A line-based agent: this one wraps every request in a reply.
    let mut agent = sb
        .command("sh")
        .args([
            "-c",
            r#"while read -r line; do echo "{\"jsonrpc\":\"2.0\",\"result\":$line}"; done"#,
        ])
        .spawn()
        .await?;
    for id in 0..3 {
        let request = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        agent.writeline(&request).await?;
        let reply = tokio::time::timeout(Duration::from_secs(5), agent.readline()).await??;
        println!("-> {request}\n<- {}", reply.unwrap_or_default());
    }
    // Closing stdin ends the loop; kill() would end it (and anything it
    // started) at once.
    agent.close_stdin();
    println!("agent exited with {}", agent.wait().await?.code());
    Ok(())
}
