//! Whether unprivileged user namespaces work here, and the knobs that
//! decide it (max_user_namespaces, Debian's and AppArmor's switches).

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::Path;

use rustix::io::Errno;
use rustix::thread::UnshareFlags;

use super::child::{run_child, ChildVerdict};
use super::{errno_text, io_text, read_trimmed, Check, CHILD_ARG, FIX_BROKEN_CHILD};

const MAX_USERNS: &str = "/proc/sys/user/max_user_namespaces";

const USERNS_CLONE: &str = "/proc/sys/kernel/unprivileged_userns_clone";

const APPARMOR_USERNS: &str = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns";

/// The sysctls that decide whether unprivileged user namespaces are allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct UsernsKnobs {
    /// `user.max_user_namespaces` (None: unreadable).
    pub(super) max: Option<i64>,
    /// `kernel.unprivileged_userns_clone` (Debian/Ubuntu patch; None: absent).
    pub(super) clone: Option<i64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10+; None: absent).
    pub(super) apparmor: Option<i64>,
}

impl UsernsKnobs {
    pub(super) fn read() -> Self {
        let num = |p: &str| read_trimmed(p).and_then(|s| s.parse::<i64>().ok());
        Self {
            max: num(MAX_USERNS),
            clone: num(USERNS_CLONE),
            apparmor: num(APPARMOR_USERNS),
        }
    }

    pub(super) fn describe(&self) -> String {
        let show = |v: Option<i64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
        let mut text = format!("user.max_user_namespaces={}", show(self.max));
        if let Some(v) = self.clone {
            let _ = write!(text, ", kernel.unprivileged_userns_clone={v}");
        }
        if let Some(v) = self.apparmor {
            let _ = write!(text, ", kernel.apparmor_restrict_unprivileged_userns={v}");
        }
        text
    }

    /// Whether a sysctl refuses user namespaces to users without privileges.
    pub(super) fn restricts_unprivileged(&self) -> bool {
        self.max == Some(0) || self.clone == Some(0) || self.apparmor == Some(1)
    }

    /// What to run to allow unprivileged user namespaces, given the knob values.
    pub(super) fn fix(&self) -> String {
        let mut steps = Vec::new();
        if self.max == Some(0) {
            steps.push("sysctl -w user.max_user_namespaces=15000".to_owned());
        }
        if self.clone == Some(0) {
            steps.push("sysctl -w kernel.unprivileged_userns_clone=1".to_owned());
        }
        if self.apparmor == Some(1) {
            steps.push(
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 \
                 (or give sifbox an AppArmor profile that allows `userns,`)"
                    .to_owned(),
            );
        }
        if steps.is_empty() {
            return "the sysctls allow user namespaces (user.max_user_namespaces > 0, \
                    kernel.unprivileged_userns_clone=1, \
                    kernel.apparmor_restrict_unprivileged_userns=0), so something else \
                    blocks unshare(CLONE_NEWUSER): a seccomp filter or LSM (inside Docker: \
                    `docker run --security-opt seccomp=unconfined`), a nesting limit, or a kernel \
                    built without CONFIG_USER_NS"
                .to_owned();
        }
        format!(
            "as root: {}; persist it in /etc/sysctl.d/99-userns.conf",
            steps.join(" && ")
        )
    }
}

pub(super) fn check_user_namespaces(self_exe: &Path) -> Check {
    const NAME: &str = "user namespaces";
    let knobs = UsernsKnobs::read();
    match run_child(self_exe, "userns").verdict {
        ChildVerdict::Works(note) => {
            let mut detail = if note.is_empty() {
                "works".to_owned()
            } else {
                note
            };
            let _ = write!(detail, "; {}", knobs.describe());
            if rustix::process::geteuid().is_root() && knobs.restricts_unprivileged() {
                detail.push_str("; tested as root: other users are refused");
            }
            Check::ok(NAME, detail)
        }
        ChildVerdict::Refused(why) => {
            Check::fail(NAME, format!("{why}; {}", knobs.describe()), knobs.fix())
        }
        ChildVerdict::Broken(why) => Check::fail(
            NAME,
            format!("{why}; {}", knobs.describe()),
            FIX_BROKEN_CHILD,
        ),
    }
}

/// `sifbox __doctor-child userns`.
pub(super) fn child_userns() -> Result<String, String> {
    let euid = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    unshare(UnshareFlags::NEWUSER, "CLONE_NEWUSER")?;
    map_self(euid, egid)?;
    Ok(format!("works (uid {euid} and gid {egid} mapped to 0)"))
}

/// `unshare(2)` with an error text that says what probably blocked it.
pub(super) fn unshare(flags: UnshareFlags, what: &str) -> Result<(), String> {
    sifbox_sys::unshare_namespaces(flags).map_err(|e| {
        let e = Errno::from_io_error(&e).unwrap_or(Errno::INVAL);
        let hint = match e {
            Errno::PERM => "; unprivileged user namespaces are disabled (sysctl), or blocked by \
                 AppArmor, seccomp or a container runtime"
                .to_owned(),
            Errno::NOSPC => "; the user.max_user_namespaces limit is reached or 0".to_owned(),
            Errno::USERS => "; user namespaces are nested too deeply".to_owned(),
            Errno::INVAL => match thread_count() {
                Some(n) if n > 1 => format!(
                    "; this process has {n} threads and unshare(CLONE_NEWUSER) needs one \
                     (run `sifbox {CHILD_ARG}` before anything starts threads)"
                ),
                _ => "; the kernel may lack CONFIG_USER_NS".to_owned(),
            },
            _ => String::new(),
        };
        format!("unshare({what}): {}{hint}", errno_text(e))
    })
}

/// Writes this process's own single-id maps: euid -> 0 and egid -> 0.
pub(super) fn map_self(euid: u32, egid: u32) -> Result<(), String> {
    // Without CAP_SETGID in the parent namespace, setgroups must be denied before
    // gid_map may be written (absent before Linux 3.19).
    if Path::new("/proc/self/setgroups").exists() {
        write_proc("/proc/self/setgroups", "deny")?;
    }
    write_proc("/proc/self/uid_map", &format!("0 {euid} 1\n"))?;
    write_proc("/proc/self/gid_map", &format!("0 {egid} 1\n"))?;
    if !rustix::process::geteuid().is_root() {
        return Err(format!(
            "after writing uid_map the euid is {}, not 0",
            rustix::process::geteuid().as_raw()
        ));
    }
    Ok(())
}

/// Writes `content` to a /proc file in one write, opening it only now.
fn write_proc(path: &str, content: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("open {path}: {}", io_text(&e)))?;
    file.write_all(content.as_bytes())
        .map_err(|e| format!("write {:?} to {path}: {}", content.trim_end(), io_text(&e)))
}

fn thread_count() -> Option<usize> {
    sifbox_sys::thread_count().ok()
}
