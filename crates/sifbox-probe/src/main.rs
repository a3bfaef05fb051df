//! `sifbox-probe`: a test helper that runs inside a sandbox and prints, as one
//! JSON object on stdout, what it sees (ids, id maps, mounts, processes,
//! interfaces, environment, and the results of requested path, write and
//! connect checks). End-to-end tests parse this report.
//!
//! It must stay a small, fully static binary with no `unsafe`. Anything it
//! cannot read is reported as `null` (or an error string), never a panic.
//!
//! Usage: `sifbox-probe [--check-path P]... [--write-test P]...
//! [--connect HOST:PORT]... [--sleep SECS]`, or `sifbox-probe attack
//! NAME...` for the hostile suite's attempts (see `attack`).

mod attack;
mod parse;

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

const USAGE: &str = "usage: sifbox-probe [--check-path P]... [--write-test P]... \
                     [--connect HOST:PORT]... [--sleep SECS]";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Parsed command line.
#[derive(Debug, Default, PartialEq)]
struct Args {
    check_paths: Vec<String>,
    write_tests: Vec<String>,
    connects: Vec<String>,
    sleep: Option<Duration>,
}

/// Result of parsing the command line.
#[derive(Debug, PartialEq)]
enum Cli {
    Run(Args),
    Help,
}

fn parse_args<I: IntoIterator<Item = OsString>>(argv: I) -> Result<Cli, String> {
    let mut args = Args::default();
    let mut it = argv.into_iter();
    while let Some(raw) = it.next() {
        let arg = raw
            .into_string()
            .map_err(|a| format!("argument is not valid UTF-8: {a:?}"))?;
        if arg == "-h" || arg == "--help" {
            return Ok(Cli::Help);
        }
        // Accept both `--flag VALUE` and `--flag=VALUE`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        let known = matches!(
            flag.as_str(),
            "--check-path" | "--write-test" | "--connect" | "--sleep"
        );
        if !known {
            return Err(format!("unknown argument: {flag}"));
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .ok_or_else(|| format!("{flag} needs a value"))?
                .into_string()
                .map_err(|a| format!("value of {flag} is not valid UTF-8: {a:?}"))?,
        };
        match flag.as_str() {
            "--check-path" => args.check_paths.push(value),
            "--write-test" => args.write_tests.push(value),
            "--connect" => args.connects.push(value),
            _ => {
                let secs: f64 = value
                    .parse()
                    .map_err(|_| format!("--sleep: not a number of seconds: {value}"))?;
                let d = Duration::try_from_secs_f64(secs)
                    .map_err(|_| format!("--sleep: out of range: {value}"))?;
                args.sleep = Some(d);
            }
        }
    }
    Ok(Cli::Run(args))
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os().skip(1).peekable();
    if argv.peek().is_some_and(|a| a == "attack") {
        let names: Vec<String> = argv
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return match attack::run(&names) {
            Ok(report) => {
                println!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sifbox-probe: {e}");
                ExitCode::from(2)
            }
        };
    }
    let args = match parse_args(argv) {
        Ok(Cli::Run(a)) => a,
        Ok(Cli::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sifbox-probe: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    let report = collect(&args);
    let mut out = io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &report)
        .map_err(io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    drop(out);
    if let Err(e) = written {
        eprintln!("sifbox-probe: writing report: {e}");
        return ExitCode::FAILURE;
    }

    if let Some(d) = args.sleep {
        std::thread::sleep(d);
    }
    ExitCode::SUCCESS
}

/// Gather the whole report.
fn collect(args: &Args) -> Value {
    let mut r = Map::new();
    r.insert("uid".into(), json!(rustix::process::getuid().as_raw()));
    r.insert("gid".into(), json!(rustix::process::getgid().as_raw()));
    r.insert("euid".into(), json!(rustix::process::geteuid().as_raw()));
    r.insert("egid".into(), json!(rustix::process::getegid().as_raw()));
    r.insert(
        "groups".into(),
        match rustix::process::getgroups() {
            Ok(g) => g.iter().map(|g| json!(g.as_raw())).collect(),
            Err(_) => Value::Null,
        },
    );
    r.insert("uid_map".into(), id_map("/proc/self/uid_map"));
    r.insert("gid_map".into(), id_map("/proc/self/gid_map"));
    r.insert(
        "pid".into(),
        json!(rustix::process::getpid().as_raw_nonzero().get()),
    );
    r.insert(
        "ppid".into(),
        json!(rustix::process::Pid::as_raw(rustix::process::getppid())),
    );
    r.insert(
        "hostname".into(),
        json!(rustix::system::uname().nodename().to_string_lossy()),
    );
    r.insert(
        "cwd".into(),
        match std::env::current_dir() {
            Ok(p) => json!(p.to_string_lossy()),
            Err(_) => Value::Null,
        },
    );
    r.insert("env".into(), own_env());
    r.insert("cap_eff".into(), cap_eff());
    r.insert("mounts".into(), mounts());
    r.insert("interfaces".into(), interfaces());
    r.insert("processes".into(), processes());
    r.insert("paths".into(), check_paths(&args.check_paths));
    r.insert("writable".into(), write_tests(&args.write_tests));
    r.insert("connect".into(), connects(&args.connects));
    Value::Object(r)
}

fn id_map(path: &str) -> Value {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| parse::parse_id_map(&t))
        .map_or(Value::Null, |m| json!(m))
}

fn own_env() -> Value {
    let mut m = Map::new();
    for (k, v) in std::env::vars_os() {
        m.insert(k.to_string_lossy().into_owned(), json!(v.to_string_lossy()));
    }
    Value::Object(m)
}

fn cap_eff() -> Value {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse::status_field(&s, "CapEff").map(str::to_string))
        .map_or(Value::Null, Value::String)
}

fn mounts() -> Value {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Value::Null;
    };
    parse::parse_mountinfo(&text)
        .into_iter()
        .map(|m| {
            json!({
                "target": m.target,
                "fstype": m.fstype,
                "source": m.source,
                "options": m.options(),
                "readonly": m.readonly(),
            })
        })
        .collect()
}

fn interfaces() -> Value {
    let Ok(text) = fs::read_to_string("/proc/net/dev") else {
        return Value::Null;
    };
    parse::parse_net_dev(&text)
        .into_iter()
        .map(|name| {
            let up = fs::read_to_string(format!("/sys/class/net/{name}/flags"))
                .ok()
                .and_then(|f| parse::parse_iface_up(&f));
            json!({ "name": name, "up": up })
        })
        .collect()
}

fn processes() -> Value {
    // Without a mounted procfs /proc may still be an (empty) directory.
    if fs::symlink_metadata("/proc/self").is_err() {
        return Value::Null;
    }
    let Ok(dir) = fs::read_dir("/proc") else {
        return Value::Null;
    };
    let mut pids: Vec<u32> = dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let mut out = Vec::with_capacity(pids.len());
    for pid in pids {
        let cmdline = match fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(data) => json!(parse::parse_cmdline(&data)),
            // The process exited between listing and reading: leave it out.
            Err(e) if vanished(&e) => continue,
            Err(_) => Value::Null,
        };
        let environ = match fs::read(format!("/proc/{pid}/environ")) {
            Ok(data) => json!(parse::parse_environ(&data)),
            Err(_) => Value::Null,
        };
        out.push(json!({ "pid": pid, "cmdline": cmdline, "environ": environ }));
    }
    Value::Array(out)
}

fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
}

fn check_paths(paths: &[String]) -> Value {
    let mut m = Map::new();
    for p in paths {
        let entry = match fs::symlink_metadata(p) {
            Ok(md) => json!({ "exists": true, "kind": file_kind(&md.file_type()) }),
            Err(_) => json!({ "exists": false, "kind": null }),
        };
        m.insert(p.clone(), entry);
    }
    Value::Object(m)
}

fn file_kind(ft: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_char_device() {
        "char"
    } else if ft.is_block_device() {
        "block"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else {
        "other"
    }
}

fn write_tests(paths: &[String]) -> Value {
    let mut m = Map::new();
    for p in paths {
        m.insert(p.clone(), json!(can_write(Path::new(p))));
    }
    Value::Object(m)
}

/// A directory is writable when a fresh file can be created in it and removed
/// again; anything else when it can be opened for writing (no create, no
/// truncate; nothing is written).
fn can_write(path: &Path) -> bool {
    match fs::metadata(path) {
        Ok(md) if md.is_dir() => {
            let probe = path.join(unique_name());
            let created = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&probe)
                .is_ok();
            created && fs::remove_file(&probe).is_ok()
        }
        _ => fs::OpenOptions::new().write(true).open(path).is_ok(),
    }
}

fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        ".sifbox-probe-write-test.{}.{nanos}.{n}",
        rustix::process::getpid().as_raw_nonzero()
    )
}

fn connects(targets: &[String]) -> Value {
    let mut m = Map::new();
    for t in targets {
        let entry = match try_connect(t) {
            Ok(()) => json!({ "ok": true, "error": null }),
            Err(e) => json!({ "ok": false, "error": e }),
        };
        m.insert(t.clone(), entry);
    }
    Value::Object(m)
}

fn resolve(target: &str) -> Result<Vec<SocketAddr>, String> {
    if let Ok(a) = target.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    // A static binary may have no working name service inside a minimal
    // rootfs; handle the one name tests are likely to use by hand.
    if let Some(port) = target.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| format!("bad port in {target}"))?;
        return Ok(vec![
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
        ]);
    }
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| format!("resolve {target}: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("resolve {target}: no addresses"));
    }
    Ok(addrs)
}

fn try_connect(target: &str) -> Result<(), String> {
    let mut last = String::from("no addresses");
    for addr in resolve(target)? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Cli, String> {
        parse_args(v.iter().map(OsString::from))
    }

    #[test]
    fn cli_parsing() {
        assert_eq!(args(&[]), Ok(Cli::Run(Args::default())));
        assert_eq!(args(&["--help"]), Ok(Cli::Help));
        let parsed = args(&[
            "--check-path",
            "/a",
            "--check-path=/b",
            "--write-test",
            "/tmp",
            "--connect",
            "127.0.0.1:80",
            "--sleep",
            "1.5",
        ]);
        assert_eq!(
            parsed,
            Ok(Cli::Run(Args {
                check_paths: vec!["/a".into(), "/b".into()],
                write_tests: vec!["/tmp".into()],
                connects: vec!["127.0.0.1:80".into()],
                sleep: Some(Duration::from_millis(1500)),
            }))
        );
        assert!(args(&["--bogus"]).is_err());
        assert!(args(&["--check-path"]).is_err());
        assert!(args(&["--sleep", "x"]).is_err());
        assert!(args(&["--sleep", "-1"]).is_err());
    }

    #[test]
    fn write_test_on_temp_dir() {
        let dir = std::env::temp_dir();
        assert!(can_write(&dir));
        assert!(!can_write(Path::new("/nonexistent/sifbox-probe/x")));
    }

    #[test]
    fn connect_refused_is_reported() {
        let v = connects(&["127.0.0.1:1".into(), "not-an-address".into()]);
        assert_eq!(v["127.0.0.1:1"]["ok"], json!(false));
        assert!(v["127.0.0.1:1"]["error"].is_string());
        assert_eq!(v["not-an-address"]["ok"], json!(false));
    }
}
