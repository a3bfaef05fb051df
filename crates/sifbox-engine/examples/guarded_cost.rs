//! What a guarded bind costs (eval's /logs/verifier, see
//! `spec::GuardedBind`): a sandbox's start with one and without, and an
//! exec in the guarded mount namespace against a pooled one, interleaved
//! in one run; prints the medians and their differences.
//!
//! Usage:
//!   cargo build -p sifbox
//!   cargo run -p sifbox-engine --example guarded_cost -- ROOTFS [SIFBOX_BIN] [ROUNDS]
//!
//! ROOTFS is an unpacked root file system with `true` (the test rootfs);
//! SIFBOX_BIN the sifbox binary (default: $SIFBOX_BIN, else `sifbox`).

use std::error::Error;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::spec::{Bind, GuardedBind};
use sifbox_engine::{Sandbox, StartOptions};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args_os().skip(1);
    let rootfs = PathBuf::from(
        args.next()
            .ok_or("usage: guarded_cost ROOTFS [SIFBOX_BIN] [ROUNDS]")?,
    );
    let sifbox = args
        .next()
        .or_else(|| std::env::var_os("SIFBOX_BIN"))
        .map_or_else(|| PathBuf::from("sifbox"), PathBuf::from);
    let rounds: usize = args
        .next()
        .and_then(|r| r.to_str().and_then(|r| r.parse().ok()))
        .unwrap_or(40);
    let logs = tempfile::tempdir()?;
    std::fs::create_dir(logs.path().join("verifier"))?;
    let null = std::fs::File::open("/dev/null")?;
    let opts = StartOptions {
        oneshot: true,
        ..StartOptions::new(sifbox)
    };
    let start = |n: usize, guarded: bool| -> Result<(Sandbox, f64), Box<dyn Error>> {
        let name = format!("guarded-cost-{}-{n}", std::process::id());
        let mut spec = sifbox_engine::aio::default_spec(&name, &rootfs)?;
        // As eval: the rollout dir at /logs, its verifier/ guarded.
        spec.binds.push(Bind {
            src: logs.path().to_path_buf(),
            dst: "/logs".into(),
            readonly: false,
        });
        if guarded {
            spec.guarded.push(GuardedBind {
                src: logs.path().join("verifier"),
                dst: "/logs/verifier".into(),
            });
        }
        let t = Instant::now();
        let sb = Sandbox::launch(spec, &opts)?;
        sb.wait_ready()?;
        Ok((sb, t.elapsed().as_secs_f64() * 1e3))
    };
    let exec = |sb: &Sandbox, guarded: bool| -> Result<f64, Box<dyn Error>> {
        let req = ExecRequest::command(["true"]).guarded(guarded).build();
        let t = Instant::now();
        let st = sb.exec(req, [null.as_fd(), null.as_fd(), null.as_fd()])?;
        let took = t.elapsed().as_secs_f64() * 1e3;
        if st.code() != 0 {
            return Err(format!("true exited {}", st.code()).into());
        }
        Ok(took)
    };
    let (mut plain_start, mut guarded_start) = (Vec::new(), Vec::new());
    let (mut pooled_exec, mut guarded_exec) = (Vec::new(), Vec::new());
    for n in 0..rounds {
        // Alternating which goes first.
        for guarded in [n % 2 == 0, n % 2 == 1] {
            let (sb, ms) = start(n * 2 + usize::from(guarded), guarded)?;
            if guarded {
                guarded_start.push(ms);
                // A warm worker first, as an agent's execs leave one.
                exec(&sb, false)?;
                for g in [n % 2 == 0, n % 2 == 1] {
                    let ms = exec(&sb, g)?;
                    if g {
                        guarded_exec.push(ms);
                    } else {
                        pooled_exec.push(ms);
                    }
                }
            } else {
                plain_start.push(ms);
            }
            sb.stop(Duration::ZERO)?;
        }
    }
    // The differences within each round (the two ran back to back), whose
    // median is steadier on a busy host than the difference of medians.
    let diffs =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x - y).collect() };
    let mut start_diff = diffs(&guarded_start, &plain_start);
    let mut exec_diff = diffs(&guarded_exec, &pooled_exec);
    let (ps, gs) = (median(&mut plain_start), median(&mut guarded_start));
    let (pe, ge) = (median(&mut pooled_exec), median(&mut guarded_exec));
    let (sd, ed) = (median(&mut start_diff), median(&mut exec_diff));
    println!("{rounds} rounds, medians (ms), and the median of the paired differences:");
    println!("  start  without {ps:.2}  with a guarded bind {gs:.2}  (+{sd:.2})");
    println!("  exec   pooled  {pe:.2}  guarded            {ge:.2}  (+{ed:.2})");
    Ok(())
}
