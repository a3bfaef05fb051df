//! `sifbox doctor`: what this host allows, and what to do about what it does not.
//!
//! Every check is bounded in time and never panics: a failure to look something up
//! becomes `ok = false` with the error in `detail`. Checks that must create
//! namespaces run the sifbox binary itself as a child (`sifbox __doctor-child KIND`),
//! because `unshare(CLONE_NEWUSER)` needs a fresh single-threaded process and
//! because a namespace (and every mount in it) should vanish with the process that
//! made it, leaving the caller untouched.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{ErrorKind, Read, Write as _};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::thread::UnshareFlags;

/// The hidden CLI argument that turns the sifbox binary into a doctor child.
pub const CHILD_ARG: &str = "__doctor-child";

/// How long a namespace child may run before it is killed.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `apptainer --version` may run before it is killed.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The fix when a doctor child could not do its test at all.
const FIX_BROKEN_CHILD: &str = "the test could not run: doctor re-runs the sifbox binary \
    as `sifbox __doctor-child KIND` (before anything starts threads); run it from a complete \
    sifbox install, and if it hangs, look for a hung file system under TMPDIR";
/// Longest path a Unix socket address can hold (`sun_path` is 108 bytes with the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// The outcome of one check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// Stable name of the check ("user namespaces", "cgroup delegation", ...).
    pub name: &'static str,
    /// Whether this host allows it.
    pub ok: bool,
    /// What was found (one line).
    pub detail: String,
    /// What to do about it; `None` when there is nothing to do.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            ok: true,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Runs every check. `self_exe` is the sifbox binary; checks that must create
/// namespaces run it as a child: `self_exe __doctor-child KIND` (KIND = "userns" |
/// "overlay"), because namespaces must be created in a fresh single-threaded process.
#[must_use]
pub fn run_checks(self_exe: &Path) -> Vec<Check> {
    let userns = check_user_namespaces(self_exe);
    let userns_ok = userns.ok;
    vec![
        check_kernel(),
        userns,
        check_subordinate_ids(),
        check_overlay(self_exe, userns_ok),
        check_cgroups(),
    ]
    .into_iter()
    .chain(limit_checks(&limits_plan(), kernel_version()))
    .chain([check_storage(crate::disk::unavailable())])
    .chain([check_dev_fuse(), check_runtime_dir(), check_apptainer()])
    .collect()
}

/// Entry point of `sifbox __doctor-child KIND`; returns the process exit code:
/// 0 works, 1 does not (printing one line on stderr saying why), 2 unknown kind.
///
/// On success a one-line note may be printed on stdout; the parent shows it.
pub fn child_main(kind: &str) -> i32 {
    let result = match kind {
        "userns" => child_userns(),
        "overlay" => child_overlay(),
        other => {
            eprintln!("unknown doctor check {other:?} (expected \"userns\" or \"overlay\")");
            return 2;
        }
    };
    match result {
        Ok(note) => {
            if !note.is_empty() {
                println!("{}", one_line(&note));
            }
            0
        }
        Err(why) => {
            eprintln!("{}", one_line(&why));
            1
        }
    }
}

/// Human table: one line per check: "  ok   NAME  detail" or
/// "  FAIL NAME  detail\n         fix: ..." (plain ASCII, aligned).
#[must_use]
pub fn render_text(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for check in checks {
        let status = if check.ok { "ok  " } else { "FAIL" };
        let _ = writeln!(
            out,
            "  {status} {:<width$}  {}",
            check.name,
            one_line(&check.detail)
        );
        if let Some(fix) = &check.fix {
            let mut lines = fix.lines().map(one_line).filter(|l| !l.trim().is_empty());
            if let Some(first) = lines.next() {
                let _ = writeln!(out, "         fix: {first}");
            }
            for more in lines {
                let _ = writeln!(out, "              {more}");
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// kernel

fn check_kernel() -> Check {
    let uname = rustix::system::uname();
    Check::ok("kernel", uname.release().to_string_lossy().into_owned())
}

// ---------------------------------------------------------------------------
// user namespaces

const MAX_USERNS: &str = "/proc/sys/user/max_user_namespaces";
const USERNS_CLONE: &str = "/proc/sys/kernel/unprivileged_userns_clone";
const APPARMOR_USERNS: &str = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns";

/// The sysctls that decide whether unprivileged user namespaces are allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct UsernsKnobs {
    /// `user.max_user_namespaces` (None: unreadable).
    max: Option<i64>,
    /// `kernel.unprivileged_userns_clone` (Debian/Ubuntu patch; None: absent).
    clone: Option<i64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10+; None: absent).
    apparmor: Option<i64>,
}

impl UsernsKnobs {
    fn read() -> Self {
        let num = |p: &str| read_trimmed(p).and_then(|s| s.parse::<i64>().ok());
        Self {
            max: num(MAX_USERNS),
            clone: num(USERNS_CLONE),
            apparmor: num(APPARMOR_USERNS),
        }
    }

    fn describe(&self) -> String {
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
    fn restricts_unprivileged(&self) -> bool {
        self.max == Some(0) || self.clone == Some(0) || self.apparmor == Some(1)
    }

    /// What to run to allow unprivileged user namespaces, given the knob values.
    fn fix(&self) -> String {
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
                    --security-opt seccomp=unconfined), a nesting limit, or a kernel \
                    built without CONFIG_USER_NS"
                .to_owned();
        }
        format!(
            "as root: {}; persist it in /etc/sysctl.d/99-userns.conf",
            steps.join(" && ")
        )
    }
}

fn check_user_namespaces(self_exe: &Path) -> Check {
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
fn child_userns() -> Result<String, String> {
    let euid = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    unshare(UnshareFlags::NEWUSER, "CLONE_NEWUSER")?;
    map_self(euid, egid)?;
    Ok(format!("works (uid {euid} and gid {egid} mapped to 0)"))
}

/// `unshare(2)` with an error text that says what probably blocked it.
fn unshare(flags: UnshareFlags, what: &str) -> Result<(), String> {
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
fn map_self(euid: u32, egid: u32) -> Result<(), String> {
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

// ---------------------------------------------------------------------------
// subordinate ids

/// How an id-map helper gets its privilege.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HelperPrivilege {
    Setuid,
    FileCaps,
    /// Neither setuid nor file capabilities: it cannot map ranges for a normal user.
    None,
    /// Capabilities could not be read (no xattr support); assume it works.
    Unknown,
}

fn helper_privilege(path: &Path, meta: &fs::Metadata) -> HelperPrivilege {
    if meta.mode() & 0o4000 != 0 && meta.uid() == 0 {
        return HelperPrivilege::Setuid;
    }
    let mut buf = [0u8; 64];
    match rustix::fs::getxattr(path, "security.capability", &mut buf[..]) {
        Ok(n) if n > 0 => HelperPrivilege::FileCaps,
        Ok(_) | Err(Errno::NODATA) => HelperPrivilege::None,
        Err(_) => HelperPrivilege::Unknown,
    }
}

fn check_subordinate_ids() -> Check {
    const NAME: &str = "subordinate ids";
    let euid = rustix::process::geteuid().as_raw();
    let name = fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| crate::idmap::passwd_name(&t, euid));
    let who = match &name {
        Some(n) => format!("{n} (uid {euid})"),
        None => format!("uid {euid} (not in /etc/passwd)"),
    };
    let user_arg = name.clone().unwrap_or_else(|| euid.to_string());

    let mut missing = Vec::new();
    let mut found = Vec::new();
    for (file, label) in [("/etc/subuid", "subuid"), ("/etc/subgid", "subgid")] {
        match fs::read_to_string(file) {
            Ok(text) => {
                let ranges = crate::idmap::subranges(&text, name.as_deref(), euid);
                if ranges.is_empty() {
                    missing.push(format!("no range in {file}"));
                } else {
                    let list: Vec<String> = ranges.iter().map(ToString::to_string).collect();
                    found.push(format!("{label} {}", list.join(", ")));
                }
            }
            Err(e) => missing.push(format!("{file}: {}", io_text(&e))),
        }
    }

    let mut helpers = Vec::new();
    let mut helper_problem = Vec::new();
    for tool in ["newuidmap", "newgidmap"] {
        match find_executable(tool, &[Path::new("/usr/bin")]) {
            Some((path, meta)) => {
                let how = match helper_privilege(&path, &meta) {
                    HelperPrivilege::Setuid => "setuid",
                    HelperPrivilege::FileCaps => "file capabilities",
                    HelperPrivilege::Unknown => "present",
                    HelperPrivilege::None => {
                        helper_problem.push(format!(
                            "{} is neither setuid root nor has file capabilities",
                            path.display()
                        ));
                        "not setuid"
                    }
                };
                helpers.push(format!("{tool} {} ({how})", path.display()));
            }
            None => helper_problem.push(format!("{tool} not found on PATH or in /usr/bin")),
        }
    }

    let mut parts = vec![who];
    parts.extend(found);
    parts.extend(missing.iter().cloned());
    parts.extend(helpers);
    parts.extend(helper_problem.iter().cloned());

    if euid == 0 {
        let detail = if missing.is_empty() {
            format!("root can write any id map; {}", parts.join("; "))
        } else {
            "root can write any id map".to_owned()
        };
        return Check::ok(NAME, detail);
    }
    if missing.is_empty() && helper_problem.is_empty() {
        return Check::ok(NAME, parts.join("; "));
    }
    let mut fix = String::from(
        "only `--userns full` (all the image's ids mapped) needs this; `--userns single` \
         works without it.",
    );
    if !missing.is_empty() {
        let _ = write!(
            fix,
            "\nas root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user_arg}"
        );
    }
    if !helper_problem.is_empty() {
        fix.push_str(
            "\ninstall the uidmap package (newuidmap/newgidmap, setuid root): \
             apt-get install uidmap / dnf install shadow-utils",
        );
    }
    Check::fail(NAME, parts.join("; "), fix)
}

// ---------------------------------------------------------------------------
// overlayfs in a user namespace

/// The scratch dir of the overlay child with process id `pid`.
fn overlay_scratch_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("sifbox-doctor-overlay.{pid}"))
}

fn check_overlay(self_exe: &Path, userns_ok: bool) -> Check {
    const NAME: &str = "overlayfs in a user namespace";
    let run = run_child(self_exe, "overlay");
    // The child removes its scratch dir; if it was killed or failed half-way, the
    // mount is gone with its namespace and the parent removes what is left.
    let mut leftover = None;
    if let Some(pid) = run.pid {
        let dir = overlay_scratch_dir(pid);
        if fs::symlink_metadata(&dir).is_ok() {
            if let Err(e) = remove_tree(&dir) {
                leftover = Some(format!(
                    "; could not remove {}: {}",
                    dir.display(),
                    io_text(&e)
                ));
            }
        }
    }
    let leftover = leftover.unwrap_or_default();
    match run.verdict {
        ChildVerdict::Works(note) if leftover.is_empty() => Check::ok(NAME, note),
        ChildVerdict::Works(note) => Check::fail(
            NAME,
            format!("{note}{leftover}"),
            "remove the leftover directory by hand",
        ),
        ChildVerdict::Broken(why) => {
            Check::fail(NAME, format!("{why}{leftover}"), FIX_BROKEN_CHILD)
        }
        ChildVerdict::Refused(why) if !userns_ok => Check::fail(
            NAME,
            format!("{why}{leftover}"),
            "fix \"user namespaces\" first: the sandbox root is an overlay mounted inside one",
        ),
        ChildVerdict::Refused(why) => Check::fail(
            NAME,
            format!("{why}{leftover}"),
            "sandbox roots are overlays (image below, the sandbox's own upper dir above) \
             mounted in a user namespace: that needs Linux 5.11 or newer and an upper dir \
             on a local file system (ext4, xfs, btrfs or tmpfs; not NFS or another \
             overlay): point TMPDIR and SIFBOX_RUNTIME at one",
        ),
    }
}

/// `sifbox __doctor-child overlay`.
fn child_overlay() -> Result<String, String> {
    let euid = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    let base = overlay_scratch_dir(std::process::id());
    // Our pid is ours now: anything under this name is a leftover of a dead process.
    if fs::symlink_metadata(&base).is_ok() {
        remove_tree(&base)
            .map_err(|e| format!("remove stale {}: {}", base.display(), io_text(&e)))?;
    }
    DirBuilder::new()
        .mode(0o700)
        .create(&base)
        .map_err(|e| format!("create {}: {}", base.display(), io_text(&e)))?;
    let result = overlay_in(&base, euid, egid);
    let _ = std::env::set_current_dir("/");
    let cleanup = remove_tree(&base);
    match (result, cleanup) {
        (Ok(note), Ok(())) => Ok(note),
        (Ok(_), Err(e)) => Err(format!(
            "overlay works, but removing {} failed: {}",
            base.display(),
            io_text(&e)
        )),
        (Err(why), _) => Err(why),
    }
}

/// Mounts an overlay from `base/{lower,upper,work}` on `base/merged` in new user and
/// mount namespaces, writes through it, and unmounts it.
fn overlay_in(base: &Path, euid: u32, egid: u32) -> Result<String, String> {
    for sub in ["lower", "upper", "work", "merged"] {
        let dir = base.join(sub);
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("create {}: {}", dir.display(), io_text(&e)))?;
    }
    let lower_file = base.join("lower/from-lower");
    fs::write(&lower_file, b"lower\n")
        .map_err(|e| format!("write {}: {}", lower_file.display(), io_text(&e)))?;
    let fs_name = fs_type_name(base);

    unshare(
        UnshareFlags::NEWUSER | UnshareFlags::NEWNS,
        "CLONE_NEWUSER|CLONE_NEWNS",
    )?;
    map_self(euid, egid)?;
    rustix::mount::mount_change(
        "/",
        rustix::mount::MountPropagationFlags::PRIVATE | rustix::mount::MountPropagationFlags::REC,
    )
    .map_err(|e| format!("make / rprivate: {}", errno_text(e)))?;

    // Relative paths keep the option string free of whatever TMPDIR contains
    // (a ',' or ':' in it would break the option parser).
    std::env::set_current_dir(base)
        .map_err(|e| format!("chdir {}: {}", base.display(), io_text(&e)))?;
    let plain = "lowerdir=lower,upperdir=upper,workdir=work";
    let userxattr = match mount_overlay(plain) {
        Ok(()) => false,
        Err(Errno::INVAL) => {
            mount_overlay(&format!("{plain},userxattr")).map_err(|e| {
                format!(
                    "mount overlay (upper on {fs_name}): EINVAL, and with userxattr: {}{}",
                    errno_text(e),
                    overlay_hint(e, &fs_name)
                )
            })?;
            true
        }
        Err(e) => {
            return Err(format!(
                "mount overlay (upper on {fs_name}): {}{}",
                errno_text(e),
                overlay_hint(e, &fs_name)
            ))
        }
    };

    let probe = write_through(base);
    let unmounted =
        rustix::mount::unmount(base.join("merged"), rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| format!("unmount overlay: {}", errno_text(e)));
    probe?;
    unmounted?;
    Ok(format!(
        "works (upper on {fs_name} under {}{})",
        std::env::temp_dir().display(),
        if userxattr { ", needs userxattr" } else { "" }
    ))
}

fn mount_overlay(options: &str) -> Result<(), Errno> {
    let data = std::ffi::CString::new(options).map_err(|_| Errno::INVAL)?;
    rustix::mount::mount(
        "overlay",
        "merged",
        "overlay",
        rustix::mount::MountFlags::empty(),
        data.as_c_str(),
    )
}

fn overlay_hint(e: Errno, fs_name: &str) -> String {
    match e {
        Errno::PERM => {
            "; this kernel does not allow overlayfs in a user namespace (Linux 5.11+)".to_owned()
        }
        Errno::NODEV => "; the overlay file system is not available (modprobe overlay)".to_owned(),
        Errno::INVAL if matches!(fs_name, "overlayfs" | "nfs" | "fuse" | "9p" | "cifs") => {
            format!("; {fs_name} cannot hold an overlay upper dir: set TMPDIR to a local disk")
        }
        _ => String::new(),
    }
}

/// Writes a file through `base/merged` and checks that it landed in `base/upper`.
fn write_through(base: &Path) -> Result<(), String> {
    let seen = fs::read(base.join("merged/from-lower"))
        .map_err(|e| format!("read lower file through the overlay: {}", io_text(&e)))?;
    if seen != b"lower\n" {
        return Err("the overlay shows the wrong content for a lower file".to_owned());
    }
    let content = b"written through the overlay\n";
    fs::write(base.join("merged/probe"), content)
        .map_err(|e| format!("write through the overlay: {}", io_text(&e)))?;
    match fs::read(base.join("upper/probe")) {
        Ok(bytes) if bytes == content => Ok(()),
        Ok(_) => Err("the file written through the overlay has other content in upper".to_owned()),
        Err(e) => Err(format!(
            "the file written through the overlay is not in the upper dir: {}",
            io_text(&e)
        )),
    }
}

/// Removes a tree without following symlinks, first making directories searchable
/// and writable (overlay leaves `work/work` with mode 000).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    if meta.permissions().mode() & 0o700 != 0o700 {
        let _ = fs::set_permissions(path, Permissions::from_mode(0o700));
    }
    for entry in fs::read_dir(path)? {
        remove_tree(&entry?.path())?;
    }
    fs::remove_dir(path)
}

// ---------------------------------------------------------------------------
// cgroups and resource limits

/// What to do to get a cgroup when the host has cgroup v2.
const FIX_DELEGATE: &str = "sandboxes still run, with the fallbacks below.\nfor \
    kernel-enforced limits, start sifbox in a delegated cgroup: `systemd-run --user --scope \
    -p Delegate=yes sifbox ...`, Delegate=yes in the systemd unit that starts it (login \
    sessions: `systemctl edit user@.service`, [Service] Delegate=memory pids cpu), or name a \
    delegated cgroup in $SIFBOX_CGROUP";
/// What to do on a host with cgroup v1 only (or v2 without controllers).
const FIX_UNIFIED: &str = "sandboxes still run, with the fallbacks below.\nfor \
    kernel-enforced limits, run sifbox as root (cgroup v1 is writable by root only), or boot \
    with the unified cgroup v2 hierarchy (kernel parameter systemd.unified_cgroup_hierarchy=1) \
    and start sifbox in a delegated cgroup: `systemd-run --user --scope -p Delegate=yes sifbox \
    ...`";

fn check_cgroups() -> Check {
    use crate::limits::cgroup::{Detection, Hierarchy, Inputs, MOUNT_ROOT};
    const NAME: &str = "cgroups";
    let d = Detection::run(Path::new(MOUNT_ROOT), &Inputs::current());
    let why = |r: &Result<Hierarchy, String>| match r {
        Ok(h) => format!("usable ({})", h.describe()),
        Err(e) => e.clone(),
    };
    match d.chosen() {
        Some(h) => {
            let other = match h {
                Hierarchy::V1 { .. } => format!("; v2: {}", why(&d.v2)),
                Hierarchy::V2 { .. } => String::new(),
            };
            Check::ok(
                NAME,
                format!("sandboxes get their own cgroup: {}{other}", h.describe()),
            )
        }
        None => {
            let v2 = why(&d.v2);
            let fix = if v2.contains("no cgroup2") || v2.contains("holds none") {
                FIX_UNIFIED
            } else {
                FIX_DELEGATE
            };
            Check::fail(
                NAME,
                format!("no cgroup sifbox may make: v2: {v2}; v1: {}", why(&d.v1)),
                fix,
            )
        }
    }
}

/// The limits doctor asks the planner about: every one set.
fn every_limit() -> crate::spec::Limits {
    crate::spec::Limits {
        memory: Some(1 << 30),
        // Unset: twice the memory, as Docker.
        memory_swap: None,
        pids: Some(crate::spec::DEFAULT_PIDS),
        cpus_milli: Some(1500),
    }
}

/// How this host enforces each limit for the caller (a sandbox asking for
/// all of them: 1 GiB, swap as much again, the default pids cap, 1.5 CPUs).
#[must_use]
pub fn limits_plan() -> crate::limits::Enforcement {
    crate::limits::plan(&every_limit(), &crate::limits::Host::detect(), 0)
}

/// One check per limit: the mechanism `plan` chose and what it promises;
/// `ok` when the kernel enforces the limit for the sandbox alone.
fn limit_checks(plan: &crate::limits::Enforcement, kernel: (u32, u32)) -> Vec<Check> {
    use crate::limits::How;
    let fix = if plan
        .applied
        .iter()
        .any(|a| matches!(a.how, How::CgroupV1 | How::CgroupV2))
    {
        // Some limit has a cgroup: what is missing is a controller.
        "the cgroup sifbox uses lacks this controller: enable it in the delegated cgroup's \
         parent (systemd: Delegate=memory pids cpu)"
    } else {
        "a cgroup would enforce it in the kernel: see the cgroups check"
    };
    let mut out = Vec::new();
    for (name, key) in [
        ("limit: memory", "memory"),
        ("limit: memory+swap", "memory_swap"),
        ("limit: pids", "pids"),
        ("limit: cpus", "cpus"),
    ] {
        let Some(a) = plan.applied.iter().find(|a| a.limit == key) else {
            let note = plan
                .not_enforced
                .iter()
                .find(|n| n.starts_with(key) && !n.starts_with(&format!("{key}_")))
                .cloned()
                .unwrap_or_else(|| format!("{key}: not enforced here"));
            out.push(Check::fail(name, format!("not enforced: {note}"), fix));
            continue;
        };
        let cg = |v: &str| format!("kernel-enforced by cgroup {v} ({})", a.detail);
        let check = match (key, a.how) {
            ("memory", How::CgroupV1 | How::CgroupV2) => Check::ok(
                name,
                format!(
                    "{}: the sandbox's processes, page cache and tmpfs pages (its writable \
                     layer, /dev/shm) are charged; past it the kernel reclaims, then its OOM \
                     killer kills inside the sandbox only, and the kill is counted",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("memory", _) => Check::fail(
                name,
                "fallback: sifbox's watchdog samples the private resident memory of the \
                 sandbox's processes and its tmpfs use (every 20 ms to 5 s, faster near the \
                 limit) and kills the largest process above the limit; it cannot promise the \
                 limit: a burst between samples overshoots it, shared and kernel memory are \
                 not counted, and the host's OOM killer may act first",
                fix,
            ),
            ("memory_swap", _) => Check::ok(
                name,
                format!(
                    "{}: memory plus swap capped together",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("pids", How::CgroupV1 | How::CgroupV2) => Check::ok(
                name,
                format!(
                    "{}: processes and threads of the whole sandbox; a fork past it fails \
                     with EAGAIN",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("pids", _) if kernel < (5, 14) => Check::fail(
                name,
                format!(
                    "fallback: RLIMIT_NPROC, but this kernel ({}.{}) counts it for the \
                     caller's user id across the whole host, not per sandbox (Linux 5.14 \
                     counts per user namespace)",
                    kernel.0, kernel.1
                ),
                fix,
            ),
            ("pids", _) => Check::ok(
                name,
                "fallback, kernel-enforced: RLIMIT_NPROC of the sandbox's user namespace \
                 (Linux 5.14 counts processes per user namespace); a fork past it fails with \
                 EAGAIN; it counts per user id inside the sandbox, threads included",
            ),
            ("cpus", How::CgroupV1 | How::CgroupV2) => Check::ok(
                name,
                format!(
                    "{}: a share of CPU time per 100 ms on any CPU, fractions exact",
                    cg(if a.how == How::CgroupV2 { "v2" } else { "v1" })
                ),
            ),
            ("cpus", _) => Check::fail(
                name,
                format!(
                    "fallback: {}; it cannot promise a share: a fraction is rounded up to \
                     whole CPUs and sandboxes on the same CPUs share them",
                    a.detail
                ),
                fix,
            ),
            _ => Check::ok(name, a.detail.clone()),
        };
        out.push(check);
    }
    out
}

/// Where writable layers can live: on disk (host root with loop devices and
/// mkfs.ext4) or only in a tmpfs; `why_not` is [`crate::disk::unavailable`].
fn check_storage(why_not: Option<String>) -> Check {
    const NAME: &str = "limit: storage";
    match why_not {
        None => Check::ok(
            NAME,
            "writable layers can be on disk (`--disk SIZE`; eval's default): an ext4 file \
             system of the size asked on a loop device, full at its size (ENOSPC), holding no \
             memory; else a tmpfs of --tmpfs-size, whose pages are memory",
        ),
        Some(why) => Check::fail(
            NAME,
            format!(
                "writable layers are tmpfs only: full at their size (ENOSPC), but their pages \
                 are memory, counted in the memory limit; no disk-backed layer: {why}"
            ),
            "keep storage_mb below memory_mb, or run as root for disk-backed layers",
        ),
    }
}

/// The kernel's major and minor version.
fn kernel_version() -> (u32, u32) {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

// ---------------------------------------------------------------------------
// /dev/fuse

fn check_dev_fuse() -> Check {
    const NAME: &str = "/dev/fuse";
    const FIX: &str = "needed only to mount SIF squashfs images without unpacking them \
        (squashfuse); sifbox unpacks them instead.\nto enable: as root, `modprobe fuse` and \
        make /dev/fuse mode 0666 (`chmod 0666 /dev/fuse`, or a udev rule)";
    let meta = match fs::metadata("/dev/fuse") {
        Ok(m) => m,
        Err(e) => return Check::fail(NAME, format!("/dev/fuse: {}", io_text(&e)), FIX),
    };
    let mode = meta.mode() & 0o7777;
    match OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(file) => {
            drop(file);
            Check::ok(
                NAME,
                format!(
                    "openable read-write (mode {mode:04o}, owner uid {})",
                    meta.uid()
                ),
            )
        }
        Err(e) => Check::fail(
            NAME,
            format!(
                "present (mode {mode:04o}, owner uid {}) but not openable read-write: {}",
                meta.uid(),
                io_text(&e)
            ),
            FIX,
        ),
    }
}

// ---------------------------------------------------------------------------
// runtime dir

/// Where sifbox keeps sandbox state: `$SIFBOX_RUNTIME`, else `$XDG_RUNTIME_DIR/sifbox`,
/// else `/tmp/sifbox-<uid>`. Empty variables (and a relative XDG_RUNTIME_DIR) count as unset.
fn runtime_dir_from(
    sifbox_runtime: Option<OsString>,
    xdg_runtime_dir: Option<OsString>,
    uid: u32,
) -> (PathBuf, &'static str) {
    if let Some(dir) = sifbox_runtime.filter(|d| !d.is_empty()) {
        return (PathBuf::from(dir), "$SIFBOX_RUNTIME");
    }
    if let Some(dir) = xdg_runtime_dir.filter(|d| !d.is_empty() && Path::new(d).is_absolute()) {
        return (PathBuf::from(dir).join("sifbox"), "$XDG_RUNTIME_DIR/sifbox");
    }
    (PathBuf::from(format!("/tmp/sifbox-{uid}")), "default")
}

fn check_runtime_dir() -> Check {
    const NAME: &str = "runtime dir";
    const FIX: &str = "set SIFBOX_RUNTIME to a directory you own on a local disk, \
        e.g. `export SIFBOX_RUNTIME=/var/tmp/sifbox-$(id -u)`";
    let uid = rustix::process::getuid().as_raw();
    let (dir, source) = runtime_dir_from(
        std::env::var_os("SIFBOX_RUNTIME"),
        std::env::var_os("XDG_RUNTIME_DIR"),
        uid,
    );
    let shown = format!("{} ({source})", dir.display());

    let mut detail = match fs::symlink_metadata(&dir) {
        Ok(meta) => {
            if !meta.is_dir() {
                return Check::fail(NAME, format!("{shown}: exists but is not a directory"), FIX);
            }
            if meta.uid() != uid {
                return Check::fail(
                    NAME,
                    format!(
                        "{shown}: owned by uid {}, not by you (uid {uid})",
                        meta.uid()
                    ),
                    FIX,
                );
            }
            if let Err(e) = probe_writable(&dir) {
                return Check::fail(NAME, format!("{shown}: not writable: {}", io_text(&e)), FIX);
            }
            format!(
                "{shown}: writable, mode {:04o}, on {}",
                meta.mode() & 0o7777,
                fs_type_name(&dir)
            )
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let Some(ancestor) = dir.ancestors().skip(1).find(|a| a.exists()) else {
                return Check::fail(NAME, format!("{shown}: no existing parent directory"), FIX);
            };
            if !ancestor.is_dir() {
                return Check::fail(
                    NAME,
                    format!(
                        "{shown}: cannot be created: {} is not a directory",
                        ancestor.display()
                    ),
                    FIX,
                );
            }
            if let Err(e) = probe_writable(ancestor) {
                return Check::fail(
                    NAME,
                    format!(
                        "{shown}: cannot be created: making a directory in {} fails: {}",
                        ancestor.display(),
                        io_text(&e)
                    ),
                    FIX,
                );
            }
            format!(
                "{shown}: not there yet, can be created in {} (on {})",
                ancestor.display(),
                fs_type_name(ancestor)
            )
        }
        Err(e) => return Check::fail(NAME, format!("{shown}: {}", io_text(&e)), FIX),
    };

    // Control sockets live at DIR/sandboxes/NAME/control.sock; sun_path is short.
    let fixed = dir.as_os_str().len() + "/sandboxes/".len() + "/control.sock".len();
    let room = SOCKET_PATH_MAX.saturating_sub(fixed);
    if room == 0 {
        return Check::fail(
            NAME,
            format!("{detail}; the path is too long for control sockets (limit {SOCKET_PATH_MAX} bytes)"),
            FIX,
        );
    }
    if room < 32 {
        let _ = write!(
            detail,
            "; note: long path leaves {room} bytes for sandbox names in socket paths"
        );
    }
    Check::ok(NAME, detail)
}

/// Proves `dir` writable by making and removing a uniquely named directory in it
/// (a real attempt, unlike access(2), also holds for root and odd file systems).
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let probe = dir.join(format!(
        ".sifbox-doctor-probe.{}.{nanos}",
        std::process::id()
    ));
    DirBuilder::new().mode(0o700).create(&probe)?;
    fs::remove_dir(&probe)
}

// ---------------------------------------------------------------------------
// apptainer

fn check_apptainer() -> Check {
    const NAME: &str = "apptainer";
    const FIX: &str = "only needed for --engine apptainer";
    let Some((path, _)) =
        find_executable("apptainer", &[]).or_else(|| find_executable("singularity", &[]))
    else {
        return Check::fail(
            NAME,
            "neither apptainer nor singularity is on PATH",
            format!("{FIX}; install Apptainer (https://apptainer.org) to use it"),
        );
    };
    let mut cmd = Command::new(&path);
    cmd.arg("--version");
    match run_bounded(&mut cmd, VERSION_TIMEOUT) {
        Ok(run) => match run.status {
            Some(st) if st.success() => {
                let version = last_line(&run.stdout)
                    .or_else(|| last_line(&run.stderr))
                    .unwrap_or("(no version printed)");
                Check::ok(NAME, format!("{}: {version}", path.display()))
            }
            Some(st) => Check::fail(
                NAME,
                format!(
                    "{} --version {}{}",
                    path.display(),
                    status_text(st),
                    last_line(&run.stderr)
                        .map(|l| format!(": {l}"))
                        .unwrap_or_default()
                ),
                format!("{FIX}; check that installation"),
            ),
            None => Check::fail(
                NAME,
                format!(
                    "{} --version: no answer in {} s (killed)",
                    path.display(),
                    VERSION_TIMEOUT.as_secs()
                ),
                format!("{FIX}; check that installation"),
            ),
        },
        Err(e) => Check::fail(
            NAME,
            format!("cannot run {}: {}", path.display(), io_text(&e)),
            format!("{FIX}; check that installation"),
        ),
    }
}

// ---------------------------------------------------------------------------
// running children

/// What a finished (or killed) child left.
#[derive(Debug)]
struct Finished {
    pid: u32,
    /// `None`: it ran past its time and was killed.
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

/// What a doctor child found.
#[derive(Debug)]
enum ChildVerdict {
    /// Exit 0, with the note it printed on stdout.
    Works(String),
    /// Exit 1: the host refused; the line it printed on stderr.
    Refused(String),
    /// The test itself did not run properly (not started, killed, unknown kind).
    Broken(String),
}

/// A doctor child's answer.
#[derive(Debug)]
struct ChildRun {
    /// `None` when it could not be started.
    pid: Option<u32>,
    verdict: ChildVerdict,
}

/// Runs `self_exe __doctor-child KIND` for at most [`CHILD_TIMEOUT`].
fn run_child(self_exe: &Path, kind: &str) -> ChildRun {
    let mut cmd = Command::new(self_exe);
    cmd.arg(CHILD_ARG).arg(kind).env_remove("RUST_LOG");
    let run = match run_bounded(&mut cmd, CHILD_TIMEOUT) {
        Ok(run) => run,
        Err(e) => {
            return ChildRun {
                pid: None,
                verdict: ChildVerdict::Broken(format!(
                    "cannot run {} {CHILD_ARG} {kind}: {}",
                    self_exe.display(),
                    io_text(&e)
                )),
            }
        }
    };
    let why = || last_line(&run.stderr).map(str::to_owned);
    let verdict = match run.status {
        None => ChildVerdict::Broken(format!(
            "the test did not finish in {} s (killed)",
            CHILD_TIMEOUT.as_secs()
        )),
        Some(st) => match st.code() {
            Some(0) => ChildVerdict::Works(last_line(&run.stdout).unwrap_or_default().to_owned()),
            Some(1) => ChildVerdict::Refused(
                why().unwrap_or_else(|| "failed without saying why".to_owned()),
            ),
            Some(2) => ChildVerdict::Broken(format!(
                "{} does not know `{CHILD_ARG} {kind}`{}",
                self_exe.display(),
                why().map(|w| format!(": {w}")).unwrap_or_default()
            )),
            _ => ChildVerdict::Broken(format!(
                "the test {}{}",
                status_text(st),
                why().map(|w| format!(": {w}")).unwrap_or_default()
            )),
        },
    };
    ChildRun {
        pid: Some(run.pid),
        verdict,
    }
}

/// Runs `cmd` (stdin null, stdout and stderr captured) in its own process group;
/// kills the group if it runs longer than `timeout`.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> std::io::Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                // Not reaped yet, so the group id is still this child's.
                if let Some(pgid) = i32::try_from(pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let _ =
                        rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // A grandchild could hold the pipes open: wait for the output only briefly.
    let grace = Duration::from_secs(1);
    Ok(Finished {
        pid,
        status,
        stdout: stdout.recv_timeout(grace).unwrap_or_default(),
        stderr: stderr.recv_timeout(grace).unwrap_or_default(),
    })
}

/// Reads a pipe to its end on a helper thread (keeping the first 64 KiB).
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        let _detached = std::thread::Builder::new()
            .name("doctor-pipe".to_owned())
            .spawn(move || {
                let mut buf = Vec::new();
                let _ = (&mut pipe).take(64 * 1024).read_to_end(&mut buf);
                let _ = std::io::copy(&mut pipe, &mut std::io::sink());
                let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
            });
    } else {
        let _ = tx.send(String::new());
    }
    rx
}

fn status_text(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended with {status}"),
    }
}

// ---------------------------------------------------------------------------
// small helpers

/// The first file called `name` on PATH (then in `extra`) that is an executable file.
fn find_executable(name: &str, extra: &[&Path]) -> Option<(PathBuf, fs::Metadata)> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .filter(|d| d.is_absolute())
        .chain(extra.iter().map(|d| d.to_path_buf()))
        .map(|d| d.join(name))
        .find_map(|candidate| {
            let meta = fs::metadata(&candidate).ok()?;
            (meta.is_file() && meta.mode() & 0o111 != 0).then_some((candidate, meta))
        })
}

/// The file system type under `path`, by name where known.
fn fs_type_name(path: &Path) -> String {
    let Ok(st) = rustix::fs::statfs(path) else {
        return "an unknown file system".to_owned();
    };
    let magic = i128::from(st.f_type) & 0xFFFF_FFFF;
    let name = match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0xFF53_4D42 | 0xFE53_4D42 => "cifs",
        0x2FC1_2FC1 => "zfs",
        0x6B41_4653 => "afs",
        0x0BD0_0BD0 => "lustre",
        0x4750_4653 => "gpfs",
        0x0027_E0EB => "cgroup",
        0x6367_7270 => "cgroup2",
        0x7363_6673 => "securityfs",
        0xF15F => "ecryptfs",
        0xCA45_1A4E => "bcachefs",
        0x7366_7362 => "squashfs",
        0x9FA0 => "proc",
        0x6265_6572 => "sysfs",
        _ => return format!("file system 0x{magic:x}"),
    };
    name.to_owned()
}

fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).rfind(|l| !l.is_empty())
}

/// Control characters (newlines included) become spaces, so a detail stays one line.
fn one_line(text: &str) -> String {
    text.trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// "EPERM (Operation not permitted)".
fn errno_text(e: Errno) -> String {
    let name = match e {
        Errno::PERM => "EPERM",
        Errno::NOENT => "ENOENT",
        Errno::ACCESS => "EACCES",
        Errno::INVAL => "EINVAL",
        Errno::NOSPC => "ENOSPC",
        Errno::USERS => "EUSERS",
        Errno::NOSYS => "ENOSYS",
        Errno::ROFS => "EROFS",
        Errno::BUSY => "EBUSY",
        Errno::NODEV => "ENODEV",
        Errno::NOTDIR => "ENOTDIR",
        Errno::OVERFLOW => "EOVERFLOW",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::NOMEM => "ENOMEM",
        Errno::EXIST => "EEXIST",
        Errno::XDEV => "EXDEV",
        _ => return std::io::Error::from(e).to_string(),
    };
    let text = std::io::Error::from(e).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
    format!("{name} ({text})")
}

fn io_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(raw) => errno_text(Errno::from_raw_os_error(raw)),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subid_matches_name_or_uid() {
        let text = "\
# comment line
alice:100000:65536

bob:165536:65536
1000:300000:1000
alice:400000:10
  alice : 500000 : 5  
";
        assert_eq!(
            crate::idmap::subranges(text, Some("alice"), 1000),
            vec![
                crate::idmap::SubRange {
                    start: 100000,
                    count: 65536
                },
                crate::idmap::SubRange {
                    start: 300000,
                    count: 1000
                },
                crate::idmap::SubRange {
                    start: 400000,
                    count: 10
                },
                crate::idmap::SubRange {
                    start: 500000,
                    count: 5
                },
            ]
        );
        assert_eq!(
            crate::idmap::subranges(text, Some("bob"), 1001),
            vec![crate::idmap::SubRange {
                start: 165536,
                count: 65536
            }]
        );
        assert_eq!(
            crate::idmap::subranges(text, None, 1000),
            vec![crate::idmap::SubRange {
                start: 300000,
                count: 1000
            }]
        );
        assert_eq!(
            crate::idmap::subranges(text, Some("carol"), 1002),
            Vec::<crate::idmap::SubRange>::new()
        );
    }

    #[test]
    fn subid_skips_malformed_lines() {
        let text =
            "alice:100000\nalice:x:65536\nalice:1:2:3\nalice:5:0\n:1:2\nalice:-1:5\nalice:7:8\n";
        assert_eq!(
            crate::idmap::subranges(text, Some("alice"), 1000),
            vec![crate::idmap::SubRange { start: 7, count: 8 }]
        );
        // a uid string never matches a user whose name merely contains it
        assert_eq!(
            crate::idmap::subranges("10000:1:2\n", Some("x"), 1000),
            Vec::<crate::idmap::SubRange>::new()
        );
        assert_eq!(
            crate::idmap::SubRange {
                start: 100000,
                count: 65536
            }
            .to_string(),
            "100000-165535 (65536 ids)"
        );
    }

    #[test]
    fn passwd_lookup() {
        let text = "root:x:0:0:root:/root:/bin/bash\n# x\n+nis::1000:::\nalice:x:1000:1000::/home/alice:/bin/sh\nbroken\n";
        assert_eq!(crate::idmap::passwd_name(text, 0).as_deref(), Some("root"));
        assert_eq!(
            crate::idmap::passwd_name(text, 1000).as_deref(),
            Some("alice")
        );
        assert_eq!(crate::idmap::passwd_name(text, 1001), None);
    }

    #[test]
    fn every_limit_gets_a_line_saying_what_enforces_it() {
        use crate::limits::{plan, Host};
        let limits = every_limit();
        // No cgroup, an unprivileged user: the fallbacks, and what they
        // cannot promise.
        let host = Host {
            cgroup: None,
            cpus: vec![0, 1, 2, 3],
            root: false,
        };
        let checks = limit_checks(&plan(&limits, &host, 0), (6, 1));
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "limit: memory",
                "limit: memory+swap",
                "limit: pids",
                "limit: cpus"
            ]
        );
        assert!(
            !checks[0].ok && checks[0].detail.contains("watchdog"),
            "{:?}",
            checks[0]
        );
        assert!(checks[0].detail.contains("cannot promise"));
        assert!(!checks[1].ok && checks[1].detail.starts_with("not enforced: memory_swap"));
        assert!(checks[2].ok && checks[2].detail.contains("RLIMIT_NPROC"));
        assert!(
            !checks[3].ok && checks[3].detail.contains("rounded up"),
            "{:?}",
            checks[3]
        );
        // Before 5.14 the rlimit is the user's, host-wide.
        let old = limit_checks(&plan(&limits, &host, 0), (5, 10));
        assert!(!old[2].ok && old[2].detail.contains("whole host"));
        // Root without cgroups: no pids limit at all, said.
        let root = limit_checks(&plan(&limits, &Host { root: true, ..host }, 0), (6, 1));
        assert!(
            !root[2].ok && root[2].detail.contains("exempt"),
            "{:?}",
            root[2]
        );
        // A v1 cgroup: the kernel enforces every one.
        let v1 = Host {
            cgroup: Some(crate::limits::cgroup::Hierarchy::V1 {
                dirs: ["memory", "pids", "cpu"]
                    .iter()
                    .map(|c| crate::limits::cgroup::V1Dir {
                        controllers: vec![(*c).to_string()],
                        mount: PathBuf::from(format!("/sys/fs/cgroup/{c}")),
                        home: PathBuf::from(format!("/sys/fs/cgroup/{c}")),
                    })
                    .collect(),
                swap: true,
                quota: true,
            }),
            cpus: vec![0],
            root: true,
        };
        let checks = limit_checks(&plan(&limits, &v1, 0), (6, 1));
        for c in &checks {
            assert!(c.ok && c.detail.contains("cgroup v1"), "{c:?}");
            assert!(c.fix.is_none());
        }
        assert!(checks[0].detail.contains("memory.limit_in_bytes"));
        let text = render_text(&checks);
        assert!(text.is_ascii() && text.lines().count() == 4, "{text}");
    }

    #[test]
    fn userns_fix_names_the_blocking_sysctl() {
        let knobs = UsernsKnobs {
            max: Some(0),
            clone: Some(0),
            apparmor: Some(1),
        };
        let fix = knobs.fix();
        assert!(fix.contains("user.max_user_namespaces=15000"));
        assert!(fix.contains("kernel.unprivileged_userns_clone=1"));
        assert!(fix.contains("kernel.apparmor_restrict_unprivileged_userns=0"));
        let open = UsernsKnobs {
            max: Some(1000),
            clone: None,
            apparmor: None,
        };
        assert!(open.fix().contains("seccomp"));
        assert!(knobs.restricts_unprivileged());
        assert!(!open.restricts_unprivileged());
        assert_eq!(open.describe(), "user.max_user_namespaces=1000");
    }

    #[test]
    fn runtime_dir_order() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            runtime_dir_from(os("/x"), os("/run/user/1"), 1).0,
            PathBuf::from("/x")
        );
        assert_eq!(
            runtime_dir_from(os(""), os("/run/user/1"), 1).0,
            PathBuf::from("/run/user/1/sifbox")
        );
        assert_eq!(
            runtime_dir_from(None, os("relative"), 7).0,
            PathBuf::from("/tmp/sifbox-7")
        );
        assert_eq!(
            runtime_dir_from(None, None, 7).0,
            PathBuf::from("/tmp/sifbox-7")
        );
    }

    #[test]
    fn text_table_is_aligned() {
        let checks = vec![
            Check::ok("kernel", "6.1"),
            Check::fail("/dev/fuse", "absent\nreally", "chmod it\nor not"),
        ];
        let text = render_text(&checks);
        assert_eq!(
            text,
            "  ok   kernel     6.1\n  FAIL /dev/fuse  absent really\n         fix: chmod it\n              or not\n"
        );
        assert!(text.is_ascii());
    }

    #[test]
    fn unknown_child_kind() {
        assert_eq!(child_main("nonsense"), 2);
    }
}
