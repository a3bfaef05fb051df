//! `sifbox-probe attack NAME...`: what a hostile command inside a sandbox
//! would try, each attempt reported as contained or not.
//!
//! Every attack is harmless when it succeeds: it reads, or writes back
//! what it read, or targets files the test made; it never changes a real
//! host setting. The report is one JSON object:
//! `{"attacks": {NAME: {"contained": bool, "detail": "..."}}}`, and the
//! end-to-end tests (crates/sifbox/tests/e2e/hostile.rs) assert on it.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use serde_json::{json, Map, Value};
use sifbox_sys::{try_syscall, IoctlRequest, ProbeSyscall};

/// One attempt's outcome.
struct Outcome {
    contained: bool,
    detail: String,
}

impl Outcome {
    fn contained(detail: impl Into<String>) -> Outcome {
        Outcome {
            contained: true,
            detail: detail.into(),
        }
    }

    fn escaped(detail: impl Into<String>) -> Outcome {
        Outcome {
            contained: false,
            detail: detail.into(),
        }
    }
}

/// The attacks this probe knows, in the order `all` runs them.
pub const ATTACKS: &[&str] = &[
    "supervisor-fds",
    "supervisor-mem",
    "supervisor-environ",
    "supervisor-pidfd-getfd",
    "supervisor-ptrace",
    "proc-sys-write",
    "proc-sysrq",
    "proc-masked",
    "remount",
    "unmount-covers",
    "mount-new",
    "keyring",
    "new-userns",
    "syscalls",
    "mount-api",
    "vsock",
    "seccomp-listener",
];

/// Runs the named attacks (`all`: every one) and returns the report.
pub fn run(names: &[String]) -> Result<Value, String> {
    let names: Vec<&str> = if names.iter().any(|n| n == "all") {
        ATTACKS.to_vec()
    } else {
        names.iter().map(String::as_str).collect()
    };
    let mut out = Map::new();
    for name in names {
        let outcome = match name {
            "supervisor-fds" => supervisor_fds(),
            "supervisor-mem" => supervisor_mem(),
            "supervisor-environ" => supervisor_environ(),
            "supervisor-pidfd-getfd" => supervisor_pidfd_getfd(),
            "supervisor-ptrace" => supervisor_ptrace(),
            "proc-sys-write" => proc_sys_write(),
            "proc-sysrq" => proc_sysrq(),
            "proc-masked" => proc_masked(),
            "remount" => remount(),
            "unmount-covers" => unmount_covers(),
            "mount-new" => mount_new(),
            "keyring" => keyring(),
            "new-userns" => new_userns(),
            "syscalls" => try_all(ALWAYS_DENIED),
            "mount-api" => try_all(USERNS_ONLY),
            "vsock" => vsock(),
            "seccomp-listener" => seccomp_listener(),
            other => return Err(format!("unknown attack {other:?}; known: {ATTACKS:?}")),
        };
        out.insert(
            name.to_string(),
            json!({ "contained": outcome.contained, "detail": outcome.detail }),
        );
    }
    Ok(json!({ "attacks": Value::Object(out) }))
}

/// The pids of sifbox's own processes in this sandbox: init (pid 1) and
/// every process whose command line is sifbox's (the exec workers), but
/// never this probe.
fn supervisors() -> Vec<u32> {
    let me = std::process::id();
    let mut out = vec![1];
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if pid == 1 || pid == me {
                continue;
            }
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmd.starts_with(b"sifbox\0") {
                out.push(pid);
            }
        }
    }
    // The process that spawned this one serves its exec.
    if let Ok(stat) = fs::read_to_string("/proc/self/stat") {
        if let Some(ppid) = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        {
            if ppid > 0 && !out.contains(&ppid) {
                out.push(ppid);
            }
        }
    }
    out
}

/// Reads through every fd of every supervisor: links, opens, and walks of
/// directory fds (which would lead to the host's file system).
fn supervisor_fds() -> Outcome {
    let mut got = Vec::new();
    let mut tried = 0;
    for pid in supervisors() {
        let dir = format!("/proc/{pid}/fd");
        let names: Vec<String> = match fs::read_dir(&dir) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => (0..64).map(|n| n.to_string()).collect(),
        };
        for n in names {
            let p = format!("{dir}/{n}");
            tried += 1;
            if let Ok(target) = fs::read_link(&p) {
                got.push(format!("readlink {p} -> {}", target.display()));
            }
            if fs::File::open(&p).is_ok() {
                got.push(format!("open {p}"));
            }
            if let Ok(rd) = fs::read_dir(&p) {
                let n = rd.count();
                got.push(format!("listed {p}/ ({n} entries)"));
            }
            if fs::OpenOptions::new().append(true).open(&p).is_ok() {
                got.push(format!("opened {p} for writing"));
            }
        }
    }
    if got.is_empty() {
        Outcome::contained(format!("{tried} fds of sifbox processes: none readable"))
    } else {
        Outcome::escaped(got.join("; "))
    }
}

fn supervisor_mem() -> Outcome {
    let mut got = Vec::new();
    for pid in supervisors() {
        let p = format!("/proc/{pid}/mem");
        if let Ok(mut f) = fs::File::open(&p) {
            let mut b = [0u8; 1];
            got.push(format!("opened {p} (read: {:?})", f.read(&mut b).is_ok()));
        }
        for file in ["maps", "smaps", "pagemap", "stack", "syscall", "auxv"] {
            let p = format!("/proc/{pid}/{file}");
            // A prefix is proof enough (pagemap spans the whole address
            // space).
            let mut buf = [0u8; 256];
            if fs::File::open(&p)
                .and_then(|mut f| f.read(&mut buf))
                .is_ok_and(|n| n > 0)
            {
                got.push(format!("read {p}"));
            }
        }
    }
    if got.is_empty() {
        Outcome::contained("no sifbox process's memory or maps readable")
    } else {
        Outcome::escaped(got.join("; "))
    }
}

fn supervisor_environ() -> Outcome {
    let mut got = Vec::new();
    for pid in supervisors() {
        let p = format!("/proc/{pid}/environ");
        if let Ok(d) = fs::read(&p) {
            if d.iter().any(|b| *b != 0) {
                got.push(format!("{p}: {} bytes", d.len()));
            }
        }
    }
    if got.is_empty() {
        Outcome::contained("no sifbox process's environment readable")
    } else {
        Outcome::escaped(got.join("; "))
    }
}

fn supervisor_pidfd_getfd() -> Outcome {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let mut got = Vec::new();
    let mut opened = 0;
    for pid in supervisors() {
        let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
            continue;
        };
        let Ok(pidfd) = pidfd_open(p, PidfdFlags::empty()) else {
            continue;
        };
        opened += 1;
        for fd in 0..64 {
            if pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).is_ok() {
                got.push(format!("pid {pid} fd {fd}"));
            }
        }
    }
    if got.is_empty() {
        Outcome::contained(format!("pidfd_getfd refused on {opened} sifbox processes"))
    } else {
        Outcome::escaped(format!("took fds: {}", got.join(", ")))
    }
}

fn supervisor_ptrace() -> Outcome {
    let mut got = Vec::new();
    let mut tried = Vec::new();
    for pid in supervisors() {
        let Ok(p) = i32::try_from(pid) else { continue };
        // Seize, interrupt, wait, detach: the target runs on unharmed.
        match try_syscall(ProbeSyscall::PtraceSeize(p)) {
            Ok(_) => got.push(format!("PTRACE_SEIZE {pid}")),
            Err(e) => tried.push(format!("PTRACE_SEIZE {pid}: {e}")),
        }
    }
    if got.is_empty() {
        Outcome::contained(tried.join("; "))
    } else {
        Outcome::escaped(format!("traced: {}", got.join(", ")))
    }
}

/// Writes a host-wide kernel setting back with the value it has: a
/// sandbox of host root that can do this can set core_pattern and run code
/// as host root.
fn proc_sys_write() -> Outcome {
    let mut got = Vec::new();
    for knob in [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/drop_caches",
    ] {
        let Ok(current) = fs::read(knob) else {
            continue;
        };
        if let Ok(mut f) = fs::OpenOptions::new().write(true).open(knob) {
            // The same value: no harm done even when it goes through.
            let wrote = knob.ends_with("drop_caches") || f.write_all(&current).is_ok();
            got.push(format!("{knob} opened for writing (written back: {wrote})"));
        }
    }
    if got.is_empty() {
        Outcome::contained("/proc/sys is read-only")
    } else {
        Outcome::escaped(got.join("; "))
    }
}

fn proc_sysrq() -> Outcome {
    // Opened, never written.
    match fs::OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open("/proc/sysrq-trigger")
    {
        Ok(_) => Outcome::escaped("/proc/sysrq-trigger opened for writing"),
        Err(e) => Outcome::contained(format!("/proc/sysrq-trigger: {e}")),
    }
}

fn proc_masked() -> Outcome {
    let mut got = Vec::new();
    for p in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
    ] {
        if let Ok(d) = fs::read(p) {
            if !d.is_empty() {
                got.push(format!("{p}: {} bytes", d.len()));
            }
        }
    }
    for d in ["/proc/acpi", "/proc/scsi", "/sys/firmware"] {
        if fs::read_dir(d).is_ok_and(|mut rd| rd.next().is_some()) {
            got.push(format!("{d} lists entries"));
        }
    }
    if got.is_empty() {
        Outcome::contained("masked files are empty")
    } else {
        Outcome::escaped(got.join("; "))
    }
}

/// Makes the read-only covers writable again.
fn remount() -> Outcome {
    use rustix::mount::{mount_remount, MountFlags};
    let mut got = Vec::new();
    for p in ["/proc/sys", "/sys", "/"] {
        if mount_remount(p, MountFlags::BIND, "").is_ok() {
            got.push(format!("remounted {p}"));
        }
    }
    if got.is_empty() {
        Outcome::contained("remounts refused")
    } else {
        Outcome::escaped(got.join("; "))
    }
}

fn unmount_covers() -> Outcome {
    use rustix::mount::{unmount, UnmountFlags};
    let mut got = Vec::new();
    for p in [
        "/proc/sys",
        "/proc/kcore",
        "/proc/keys",
        "/sys/firmware",
        "/etc/resolv.conf",
    ] {
        if unmount(p, UnmountFlags::DETACH).is_ok() {
            got.push(format!("unmounted {p}"));
        }
    }
    if got.is_empty() {
        Outcome::contained("covers stay")
    } else {
        Outcome::escaped(got.join("; "))
    }
}

fn mount_new() -> Outcome {
    use rustix::mount::{mount, MountFlags};
    let dir = std::env::temp_dir().join(format!("sifbox-probe-mnt-{}", std::process::id()));
    let _ = fs::create_dir(&dir);
    let r = mount("proc", &dir, "proc", MountFlags::empty(), None);
    let r2 = mount("tmpfs", &dir, "tmpfs", MountFlags::empty(), None);
    let _ = rustix::mount::unmount(&dir, rustix::mount::UnmountFlags::DETACH);
    let _ = fs::remove_dir(&dir);
    match (r, r2) {
        (Err(a), Err(b)) => Outcome::contained(format!("proc: {a}; tmpfs: {b}")),
        _ => Outcome::escaped("mounted a file system in the sandbox's mount namespace"),
    }
}

/// The session keyring: its id, when the kernel lets us see it (then the
/// test compares it with the host's).
fn keyring() -> Outcome {
    match try_syscall(ProbeSyscall::KeyctlSessionKeyringId) {
        Ok(id) => Outcome::escaped(format!("session keyring {id}")),
        Err(e) => Outcome::contained(format!("keyctl: {e}")),
    }
}

/// `CLONE_NEWUSER`.
const CLONE_NEWUSER: u64 = 0x1000_0000;

fn new_userns() -> Outcome {
    match try_syscall(ProbeSyscall::Unshare(CLONE_NEWUSER)) {
        Ok(_) => Outcome::escaped("unshare(CLONE_NEWUSER) succeeded"),
        Err(e) => Outcome::contained(format!("unshare(CLONE_NEWUSER): {e}")),
    }
}

/// Kernel interfaces the default policy always denies (also with user
/// namespaces allowed). Each call's arguments make it harmless where it
/// gets through (see sifbox-sys's probe module).
const ALWAYS_DENIED: &[ProbeSyscall] = &[
    ProbeSyscall::KeyctlSessionKeyringId,
    ProbeSyscall::AddKeyNull,
    ProbeSyscall::RequestKeyNull,
    ProbeSyscall::BpfMapCreateEmpty,
    ProbeSyscall::PerfEventOpenNull,
    ProbeSyscall::UserfaultfdUserMode,
    ProbeSyscall::IoUringSetupNull,
    ProbeSyscall::IoUringEnterBadFd,
    ProbeSyscall::IoUringRegisterBadFd,
    ProbeSyscall::KexecLoadInvalid,
    ProbeSyscall::KexecFileLoadInvalid,
    ProbeSyscall::InitModuleNull,
    ProbeSyscall::FinitModuleBadFd,
    ProbeSyscall::DeleteModuleNull,
    ProbeSyscall::OpenByHandleAtNull,
    ProbeSyscall::SwapoffNull,
    ProbeSyscall::RebootBadMagic,
    ProbeSyscall::ClockSettimeNull,
    ProbeSyscall::SyslogSizeBuffer,
    ProbeSyscall::IoctlDevNull(IoctlRequest::Tiocsti),
    ProbeSyscall::IoctlDevNull(IoctlRequest::TiocstiHighBits),
    ProbeSyscall::IoctlDevNull(IoctlRequest::Tioclinux),
];

/// What only the nested-namespace opt-in allows: new namespaces and the
/// mount API.
const USERNS_ONLY: &[ProbeSyscall] = &[
    ProbeSyscall::Clone(CLONE_NEWUSER),
    ProbeSyscall::Clone3Null,
    ProbeSyscall::MountNull,
    ProbeSyscall::Umount2Null,
    ProbeSyscall::PivotRootNull,
    ProbeSyscall::SetnsBadFd,
    ProbeSyscall::FsopenNull,
    ProbeSyscall::OpenTreeNull,
];

/// Calls that answer EPERM or ENOSYS are stopped (by the policy or the
/// kernel); any other answer means the call reached the kernel's code.
fn try_all(calls: &[ProbeSyscall]) -> Outcome {
    let mut open = Vec::new();
    let mut denied = Vec::new();
    for s in calls {
        match try_syscall(*s) {
            Err(e) if matches!(e.raw_os_error(), Some(EPERM | ENOSYS)) => {
                denied.push(format!("{s:?}: {e}"));
            }
            Ok(_) => open.push(format!("{s:?}: succeeded")),
            Err(e) => open.push(format!("{s:?}: reached the kernel ({e})")),
        }
    }
    if open.is_empty() {
        Outcome::contained(denied.join("; "))
    } else {
        Outcome::escaped(open.join("; "))
    }
}

/// A seccomp listener of its own (what container runtimes and some
/// sandboxes inside ask for): the kernel allows one per filter chain, and
/// the default policy's is sifbox's, so the kernel answers EBUSY. Not an
/// escape where it works: the filter allows everything.
fn seccomp_listener() -> Outcome {
    match try_syscall(ProbeSyscall::SeccompListenerAllowAll) {
        Ok(_) => Outcome::escaped("got a seccomp listener of its own"),
        Err(e) => Outcome::contained(format!("seccomp(NEW_LISTENER): {e}")),
    }
}

/// A vsock socket (the host's hypervisor channel): run only under the
/// policy, since without it the kernel may load the vsock module.
fn vsock() -> Outcome {
    try_all(&[ProbeSyscall::Socket(40)])
}

/// The two errno values a seccomp denial gives.
const EPERM: i32 = 1;
const ENOSYS: i32 = 38;
