//! `sifbox wait | kill | logs`: detached execs (`sifbox exec --detach`).

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use sifbox_engine::{Error, Sandbox};

use crate::cmd::options::bad;
use crate::cmd::status_exit;

#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    /// The sandbox the exec runs in.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The id `sifbox exec --detach` printed.
    #[arg(value_name = "ID")]
    pub id: String,
}

#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// The sandbox the exec runs in.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The id `sifbox exec --detach` printed.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Signal name (KILL, TERM, INT, HUP, ...) or number; default KILL,
    /// which reaches every process the exec started.
    #[arg(default_value = "KILL", value_name = "SIGNAL")]
    pub signal: String,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The sandbox the exec runs in.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The id `sifbox exec --detach` printed.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Keep printing until the exec ends.
    #[arg(short = 'f', long)]
    pub follow: bool,
}

pub fn wait(a: WaitArgs) -> crate::error::Result<ExitCode> {
    let sandbox = Sandbox::attach(&a.name)?;
    Ok(status_exit(&sandbox.wait_detached(&a.id)?))
}

fn parse_signal(s: &str) -> crate::error::Result<i32> {
    let name = s.trim_start_matches("SIG").to_ascii_uppercase();
    let known = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
    ];
    if let Some((_, n)) = known.iter().find(|(k, _)| *k == name) {
        return Ok(*n);
    }
    match s.parse::<i32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(n),
        _ => Err(bad(
            &format!("signal {s:?}"),
            "unknown signal",
            "use a name like TERM or a number 1-64",
        )),
    }
}

pub fn kill(a: KillArgs) -> crate::error::Result<ExitCode> {
    let sig = parse_signal(&a.signal)?;
    let sandbox = Sandbox::attach(&a.name)?;
    sandbox.signal_detached(&a.id, sig)?;
    Ok(ExitCode::SUCCESS)
}

pub fn logs(a: LogsArgs) -> crate::error::Result<ExitCode> {
    let sandbox = Sandbox::attach(&a.name)?;
    let (out, err, _) = sandbox.detached_files(&a.id)?;
    let open = |p: &std::path::Path| {
        std::fs::File::open(p).map_err(|e| Error::io(format!("opening {}", p.display()), e))
    };
    let (mut out_f, mut err_f) = (open(&out)?, open(&err)?);
    let copy = |f: &mut std::fs::File, to: &mut dyn Write| -> sifbox_engine::Result<()> {
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)
            .map_err(|e| Error::io("reading exec output", e))?;
        let _ = to.write_all(&buf);
        let _ = to.flush();
        Ok(())
    };
    loop {
        let ended = !a.follow || sandbox.detached_status(&a.id)?.is_some() || !sandbox.is_running();
        copy(&mut out_f, &mut std::io::stdout())?;
        copy(&mut err_f, &mut std::io::stderr())?;
        if ended {
            return Ok(ExitCode::SUCCESS);
        }
        // Files only grow: the next read goes on from where this one ended.
        std::thread::sleep(Duration::from_millis(50));
    }
}
