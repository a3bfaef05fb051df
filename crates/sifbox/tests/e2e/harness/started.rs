//! A long-lived sandbox (`sifbox start`) held by a guard that stops it when
//! the test ends, also when an assertion failed.

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{descendants, proc_of, rootfs, sifbox_bin, unique, Invocation, Output, Proc, Sifbox};

/// A sandbox of the test's runtime dir; dropping the guard runs `sifbox
/// stop` (so a failed assertion never leaves it running).
#[derive(Debug)]
pub struct Started<'a> {
    sb: &'a Sifbox,
    pub name: String,
    /// Host pid of the supervisor, from `start --json` (0 when adopted).
    pub pid: i32,
    /// What `start --json` printed (null when adopted).
    pub info: Value,
    stopped: bool,
}

impl<'a> Started<'a> {
    /// `sifbox start --json --rootfs <test rootfs> --name NAME OPTS...`,
    /// with `envs` added to sifbox's own environment; asserts success.
    pub fn new(sb: &'a Sifbox, name: &str, opts: &[&str], envs: &[(&str, &str)]) -> Started<'a> {
        let mut args: Vec<OsString> = vec![
            "start".into(),
            "--json".into(),
            "--rootfs".into(),
            rootfs().into(),
            "--name".into(),
            name.into(),
        ];
        args.extend(opts.iter().map(OsString::from));
        let mut inv = sb.cmd(args).no_clean_check();
        for (k, v) in envs {
            inv = inv.env(k, v);
        }
        let out = inv.output();
        // Whatever happened, a sandbox of that name may exist now: the
        // guard owns it from here on.
        let mut guard = Started::adopt(sb, name);
        out.success();
        guard.info = out.json();
        assert_eq!(guard.info["name"], name, "start --json: {}", guard.info);
        guard.pid = guard.info["supervisor_pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or_else(|| panic!("no supervisor_pid in {}", guard.info));
        guard
    }

    /// A sandbox with a unique name and no options.
    pub fn plain(sb: &'a Sifbox, prefix: &str) -> Started<'a> {
        Started::new(sb, &unique(prefix), &[], &[])
    }

    /// The guard of a sandbox `name` that the test started itself (no pid,
    /// no info).
    pub fn adopt(sb: &'a Sifbox, name: impl Into<String>) -> Started<'a> {
        Started {
            sb,
            name: name.into(),
            pid: 0,
            info: Value::Null,
            stopped: false,
        }
    }

    /// `sifbox exec OPTS... NAME -- CMD...`, to run (no clean check).
    pub fn exec_cmd(&self, opts: &[&str], cmd: &[&str]) -> Invocation<'a> {
        self.sb.cmd(self.exec_args(opts, cmd)).no_clean_check()
    }

    /// `sifbox exec OPTS... NAME -- CMD...`
    pub fn exec(&self, opts: &[&str], cmd: &[&str]) -> Output {
        self.exec_cmd(opts, cmd).output()
    }

    /// `sifbox exec OPTS... NAME -- CMD...` with `envs` in sifbox's own
    /// environment.
    pub fn exec_env(&self, opts: &[&str], cmd: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut inv = self.exec_cmd(opts, cmd);
        for (k, v) in envs {
            inv = inv.env(k, v);
        }
        inv.output()
    }

    /// The arguments of `sifbox exec OPTS... NAME -- CMD...`.
    pub fn exec_args(&self, opts: &[&str], cmd: &[&str]) -> Vec<String> {
        let mut args = vec!["exec".to_string()];
        args.extend(opts.iter().map(|s| s.to_string()));
        args.push(self.name.clone());
        args.push("--".into());
        args.extend(cmd.iter().map(|s| s.to_string()));
        args
    }

    /// `sifbox exec NAME sh -c SCRIPT`
    pub fn sh(&self, script: &str) -> Output {
        self.exec(&[], &["sh", "-c", script])
    }

    /// `sifbox ARGS...` against this test's runtime dir, with no clean
    /// check, to run (with stdin, say).
    pub fn cmd(&self, args: &[&str]) -> Invocation<'a> {
        self.sb.cmd(args).no_clean_check()
    }

    /// `sifbox ARGS...` against this test's runtime dir, with no clean check.
    pub fn sifbox(&self, args: &[&str]) -> Output {
        self.sb.cmd(args).no_clean_check().output()
    }

    /// `sifbox stop [OPTS...] NAME`; returns its output (not asserted).
    pub fn stop_with(mut self, opts: &[&str]) -> Output {
        let mut args = vec!["stop"];
        args.extend_from_slice(opts);
        args.push(&self.name);
        let out = self.sb.cmd(&args).no_clean_check().output();
        self.stopped = true;
        out
    }

    /// `sifbox stop NAME`, asserted to succeed.
    pub fn stop(self) {
        let name = self.name.clone();
        let out = self.stop_with(&[]);
        out.success();
        assert!(
            out.stdout.contains(&name),
            "stop does not name {name}: {out:?}"
        );
        // A clean stop has nothing to warn about (as an unprivileged
        // user, giving back a `--logs` dir included).
        assert!(
            !out.stderr.contains("warning"),
            "stop of {name} warned: {out:?}"
        );
    }

    /// Forgets the sandbox (it was ended some other way).
    pub fn disarm(mut self) {
        self.stopped = true;
    }

    /// The supervisor and every host process below it, now.
    pub fn processes(&self) -> Vec<Proc> {
        let mut v = descendants(self.pid);
        v.extend(proc_of(self.pid));
        v
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        if !self.stopped {
            stop_quietly(self.sb, &self.name);
        }
    }
}

/// `sifbox stop --timeout 0 NAME` without asserting anything (for guards:
/// it must not panic), killed after 30 s.
fn stop_quietly(sb: &Sifbox, name: &str) {
    let child = Command::new(sifbox_bin())
        .args(["stop", "--timeout", "0", name])
        .env("SIFBOX_RUNTIME", sb.runtime())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return };
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(None) = child.try_wait() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
