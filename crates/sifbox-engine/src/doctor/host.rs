//! Host facilities: /dev/fuse, the runtime dir, Apptainer.

use std::fmt::Write as _;
use std::fs::{self, DirBuilder, OpenOptions};

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use super::child::{run_bounded, status_text};
use super::{
    find_executable, fs_type_name, io_text, last_line, Check, SOCKET_PATH_MAX, VERSION_TIMEOUT,
};

pub(super) fn check_dev_fuse() -> Check {
    const NAME: &str = "/dev/fuse";
    const LOST: &str = "sifbox does without it: it unpacks a SIF's squashfs image where \
        /dev/fuse would mount it (squashfuse) without unpacking";
    const FIX: &str = "as root, `modprobe fuse` and make /dev/fuse mode 0666 \
        (`chmod 0666 /dev/fuse`, or a udev rule)";
    let meta = match fs::metadata("/dev/fuse") {
        Ok(m) => m,
        Err(e) => return Check::optional(NAME, format!("/dev/fuse: {}; {LOST}", io_text(&e)), FIX),
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
        Err(e) => Check::optional(
            NAME,
            format!(
                "present (mode {mode:04o}, owner uid {}) but not openable read-write: {}; \
                 {LOST}",
                meta.uid(),
                io_text(&e)
            ),
            FIX,
        ),
    }
}

/// The runtime dir sandboxes live in: the one [`crate::runtime::root`]
/// chooses and opens (made when missing, as `sifbox start` would), with
/// the rule that chose it.
pub(super) fn check_runtime_dir() -> Check {
    const NAME: &str = "runtime dir";
    const FIX: &str = "set SIFBOX_RUNTIME to a directory you own on a local disk, \
        e.g. `export SIFBOX_RUNTIME=/var/tmp/sifbox-$(id -u)`";
    let rule = crate::runtime::Rule::current();
    let root = match crate::runtime::root() {
        Ok(r) => r,
        Err(e) => return Check::fail(NAME, e.to_string(), FIX),
    };
    let dir = root.path();
    let shown = format!("{} ({})", dir.display(), rule.describe(dir));
    if let Err(e) = probe_writable(root.at()) {
        return Check::fail(NAME, format!("{shown}: not writable: {}", io_text(&e)), FIX);
    }
    let mode = fs::metadata(root.at()).map_or(0, |m| m.mode() & 0o7777);
    let mut detail = format!(
        "{shown}: writable, mode {mode:04o}, on {}",
        fs_type_name(root.at())
    );
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

pub(super) fn check_apptainer() -> Check {
    const NAME: &str = "apptainer";
    // sifbox runs its images itself; Apptainer is for the SIFs it exports.
    const FIX: &str = "sifbox does not need it (it runs every image itself): only to run \
                       images exported with `sifbox image export` under Apptainer";
    let Some((path, _)) =
        find_executable("apptainer", &[]).or_else(|| find_executable("singularity", &[]))
    else {
        return Check::optional(
            NAME,
            format!("neither apptainer nor singularity is on PATH; {FIX}"),
            "install Apptainer (https://apptainer.org)",
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
            Some(st) => Check::optional(
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
            None => Check::optional(
                NAME,
                format!(
                    "{} --version: no answer in {} s (killed)",
                    path.display(),
                    VERSION_TIMEOUT.as_secs()
                ),
                format!("{FIX}; check that installation"),
            ),
        },
        Err(e) => Check::optional(
            NAME,
            format!("cannot run {}: {}", path.display(), io_text(&e)),
            format!("{FIX}; check that installation"),
        ),
    }
}
