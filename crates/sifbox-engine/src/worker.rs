//! The worker side of an exec, inside the sandbox: resolving the user,
//! spawning the command on the client's stdio or a pty, timeouts, and
//! killing every process the exec started.
//!
//! Runs in a process forked by the sandbox's init (or in init itself for the
//! sandbox's last command) that is a child subreaper: whatever the command
//! starts, also what calls setsid or double-forks, stays below it, so a
//! timeout or a kill can reach all of it.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

use sifbox_sys::syscall::{Prctl, Syscall};

use crate::protocol::{self, Event, ExecRequest};
use crate::spec::{Confinement, SeccompMode};

/// Whether this process installed the sandbox's seccomp policy already (a
/// worker does at its first exec, and keeps it: every exec of a sandbox
/// runs under the same policy).
static POLICY_INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs the sandbox's seccomp policy on this process, once, with a
/// listener that counts its denials ([`crate::denials`]) unless this
/// process's filter chain has one already (a sifbox inside a sandbox:
/// denials stay silent there).
fn confine(c: Confinement) -> std::io::Result<()> {
    use std::sync::atomic::Ordering;
    /// Why the listener's thread could not start: the filter is in place
    /// without it (the kernel answers ENOSYS instead of EPERM), so every
    /// exec of this process fails with the reason rather than run so.
    static NO_LISTENER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(why) = NO_LISTENER.get() {
        return Err(std::io::Error::other(why.clone()));
    }
    if c.seccomp == SeccompMode::Unconfined || POLICY_INSTALLED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let listener = crate::seccomp::install_reporting(c.allow_userns)?;
    POLICY_INSTALLED.store(true, Ordering::Relaxed);
    if let Some(fd) = listener {
        // Nobody else answers the listener (held, unserved, it would
        // stop every denied call for ever; closed, the kernel answers
        // ENOSYS).
        if let Err(e) = crate::denials::serve(fd) {
            let why = format!("starting the seccomp listener's thread: {e}");
            let _ = NO_LISTENER.set(why.clone());
            return Err(std::io::Error::new(e.kind(), why));
        }
    }
    Ok(())
}

/// The sandbox's clock, as reported in events.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// A user of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: u32,
    pub gid: u32,
    pub home: Option<String>,
}

/// Resolves `spec` (`name`, `uid`, `uid:gid`, `name:group`) against the
/// image's passwd and group text.
pub fn resolve_user(spec: &str, passwd: &str, group: &str) -> Result<ImageUser, String> {
    let (user, grp) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entries: Vec<Vec<&str>> = passwd.lines().map(|l| l.split(':').collect()).collect();
    let by_name = entries.iter().find(|f| f.len() >= 7 && f[0] == user);
    let (uid, mut gid, home) = if let Some(f) = by_name {
        let uid = f[2]
            .parse()
            .map_err(|_| format!("bad uid for {user} in /etc/passwd"))?;
        let gid = f[3]
            .parse()
            .map_err(|_| format!("bad gid for {user} in /etc/passwd"))?;
        (uid, gid, Some(f[5].to_string()))
    } else if let Ok(uid) = user.parse::<u32>() {
        let f = entries.iter().find(|f| f.len() >= 7 && f[2] == user);
        let gid = f.and_then(|f| f[3].parse().ok()).unwrap_or(uid);
        (uid, gid, f.map(|f| f[5].to_string()))
    } else {
        return Err(format!(
            "user {user:?} is not in the image's /etc/passwd; pass a numeric uid[:gid] or a user the image has"
        ));
    };
    if let Some(g) = grp {
        gid = match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => group
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| format!("group {g:?} is not in the image's /etc/group"))?,
        };
    }
    Ok(ImageUser { uid, gid, home })
}

/// Looks a user up in the sandbox's own /etc/passwd and /etc/group.
pub fn lookup_user(spec: &str) -> Result<ImageUser, String> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    resolve_user(spec, &passwd, &group)
}

/// Why an exec could not start: its exit code and the message.
type NotStarted = (i32, String);

/// Runs one exec; returns the exit code. `fds` are the client's stdio (and
/// for a detached exec, the status file). The command runs under the
/// sandbox's `confinement` (installed on this process before it spawns).
/// The system calls that set this process up go through `sys` (the
/// syscall seam).
pub fn run(
    sys: &dyn Syscall,
    conn: &UnixStream,
    req: ExecRequest,
    mut fds: Vec<OwnedFd>,
    confinement: Confinement,
) -> i32 {
    // From the request on (the command could stop this process before it
    // is spawned; init's rescue counts from the same moment).
    let deadline = req
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let mut status_file = if req.detach_id.is_some() && fds.len() == 4 {
        fds.pop().map(File::from)
    } else {
        None
    };
    let report = |ev: &Event, status_file: &mut Option<File>| {
        if let Some(f) = status_file {
            let _ = f.write_all(serde_json::to_string(ev).unwrap_or_default().as_bytes());
        } else {
            let _ = protocol::send(conn, ev, &[]);
        }
    };
    let mut fail = |(code, message): NotStarted| {
        report(&Event::Error { code, message }, &mut status_file);
        code
    };
    if let Err(e) = prepare(sys, &req, confinement) {
        return fail(e);
    }
    // What processes of an earlier exec were denied after it ended is not
    // this exec's (the sandbox's totals have it).
    let _ = crate::denials::take_exec();
    let Some(program) = req.argv.first().cloned() else {
        return fail((125, "no command given".into()));
    };
    match std::fs::metadata(&req.cwd) {
        Ok(m) if m.is_dir() => {}
        _ => {
            return fail((
                125,
                format!(
                    "working directory {} does not exist in the sandbox; give an existing one",
                    req.cwd
                ),
            ))
        }
    }
    let user = match req.user.as_deref().map(lookup_user).transpose() {
        Ok(u) => u,
        Err(e) => return fail((125, e)),
    };
    // Without a user to switch to or a terminal to take, the command can be
    // spawned with vfork (posix_spawn), much cheaper than fork + exec. std
    // does that only for a program given as a path and without a working
    // directory to set (in a static binary it cannot find glibc's
    // addchdir), so the PATH search and the chdir happen here: this process
    // serves this one exec.
    let spawned = if !req.tty && user.is_none() {
        spawn_direct(sys, &req, &program, &fds).map(|pid| (pid, None))
    } else {
        spawn_forked(&req, &program, user.as_ref(), &mut fds)
    };
    let (pid, master) = match spawned {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    // Only the command holds the stdio fds now, so the client sees EOF when
    // the command's tree closes them.
    drop(fds);
    let started = Event::Started {
        pid: pid.as_raw_nonzero().get(),
    };
    let sent = match (&master, &status_file) {
        (_, Some(_)) => Ok(()),
        (Some(m), None) => protocol::send(conn, &started, &[m.as_fd()]),
        (None, None) => protocol::send(conn, &started, &[]),
    };
    drop(master);
    if sent.is_err() {
        kill_tree(rustix::process::getpid());
    }
    // An attached exec dies with its client: a client that gave up (or was
    // killed) must not leave the command running unseen.
    let watch_client = status_file.is_none();
    let (code, timed_out) = wait_for(pid, deadline, watch_client.then_some(conn));
    report(
        &Event::Exit {
            code,
            timed_out,
            time_ns: now_ns(),
            denied: crate::denials::take_exec(),
        },
        &mut status_file,
    );
    drop(status_file);
    if req.stop_after {
        // init stops the whole sandbox as soon as we return.
        return code;
    }
    if timed_out {
        kill_tree(rustix::process::getpid());
    }
    // Stay until every process this exec started is gone (they were
    // reparented to us), so that stopping them later has a single anchor.
    while let Ok(Some(_)) | Err(rustix::io::Errno::INTR) =
        rustix::process::wait(WaitOptions::empty())
    {}
    code
}

/// This process made ready for the exec: a child subreaper, fakeroot's
/// filter, a network namespace of its own, then the confinement.
fn prepare(
    sys: &dyn Syscall,
    req: &ExecRequest,
    confinement: Confinement,
) -> Result<(), NotStarted> {
    if let Err(e) = sys.prctl(Prctl::ChildSubreaper) {
        return Err((125, format!("prctl(PR_SET_CHILD_SUBREAPER): {e}")));
    }
    if req.fake_ids {
        crate::fakeroot::install().map_err(|e| (125, e.to_string()))?;
    }
    if req.isolate_net {
        // This process is root of the sandbox's user namespace: it may make
        // a network namespace, which its command then inherits.
        if let Err(e) = sys.unshare(rustix::thread::UnshareFlags::NEWNET) {
            return Err((
                125,
                format!(
                    "creating a network namespace for the command: {}",
                    std::io::Error::from(e)
                ),
            ));
        }
        if let Err(e) = sifbox_sys::loopback_up() {
            return Err((125, format!("bringing up lo for the command: {e}")));
        }
    }
    // Last, after what needed the system calls it denies (the network
    // namespace above), stacked on the fakeroot filter.
    confine(confinement).map_err(|e| (125, e.to_string()))
}

/// Spawns the command with posix_spawn on the client's stdio `fds`, after
/// the PATH search and the chdir.
fn spawn_direct(
    sys: &dyn Syscall,
    req: &ExecRequest,
    program: &str,
    fds: &[OwnedFd],
) -> Result<Pid, NotStarted> {
    if let Err(e) = sys.chdir(std::path::Path::new(&req.cwd)) {
        return Err((
            125,
            format!("changing to the working directory {}: {e}", req.cwd),
        ));
    }
    let path_var = req
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let found =
        find_program(program, path_var).map_err(|code| (code, not_startable(program, code)))?;
    if fds.len() != 3 {
        return Err((
            125,
            format!("expected 3 stdio descriptors, got {}", fds.len()),
        ));
    }
    let c = |s: &str| std::ffi::CString::new(s);
    let argv: Result<Vec<_>, _> = req.argv.iter().map(|a| c(a)).collect();
    let env: Result<Vec<_>, _> = req
        .env
        .iter()
        .map(|(k, v)| c(&format!("{k}={v}")))
        .collect();
    let path = std::ffi::CString::new(found.into_os_string().into_vec());
    let (Ok(argv), Ok(env), Ok(path)) = (argv, env, path) else {
        return Err((125, "an argument or variable holds a NUL byte".into()));
    };
    let stdio = [fds[0].as_fd(), fds[1].as_fd(), fds[2].as_fd()];
    sifbox_sys::spawn(&path, &argv, &env, stdio).map_err(|e| spawn_failure(program, &e))
}

/// Forks the command (std's `Command`) as `user` or on a new pty; the
/// pty's master comes back with its pid.
fn spawn_forked(
    req: &ExecRequest,
    program: &str,
    user: Option<&ImageUser>,
    fds: &mut Vec<OwnedFd>,
) -> Result<(Pid, Option<OwnedFd>), NotStarted> {
    let mut master = None;
    let mut cmd = Command::new(program);
    cmd.current_dir(&req.cwd);
    cmd.args(&req.argv[1..])
        .env_clear()
        .envs(req.env.iter().map(|(k, v)| (k, v)));
    if let Some(u) = user {
        if req.default_home {
            cmd.env("HOME", u.home.as_deref().unwrap_or("/"));
        }
    }
    let mut hooks = sifbox_sys::ExecHooks {
        setsid: true,
        ids: user.map(|u| (u.uid, u.gid)),
        ..Default::default()
    };
    if req.tty {
        match open_pty(req.winsize) {
            Ok((m, slave)) => {
                let (Ok(a), Ok(b)) = (slave.try_clone(), slave.try_clone()) else {
                    return Err((125, "duplicating the pty".into()));
                };
                cmd.stdin(Stdio::from(slave))
                    .stdout(Stdio::from(a))
                    .stderr(Stdio::from(b));
                hooks.controlling_tty = true;
                master = Some(m);
            }
            Err(e) => return Err((125, format!("allocating a pty in the sandbox: {e}"))),
        }
    } else {
        if fds.len() != 3 {
            return Err((
                125,
                format!("expected 3 stdio descriptors, got {}", fds.len()),
            ));
        }
        let err = fds.pop();
        let out = fds.pop();
        let inp = fds.pop();
        if let (Some(i), Some(o), Some(e)) = (inp, out, err) {
            cmd.stdin(Stdio::from(i))
                .stdout(Stdio::from(o))
                .stderr(Stdio::from(e));
        }
    }
    // With a user to switch to or a terminal to take, std forks: the
    // child then runs the hooks, and its signals are at their defaults.
    sifbox_sys::set_exec_hooks(&mut cmd, hooks);
    let child = cmd.spawn().map_err(|e| spawn_failure(program, &e))?;
    drop(cmd);
    let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) else {
        return Err((125, "pid out of range".into()));
    };
    Ok((pid, master))
}

/// Why `program` could not start, for the exit `code` of a failed PATH
/// search (127 not found, 126 not executable). The same words whether the
/// search or the exec found it out, for `run` and `exec` alike.
fn not_startable(program: &str, code: i32) -> String {
    if code == 126 {
        format!("{program}: permission denied")
    } else {
        format!("{program}: command not found")
    }
}

/// Why `program` could not be spawned: 127 when it is not there, 126
/// when it cannot be executed, with the reason once.
fn spawn_failure(program: &str, e: &std::io::Error) -> NotStarted {
    match (e.kind(), e.raw_os_error()) {
        (std::io::ErrorKind::NotFound, _) => (127, not_startable(program, 127)),
        (std::io::ErrorKind::PermissionDenied, _) => (126, not_startable(program, 126)),
        (_, Some(libc::ENOEXEC)) => (126, format!("{program}: not an executable format")),
        _ => (126, format!("{program}: cannot execute: {e}")),
    }
}

/// Finds `program` as execvp would: as given when it names a path (has a
/// `/`), else in the directories of `path` (the command's PATH; an empty
/// entry is the working directory). Errs with the exit code for the shell's
/// "command not found" (127), or "permission denied" (126) when only files
/// that may not be executed were found.
pub fn find_program(program: &str, path: Option<&str>) -> Result<std::path::PathBuf, i32> {
    use rustix::fs::Access;
    if program.contains('/') {
        return Ok(program.into());
    }
    if program.is_empty() {
        return Err(127);
    }
    let mut denied = false;
    for dir in path.unwrap_or("/usr/local/bin:/usr/bin:/bin").split(':') {
        let candidate = std::path::Path::new(if dir.is_empty() { "." } else { dir }).join(program);
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() => {
                if rustix::fs::access(&candidate, Access::EXEC_OK).is_ok() {
                    return Ok(candidate);
                }
                denied = true;
            }
            _ => {}
        }
    }
    Err(if denied { 126 } else { 127 })
}

/// Waits for `pid` until `deadline`, or until the client hangs up; returns
/// its exit code (124 on timeout) and whether it timed out.
fn wait_for(pid: Pid, deadline: Option<Instant>, client: Option<&UnixStream>) -> (i32, bool) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return (wait_code(pid), false);
    };
    loop {
        let timeout = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        let mut fds = vec![PollFd::new(&pidfd, PollFlags::IN)];
        if let Some(c) = client {
            fds.push(PollFd::new(c, PollFlags::IN));
        }
        match poll(&mut fds, timeout.as_ref()) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return (wait_code(pid), false),
            Ok(0) => {
                kill_tree(rustix::process::getpid());
                let _ = wait_code(pid);
                return (124, true);
            }
            Ok(_) => {}
        }
        // Woken past the deadline: the time limit counts, whatever woke us
        // (init kills the command of a worker that was stopped from inside
        // and could not keep it, then lets it go on).
        if deadline.is_some_and(|d| Instant::now() >= d) {
            kill_tree(rustix::process::getpid());
            let _ = wait_code(pid);
            return (124, true);
        }
        if !fds[0].revents().is_empty() {
            return (wait_code(pid), false);
        }
        if fds.get(1).is_some_and(|f| !f.revents().is_empty()) {
            // Readable with nothing to read means the client is gone.
            let mut b = [0u8; 1];
            let gone = client.is_some_and(|c| {
                matches!(
                    rustix::net::recv(
                        c,
                        &mut b,
                        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT
                    ),
                    Ok((0, _)) | Err(_)
                )
            });
            if gone {
                kill_tree(rustix::process::getpid());
                return (wait_code(pid), false);
            }
            // A stray byte from the client: ignore it and keep waiting.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Waits for `pid` and turns its status into the exit-code contract.
pub fn wait_code(pid: Pid) -> i32 {
    loop {
        match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
            Ok(Some((_, st))) => {
                if let Some(code) = st.exit_status() {
                    return code;
                }
                if let Some(sig) = st.terminating_signal() {
                    return 128 + sig;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            _ => return 125,
        }
    }
}

/// Every process below `root` in the sandbox (from /proc's parent links).
pub fn descendants(root: Pid) -> Vec<Pid> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut todo = vec![root.as_raw_nonzero().get()];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(c) {
                out.extend(Pid::from_raw(c));
                todo.push(c);
            }
        }
    }
    out
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// SIGKILLs every process below `root` until none is left, reaping those
/// that are its children (orphans are reparented to it: it is a subreaper).
pub fn kill_tree(root: Pid) {
    for _ in 0..1000 {
        let procs = descendants(root);
        if procs.is_empty() {
            return;
        }
        for p in &procs {
            let _ = rustix::process::kill_process(*p, Signal::KILL);
        }
        while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Allocates a pty in the sandbox's own devpts; returns (master, slave).
fn open_pty(winsize: Option<(u16, u16)>) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    if let Some((rows, cols)) = winsize {
        let ws = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(&slave, ws)?;
    }
    Ok((master, slave))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nweb:x:33:33::/var/www:/usr/sbin/nologin\n";
    const GROUP: &str = "root:x:0:\nusers:x:100:\nuser:x:1000:\n";

    #[test]
    fn programs_are_found_as_execvp_finds_them() {
        let dir = std::env::temp_dir().join(format!("sifbox-find-{}", std::process::id()));
        let (bin, other) = (dir.join("bin"), dir.join("other"));
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::create_dir_all(&other).expect("mkdir");
        let write = |p: &std::path::Path, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(p, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        write(&bin.join("tool"), 0o755);
        write(&other.join("tool"), 0o755);
        write(&other.join("plain"), 0o644);
        std::fs::create_dir_all(other.join("adir")).expect("mkdir");
        let path = format!("{}:{}", bin.display(), other.display());
        // The first directory wins; a path is taken as given.
        assert_eq!(find_program("tool", Some(&path)), Ok(bin.join("tool")));
        assert_eq!(find_program("./x/y", Some(&path)), Ok("./x/y".into()));
        // Not executable (when not root) or a directory: denied or not found.
        let plain = find_program("plain", Some(&path));
        assert!(
            matches!(plain, Err(126)) || plain == Ok(other.join("plain")),
            "{plain:?}"
        );
        assert_eq!(find_program("adir", Some(&path)), Err(127));
        assert_eq!(find_program("missing", Some(&path)), Err(127));
        assert_eq!(find_program("", Some(&path)), Err(127));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn users_resolve_by_name_and_number() {
        let u = resolve_user("user", PASSWD, GROUP).expect("user");
        assert_eq!(
            (u.uid, u.gid, u.home.as_deref()),
            (1000, 1000, Some("/home/user"))
        );
        let u = resolve_user("33", PASSWD, GROUP).expect("uid");
        assert_eq!((u.uid, u.gid), (33, 33));
        let u = resolve_user("4242", PASSWD, GROUP).expect("unknown uid");
        assert_eq!((u.uid, u.gid, u.home), (4242, 4242, None));
        let u = resolve_user("user:users", PASSWD, GROUP).expect("name:group");
        assert_eq!((u.uid, u.gid), (1000, 100));
        let u = resolve_user("5:6", PASSWD, GROUP).expect("uid:gid");
        assert_eq!((u.uid, u.gid), (5, 6));
        assert!(resolve_user("nobody-here", PASSWD, GROUP).is_err());
        assert!(resolve_user("user:nogroup", PASSWD, GROUP).is_err());
    }
}
