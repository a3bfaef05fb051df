//! Seccomp user notification: a filter whose denials a listener hears.
//!
//! A filter installed with `SECCOMP_FILTER_FLAG_NEW_LISTENER` hands back a
//! descriptor; every call the filter answers `SECCOMP_RET_USER_NOTIF` stops
//! the caller until a [`Notifier`] on that descriptor answers it. sifbox
//! answers every one EPERM, after counting it, so that denials can be
//! reported (Docker's are silent). Calls the filter allows never reach the
//! listener and cost nothing extra.
//!
//! The kernel allows one listener per filter chain: installing a second one
//! (a nested sifbox, or a program inside that wants its own) fails with
//! EBUSY, which [`install_filter_with_listener`] reports as `Ok(None)` so
//! that the caller installs its plain program instead. When the listener's
//! descriptor is closed, the kernel answers ENOSYS to every call that would
//! have notified.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

use crate::SockFilter;

/// Installs `program` on the calling thread (as
/// [`crate::install_seccomp_filter`], same preconditions) with a new
/// listener, and returns the listener's descriptor (close-on-exec).
/// `Ok(None)`: a filter of this thread's chain already has a listener
/// (EBUSY); nothing was installed.
pub fn install_filter_with_listener(program: &[SockFilter]) -> std::io::Result<Option<OwnedFd>> {
    let rc = match crate::set_mode_filter(program, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER) {
        Ok(rc) => rc,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(None),
        Err(e) => return Err(e),
    };
    let fd = i32::try_from(rc).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: with NEW_LISTENER the kernel returned a new descriptor, which
    // only we own.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// One stopped call, as the listener receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// The kernel's cookie for the answer.
    pub id: u64,
    /// The system call number.
    pub nr: i32,
    /// `AUDIT_ARCH_*` of the call.
    pub arch: u32,
    /// The caller's thread id, in the listener's pid namespace (0 if it has
    /// none there).
    pub pid: u32,
}

/// Receives and answers the notifications of one listener.
#[derive(Debug)]
pub struct Notifier {
    fd: OwnedFd,
    /// Zeroed before each receive (the kernel refuses a buffer that is
    /// not); as large as the kernel's `struct seccomp_notif`, and at least
    /// as large as ours.
    buf: Vec<u64>,
}

/// The kernel's sizes of its notification structures.
fn notif_sizes() -> std::io::Result<libc::seccomp_notif_sizes> {
    let mut sizes = libc::seccomp_notif_sizes {
        seccomp_notif: 0,
        seccomp_notif_resp: 0,
        seccomp_data: 0,
    };
    // SAFETY: SECCOMP_GET_NOTIF_SIZES writes one `struct
    // seccomp_notif_sizes` (three u16s, which `sizes` is) and reads nothing.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0 as libc::c_uint,
            &mut sizes as *mut libc::seccomp_notif_sizes,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sizes)
}

impl Notifier {
    /// A notifier for the listener `fd`, its buffer sized by the kernel.
    pub fn new(fd: OwnedFd) -> std::io::Result<Self> {
        let sizes = notif_sizes()?;
        let bytes =
            usize::from(sizes.seccomp_notif).max(std::mem::size_of::<libc::seccomp_notif>());
        Ok(Self {
            fd,
            buf: vec![0; bytes.div_ceil(8)],
        })
    }

    /// Waits for the next stopped call. EINTR (a signal) and ENOENT (the
    /// caller died before it was received) are returned as they are: the
    /// caller retries.
    pub fn receive(&mut self) -> std::io::Result<Notification> {
        self.buf.fill(0);
        // SAFETY: `buf` is zeroed, 8-byte aligned and at least as large as
        // both our `struct seccomp_notif` and the kernel's (from
        // SECCOMP_GET_NOTIF_SIZES); the kernel writes at most its size.
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                self.buf.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the buffer holds an initialised `struct seccomp_notif`
        // (plain integers, any bit pattern valid) at its start, aligned.
        let n = unsafe { std::ptr::read(self.buf.as_ptr().cast::<libc::seccomp_notif>()) };
        Ok(Notification {
            id: n.id,
            nr: n.data.nr,
            arch: n.data.arch,
            pid: n.pid,
        })
    }

    /// Answers the call `id` with `-errno` (the call fails, doing nothing).
    /// ENOENT: the caller died meanwhile (or a signal interrupted it).
    pub fn deny(&self, id: u64, errno: i32) -> std::io::Result<()> {
        let mut resp = libc::seccomp_notif_resp {
            id,
            val: 0,
            error: -errno,
            flags: 0,
        };
        // SAFETY: SECCOMP_IOCTL_NOTIF_SEND reads one `struct
        // seccomp_notif_resp`, which `resp` is, for the whole call.
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &mut resp as *mut libc::seccomp_notif_resp,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Blocks every signal in the calling thread (SIGKILL and SIGSTOP stay, as
/// always), so that signals sent to the process go to its other threads as
/// before: for a thread that only serves a listener.
pub fn block_signals_in_this_thread() -> std::io::Result<()> {
    // SAFETY: sigfillset initialises the set on our stack; pthread_sigmask
    // reads it and writes no old mask (NULL).
    let rc = unsafe {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigfillset(set.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// `n` counters in an anonymous shared mapping, zeroed: processes forked
/// after this call count into the same memory, so that one process reads
/// what all its forked children counted. The mapping is never unmapped.
pub fn shared_counters(n: usize) -> std::io::Result<&'static [AtomicU64]> {
    let bytes = n
        .checked_mul(std::mem::size_of::<AtomicU64>())
        .filter(|b| *b > 0)
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a new anonymous mapping, touching no memory of ours.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the mapping is `bytes` long, page-aligned (so aligned for
    // AtomicU64), zero-filled (a valid AtomicU64 of 0 each), readable and
    // writable, and never unmapped: it lives as long as the process, and
    // only atomics access it.
    Ok(unsafe { std::slice::from_raw_parts(addr.cast::<AtomicU64>(), n) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// A filter that notifies `getppid` and allows everything else.
    fn notify_getppid() -> Vec<SockFilter> {
        let f = |code: u16, jt: u8, jf: u8, k: u32| SockFilter { code, jt, jf, k };
        let nr = u32::try_from(libc::SYS_getppid).expect("small number");
        vec![
            f(0x20, 0, 0, 0),  // ld [nr]
            f(0x15, 0, 1, nr), // jeq getppid
            f(0x06, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
            f(0x06, 0, 0, 0x7fff_0000), // allow
        ]
    }

    fn no_new_privs() {
        // SAFETY: prctl with integer arguments, on this thread only.
        let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }

    /// The errno of a raw getppid: 0 if it succeeded.
    fn getppid_errno() -> i32 {
        // SAFETY: getppid takes no arguments.
        let rc = unsafe { libc::syscall(libc::SYS_getppid) };
        if rc < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            0
        }
    }

    // A filter without TSYNC applies to the thread that installs it (and
    // what it starts) only: each test confines a thread of its own, so the
    // test harness stays unfiltered.

    #[test]
    fn a_notified_call_is_received_and_denied() {
        let (tx, rx) = std::sync::mpsc::channel();
        let confined = std::thread::spawn(move || {
            no_new_privs();
            let fd = install_filter_with_listener(&notify_getppid())
                .expect("install")
                .expect("no listener yet");
            tx.send(fd).expect("send");
            // A second listener in the same chain: EBUSY, nothing installed.
            let second = install_filter_with_listener(&notify_getppid()).expect("install");
            assert!(second.is_none());
            (getppid_errno(), getppid_errno())
        });
        let fd = rx.recv().expect("listener");
        let mut n = Notifier::new(fd).expect("notifier");
        let counts = shared_counters(4).expect("counters");
        for _ in 0..2 {
            let got = n.receive().expect("receive");
            assert_eq!(i64::from(got.nr), libc::SYS_getppid);
            assert!(got.pid > 0);
            counts[0].fetch_add(1, Ordering::Relaxed);
            n.deny(got.id, libc::EPERM).expect("deny");
        }
        assert_eq!(confined.join().expect("thread"), (libc::EPERM, libc::EPERM));
        assert_eq!(counts[0].load(Ordering::Relaxed), 2);
        assert_eq!(counts[3].load(Ordering::Relaxed), 0);
    }

    #[test]
    fn without_a_listener_the_kernel_answers_enosys() {
        let confined = std::thread::spawn(|| {
            no_new_privs();
            let fd = install_filter_with_listener(&notify_getppid())
                .expect("install")
                .expect("no listener yet");
            drop(fd);
            getppid_errno()
        });
        assert_eq!(confined.join().expect("thread"), libc::ENOSYS);
    }

    #[test]
    fn a_serving_thread_blocks_signals() {
        let blocked = std::thread::spawn(|| {
            block_signals_in_this_thread().expect("block");
            // SAFETY: reads this thread's mask into a set on our stack.
            unsafe {
                let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
                libc::sigemptyset(set.as_mut_ptr());
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), set.as_mut_ptr());
                [libc::SIGTERM, libc::SIGCHLD, libc::SIGINT]
                    .map(|sig| libc::sigismember(set.as_ptr(), sig) == 1)
            }
        })
        .join()
        .expect("thread");
        assert_eq!(blocked, [true; 3]);
    }

    #[test]
    fn shared_counters_are_shared_with_a_forked_child() {
        let counts = shared_counters(2).expect("counters");
        // SAFETY: the child only does an atomic add and _exit, both
        // async-signal-safe in a multi-threaded parent.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            counts[1].fetch_add(7, Ordering::Relaxed);
            // SAFETY: ends the child at once, running no destructors.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, writing its status.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(rc, pid);
        assert_eq!(counts[1].load(Ordering::Relaxed), 7);
        assert!(shared_counters(0).is_err());
    }
}
