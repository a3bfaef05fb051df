//! What the kernel answers under the default seccomp policy.
//!
//! Each case forks a child of this single-threaded program (no libtest
//! harness: its threads would stop a child from entering a user namespace),
//! which installs the policy and then makes real system calls through
//! sifbox-sys's probes, whose arguments are fixed and memory-safe. Run as
//! root the child installs the policy as sifbox does (without
//! no_new_privs, with CAP_SYS_ADMIN); run unprivileged it sets
//! no_new_privs first, as the kernel then requires.
//!
//! `SIFBOX_SECCOMP_BENCH=1` adds measurements: the cost of installing the
//! filters and the overhead per system call.
//!
//! Takes libtest's arguments as far as cargo and nextest pass them: name
//! filters, `--exact`, `--list`.

use std::io::{Read, Write};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use rustix::process::WaitOptions;
use sifbox_engine::seccomp;
use sifbox_sys::{try_syscall, Forked, IoctlRequest, ProbeSyscall as P};

/// The policy compiler of build.rs, for the benchmark's comparison with
/// seccompiler's own programs.
#[path = "../seccomp/compile.rs"]
mod compile;

/// seccompiler's stacked programs for the policy on this architecture (what
/// the single program replaces), compiled once: forked children inherit them.
fn reference_programs() -> &'static [Vec<sifbox_sys::SockFilter>] {
    static PROGRAMS: std::sync::OnceLock<Vec<Vec<sifbox_sys::SockFilter>>> =
        std::sync::OnceLock::new();
    PROGRAMS.get_or_init(compile_reference)
}

fn compile_reference() -> Vec<Vec<sifbox_sys::SockFilter>> {
    let text = include_str!("../seccomp/policy.toml");
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH).expect("supported arch");
    let p = compile::compile(&compile::parse(text).expect("parses"), arch).expect("compiles");
    [p.default, p.enosys, p.newer]
        .into_iter()
        .map(|prog| {
            prog.iter()
                .map(|i| sifbox_sys::SockFilter {
                    code: i.code,
                    jt: i.jt,
                    jf: i.jf,
                    k: i.k,
                })
                .collect()
        })
        .collect()
}

const EPERM: i32 = libc::EPERM;
const ENOSYS: i32 = libc::ENOSYS;
const NEWNS: u64 = 0x0002_0000;
const NEWUSER: u64 = 0x1000_0000;
const NEWPID: u64 = 0x2000_0000;
const NEWNET: u64 = 0x4000_0000;
const NEWTIME: u64 = 0x80;
const AF_UNIX: u64 = 1;
const AF_INET: u64 = 2;
const AF_VSOCK: u64 = 40;

/// The environment variable that makes this binary a probe: it prints what
/// one call answers and exits (to see that exec'd programs are filtered).
const PROBE_ENV: &str = "SIFBOX_SECCOMP_TEST_PROBE";

type Outcome = Result<(), String>;
/// A test case: its name and body.
type Case = (&'static str, fn() -> Outcome);

fn main() -> ExitCode {
    if let Ok(which) = std::env::var(PROBE_ENV) {
        return probe_main(&which);
    }
    let mut cases: Vec<Case> = vec![
        ("denied_calls_answer_eperm_or_enosys", denied_calls),
        ("allowed_calls_and_programs_work", allowed_calls),
        ("exec_d_programs_inherit_the_policy", exec_inherits),
        ("the_exec_hook_filters_only_the_command", exec_hook),
        ("nested_namespaces_when_opted_in", nested_namespaces),
        ("fakeroot_filter_stacks_under_the_policy", fakeroot_stack),
        (
            "install_without_cap_sys_admin_or_nnp_is_eacces",
            needs_privilege,
        ),
        ("install_does_not_set_no_new_privs", keeps_setuid),
        ("a_foreign_abi_is_killed", foreign_abi),
        (
            "denials_are_heard_counted_and_answered_eperm",
            denials_heard,
        ),
    ];
    if std::env::var_os("SIFBOX_SECCOMP_BENCH").is_some() {
        cases.push(("bench", bench));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exact = args.iter().any(|a| a == "--exact");
    let filters: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let selected = |name: &str| {
        filters.is_empty()
            || filters
                .iter()
                .any(|f| if exact { name == *f } else { name.contains(f) })
    };
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            for (name, _) in cases.iter().filter(|(n, _)| selected(n)) {
                println!("{name}: test");
            }
        }
        return ExitCode::SUCCESS;
    }
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, case) in cases.iter().filter(|(n, _)| selected(n)) {
        ran += 1;
        match case() {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) => {
                println!("test {name} ... FAILED\n{e}");
                failed.push(*name);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        ran - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How a forked child ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Exit(i32),
    Signal(i32),
}

/// Runs `body` in a forked child and returns how it ended; the child's
/// failure message goes to stderr.
fn fork_child(body: impl FnOnce() -> Outcome) -> Result<End, String> {
    // Flush so that the child does not print the parent's buffered output.
    let _ = std::io::stdout().flush();
    match sifbox_sys::fork().map_err(|e| e.to_string())? {
        Forked::Child => {
            let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                Ok(Ok(())) => 0,
                Ok(Err(msg)) => {
                    eprintln!("{msg}");
                    1
                }
                Err(_) => 2,
            };
            let _ = std::io::stdout().flush();
            #[allow(clippy::exit, reason = "the end of a forked test child")]
            std::process::exit(code)
        }
        Forked::Parent(pid) => {
            let (_, status) = rustix::process::waitpid(Some(pid), WaitOptions::empty())
                .map_err(|e| format!("waitpid: {e}"))?
                .ok_or("waitpid: no status")?;
            if let Some(code) = status.exit_status() {
                Ok(End::Exit(code))
            } else if let Some(sig) = status.terminating_signal() {
                Ok(End::Signal(sig))
            } else {
                Err(format!("child stopped: {status:?}"))
            }
        }
    }
}

/// Runs `body` in a child that must exit 0.
fn in_child(body: impl FnOnce() -> Outcome) -> Outcome {
    match fork_child(body)? {
        End::Exit(0) => Ok(()),
        other => Err(format!(
            "the child ended with {other:?} (its message is above)"
        )),
    }
}

fn has_cap_sys_admin() -> bool {
    rustix::thread::capabilities(None)
        .map(|c| {
            c.effective
                .contains(rustix::thread::CapabilitySet::SYS_ADMIN)
        })
        .unwrap_or(false)
}

/// Installs the policy as the caller's privileges allow: as sifbox does
/// when this process may (CAP_SYS_ADMIN), else after setting no_new_privs.
fn confine(allow_userns: bool) -> Outcome {
    if !has_cap_sys_admin() {
        rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    }
    seccomp::install(allow_userns).map_err(|e| e.to_string())
}

/// The errno of an answer, or None for success.
fn errno(r: &std::io::Result<i64>) -> Option<i32> {
    r.as_ref().err().map(|e| e.raw_os_error().unwrap_or(-1))
}

fn show(r: &std::io::Result<i64>) -> String {
    match r {
        Ok(v) => format!("ok({v})"),
        Err(e) => format!("{e}"),
    }
}

/// Asserts that each probe answers the errno given (None: succeeds).
fn expect(rows: &[(P, Option<i32>)], before: Option<&[std::io::Result<i64>]>) -> Outcome {
    let mut bad = Vec::new();
    for (i, (probe, want)) in rows.iter().enumerate() {
        let got = try_syscall(*probe);
        let was = before
            .map(|b| format!("{} -> ", show(&b[i])))
            .unwrap_or_default();
        if errno(&got) != *want {
            bad.push(format!(
                "  {probe:?}: {was}{} (wanted {})",
                show(&got),
                want.map(|e| std::io::Error::from_raw_os_error(e).to_string())
                    .unwrap_or_else(|| "success".into())
            ));
        } else if std::env::var_os("SIFBOX_SECCOMP_VERBOSE").is_some() {
            eprintln!("  {probe:?}: {was}{}", show(&got));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("\n"))
    }
}

fn denied_calls() -> Outcome {
    let rows = [
        (P::KeyctlSessionKeyringId, Some(EPERM)),
        (P::AddKeyNull, Some(EPERM)),
        (P::RequestKeyNull, Some(EPERM)),
        (P::BpfMapCreateEmpty, Some(EPERM)),
        (P::PerfEventOpenNull, Some(EPERM)),
        (P::UserfaultfdUserMode, Some(EPERM)),
        (P::IoUringSetupNull, Some(ENOSYS)),
        (P::IoUringEnterBadFd, Some(ENOSYS)),
        (P::IoUringRegisterBadFd, Some(ENOSYS)),
        (P::Unshare(NEWUSER), Some(EPERM)),
        (P::Unshare(NEWNS), Some(EPERM)),
        (P::Unshare(NEWNET), Some(EPERM)),
        (P::Unshare(NEWTIME), Some(EPERM)),
        (P::Clone(NEWUSER), Some(EPERM)),
        (P::Clone(NEWPID), Some(EPERM)),
        (P::Clone(NEWNET), Some(EPERM)),
        (P::Clone3Null, Some(ENOSYS)),
        (P::IoctlDevNull(IoctlRequest::Tiocsti), Some(EPERM)),
        (P::IoctlDevNull(IoctlRequest::TiocstiHighBits), Some(EPERM)),
        (P::IoctlDevNull(IoctlRequest::Tioclinux), Some(EPERM)),
        (P::Socket(AF_VSOCK), Some(EPERM)),
        (P::Socket(AF_VSOCK | 1 << 32), Some(EPERM)),
        (P::Personality(0x0040_0000), Some(EPERM)),
        (P::KexecLoadInvalid, Some(EPERM)),
        (P::KexecFileLoadInvalid, Some(EPERM)),
        (P::InitModuleNull, Some(EPERM)),
        (P::FinitModuleBadFd, Some(EPERM)),
        (P::DeleteModuleNull, Some(EPERM)),
        (P::OpenByHandleAtNull, Some(EPERM)),
        (P::MountNull, Some(EPERM)),
        (P::Umount2Null, Some(EPERM)),
        (P::PivotRootNull, Some(EPERM)),
        (P::SetnsBadFd, Some(EPERM)),
        (P::FsopenNull, Some(EPERM)),
        (P::OpenTreeNull, Some(EPERM)),
        (P::SwapoffNull, Some(EPERM)),
        (P::RebootBadMagic, Some(EPERM)),
        (P::ClockSettimeNull, Some(EPERM)),
        (P::SyslogSizeBuffer, Some(EPERM)),
        (P::Unassigned, Some(ENOSYS)),
    ];
    in_child(|| {
        // What the kernel answers without the policy, for the report. Left
        // out: the vsock socket (it may make the host load a module) and the
        // calls that would change this child (unshare, personality).
        let before: Vec<_> = rows
            .iter()
            .map(|(p, _)| match p {
                P::Socket(_) | P::Unshare(_) | P::Personality(_) => {
                    Err(std::io::Error::other("not tried"))
                }
                p => try_syscall(*p),
            })
            .collect();
        confine(false)?;
        expect(&rows, Some(&before))
    })
}

/// The reporting install: a denied call still fails with EPERM (answered
/// by the listener's thread), is counted by name, and allowed or ENOSYS
/// calls are not; a second listener in the chain (a nested sifbox) falls
/// back to the plain policy, whose EPERM then wins unheard.
fn denials_heard() -> Outcome {
    use sifbox_engine::denials::{self, Denied};
    in_child(|| {
        if !has_cap_sys_admin() {
            rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
        }
        let fd = seccomp::install_reporting(false)
            .map_err(|e| e.to_string())?
            .ok_or("no listener: this process's chain had one already")?;
        denials::serve(fd).map_err(|e| format!("serving the listener: {e}"))?;
        expect(
            &[
                (P::KeyctlSessionKeyringId, Some(EPERM)),
                (P::KeyctlSessionKeyringId, Some(EPERM)),
                (P::KeyctlSessionKeyringId, Some(EPERM)),
                (P::AddKeyNull, Some(EPERM)),
                (P::Getpid, None),
                (P::IoUringSetupNull, Some(ENOSYS)),
                (P::Unassigned, Some(ENOSYS)),
            ],
            None,
        )?;
        let d = |name: &str, count| Denied {
            syscall: name.into(),
            count,
        };
        let mut got = denials::take_exec();
        got.sort_by(|a, b| a.syscall.cmp(&b.syscall));
        if got != [d("add_key", 1), d("keyctl", 3)] {
            return Err(format!("counted {got:?}"));
        }
        if !denials::take_exec().is_empty() {
            return Err("take_exec did not clear the counts".into());
        }
        // A program's own program exec'd below is heard too.
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let out = Command::new(exe)
            .env(PROBE_ENV, "keyctl")
            .output()
            .map_err(|e| format!("running the probe: {e}"))?;
        let said = String::from_utf8_lossy(&out.stdout);
        if said.trim() != EPERM.to_string() {
            return Err(format!("the exec'd probe said {said:?}"));
        }
        if denials::take_exec() != [d("keyctl", 1)] {
            return Err("the exec'd program's denial was not counted".into());
        }
        // A nested sifbox: no second listener; the plain policy stacks.
        match seccomp::install_reporting(false) {
            Ok(None) => {}
            other => return Err(format!("a second listener: {other:?}")),
        }
        expect(&[(P::KeyctlSessionKeyringId, Some(EPERM))], None)?;
        if !denials::take_exec().is_empty() {
            return Err("the inner filter's EPERM should win, unheard".into());
        }
        Ok(())
    })
}

fn allowed_calls() -> Outcome {
    in_child(|| {
        confine(false)?;
        let pid = try_syscall(P::Getpid).map_err(|e| e.to_string())?;
        if pid != i64::from(std::process::id()) {
            return Err(format!("getpid answered {pid}"));
        }
        std::fs::File::open("/dev/null").map_err(|e| format!("openat: {e}"))?;
        std::fs::read_dir("/").map_err(|e| format!("getdents: {e}"))?;
        // posix_spawn and pthread_create try clone3 first and fall back to
        // clone on ENOSYS.
        let st = Command::new("/bin/true")
            .status()
            .map_err(|e| format!("spawning /bin/true: {e}"))?;
        if !st.success() {
            return Err(format!("/bin/true: {st}"));
        }
        let out = Command::new("/bin/sh")
            .args(["-c", "echo $(( 6 * 7 ))"])
            .output()
            .map_err(|e| format!("spawning sh: {e}"))?;
        if out.stdout != b"42\n" {
            return Err(format!("sh printed {:?}", out.stdout));
        }
        let t = std::thread::spawn(|| 7)
            .join()
            .map_err(|_| "thread panicked".to_string())?;
        if t != 7 {
            return Err("thread".into());
        }
        expect(
            &[
                (P::Clone(0), None),
                (P::Unshare(0), None),
                (P::Personality(0xffff_ffff), None),
                (P::Personality(0), None),
                (P::Socket(AF_UNIX), None),
                (P::Socket(AF_INET), None),
                // Reaches /dev/null, which has no terminal ioctls.
                (P::IoctlDevNull(IoctlRequest::Tcgets), Some(libc::ENOTTY)),
            ],
            None,
        )?;
        // A debugger may trace its own child.
        let mut sleeper = Command::new("/bin/sleep")
            .arg("10")
            .spawn()
            .map_err(|e| format!("spawning sleep: {e}"))?;
        let pid = i32::try_from(sleeper.id()).map_err(|e| e.to_string())?;
        let traced = try_syscall(P::PtraceSeize(pid));
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        traced.map_err(|e| format!("ptrace(PTRACE_SEIZE) of a child: {e}"))?;
        Ok(())
    })
}

/// The probe mode of this binary: print the errno (0 for success) of one
/// call.
fn probe_main(which: &str) -> ExitCode {
    let probe = match which {
        "keyctl" => P::KeyctlSessionKeyringId,
        "unshare-user" => P::Unshare(NEWUSER),
        "clone3" => P::Clone3Null,
        "getpid" => P::Getpid,
        _ => return ExitCode::from(3),
    };
    println!("{}", errno(&try_syscall(probe)).unwrap_or(0));
    ExitCode::SUCCESS
}

fn exec_inherits() -> Outcome {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    in_child(|| {
        confine(false)?;
        for (which, want) in [
            ("keyctl", EPERM),
            ("unshare-user", EPERM),
            ("clone3", ENOSYS),
            ("getpid", 0),
        ] {
            let out = Command::new(&exe)
                .env(PROBE_ENV, which)
                .output()
                .map_err(|e| format!("running the probe: {e}"))?;
            let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if got != want.to_string() {
                return Err(format!(
                    "exec'd probe {which}: errno {got:?}, wanted {want} ({})",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok(())
    })
}

/// The policy installed between fork and exec (as the exec path can), before
/// the switch to the command's user: the command is filtered, its parent
/// is not.
fn exec_hook() -> Outcome {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    in_child(|| {
        let root = has_cap_sys_admin();
        if !root {
            rustix::thread::set_no_new_privs(true).map_err(|e| e.to_string())?;
        }
        let run = |which: &str| -> Result<String, String> {
            let mut cmd = Command::new(&exe);
            cmd.env(PROBE_ENV, which);
            sifbox_sys::set_exec_hooks(
                &mut cmd,
                sifbox_sys::ExecHooks {
                    seccomp: Some(seccomp::program(false)),
                    // As root, switch to another user after the filter,
                    // as `exec --user` does: installing after the switch
                    // would be refused.
                    ids: root.then_some((4242, 4242)),
                    ..Default::default()
                },
            );
            let out = cmd
                .output()
                .map_err(|e| format!("spawning the probe: {e}"))?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        for (which, want) in [("keyctl", EPERM), ("clone3", ENOSYS), ("getpid", 0)] {
            let got = run(which)?;
            if got != want.to_string() {
                return Err(format!("command's {which}: errno {got:?}, wanted {want}"));
            }
        }
        // The parent still reaches the kernel.
        expect(&[(P::Clone3Null, Some(libc::EINVAL))], None)
    })
}

fn nested_namespaces() -> Outcome {
    // Whether this host lets this user make a user namespace at all.
    let host = fork_child(|| {
        try_syscall(P::Unshare(NEWUSER))
            .map(|_| ())
            .map_err(|e| e.to_string())
    })?;
    // Opting in lifts the namespace rules but nothing else.
    in_child(|| {
        confine(true)?;
        expect(
            &[
                // The kernel's own answer to clone3(NULL, 0), not ENOSYS.
                (P::Clone3Null, Some(libc::EINVAL)),
                (P::IoUringSetupNull, Some(ENOSYS)),
                (P::KeyctlSessionKeyringId, Some(EPERM)),
                (P::BpfMapCreateEmpty, Some(EPERM)),
                (P::IoctlDevNull(IoctlRequest::Tiocsti), Some(EPERM)),
                (P::SetnsBadFd, Some(libc::EBADF)),
            ],
            None,
        )
    })?;
    if host != End::Exit(0) {
        println!("  (this host does not allow new user namespaces: the unshare part is skipped)");
        return Ok(());
    }
    in_child(|| {
        confine(true)?;
        expect(
            &[
                (P::Clone(NEWUSER | NEWPID), None),
                (P::Unshare(NEWUSER), None),
                (P::Unshare(NEWNS), None),
                // Now root of its own mount namespace: mount reaches the
                // kernel's path lookup of the NULL target.
                (P::MountNull, Some(libc::EFAULT)),
            ],
            None,
        )
    })
}

fn fakeroot_stack() -> Outcome {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("owned");
    std::fs::write(&path, b"x").map_err(|e| e.to_string())?;
    let me = rustix::process::getuid().as_raw();
    in_child(|| {
        sifbox_engine::fakeroot::install().map_err(|e| e.to_string())?;
        confine(false)?;
        let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        std::os::unix::fs::fchown(&file, Some(4242), Some(4242))
            .map_err(|e| format!("fchown under fakeroot: {e}"))?;
        std::os::unix::fs::lchown(&path, Some(4243), None)
            .map_err(|e| format!("lchown under fakeroot: {e}"))?;
        let owner = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(&path).map_err(|e| e.to_string())?,
        );
        if owner != me {
            return Err(format!("the chown was not faked: owner is {owner}"));
        }
        rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(4242))
            .map_err(|e| format!("setuid under fakeroot: {e}"))?;
        if rustix::process::getuid().as_raw() != me {
            return Err("setuid was not faked".into());
        }
        expect(
            &[
                (P::KeyctlSessionKeyringId, Some(EPERM)),
                (P::Clone3Null, Some(ENOSYS)),
                (P::Unshare(NEWUSER), Some(EPERM)),
            ],
            None,
        )
    })
}

fn needs_privilege() -> Outcome {
    if rustix::thread::no_new_privs().unwrap_or(true) {
        println!("  (no_new_privs is already set on this test: nothing to check)");
        return Ok(());
    }
    in_child(|| {
        if has_cap_sys_admin() {
            // As root: drop CAP_SYS_ADMIN from the effective set.
            let mut caps = rustix::thread::capabilities(None).map_err(|e| e.to_string())?;
            caps.effective
                .remove(rustix::thread::CapabilitySet::SYS_ADMIN);
            rustix::thread::set_capabilities(None, caps).map_err(|e| e.to_string())?;
        }
        let err = match seccomp::install(false) {
            Ok(()) => return Err("installed without CAP_SYS_ADMIN or no_new_privs".into()),
            Err(e) => e,
        };
        let msg = err.to_string();
        if err.kind() != std::io::ErrorKind::PermissionDenied
            || !msg.contains("seccomp(SECCOMP_SET_MODE_FILTER)")
            || !msg.contains("CAP_SYS_ADMIN")
            || !msg.contains("no_new_privs")
        {
            return Err(format!("unclear error: {msg}"));
        }
        // Nothing was installed: the calls still reach the kernel.
        expect(&[(P::Clone3Null, Some(libc::EINVAL))], None)?;
        rustix::thread::set_no_new_privs(true).map_err(|e| e.to_string())?;
        seccomp::install(false).map_err(|e| e.to_string())?;
        expect(&[(P::Clone3Null, Some(ENOSYS))], None)
    })
}

fn keeps_setuid() -> Outcome {
    if !has_cap_sys_admin() {
        println!("  (needs CAP_SYS_ADMIN, as in a sandbox; skipped unprivileged)");
        return Ok(());
    }
    in_child(|| {
        seccomp::install(false).map_err(|e| e.to_string())?;
        match rustix::thread::no_new_privs() {
            Ok(false) => Ok(()),
            other => Err(format!(
                "no_new_privs after install: {other:?}; setuid programs would stop working"
            )),
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn foreign_abi() -> Outcome {
    let host = fork_child(|| match try_syscall(P::Int80Getpid) {
        Ok(pid) if pid == i64::from(std::process::id()) => Ok(()),
        other => Err(format!("int 0x80 getpid: {other:?}")),
    })?;
    if host != End::Exit(0) {
        println!("  (this kernel has no 32-bit entry: skipped)");
        return Ok(());
    }
    let end = fork_child(|| {
        confine(false)?;
        let r = try_syscall(P::Int80Getpid);
        Err(format!("a 32-bit call returned under the policy: {r:?}"))
    })?;
    if end != End::Signal(rustix::process::Signal::SYS.as_raw()) {
        return Err(format!("the child ended with {end:?}, not SIGSYS"));
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn foreign_abi() -> Outcome {
    Ok(())
}

/// Median of durations.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Runs `body` in a child `n` times; each child reports one duration.
fn timed_children(n: usize, body: fn() -> Duration) -> Result<Vec<Duration>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (mut r, mut w) = std::io::pipe().map_err(|e| e.to_string())?;
        let end = fork_child(|| {
            let d = body();
            w.write_all(&d.as_nanos().to_le_bytes())
                .map_err(|e| e.to_string())
        });
        drop(w);
        let mut buf = [0u8; 16];
        r.read_exact(&mut buf)
            .map_err(|e| format!("{e} ({end:?})"))?;
        out.push(Duration::from_nanos(
            u64::try_from(u128::from_le_bytes(buf)).unwrap_or(u64::MAX),
        ));
    }
    Ok(out)
}

/// Nanoseconds per call of `probe`, over `n` calls.
fn per_call(probe: P, n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let _ = std::hint::black_box(try_syscall(std::hint::black_box(probe)));
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn bench() -> Outcome {
    if !has_cap_sys_admin() {
        rustix::thread::set_no_new_privs(true).map_err(|e| e.to_string())?;
    }
    const N: usize = 300;
    reference_programs();
    let report = |what: &str, v: Vec<Duration>| {
        let mut s = v.clone();
        s.sort_unstable();
        println!(
            "  {what}: median {:?}, p10 {:?}, p90 {:?} ({} runs)",
            median(v),
            s[s.len() / 10],
            s[s.len() * 9 / 10],
            s.len()
        );
    };
    for (what, body) in [
        (
            "install(false)",
            (|| {
                let t = Instant::now();
                let _ = seccomp::install(false);
                t.elapsed()
            }) as fn() -> Duration,
        ),
        ("install(true)", || {
            let t = Instant::now();
            let _ = seccomp::install(true);
            t.elapsed()
        }),
        (
            "install_reporting(false) + denials::serve (the listener's thread)",
            || {
                let t = Instant::now();
                if let Ok(Some(fd)) = seccomp::install_reporting(false) {
                    let _ = sifbox_engine::denials::serve(fd);
                }
                t.elapsed()
            },
        ),
        (
            "seccompiler's linear programs for the same policy, stacked",
            || {
                let stack = reference_programs();
                let t = Instant::now();
                for p in stack {
                    let _ = sifbox_sys::install_seccomp_filter(p);
                }
                t.elapsed()
            },
        ),
        ("fakeroot's filter (seccompiler at run time)", || {
            let t = Instant::now();
            let _ = sifbox_engine::fakeroot::install();
            t.elapsed()
        }),
    ] {
        report(what, timed_children(N, body)?);
    }
    // fork + exit of a child, with and without installing first.
    // Interleaved, so that the machine's load falls on all three alike.
    let whats = [
        "fork+wait, no filter",
        "fork+install+wait",
        "fork+install_reporting+serve+wait",
    ];
    let mut v = vec![Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..N {
        for (i, times) in v.iter_mut().enumerate() {
            let t = Instant::now();
            fork_child(|| {
                if i == 1 {
                    seccomp::install(false).map_err(|e| e.to_string())?;
                } else if i == 2 {
                    if let Some(fd) =
                        seccomp::install_reporting(false).map_err(|e| e.to_string())?
                    {
                        sifbox_engine::denials::serve(fd).map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            })?;
            times.push(t.elapsed());
        }
    }
    for (what, times) in whats.iter().zip(v) {
        report(what, times);
    }
    // Per-call overhead: getpid (constant answer: the kernel caches it) and
    // ioctl (argument checks: the filters run every time), under the plain
    // policy and under the reporting one (allowed calls never reach its
    // listener: the same program, other return values).
    for reporting in [false, true] {
        let (mut r, mut w) = std::io::pipe().map_err(|e| e.to_string())?;
        fork_child(|| {
            let n = 2_000_000;
            let mut rows = Vec::new();
            for round in 0..2 {
                if round == 1 && reporting {
                    let fd = seccomp::install_reporting(false).map_err(|e| e.to_string())?;
                    if let Some(fd) = fd {
                        sifbox_engine::denials::serve(fd).map_err(|e| e.to_string())?;
                    }
                } else if round == 1 {
                    seccomp::install(false).map_err(|e| e.to_string())?;
                }
                rows.push(per_call(P::Getpid, n));
                rows.push(per_call(P::IoctlDevNull(IoctlRequest::Tcgets), n / 10));
                rows.push(per_call(P::Clone3Null, n / 4));
            }
            let line = format!(
                "  getpid: {:.0} ns -> {:.0} ns; open+ioctl(TCGETS)+close: {:.0} ns -> {:.0} ns; clone3 (ENOSYS): {:.0} ns -> {:.0} ns (no filter -> {})\n",
                rows[0],
                rows[3],
                rows[1],
                rows[4],
                rows[2],
                rows[5],
                if reporting { "the reporting policy" } else { "the plain policy" }
            );
            w.write_all(line.as_bytes()).map_err(|e| e.to_string())
        })?;
        drop(w);
        let mut s = String::new();
        r.read_to_string(&mut s).map_err(|e| e.to_string())?;
        print!("{s}");
    }
    Ok(())
}
