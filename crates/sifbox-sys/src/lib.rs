//! Every `unsafe` line of sifbox lives in this crate.
//!
//! The rest of the workspace denies `unsafe_code`. What `rustix` already offers
//! safely (unshare, pivot_root, mount, pidfd, prctl, SCM_RIGHTS, ptys) is used
//! directly by the engine; this crate covers the remainder: `fork`, the hooks
//! that run between `fork` and `exec` of a `std::process::Command`,
//! `mount_setattr`, bringing the loopback interface up, attaching loop
//! devices, giving idle supervisors' clean pages back (`madvise`),
//! installing seccomp filters (and hearing their denials,
//! [`seccomp_notify`]) and (feature `probe`, for tests) raw system
//! call probes. Each function is
//! small, checks its preconditions, and maps each failing call to its own
//! error variant so that an error names the exact syscall that failed.

#![allow(unsafe_code)]

pub mod beneath;
pub mod lockfile;
pub mod seccomp_notify;
pub mod syscall;

pub use beneath::private_dir::{check_ancestors, fd_path, private_dir, NotPrivate};
pub use beneath::walk;

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Errors of the raw syscalls in this crate; each names the call that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "fork refused: the process has {0} threads, fork is only safe in a single-threaded process"
    )]
    NotSingleThreaded(usize),
    #[error("cannot count this process's threads: {0}")]
    ThreadCount(std::io::Error),
    #[error("fork: {0}")]
    Fork(std::io::Error),
    #[error("mount_setattr({path}): {source}")]
    MountSetattr {
        path: String,
        source: std::io::Error,
    },
    #[error("kill(-1, {sig}): {source}")]
    KillAll { sig: i32, source: std::io::Error },
    #[error("close_range(CLOSE_RANGE_CLOEXEC): {0}")]
    CloseRange(std::io::Error),
    #[error("close_range closing inherited descriptors: {0}")]
    CloseInherited(std::io::Error),
    #[error("keyctl(KEYCTL_JOIN_SESSION_KEYRING): {0}")]
    JoinKeyring(std::io::Error),
    #[error("socket(AF_INET) for the loopback interface: {0}")]
    LoopbackSocket(std::io::Error),
    #[error("ioctl(SIOCGIFFLAGS, lo): {0}")]
    LoopbackGetFlags(std::io::Error),
    #[error("ioctl(SIOCSIFFLAGS, lo): {0}")]
    LoopbackSetFlags(std::io::Error),
    #[error("seccomp(SECCOMP_SET_MODE_FILTER): {0}{hint}", hint = seccomp_hint(.0))]
    Seccomp(std::io::Error),
    #[error("opening /dev/loop-control: {0}")]
    LoopControl(std::io::Error),
    #[error("ioctl(LOOP_CTL_GET_FREE): {0}")]
    LoopGetFree(std::io::Error),
    #[error("opening {path}: {source}")]
    LoopOpen {
        path: String,
        source: std::io::Error,
    },
    #[error("ioctl({path}, LOOP_CONFIGURE): {source}")]
    LoopConfigure {
        path: String,
        source: std::io::Error,
    },
}

/// Result of [`fork`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// In the parent; the child's pid.
    Parent(rustix::process::Pid),
    /// In the child.
    Child,
}

/// Number of threads of the calling process: procfs reports the link count
/// of /proc/self/task as the number of threads plus two, which one statx
/// tells more cheaply than formatting /proc/self/stat.
pub fn thread_count() -> Result<usize, Error> {
    let st = rustix::fs::stat("/proc/self/task").map_err(|e| Error::ThreadCount(e.into()))?;
    usize::try_from(st.st_nlink)
        .ok()
        .and_then(|n| n.checked_sub(2))
        .filter(|n| *n >= 1)
        .ok_or_else(|| {
            Error::ThreadCount(std::io::Error::other(
                "unexpected link count of /proc/self/task",
            ))
        })
}

/// Forks the calling process.
///
/// Refuses unless the process is single-threaded: after `fork` in a
/// multi-threaded process the child may only call async-signal-safe functions,
/// which this API cannot enforce. The sandbox supervisor is single-threaded
/// (it runs before any runtime starts), so it may fork freely.
pub fn fork() -> Result<Forked, Error> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(Error::NotSingleThreaded(threads));
    }
    // SAFETY: the process is single-threaded (checked just above, and nothing in
    // this call path starts a thread), so the child is a complete copy of the
    // only thread and may run arbitrary code, including allocation.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(Error::Fork(std::io::Error::last_os_error())),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(
            rustix::process::Pid::from_raw(pid).ok_or_else(|| {
                Error::Fork(std::io::Error::other("fork returned a negative pid"))
            })?,
        )),
    }
}

/// Replaces what /proc/self/cmdline and /proc/self/environ show for this
/// process: the argument block becomes `title` (NUL-separated words) and the
/// environment block is zeroed; `environ` is cleared too.
///
/// A process forked from the CLI (without exec) still carries the CLI's
/// argv and environment in these blocks; a sandbox supervisor must carry
/// neither. Only call this in a single-threaded process that no longer reads
/// its environment or `std::env::args` (both become empty strings).
pub fn scrub_proc_identity(title: &[&str]) -> Result<(), Error> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(Error::NotSingleThreaded(threads));
    }
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(Error::ThreadCount)?;
    let bad = || Error::ThreadCount(std::io::Error::other("malformed /proc/self/stat"));
    let after = stat.rfind(')').map(|i| &stat[i + 1..]).ok_or_else(bad)?;
    // After the command name the fields start at 3; arg_start..env_end are
    // fields 48..51.
    let f: Vec<usize> = after
        .split_whitespace()
        .skip(45)
        .take(4)
        .map(|v| v.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [arg_start, arg_end, env_start, env_end] = f[..] else {
        return Err(bad());
    };
    if arg_end < arg_start || env_end < env_start {
        return Err(bad());
    }
    // SAFETY: clearenv only resets the `environ` pointer of this
    // single-threaded process (checked above); no other thread can be
    // reading the environment concurrently.
    unsafe {
        libc::clearenv();
    }
    let mut block: Vec<u8> = Vec::new();
    for word in title {
        block.extend_from_slice(word.as_bytes());
        block.push(0);
    }
    let arg_len = arg_end - arg_start;
    block.truncate(arg_len);
    // SAFETY: [arg_start, arg_end) and [env_start, env_end) are the argument
    // and environment string blocks the kernel placed on this process's
    // stack at exec (read from /proc/self/stat just above); they are mapped
    // and writable for the life of the process. Nothing reads them through
    // Rust references: `environ` was cleared above and the caller promises
    // not to read std::env::args again, so overwriting them aliases nothing.
    unsafe {
        let arg = arg_start as *mut u8;
        std::ptr::write_bytes(arg, 0, arg_len);
        std::ptr::copy_nonoverlapping(block.as_ptr(), arg, block.len());
        std::ptr::write_bytes(env_start as *mut u8, 0, env_end - env_start);
    }
    Ok(())
}

/// Marks every file descriptor from `first` on close-on-exec
/// (`close_range(first, ~0, CLOSE_RANGE_CLOEXEC)`), so that descriptors this
/// process inherited (from the shell that started sifbox, say) never reach
/// a command it executes. Nothing is closed: descriptors the process holds
/// stay usable.
pub fn cloexec_from(first: u32) -> Result<(), Error> {
    /// `CLOSE_RANGE_CLOEXEC` from linux/close_range.h.
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: with CLOSE_RANGE_CLOEXEC the call closes no descriptor, it only
    // sets FD_CLOEXEC on them; no memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == -1 {
        return Err(Error::CloseRange(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Closes every file descriptor from 3 up except those in `keep`, with
/// `close_range` over the gaps between them.
///
/// A supervisor that a CLI forked (without exec) holds every descriptor the
/// CLI had, close-on-exec or not, and never executes anything that would
/// drop them: a pipe the caller passed would stay open (its reader would
/// hang until the sandbox stopped) and a directory fd would lead out of the
/// sandbox through `/proc/PID/fd`. Refused unless single-threaded. Call it
/// only in a process that never again uses a descriptor it does not keep:
/// one just forked (or executed) that never returns into its parent's code,
/// as the supervisor.
pub fn close_inherited_fds(keep: &[BorrowedFd<'_>]) -> Result<(), Error> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(Error::NotSingleThreaded(threads));
    }
    let kept: Vec<u32> = keep
        .iter()
        .filter_map(|fd| u32::try_from(fd.as_raw_fd()).ok())
        .collect();
    for (first, last) in close_gaps(&kept) {
        // SAFETY: close_range only closes descriptors; no memory is
        // passed. Closing descriptors that objects of this process may
        // still own is sound here because the caller (see above) never
        // uses them again: the process was just forked or executed and
        // never returns into the code that holds them, and the one thread
        // (checked above) cannot race with another opening fds.
        let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        if rc == -1 {
            return Err(Error::CloseInherited(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The ranges `[first, last]` of descriptors from 3 up that are not in
/// `keep`, for close_range.
fn close_gaps(keep: &[u32]) -> Vec<(u32, u32)> {
    let mut kept: Vec<u32> = keep.iter().copied().filter(|&fd| fd >= 3).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut out = Vec::new();
    let mut first: u32 = 3;
    for k in kept {
        if k > first {
            out.push((first, k - 1));
        }
        first = k.saturating_add(1);
    }
    out.push((first, u32::MAX));
    out
}

/// Makes the calling process (and what it forks from now on) join a fresh,
/// anonymous session keyring: keys of the session it came from (an ssh
/// login's, say) are then out of its reach. Each keyring counts against
/// the user's key quota (`kernel.keys.maxkeys`): `EDQUOT` says it is full.
pub fn join_new_session_keyring() -> Result<(), Error> {
    /// `KEYCTL_JOIN_SESSION_KEYRING` from linux/keyctl.h.
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    // SAFETY: a NULL name asks the kernel for a new anonymous keyring; no
    // memory of ours is read or written.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if rc == -1 {
        return Err(Error::JoinKeyring(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Returns free heap memory to the kernel (`malloc_trim(0)`): a supervisor
/// forked from the CLI carries the CLI's freed allocations otherwise, and
/// hundreds of idle sandboxes pay for them.
pub fn release_free_memory() {
    // SAFETY: malloc_trim only walks and trims glibc's own heap; it takes
    // the allocator's locks like any allocation does.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Unmaps, from this process's page tables, the pages of its read-only file
/// mappings (the code and constants of sifbox and its libraries) that hold
/// nothing but the file's own bytes.
///
/// An idle supervisor waits in a loop that needs a handful of those pages,
/// but keeps mapped everything it touched while setting the sandbox up, and
/// each of those pages counts in its resident set. The page cache keeps the
/// pages (shared by every sandbox); whatever the process touches again is
/// faulted back in from there, unchanged.
pub fn drop_clean_file_pages() {
    // Another thread could unmap a listed range and map something else
    // there between the listing and the advice.
    if thread_count().ok() != Some(1) {
        return;
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    for m in clean_file_mappings(&smaps) {
        let len = m.end - m.start;
        // Advice that fails leaves the pages mapped, which is harmless.
        // SAFETY: [start, end) is a whole mapping of this process as the
        // kernel listed it a moment ago (the process is single-threaded,
        // checked above, so nothing has remapped it since), backed by
        // a file, not writable, and holding no anonymous (copy-on-write)
        // page. MADV_DONTNEED only drops page-table entries there: the next
        // access faults the same bytes back in from the page cache, so no
        // Rust object in that range can observe a change.
        let _ = unsafe {
            rustix::mm::madvise(
                std::ptr::with_exposed_provenance_mut::<std::ffi::c_void>(m.start),
                len,
                rustix::mm::Advice::LinuxDontNeed,
            )
        };
    }
}

/// One mapping of /proc/self/smaps that [`drop_clean_file_pages`] may drop.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CleanMapping {
    start: usize,
    end: usize,
    rss_kb: usize,
}

/// The file-backed, non-writable mappings of an smaps text with resident
/// pages and no anonymous ones.
fn clean_file_mappings(smaps: &str) -> Vec<CleanMapping> {
    let mut out = Vec::new();
    let mut cur: Option<(CleanMapping, bool)> = None;
    let mut finish = |cur: &mut Option<(CleanMapping, bool)>| {
        if let Some((m, ok)) = cur.take() {
            if ok && m.rss_kb > 0 {
                out.push(m);
            }
        }
    };
    for line in smaps.lines() {
        let mut words = line.split_ascii_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            finish(&mut cur);
            let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                continue;
            };
            let perms = words.next().unwrap_or("");
            let path = words.nth(3).unwrap_or("");
            let ok = perms.len() == 4
                && perms.as_bytes()[1] == b'-'
                && path.starts_with('/')
                && start < end;
            cur = Some((
                CleanMapping {
                    start,
                    end,
                    rss_kb: 0,
                },
                ok,
            ));
            continue;
        }
        let Some((m, ok)) = cur.as_mut() else {
            continue;
        };
        let kb = || words.clone().next().and_then(|v| v.parse::<usize>().ok());
        match first {
            "Rss:" => m.rss_kb = kb().unwrap_or(0),
            "Anonymous:" if kb() != Some(0) => *ok = false,
            // Locked pages are meant to stay.
            "Locked:" if kb() != Some(0) => *ok = false,
            _ => {}
        }
    }
    finish(&mut cur);
    out
}

/// `unshare(2)` for namespace flags only.
///
/// rustix marks `unshare` unsafe because `CLONE_FILES` (and `CLONE_FS`) would
/// unshare state that Rust code may hold references into; namespace flags do
/// not touch the fd table or the process's memory, so this wrapper accepts
/// only those.
pub fn unshare_namespaces(flags: rustix::thread::UnshareFlags) -> std::io::Result<()> {
    use rustix::thread::UnshareFlags as F;
    let allowed = F::NEWNS
        | F::NEWUTS
        | F::NEWIPC
        | F::NEWUSER
        | F::NEWPID
        | F::NEWNET
        | F::NEWCGROUP
        | F::NEWTIME;
    if !allowed.contains(flags) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: only namespace flags are passed (checked above); they change
    // which namespaces later syscalls act in, not the fd table, the file
    // system context or any memory this process holds.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(Into::into)
}

/// Starts the program at `path` with `argv` (its `argv[0]` as given) and the
/// environment `env` (`KEY=VALUE`), its stdin, stdout and stderr `stdio`,
/// in a process group of its own, through posix_spawn (vfork: cheap, and
/// nothing runs between the fork and the exec).
///
/// Every signal starts at its default disposition and none is blocked, as
/// a freshly started program expects. `std::process::Command`'s own
/// posix_spawn leaves glibc's internal signals 32 and 33 ignored in the
/// program (glibc's child sets them to SIG_IGN unless the caller names them
/// in POSIX_SPAWN_SETSIGDEF), and ignored signals survive exec.
pub fn spawn(
    path: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    env: &[std::ffi::CString],
    stdio: [BorrowedFd<'_>; 3],
) -> std::io::Result<rustix::process::Pid> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(r))
        }
    };
    let mut argv_ptrs: Vec<*mut libc::c_char> =
        argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv_ptrs.push(std::ptr::null_mut());
    let mut env_ptrs: Vec<*mut libc::c_char> = env.iter().map(|e| e.as_ptr().cast_mut()).collect();
    env_ptrs.push(std::ptr::null_mut());
    // SAFETY: `attr` and `actions` are initialised by their init calls
    // before any other use and destroyed once, on every path after init
    // succeeded; the sigsets are plain bit arrays (all-zero is a valid
    // value; `all` is then filled with ones over its own size). posix_spawn reads `path`, the NUL-terminated argv and envp
    // arrays (whose strings `argv` and `env` keep alive for the call) and
    // writes the child's pid to `pid`; it does not keep any pointer after it
    // returns. The fds are borrowed for the call; the child gets copies.
    unsafe {
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        check(libc::posix_spawnattr_init(&mut attr))?;
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        if let Err(e) = check(libc::posix_spawn_file_actions_init(&mut actions)) {
            libc::posix_spawnattr_destroy(&mut attr);
            return Err(e);
        }
        // Every bit set, glibc's internal signals included: sigfillset
        // leaves those out, and they are the ones to reset.
        let mut all: libc::sigset_t = std::mem::zeroed();
        std::ptr::write_bytes(
            std::ptr::addr_of_mut!(all).cast::<u8>(),
            0xff,
            std::mem::size_of::<libc::sigset_t>(),
        );
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        // 0x2 | 0x4 | 0x8: fits the attribute's short.
        let flags = libc::c_short::try_from(
            libc::POSIX_SPAWN_SETPGROUP
                | libc::POSIX_SPAWN_SETSIGDEF
                | libc::POSIX_SPAWN_SETSIGMASK,
        )
        .unwrap_or_default();
        let mut result = check(libc::posix_spawnattr_setflags(&mut attr, flags))
            .and_then(|()| check(libc::posix_spawnattr_setpgroup(&mut attr, 0)))
            .and_then(|()| check(libc::posix_spawnattr_setsigdefault(&mut attr, &all)))
            .and_then(|()| check(libc::posix_spawnattr_setsigmask(&mut attr, &none)));
        for (target, fd) in (0..).zip(stdio.iter()) {
            result = result.and_then(|()| {
                check(libc::posix_spawn_file_actions_adddup2(
                    &mut actions,
                    fd.as_raw_fd(),
                    target,
                ))
            });
        }
        let mut pid: libc::pid_t = 0;
        if result.is_ok() {
            result = check(libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                &actions,
                &attr,
                argv_ptrs.as_ptr(),
                env_ptrs.as_ptr(),
            ));
        }
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attr);
        result?;
        rustix::process::Pid::from_raw(pid)
            .ok_or_else(|| std::io::Error::other("posix_spawn returned no pid"))
    }
}

/// What to do in the child of a `Command` between `fork` and `exec`.
///
/// Only async-signal-safe raw syscalls are made there (through rustix, which
/// does not allocate for these calls).
#[derive(Debug, Default, Clone)]
pub struct ExecHooks {
    /// Start a new session (and process group) for the command.
    pub setsid: bool,
    /// Make this fd (already the child's stdin) the controlling terminal.
    pub controlling_tty: bool,
    /// Signal sent to the child when its parent dies.
    pub parent_death_signal: Option<rustix::process::Signal>,
    /// Switch to this gid, then this uid, before `exec` (also clears groups).
    pub ids: Option<(u32, u32)>,
    /// Install this seccomp program (see [`install_seccomp_filter`]) just
    /// before the id switch: late enough that only the command is filtered,
    /// early enough that the child is still root of its user namespace (a
    /// command's user has no CAP_SYS_ADMIN there, and no_new_privs is not
    /// set, so the kernel would refuse the filter after the switch).
    pub seccomp: Option<&'static [SockFilter]>,
}

/// Sets every signal to its default disposition in a child about to exec:
/// exec resets handled signals but keeps ignored ones, and the parent may
/// ignore some (a worker started by posix_spawn has glibc's internal
/// signals 32 and 33 ignored). Raw rt_sigaction, as glibc's sigaction
/// refuses its internal signals; failures (SIGKILL, SIGSTOP) are expected
/// and ignored. Async-signal-safe: only system calls, no allocation.
fn default_signal_dispositions() {
    // A kernel `struct sigaction` of all zeros: SIG_DFL, no flags, an empty
    // mask (32 bytes covers its layout on every 64-bit architecture).
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        // SAFETY: rt_sigaction reads `dfl` (zeroed, large enough for the
        // kernel's struct) and writes nothing (no old-action pointer); the
        // last argument is the size of the kernel's sigset.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                dfl.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            );
        }
    }
}

/// Installs `hooks` on `cmd`.
pub fn set_exec_hooks(cmd: &mut Command, hooks: ExecHooks) {
    let run = move || -> std::io::Result<()> {
        default_signal_dispositions();
        if hooks.setsid {
            rustix::process::setsid()?;
        }
        if hooks.controlling_tty {
            rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
        }
        if let Some(sig) = hooks.parent_death_signal {
            rustix::process::set_parent_process_death_signal(Some(sig))?;
        }
        if let Some(program) = hooks.seccomp {
            install_seccomp_filter(program).map_err(|e| match e {
                Error::Seccomp(io) => io,
                _ => std::io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        }
        if let Some((uid, gid)) = hooks.ids {
            let gid = rustix::process::Gid::from_raw(gid);
            let uid = rustix::process::Uid::from_raw(uid);
            // Clearing supplementary groups fails with EPERM where setgroups is
            // denied (single-id user namespaces); the groups are then already
            // the overflow group only, so that is not an error.
            match rustix::thread::set_thread_groups(&[]) {
                Ok(()) | Err(rustix::io::Errno::PERM) => {}
                Err(e) => return Err(e.into()),
            }
            rustix::thread::set_thread_res_gid(gid, gid, gid)?;
            rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec. It only makes
    // raw syscalls through rustix (setsid, ioctl, prctl, setgroups/setres[ug]id)
    // and seccomp(2) with a static program (install_seccomp_filter builds
    // its arguments on the stack; its errors are raw errnos, which do not
    // allocate), all async-signal-safe, none allocating or taking locks.
    unsafe {
        cmd.pre_exec(run);
    }
}

/// `MOUNT_ATTR_RDONLY` from linux/mount.h.
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// `AT_RECURSIVE` from linux/fcntl.h.
const AT_RECURSIVE: libc::c_int = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sends `sig` to every process this process may signal, except itself and
/// the init of its pid namespace (`kill(-1, sig)`). Inside a sandbox's pid
/// namespace that is every other process of the sandbox. `ESRCH` (nothing
/// left) is success.
pub fn kill_all(sig: rustix::process::Signal) -> Result<(), Error> {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(-1, sig.as_raw()) };
    if rc == -1 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(Error::KillAll {
                sig: sig.as_raw(),
                source: err,
            });
        }
    }
    Ok(())
}

/// Makes the detached or attached mount tree referred to by `fd` (from
/// `open_tree`) read-only, recursively, leaving every other flag as it is.
pub fn make_readonly_fd(fd: BorrowedFd<'_>) -> Result<(), Error> {
    mount_setattr(fd, true, MOUNT_ATTR_RDONLY, 0).map_err(|e| Error::MountSetattr {
        path: format!("fd {}", fd.as_raw_fd()),
        source: e.into(),
    })
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH [| AT_RECURSIVE])` on the mount
/// (tree) `fd` refers to, setting the `MOUNT_ATTR_*` bits of `set` and
/// clearing those of `clear`.
pub fn mount_setattr(
    fd: BorrowedFd<'_>,
    recursive: bool,
    set: u64,
    clear: u64,
) -> Result<(), rustix::io::Errno> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive {
        AT_RECURSIVE | libc::AT_EMPTY_PATH
    } else {
        libc::AT_EMPTY_PATH
    };
    // SAFETY: the path is a static NUL-terminated empty string (with
    // AT_EMPTY_PATH the call acts on `fd`, which is open for the whole call);
    // `attr` is a live repr(C) struct mount_attr of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == -1 {
        return Err(
            rustix::io::Errno::from_io_error(&std::io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::INVAL),
        );
    }
    Ok(())
}

/// IFF_UP | IFF_RUNNING as the `short` that `ifr_flags` holds (both fit).
const IFF_UP_RUNNING: libc::c_short = 0x1 | 0x40;

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> Result<(), Error> {
    use rustix::net::{socket_with, AddressFamily, SocketFlags, SocketType};
    let sock = socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| Error::LoopbackSocket(e.into()))?;
    let fd: BorrowedFd<'_> = std::os::fd::AsFd::as_fd(&sock);
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifr_flags of the ifreq we
    // own; the socket fd is open for the duration of the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } == -1 {
        return Err(Error::LoopbackGetFlags(std::io::Error::last_os_error()));
    }
    // SAFETY: after a successful SIOCGIFFLAGS the union holds ifru_flags.
    unsafe {
        req.ifr_ifru.ifru_flags |= IFF_UP_RUNNING;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own; the fd is open.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } == -1 {
        return Err(Error::LoopbackSetFlags(std::io::Error::last_os_error()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Loop devices: a file as a block device, for disk-backed writable layers
// ---------------------------------------------------------------------------

/// `LOOP_CTL_GET_FREE` of linux/loop.h: finds (or makes) a free device.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CONFIGURE` (Linux 5.8): backing file, block size and flags in one
/// call.
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// The device detaches itself when its last user (the mount) lets go.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of linux/loop.h (232 bytes).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of linux/loop.h (304 bytes).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// Attaches `backing` (a regular file, open read-write) to a free loop
/// device with 4 KiB blocks and auto-clear; returns the
/// device, open read-write and close-on-exec. The device goes away by
/// itself once the returned fd and every mount of it are gone. A device
/// that another process takes between the lookup and the attach is
/// skipped (a few tries).
pub fn attach_loop(backing: BorrowedFd<'_>) -> Result<std::os::fd::OwnedFd, Error> {
    use rustix::fs::{open, Mode, OFlags};
    let control = open(
        "/dev/loop-control",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::LoopControl(e.into()))?;
    let fd = u32::try_from(backing.as_raw_fd())
        .map_err(|_| Error::LoopGetFree(std::io::Error::from_raw_os_error(libc::EBADF)))?;
    let mut last = None;
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device
        // number; the control fd is open for the call.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(Error::LoopGetFree(std::io::Error::last_os_error()));
        }
        let path = format!("/dev/loop{n}");
        let dev =
            open(path.as_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
                Error::LoopOpen {
                    path: path.clone(),
                    source: e.into(),
                }
            })?;
        // SAFETY: LoopConfig is plain old data; all-zero is a valid value.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = fd;
        config.block_size = 4096;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_CONFIGURE reads a struct loop_config, which `config`
        // is (repr(C), its size checked above), alive for the call; both
        // fds are open.
        let rc = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok(dev);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(Error::LoopConfigure { path, source: err });
        }
        last = Some(Error::LoopConfigure { path, source: err });
    }
    Err(last.unwrap_or_else(|| Error::LoopGetFree(std::io::Error::from_raw_os_error(libc::EBUSY))))
}

// ---------------------------------------------------------------------------
// Seccomp: installing a compiled filter, and (feature `probe`) raw system
// call probes with fixed arguments for the tests of the default policy.
// ---------------------------------------------------------------------------

/// One classic BPF instruction, laid out as the kernel's `struct sock_filter`
/// (`code`, `jt`, `jf`, `k`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockFilter {
    /// Opcode.
    pub code: u16,
    /// Jump offset when the condition holds.
    pub jt: u8,
    /// Jump offset when it does not.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

// The kernel reads `SockFilter`s as `struct sock_filter`s.
const _: () = {
    assert!(std::mem::size_of::<SockFilter>() == std::mem::size_of::<libc::sock_filter>());
    assert!(std::mem::align_of::<SockFilter>() == std::mem::align_of::<libc::sock_filter>());
};

/// `BPF_MAXINSNS`: the most instructions one filter may hold.
const BPF_MAXINSNS: usize = 4096;

/// What an errno of `seccomp(SECCOMP_SET_MODE_FILTER)` means for the caller.
fn seccomp_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EACCES) => {
            ": the process needs CAP_SYS_ADMIN in its user namespace, or no_new_privs set, to install a filter"
        }
        Some(libc::EINVAL) => ": the program is empty, longer than 4096 instructions or not valid BPF",
        Some(libc::ENOMEM) => ": the filters stacked on this process are too long together",
        _ => "",
    }
}

/// Installs `program` as a seccomp filter of the calling thread
/// (`seccomp(SECCOMP_SET_MODE_FILTER, 0, prog)`). Children the thread
/// starts afterwards inherit it; it cannot be removed. Other threads of the
/// process are not affected (no TSYNC): call it in the single thread that
/// goes on to start the commands.
///
/// Unlike seccompiler's `apply_filter`, this does not set no_new_privs
/// first: sifbox installs the filter in a process that is root of the
/// sandbox's user namespace, where the kernel allows a filter without it,
/// and no_new_privs would stop setuid programs inside (sudo, su) from
/// working. Without CAP_SYS_ADMIN in its user namespace a caller must set
/// no_new_privs itself (`rustix::thread::set_no_new_privs`), or the kernel
/// answers EACCES, which the error spells out.
pub fn install_seccomp_filter(program: &[SockFilter]) -> Result<(), Error> {
    // Flags 0: only the calling thread's seccomp state changes.
    set_mode_filter(program, 0)
        .map(drop)
        .map_err(Error::Seccomp)
}

/// seccomp(SECCOMP_SET_MODE_FILTER, `flags`, `program`) on the calling
/// thread; returns what the kernel returned (0, or a new listener's
/// descriptor with SECCOMP_FILTER_FLAG_NEW_LISTENER).
pub(crate) fn set_mode_filter(
    program: &[SockFilter],
    flags: libc::c_ulong,
) -> std::io::Result<i64> {
    let len = u16::try_from(program.len())
        .ok()
        .filter(|n| *n > 0 && usize::from(*n) <= BPF_MAXINSNS)
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    // SAFETY: `fprog` points at the `len` instructions of `program`, which is
    // borrowed for the whole call, and `SockFilter` has the layout of
    // `struct sock_filter` (asserted above). The kernel copies the program
    // and never writes through the pointer (the `mut` is only the C type's).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &fprog as *const libc::sock_fprog,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}

#[cfg(feature = "probe")]
pub use probe::{try_syscall, IoctlRequest, ProbeSyscall};

#[cfg(feature = "probe")]
mod probe;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_read_only_file_mappings_are_dropped() {
        let smaps = "\
55d0a0000000-55d0a0100000 r--p 00000000 fe:00 123 /usr/bin/sifbox
Size:               1024 kB
Rss:                 300 kB
Anonymous:             0 kB
Locked:                0 kB
55d0a0100000-55d0a0900000 r-xp 00100000 fe:00 123 /usr/bin/sifbox
Rss:                1200 kB
Anonymous:             0 kB
55d0a0900000-55d0a0950000 r--p 00900000 fe:00 123 /usr/bin/sifbox
Rss:                  80 kB
Anonymous:            80 kB
55d0a0950000-55d0a0960000 rw-p 00950000 fe:00 123 /usr/bin/sifbox
Rss:                  16 kB
Anonymous:            16 kB
55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0 [heap]
Rss:                  96 kB
Anonymous:            96 kB
7f0000000000-7f0000010000 r--p 00000000 fe:00 7 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   0 kB
Anonymous:             0 kB
7f0000010000-7f0000020000 r-xp 00010000 fe:00 7 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                  64 kB
Anonymous:             0 kB
Locked:               64 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
Anonymous:             0 kB
";
        let got = clean_file_mappings(smaps);
        assert_eq!(
            got,
            vec![
                CleanMapping {
                    start: 0x55d0_a000_0000,
                    end: 0x55d0_a010_0000,
                    rss_kb: 300
                },
                CleanMapping {
                    start: 0x55d0_a010_0000,
                    end: 0x55d0_a090_0000,
                    rss_kb: 1200
                },
            ]
        );
        assert!(clean_file_mappings("").is_empty());
        assert!(clean_file_mappings("garbage\n-\nRss: x\n").is_empty());
    }

    #[test]
    fn close_gaps_spare_exactly_the_kept_descriptors() {
        assert_eq!(close_gaps(&[]), vec![(3, u32::MAX)]);
        assert_eq!(close_gaps(&[0, 1, 2]), vec![(3, u32::MAX)]);
        assert_eq!(close_gaps(&[3]), vec![(4, u32::MAX)]);
        assert_eq!(
            close_gaps(&[9, 5, 5, 6]),
            vec![(3, 4), (7, 8), (10, u32::MAX)]
        );
    }

    #[test]
    fn thread_count_sees_test_threads() {
        let n = thread_count().expect("thread count");
        assert!(n >= 1);
    }

    #[test]
    fn fork_refuses_in_multithreaded_process() {
        // The test harness runs tests on worker threads, so the process has
        // more than one thread here.
        let _keep = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(1)));
        match fork() {
            Err(Error::NotSingleThreaded(n)) => assert!(n > 1),
            other => panic!("expected refusal, got {other:?}"),
        }
    }
}
