//! Real programs work in a default sandbox as they do without the seccomp
//! policy: the compatibility side of the boundary (SECURITY.md, "System
//! calls"). A Debian bookworm image with Python, Node, OpenSSL, curl, git,
//! OpenSSH's ssh-keygen, Go, Rust, a JDK, gcc and make, gdb and strace and
//! SQLite (`$SIFBOX_TEST_COMPAT_TAR`, default `target/bookworm-compat.tar`,
//! made by scripts/bootstrap-base.sh) runs `compat/programs.sh` twice, under
//! the default policy and under `--seccomp unconfined`, and every check
//! must pass in both. The TLS clients talk to a server the script starts
//! with a CA of its own (a local PEP 503 index for pip among them), on the
//! sandbox's own loopback (`--net none`).
//!
//! The policy once left out `getrandom`: every TLS client failed in every
//! sandbox and no test noticed. A denial that breaks a program shows here
//! as a check that passes unconfined and fails confined.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::harness::Store;

/// The script of checks, run with `sh -c`.
const PROGRAMS: &str = include_str!("compat/programs.sh");

/// Every check the script makes, in its order: a run that prints fewer
/// (a check that hung, a script cut short) fails the test.
const CHECKS: &[&str] = &[
    "openssl-rand",
    "tls-setup",
    "index-setup",
    "tls-server",
    "curl-tls",
    "python-ssl",
    "python-venv-pip",
    "python-multiprocessing-asyncio",
    "node-crypto-https-workers",
    "git",
    "ssh-keygen",
    "go",
    "rust",
    "java",
    "gcc-make",
    "strace-gdb",
    "sqlite",
];

/// The compat image's tarball. Panics (never skips) when it is missing.
fn compat_tar() -> PathBuf {
    crate::harness::bootstrapped_tar(
        "SIFBOX_TEST_COMPAT_TAR",
        "bookworm-compat.tar",
        "compat image's",
    )
}

/// What each check said in one run: `ok`, or its failure.
fn results(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("CHECK "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, said)| (name.to_string(), said.to_string()))
        .collect()
}

#[test]
fn real_programs_work_under_the_default_policy_as_unconfined() {
    let store = Store::new("sifbox-compat.");
    store
        .import(&compat_tar(), "compat")
        .timeout(Duration::from_secs(600))
        .output()
        .success();
    let mut runs = Vec::new();
    for seccomp in ["default", "unconfined"] {
        let out = store
            .cmd([
                "run",
                "--net",
                "none",
                "--seccomp",
                seccomp,
                "--memory",
                "4g",
                "compat",
                "--",
                "sh",
                "-c",
                PROGRAMS,
            ])
            .timeout(Duration::from_secs(600))
            .output();
        out.success();
        runs.push((seccomp, results(&out.stdout), out));
    }
    let mut problems = Vec::new();
    for (seccomp, got, out) in &runs {
        for check in CHECKS {
            match got.get(*check).map(String::as_str) {
                Some("ok") => {}
                Some(said) => problems.push(format!("--seccomp {seccomp}: {check}: {said}")),
                None => problems.push(format!(
                    "--seccomp {seccomp}: {check}: no result (stderr: {})",
                    out.stderr
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    store.empty();
}
