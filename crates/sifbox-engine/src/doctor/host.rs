//! Host facilities: /dev/fuse, the runtime dir, Apptainer.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::child::{run_bounded, status_text};
use super::{
    find_executable, fs_type_name, io_text, last_line, Check, SOCKET_PATH_MAX, VERSION_TIMEOUT,
};

pub(super) fn check_dev_fuse() -> Check {
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

/// Where sifbox keeps sandbox state: `$SIFBOX_RUNTIME`, else `$XDG_RUNTIME_DIR/sifbox`,
/// else `/tmp/sifbox-<uid>`. Empty variables (and a relative XDG_RUNTIME_DIR) count as unset.
pub(super) fn runtime_dir_from(
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

pub(super) fn check_runtime_dir() -> Check {
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

pub(super) fn check_apptainer() -> Check {
    const NAME: &str = "apptainer";
    // sifbox runs its images itself; Apptainer is for the SIFs it exports.
    const FIX: &str = "sifbox does not need it: only to run images exported with `sifbox image \
                       export` under Apptainer";
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
