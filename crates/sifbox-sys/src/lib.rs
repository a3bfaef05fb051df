//! Every `unsafe` line of sifbox lives in this crate.
//!
//! The rest of the workspace denies `unsafe_code`. What `rustix` already offers
//! safely (unshare, pivot_root, mount, pidfd, prctl, SCM_RIGHTS, ptys) is used
//! directly by the engine; this crate covers the remainder: `fork`, the hooks
//! that run between `fork` and `exec` of a `std::process::Command`,
//! `mount_setattr`, bringing the loopback interface up, and giving idle
//! supervisors' clean pages back (`madvise`). Each function is
//! small, checks its preconditions, and maps each failing call to its own
//! error variant so that an error names the exact syscall that failed.

#![allow(unsafe_code)]

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
}

/// Installs `hooks` on `cmd`.
pub fn set_exec_hooks(cmd: &mut Command, hooks: ExecHooks) {
    let run = move || -> std::io::Result<()> {
        if hooks.setsid {
            rustix::process::setsid()?;
        }
        if hooks.controlling_tty {
            rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
        }
        if let Some(sig) = hooks.parent_death_signal {
            rustix::process::set_parent_process_death_signal(Some(sig))?;
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
    // which are async-signal-safe and do not allocate or take locks.
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
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the path is a static NUL-terminated empty string (with
    // AT_EMPTY_PATH the call acts on `fd`, which is open for the whole call);
    // `attr` is a live repr(C) struct mount_attr of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            AT_RECURSIVE | libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == -1 {
        return Err(Error::MountSetattr {
            path: format!("fd {}", fd.as_raw_fd()),
            source: std::io::Error::last_os_error(),
        });
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
