//! Raw system calls with fixed arguments, to see what a seccomp policy (or
//! the kernel) answers from inside a sandbox. Every argument is an integer,
//! a descriptor the probe opens itself, or NULL, so no call can read or
//! write memory of this process; each variant says why its call does
//! nothing beyond answering. Built only with the `probe` feature.

use std::ptr::null;

/// The namespace flags of clone(2) and unshare(2): CLONE_NEWNS,
/// NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
const CLONE_NAMESPACES: u64 = 0x7E02_0000;
/// CLONE_NEWTIME (unshare only: in clone's flags 0x80 is the exit signal).
const CLONE_NEWTIME: u64 = 0x80;
const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
const BPF_MAP_CREATE: libc::c_long = 0;
const UFFD_USER_MODE_ONLY: libc::c_long = 1;
const SYSLOG_ACTION_SIZE_BUFFER: libc::c_long = 10;
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const TCGETS: u64 = 0x5401;
/// A system call number no kernel assigns (Linux 6.18 ends below 480).
const UNASSIGNED: libc::c_long = 1000;

/// An ioctl request for [`ProbeSyscall::IoctlDevNull`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoctlRequest {
    /// TIOCSTI: push a character into a terminal's input.
    Tiocsti,
    /// TIOCSTI with bit 32 set: the kernel reads the request as an
    /// unsigned int, so this is TIOCSTI to it, but not to a filter that
    /// compares 64 bits.
    TiocstiHighBits,
    /// TIOCLINUX: console selection and paste.
    Tioclinux,
    /// TCGETS: read terminal attributes (what `isatty` does).
    Tcgets,
}

/// A system call with a fixed, memory-safe set of arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeSyscall {
    /// getpid(): no arguments.
    Getpid,
    /// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0): the id
    /// of the session keyring, without creating one; only integers.
    KeyctlSessionKeyringId,
    /// add_key(NULL, NULL, NULL, 0, KEY_SPEC_SESSION_KEYRING): the kernel
    /// fails reading the NULL type (EFAULT) before adding anything.
    AddKeyNull,
    /// request_key(NULL, NULL, NULL, 0): EFAULT on the NULL type before
    /// any lookup or upcall.
    RequestKeyNull,
    /// bpf(BPF_MAP_CREATE, NULL, 0): an all-zero attribute block (size 0
    /// copies nothing) names map type 0, which does not exist (EINVAL).
    BpfMapCreateEmpty,
    /// perf_event_open(NULL, 0, -1, -1, 0): EFAULT reading the NULL
    /// attributes before any event is made.
    PerfEventOpenNull,
    /// userfaultfd(O_CLOEXEC | UFFD_USER_MODE_ONLY): a descriptor that
    /// registers no memory, closed at once; user-mode-only so that an
    /// unprivileged caller gets one too (vm.unprivileged_userfaultfd=0
    /// allows that mode).
    UserfaultfdUserMode,
    /// io_uring_setup(1, NULL): EFAULT reading the NULL parameters
    /// before any ring exists.
    IoUringSetupNull,
    /// io_uring_enter(-1, 0, 0, 0, NULL, 0): EBADF.
    IoUringEnterBadFd,
    /// io_uring_register(-1, 0, NULL, 0): EBADF.
    IoUringRegisterBadFd,
    /// unshare(flags) for namespace flags only (CLONE_NEW*, CLONE_NEWTIME;
    /// 0 is a no-op): moves the caller into new namespaces, which changes
    /// no memory nor the fd table. Other flags: EINVAL without a call.
    Unshare(u64),
    /// clone(flags | SIGCHLD, NULL, NULL, NULL, 0) for namespace flags only
    /// (or 0): without CLONE_VM this is a fork, and the child exits at
    /// once (`_exit`, async-signal-safe) while the probe reaps it; all
    /// pointer arguments are NULL, so their order (which differs between
    /// x86_64 and aarch64) does not matter. Answers the child's pid.
    /// Other flags: EINVAL without a call.
    Clone(u64),
    /// clone3(NULL, 0): a size below the smallest `clone_args` is EINVAL
    /// before the kernel reads anything.
    Clone3Null,
    /// ptrace(PTRACE_SEIZE, pid, 0, 0); if that succeeds,
    /// PTRACE_INTERRUPT, a wait for the stop, and PTRACE_DETACH: the
    /// tracee stops for a moment and runs on. Only integers and a status
    /// word of the probe's own.
    PtraceSeize(i32),
    /// kexec_load(0, 17, NULL, flags with an undefined bit and a foreign
    /// architecture): refused (EPERM, or EINVAL for the flags and the
    /// 17 segments, one more than the kernel takes) before any segment
    /// is read; never nr_segments 0, which would unload a loaded kernel.
    KexecLoadInvalid,
    /// kexec_file_load(-1, -1, 0, NULL, an undefined flag): EINVAL or
    /// EBADF; never KEXEC_FILE_UNLOAD.
    KexecFileLoadInvalid,
    /// init_module(NULL, 0, NULL): a module image shorter than an ELF
    /// header is ENOEXEC before anything is copied.
    InitModuleNull,
    /// finit_module(-1, NULL, 0): EBADF.
    FinitModuleBadFd,
    /// delete_module(NULL, 0): EFAULT reading the NULL name.
    DeleteModuleNull,
    /// open_by_handle_at(-1, NULL, O_RDONLY): EBADF or EFAULT.
    OpenByHandleAtNull,
    /// mount(NULL, NULL, NULL, 0, NULL): EFAULT on the NULL target.
    MountNull,
    /// umount2(NULL, 0): EFAULT on the NULL target.
    Umount2Null,
    /// pivot_root(NULL, NULL): EFAULT.
    PivotRootNull,
    /// setns(-1, 0): EBADF.
    SetnsBadFd,
    /// fsopen(NULL, 0): EFAULT on the NULL file system name.
    FsopenNull,
    /// open_tree(-1, NULL, 0): EFAULT or EBADF.
    OpenTreeNull,
    /// swapoff(NULL): EFAULT on the NULL path.
    SwapoffNull,
    /// reboot(0, 0, 0, NULL): wrong magic numbers are EINVAL right after
    /// the capability check, before any action.
    RebootBadMagic,
    /// clock_settime(CLOCK_REALTIME, NULL): EFAULT reading the NULL time.
    ClockSettimeNull,
    /// syslog(SYSLOG_ACTION_SIZE_BUFFER, NULL, 0): the size of the kernel
    /// log buffer; reads nothing, clears nothing.
    SyslogSizeBuffer,
    /// socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0), closed at once; the
    /// domain is passed as all 64 bits (the kernel reads an int). The
    /// kernel may load the family's module. Answers 0.
    Socket(u64),
    /// ioctl(fd, request, NULL) on /dev/null, which the probe opens and
    /// closes: /dev/null has no terminal ioctls (ENOTTY).
    IoctlDevNull(IoctlRequest),
    /// personality(persona): changes the caller's execution domain (and
    /// that of programs it execs) when the value is valid; no memory.
    Personality(u32),
    /// seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER,
    /// a static one-instruction program that allows every call): what a
    /// program that wants its own seccomp listener does. Where it is
    /// installed it changes nothing the caller may do; the listener's
    /// descriptor is closed at once. EBUSY where the caller's filter
    /// chain has a listener already.
    SeccompListenerAllowAll,
    /// System call number 1000, which no kernel assigns, with zero
    /// arguments: ENOSYS from the kernel.
    Unassigned,
    /// getpid through the 32-bit `int 0x80` entry (x86_64 only): a foreign
    /// ABI for a 64-bit filter. No memory arguments.
    #[cfg(target_arch = "x86_64")]
    Int80Getpid,
}

/// The raw return of `libc::syscall` as a result.
fn check(rc: libc::c_long) -> std::io::Result<i64> {
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn einval() -> std::io::Result<i64> {
    Err(std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// Makes the system call `which` describes and returns what the kernel
/// (or a seccomp filter) answered: the return value, or the errno.
pub fn try_syscall(which: ProbeSyscall) -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    match which {
        // SAFETY: no arguments.
        ProbeSyscall::Getpid => check(unsafe { libc::syscall(libc::SYS_getpid) }),
        ProbeSyscall::KeyctlSessionKeyringId => check(
            // SAFETY: integers only (see the variant).
            unsafe {
                libc::syscall(
                    libc::SYS_keyctl,
                    KEYCTL_GET_KEYRING_ID,
                    KEY_SPEC_SESSION_KEYRING,
                    0 as libc::c_long,
                )
            },
        ),
        ProbeSyscall::AddKeyNull => check(
            // SAFETY: NULL pointers, which the kernel refuses with EFAULT.
            unsafe {
                libc::syscall(
                    libc::SYS_add_key,
                    none,
                    none,
                    none,
                    0 as libc::size_t,
                    KEY_SPEC_SESSION_KEYRING,
                )
            },
        ),
        ProbeSyscall::RequestKeyNull => check(
            // SAFETY: NULL pointers (EFAULT) and an integer.
            unsafe { libc::syscall(libc::SYS_request_key, none, none, none, 0 as libc::c_long) },
        ),
        ProbeSyscall::BpfMapCreateEmpty => check(
            // SAFETY: a NULL attribute pointer with size 0: nothing is read.
            unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_CREATE, none, 0 as libc::c_uint) },
        ),
        ProbeSyscall::PerfEventOpenNull => check(
            // SAFETY: a NULL attribute pointer (EFAULT) and integers.
            unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    none,
                    0 as libc::pid_t,
                    -1 as libc::c_int,
                    -1 as libc::c_int,
                    0 as libc::c_ulong,
                )
            },
        ),
        ProbeSyscall::UserfaultfdUserMode => userfaultfd_user_mode(),
        ProbeSyscall::IoUringSetupNull => check(
            // SAFETY: a NULL parameter pointer (EFAULT).
            unsafe { libc::syscall(libc::SYS_io_uring_setup, 1 as libc::c_uint, none) },
        ),
        ProbeSyscall::IoUringEnterBadFd => check(
            // SAFETY: an invalid descriptor (EBADF), integers and NULL.
            unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    -1 as libc::c_int,
                    0 as libc::c_uint,
                    0 as libc::c_uint,
                    0 as libc::c_uint,
                    none,
                    0 as libc::size_t,
                )
            },
        ),
        ProbeSyscall::IoUringRegisterBadFd => check(
            // SAFETY: an invalid descriptor (EBADF), integers and NULL.
            unsafe {
                libc::syscall(
                    libc::SYS_io_uring_register,
                    -1 as libc::c_int,
                    0 as libc::c_uint,
                    none,
                    0 as libc::c_uint,
                )
            },
        ),
        ProbeSyscall::Unshare(flags) => unshare(flags),
        ProbeSyscall::Clone(flags) => clone_fork(flags),
        ProbeSyscall::Clone3Null => check(
            // SAFETY: NULL with size 0 is refused before anything is read.
            unsafe { libc::syscall(libc::SYS_clone3, none, 0 as libc::size_t) },
        ),
        ProbeSyscall::PtraceSeize(pid) => ptrace_seize(pid),
        ProbeSyscall::KexecLoadInvalid => kexec_load_invalid(),
        ProbeSyscall::KexecFileLoadInvalid => check(
            // SAFETY: invalid descriptors, a NULL command line of length 0
            // and an undefined flag (bit 30; bit 0, unload, is clear).
            unsafe {
                libc::syscall(
                    libc::SYS_kexec_file_load,
                    -1 as libc::c_int,
                    -1 as libc::c_int,
                    0 as libc::c_ulong,
                    none,
                    0x4000_0000 as libc::c_ulong,
                )
            },
        ),
        ProbeSyscall::InitModuleNull => check(
            // SAFETY: a NULL image of length 0 (ENOEXEC) and NULL options.
            unsafe { libc::syscall(libc::SYS_init_module, none, 0 as libc::c_ulong, none) },
        ),
        ProbeSyscall::FinitModuleBadFd => check(
            // SAFETY: an invalid descriptor (EBADF) and NULL options.
            unsafe {
                libc::syscall(
                    libc::SYS_finit_module,
                    -1 as libc::c_int,
                    none,
                    0 as libc::c_int,
                )
            },
        ),
        ProbeSyscall::DeleteModuleNull => check(
            // SAFETY: a NULL name (EFAULT).
            unsafe { libc::syscall(libc::SYS_delete_module, none, 0 as libc::c_uint) },
        ),
        ProbeSyscall::OpenByHandleAtNull => open_by_handle_at_null(),
        ProbeSyscall::MountNull => check(
            // SAFETY: NULL strings and data; the NULL target is EFAULT.
            unsafe { libc::syscall(libc::SYS_mount, none, none, none, 0 as libc::c_ulong, none) },
        ),
        ProbeSyscall::Umount2Null => check(
            // SAFETY: a NULL target (EFAULT).
            unsafe { libc::syscall(libc::SYS_umount2, none, 0 as libc::c_int) },
        ),
        ProbeSyscall::PivotRootNull => check(
            // SAFETY: NULL paths (EFAULT).
            unsafe { libc::syscall(libc::SYS_pivot_root, none, none) },
        ),
        ProbeSyscall::SetnsBadFd => check(
            // SAFETY: an invalid descriptor (EBADF).
            unsafe { libc::syscall(libc::SYS_setns, -1 as libc::c_int, 0 as libc::c_int) },
        ),
        ProbeSyscall::FsopenNull => fsopen_null(),
        ProbeSyscall::OpenTreeNull => open_tree_null(),
        ProbeSyscall::SwapoffNull => check(
            // SAFETY: a NULL path (EFAULT).
            unsafe { libc::syscall(libc::SYS_swapoff, none) },
        ),
        ProbeSyscall::RebootBadMagic => check(
            // SAFETY: integers and NULL; wrong magic numbers.
            unsafe {
                libc::syscall(
                    libc::SYS_reboot,
                    0 as libc::c_int,
                    0 as libc::c_int,
                    0 as libc::c_uint,
                    none,
                )
            },
        ),
        ProbeSyscall::ClockSettimeNull => check(
            // SAFETY: a NULL time (EFAULT).
            unsafe { libc::syscall(libc::SYS_clock_settime, libc::CLOCK_REALTIME, none) },
        ),
        ProbeSyscall::SyslogSizeBuffer => check(
            // SAFETY: a NULL buffer of length 0; this action reads nothing.
            unsafe {
                libc::syscall(
                    libc::SYS_syslog,
                    SYSLOG_ACTION_SIZE_BUFFER,
                    none,
                    0 as libc::c_int,
                )
            },
        ),
        ProbeSyscall::Socket(domain) => socket(domain),
        ProbeSyscall::IoctlDevNull(request) => ioctl_dev_null(request),
        ProbeSyscall::Personality(persona) => check(
            // SAFETY: an integer.
            unsafe { libc::syscall(libc::SYS_personality, persona as libc::c_ulong) },
        ),
        ProbeSyscall::SeccompListenerAllowAll => seccomp_listener_allow_all(),
        ProbeSyscall::Unassigned => check(
            // SAFETY: no arguments; no kernel implements this number.
            unsafe { libc::syscall(UNASSIGNED) },
        ),
        #[cfg(target_arch = "x86_64")]
        ProbeSyscall::Int80Getpid => int80_getpid(),
    }
}

/// [`ProbeSyscall::UserfaultfdUserMode`].
fn userfaultfd_user_mode() -> std::io::Result<i64> {
    let flags = libc::c_long::from(libc::O_CLOEXEC) | UFFD_USER_MODE_ONLY;
    // SAFETY: integer flags; the descriptor is closed below.
    let fd = check(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    close_raw(fd);
    Ok(0)
}

/// [`ProbeSyscall::Unshare`].
fn unshare(flags: u64) -> std::io::Result<i64> {
    if flags & !(CLONE_NAMESPACES | CLONE_NEWTIME) != 0 {
        return einval();
    }
    // SAFETY: namespace flags only (checked above): they change
    // which namespaces later calls act in, not memory or the fd
    // table that Rust code holds.
    check(unsafe { libc::syscall(libc::SYS_unshare, flags as libc::c_ulong) })
}

/// [`ProbeSyscall::Clone`].
fn clone_fork(flags: u64) -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    if flags & !CLONE_NAMESPACES != 0 {
        return einval();
    }
    let flags = flags | libc::SIGCHLD as u64;
    // SAFETY: no CLONE_VM, CLONE_THREAD, CLONE_SETTLS or *_TID
    // flag (checked above), so this is a fork: the child gets a
    // copy of memory and, with the NULL stack, goes on on its copy
    // of this stack. It only calls `_exit`, which is
    // async-signal-safe, so even a copy of a multi-threaded
    // process's state is never used.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            none,
            none,
            none,
            0 as libc::c_ulong,
        )
    };
    if pid == 0 {
        // SAFETY: in the forked child: end it at once, running no
        // handler of the parent's state.
        unsafe { libc::_exit(0) }
    }
    let pid = check(pid)?;
    let Ok(child) = libc::pid_t::try_from(pid) else {
        return Ok(pid);
    };
    let mut status: libc::c_int = 0;
    // SAFETY: waits for our own child; `status` is a local word.
    unsafe { libc::waitpid(child, &mut status, libc::__WALL) };
    Ok(pid)
}

/// [`ProbeSyscall::PtraceSeize`].
fn ptrace_seize(pid: i32) -> std::io::Result<i64> {
    if pid <= 0 {
        return einval();
    }
    // SAFETY: integer arguments only (addr and data are 0).
    let seize = unsafe {
        libc::syscall(
            libc::SYS_ptrace,
            libc::PTRACE_SEIZE,
            pid,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    check(seize)?;
    // SAFETY: integers only; the tracee is ours since the seize.
    unsafe {
        libc::syscall(
            libc::SYS_ptrace,
            libc::PTRACE_INTERRUPT,
            pid,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    let mut status: libc::c_int = 0;
    // SAFETY: waits for the tracee's stop; `status` is a local word.
    unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    // SAFETY: integers only: detach, delivering no signal.
    unsafe {
        libc::syscall(
            libc::SYS_ptrace,
            libc::PTRACE_DETACH,
            pid,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    Ok(0)
}

/// [`ProbeSyscall::KexecLoadInvalid`].
fn kexec_load_invalid() -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    // An undefined flag (0x80) in a foreign architecture field.
    let flags: libc::c_ulong = 0x7f00_0080;
    check(
        // SAFETY: NULL segments with a count the kernel refuses
        // before reading them; integers otherwise.
        unsafe {
            libc::syscall(
                libc::SYS_kexec_load,
                0 as libc::c_ulong,
                17 as libc::c_ulong,
                none,
                flags,
            )
        },
    )
}

/// [`ProbeSyscall::OpenByHandleAtNull`].
fn open_by_handle_at_null() -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    // SAFETY: an invalid descriptor and a NULL handle.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            -1 as libc::c_int,
            none,
            libc::O_RDONLY,
        )
    };
    let fd = check(rc)?;
    close_raw(fd);
    Ok(0)
}

/// [`ProbeSyscall::FsopenNull`].
fn fsopen_null() -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    // SAFETY: a NULL file system name (EFAULT).
    let fd = check(unsafe { libc::syscall(libc::SYS_fsopen, none, 0 as libc::c_uint) })?;
    close_raw(fd);
    Ok(0)
}

/// [`ProbeSyscall::OpenTreeNull`].
fn open_tree_null() -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    // SAFETY: an invalid descriptor and a NULL path.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            -1 as libc::c_int,
            none,
            0 as libc::c_uint,
        )
    })?;
    close_raw(fd);
    Ok(0)
}

/// [`ProbeSyscall::Socket`].
fn socket(domain: u64) -> std::io::Result<i64> {
    // SAFETY: integers only; the socket is closed below.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_socket,
            domain as libc::c_ulong,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0 as libc::c_int,
        )
    })?;
    close_raw(fd);
    Ok(0)
}

/// [`ProbeSyscall::IoctlDevNull`].
fn ioctl_dev_null(request: IoctlRequest) -> std::io::Result<i64> {
    let none = null::<libc::c_void>();
    let request = match request {
        IoctlRequest::Tiocsti => TIOCSTI,
        IoctlRequest::TiocstiHighBits => TIOCSTI | 1 << 32,
        IoctlRequest::Tioclinux => TIOCLINUX,
        IoctlRequest::Tcgets => TCGETS,
    };
    let null = std::fs::File::open("/dev/null")?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
    // SAFETY: a descriptor of /dev/null that `null` keeps open, a
    // terminal request that /dev/null does not implement, and a
    // NULL argument.
    check(unsafe { libc::syscall(libc::SYS_ioctl, fd, request as libc::c_ulong, none) })
}

/// [`ProbeSyscall::SeccompListenerAllowAll`].
fn seccomp_listener_allow_all() -> std::io::Result<i64> {
    static ALLOW_ALL: [libc::sock_filter; 1] = [libc::sock_filter {
        code: 0x06, // ret #k
        jt: 0,
        jf: 0,
        k: 0x7fff_0000, // SECCOMP_RET_ALLOW
    }];
    let fprog = libc::sock_fprog {
        len: 1,
        filter: ALLOW_ALL.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at a static one-instruction program,
    // which the kernel copies and never writes through.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    let answer = check(rc);
    if let Some(fd) = answer
        .as_ref()
        .ok()
        .and_then(|fd| libc::c_int::try_from(*fd).ok())
    {
        // SAFETY: closes the listener the kernel just returned
        // to us, which nothing else holds.
        unsafe { libc::close(fd) };
    }
    answer
}

/// [`ProbeSyscall::Int80Getpid`].
#[cfg(target_arch = "x86_64")]
fn int80_getpid() -> std::io::Result<i64> {
    // 20 is getpid in the 32-bit table.
    let mut rax: i64 = 20;
    // SAFETY: the 32-bit entry runs getpid, which takes no
    // arguments and touches no memory; it answers in eax, and
    // the registers it may clear on older kernels (r8 to r11)
    // are declared clobbered.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inout("rax") rax,
            lateout("r8") _,
            lateout("r9") _,
            lateout("r10") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    // The 32-bit entry answers in eax: a negative errno or the pid.
    let [a, b, c, d, ..] = rax.to_le_bytes();
    let value = i32::from_le_bytes([a, b, c, d]);
    if value < 0 {
        Err(std::io::Error::from_raw_os_error(-value))
    } else {
        Ok(i64::from(value))
    }
}

/// Closes a descriptor a probe made.
fn close_raw(fd: i64) {
    if let Ok(fd) = libc::c_int::try_from(fd) {
        // SAFETY: `fd` was just returned by the kernel to this probe and
        // nothing else owns it.
        unsafe { libc::close(fd) };
    }
}
