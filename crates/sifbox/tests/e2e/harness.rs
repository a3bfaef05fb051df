//! Helpers for the end-to-end tests: where the binary and the test rootfs
//! are, a per-test `Sifbox` with its own runtime dir, running commands with a
//! timeout, the probe, and scanning the host's /proc and file trees; the
//! host tools the suites drive; a test's own image store ([`Store`]), a
//! long-lived sandbox that is stopped when its guard goes ([`Started`]),
//! and host trees built entry by entry ([`Tree`]).
//!
//! Every command runs under a deadline ([`TIMEOUT`] unless a test chooses
//! another): a hang fails the test, with everything it printed so far,
//! instead of blocking CI.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

mod started;
mod store;
mod tarball;
mod tree;

pub use started::Started;
pub use store::Store;
pub use tarball::Tarball;
pub use tree::{mode_of, set_mode, Tree};

/// How long any one sifbox invocation may take before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The default PATH inside a sandbox (Apptainer's).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Exit code of sifbox's own errors.
pub const SIFBOX_ERROR: i32 = 125;

// ---------------------------------------------------------------------------
// Locations
// ---------------------------------------------------------------------------

/// The sifbox binary under test: `$SIFBOX_BIN`, else the one Cargo built.
pub fn sifbox_bin() -> PathBuf {
    match std::env::var_os("SIFBOX_BIN").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_BIN_EXE_sifbox")),
    }
}

/// The test rootfs: `$SIFBOX_TEST_ROOTFS`, else `<repo>/target/test-rootfs`.
/// Panics (never skips) when it is missing.
pub fn rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let given = match std::env::var_os("SIFBOX_TEST_ROOTFS").filter(|p| !p.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-rootfs"),
        };
        let marker = given.join("etc/sifbox-test-rootfs");
        let probe = given.join("usr/bin/sifbox-probe");
        assert!(
            marker.is_file() && probe.is_file(),
            "the test rootfs {} is missing or incomplete (no {} or {}): run scripts/make-test-rootfs.sh \
             (or point SIFBOX_TEST_ROOTFS at a copy)",
            given.display(),
            marker.display(),
            probe.display()
        );
        given
            .canonicalize()
            .unwrap_or_else(|e| panic!("resolving {}: {e}", given.display()))
    })
}

/// A token no other test (or test run) uses: for sandbox names, markers,
/// secrets. Only `[a-z0-9-]`, short enough for a host name.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{:x}-{n:x}-{nanos:x}", std::process::id())
}

/// A number no other test uses, for markers that must be numeric
/// (`sleep N`).
pub fn unique_number() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // 9 digits of time, then pid and counter: unique across parallel tests
    // and concurrent test processes, and far above any sane sleep.
    9_000_000_000_000
        + u64::from(nanos % 1_000_000) * 1_000_000
        + u64::from(std::process::id() % 10_000) * 100
        + n % 100
}

/// A foreign SIF made of the tree `root` with mksquashfs and siftool, as
/// Apptainer's tools make them (gzip squashfs as the primary system
/// partition), in `dir`. Panics, naming the tool, when one is missing.
/// (The images and hostile suites use it.)
pub fn foreign_sif(root: &Path, dir: &Path) -> PathBuf {
    let part = dir.join("root.sqfs");
    let sif = dir.join("foreign.sif");
    let siftool = require("siftool", "siftool");
    run_tool(
        Command::new(require("mksquashfs", "squashfs-tools"))
            .arg(root)
            .arg(&part)
            .args(["-comp", "gzip", "-noappend", "-quiet"]),
    );
    run_tool(Command::new(&siftool).arg("new").arg(&sif));
    run_tool(
        Command::new(&siftool)
            .args([
                "add",
                "--datatype",
                "4",
                "--parttype",
                "2",
                "--partfs",
                "1",
                "--partarch",
                "2",
            ])
            .arg(&sif)
            .arg(&part),
    );
    sif
}

/// A fresh temporary dir (0700) under the system's temp dir.
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("creating a temporary dir")
}

/// Whether sandboxes may have disk-backed writable layers here: host root
/// with loop devices (install-deps.sh installs mkfs.ext4).
pub fn disk_layers() -> bool {
    is_root() && Path::new("/dev/loop-control").exists()
}

/// CPUs this test may run on.
pub fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// The uid and gid this test runs as.
pub fn my_ids() -> (u32, u32) {
    (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    )
}

// ---------------------------------------------------------------------------
// Host tools and inputs
// ---------------------------------------------------------------------------

/// Whether this test runs as host root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Where the host tool `tool` is; panics, naming the Debian `package` to
/// install, when it is missing.
pub fn require(tool: &str, package: &str) -> PathBuf {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{tool} is missing: install the Debian package {package} (scripts/install-deps.sh)"
            )
        })
}

/// Runs a host tool, asserts that it succeeded and returns its stdout.
#[track_caller]
pub fn run_tool(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A copy of the test rootfs at `dst` (`cp -a`), for a test to change.
pub fn copy_rootfs(dst: &Path) {
    run_tool(Command::new("cp").arg("-a").arg(rootfs()).arg(dst));
}

/// The Debian bookworm minbase tarball: `$SIFBOX_TEST_DEBIAN_TAR`, else
/// `<repo>/target/bookworm-minbase.tar`. Panics (never skips) when it is
/// missing.
pub fn debian_tar() -> PathBuf {
    bootstrapped_tar(
        "SIFBOX_TEST_DEBIAN_TAR",
        "bookworm-minbase.tar",
        "Debian bookworm minbase",
    )
}

/// A tarball scripts/bootstrap-base.sh makes: `$var`, else
/// `<repo>/target/<file>`. Panics (never skips), naming `what`, when it is
/// missing.
pub fn bootstrapped_tar(var: &str, file: &str, what: &str) -> PathBuf {
    let tar = match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target")
            .join(file),
    };
    assert!(
        tar.is_file(),
        "the {what} tarball {} is missing: run scripts/bootstrap-base.sh (or set {var})",
        tar.display()
    );
    tar
}

/// Every entry at any depth below `root`, with its metadata (symlinks
/// not followed), in no particular order.
pub fn entries_below(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display()));
        for e in rd.flatten() {
            let md = std::fs::symlink_metadata(e.path())
                .unwrap_or_else(|err| panic!("stat {}: {err}", e.path().display()));
            if md.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), md));
        }
    }
    out
}

/// The SHA-256 of `data`, in hex.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(data))
}

/// The image digest (`sha256:` and 64 hex digits) that a command printed
/// alone on stdout (`image import`, `pull`, `build`).
#[track_caller]
pub fn digest_of(out: &Output) -> String {
    let d = out.stdout.trim().to_string();
    assert!(
        d.starts_with("sha256:") && d.len() == 71,
        "digest: {d:?}\n{}",
        out.stderr
    );
    d
}

/// A TCP port on 127.0.0.1 that nothing listens on (now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The GOARCH name of this host (`amd64`, `arm64`).
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The JSON in the file `path`.
pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

// ---------------------------------------------------------------------------
// Sifbox: one test's private runtime dir, and commands run against it
// ---------------------------------------------------------------------------

/// One test's view of sifbox: every command it starts uses its own fresh
/// `$SIFBOX_RUNTIME`, so tests run in parallel and can check that nothing is
/// left behind.
#[derive(Debug)]
pub struct Sifbox {
    runtime: tempfile::TempDir,
}

impl Sifbox {
    pub fn new() -> Sifbox {
        Sifbox {
            runtime: tempdir("sifbox-e2e-rt."),
        }
    }

    /// `$SIFBOX_RUNTIME` of this test.
    pub fn runtime(&self) -> &Path {
        self.runtime.path()
    }

    /// `sifbox ARGS...`
    pub fn cmd<I, S>(&self, args: I) -> Invocation<'_>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Invocation::new(self, sifbox_bin(), args)
    }

    /// `sifbox run --rootfs <test rootfs> ARGS...`
    pub fn run<I, S>(&self, args: I) -> Invocation<'_>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut all: Vec<OsString> = vec!["run".into(), "--rootfs".into(), rootfs().into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self.cmd(all)
    }

    /// Any other program (e.g. a wrapper around sifbox), still with this
    /// test's `$SIFBOX_RUNTIME`.
    pub fn program<I, S>(&self, program: impl Into<PathBuf>, args: I) -> Invocation<'_>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Invocation::new(self, program.into(), args)
    }

    /// Runs the probe with sifbox options `opts` and probe arguments
    /// `probe_args`; asserts it succeeded and returns its report.
    pub fn probe(&self, opts: &[&str], probe_args: &[&str]) -> Value {
        let mut args: Vec<&str> = opts.to_vec();
        args.push("--");
        args.push("sifbox-probe");
        args.extend_from_slice(probe_args);
        self.run(args).output().success().json()
    }

    /// Names left in `$SIFBOX_RUNTIME/sandboxes`.
    pub fn leftovers(&self) -> Vec<String> {
        let dir = self.runtime().join("sandboxes");
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                let mut v: Vec<String> = rd
                    .map(|e| {
                        e.expect("listing the runtime dir")
                            .file_name()
                            .to_string_lossy()
                            .into_owned()
                    })
                    .collect();
                v.sort();
                v
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("listing {}: {e}", dir.display()),
        }
    }

    /// Asserts that no sandbox dir is left and that no host mount refers to
    /// the runtime dir.
    pub fn assert_clean(&self) {
        let left = self.leftovers();
        assert!(
            left.is_empty(),
            "sandboxes left in {}/sandboxes: {left:?}",
            self.runtime().display()
        );
        self.assert_no_host_mounts();
    }

    /// Asserts that no host mount refers to the runtime dir.
    pub fn assert_no_host_mounts(&self) {
        let rt = self.runtime().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
        let stray: Vec<&str> = mounts.lines().filter(|l| l.contains(&rt)).collect();
        assert!(
            stray.is_empty(),
            "host mounts under the runtime dir remain: {stray:#?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Invocation: a command with a deadline
// ---------------------------------------------------------------------------

/// A command about to run; see [`Invocation::output`] and
/// [`Invocation::spawn`].
#[derive(Debug)]
pub struct Invocation<'a> {
    sifbox: &'a Sifbox,
    cmd: Command,
    desc: String,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    check_clean: bool,
}

impl<'a> Invocation<'a> {
    fn new<I, S>(sifbox: &'a Sifbox, program: PathBuf, args: I) -> Invocation<'a>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        let desc = std::iter::once(program.as_os_str())
            .chain(args.iter().map(OsString::as_os_str))
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd = Command::new(&program);
        cmd.args(&args)
            .env("SIFBOX_RUNTIME", sifbox.runtime())
            .env_remove("SIFBOX_LOG");
        Invocation {
            sifbox,
            cmd,
            desc,
            stdin: None,
            timeout: TIMEOUT,
            check_clean: true,
        }
    }

    /// Sets an environment variable for the sifbox process.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// Removes an environment variable for the sifbox process.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.cmd.env_remove(key);
        self
    }

    /// Feeds `data` on stdin (default: /dev/null).
    pub fn stdin(mut self, data: &[u8]) -> Self {
        self.stdin = Some(data.to_vec());
        self
    }

    /// Gives the command `t` instead of [`TIMEOUT`] to finish.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Skips the "runtime dir is clean" check after the command (for
    /// commands that deliberately leave something, or never make a dir).
    pub fn no_clean_check(mut self) -> Self {
        self.check_clean = false;
        self
    }

    /// Starts the command; its stdout arrives line by line.
    pub fn spawn(mut self) -> Running {
        self.cmd
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self
            .cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.desc));
        if let Some(data) = self.stdin.take() {
            let mut w = child.stdin.take().expect("stdin pipe");
            std::thread::spawn(move || {
                // The command may not read it all; that is its business.
                let _ = w.write_all(&data);
            });
        }
        let out = child.stdout.take().expect("stdout pipe");
        let (line_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            loop {
                let mut buf = Vec::new();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if line_tx
                            .send(String::from_utf8_lossy(&buf).into_owned())
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        });
        let mut err = child.stderr.take().expect("stderr pipe");
        let (err_tx, stderr) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            let _ = err_tx.send(String::from_utf8_lossy(&buf).into_owned());
        });
        Running {
            desc: self.desc,
            child,
            lines,
            stdout: String::new(),
            stderr,
            timeout: self.timeout,
        }
    }

    /// Runs to completion (within the deadline) and, unless
    /// [`Invocation::no_clean_check`], asserts the runtime dir is clean.
    pub fn output(self) -> Output {
        let sifbox = self.sifbox;
        let check = self.check_clean;
        let out = self.spawn().wait();
        if check {
            sifbox.assert_clean();
        }
        out
    }
}

/// A running command.
#[derive(Debug)]
pub struct Running {
    desc: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: String,
    stderr: mpsc::Receiver<String>,
    timeout: Duration,
}

impl Running {
    /// Host pid of the command.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits in i32")
    }

    /// Waits until a stdout line satisfies `pred`; returns it.
    pub fn wait_for_line(&mut self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout.push_str(&line);
                    if pred(line.trim_end()) {
                        return line;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.fail("timed out waiting for an expected line on stdout")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.fail("stdout closed before the expected line appeared")
                }
            }
        }
    }

    /// Sends `sig` to the command.
    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).expect("a valid pid");
        rustix::process::kill_process(pid, sig)
            .unwrap_or_else(|e| panic!("sending {sig:?} to {}: {e}", self.desc));
    }

    /// Waits for the command to end (within the deadline) and for its
    /// stdout and stderr to close; returns everything it printed.
    pub fn wait(mut self) -> Output {
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => self.fail(&format!(
                    "did not finish within {} s (killed)",
                    self.timeout.as_secs()
                )),
                Err(e) => self.fail(&format!("waiting for it: {e}")),
            }
        };
        // Its pipes close when the last process holding them ends: a
        // sandbox process that outlived sifbox keeps them open.
        let pipe_deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = pipe_deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stdout.push_str(&line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => self.fail(&format!(
                    "exited ({status}) but its stdout stayed open: some process it started survived"
                )),
            }
        }
        let left = pipe_deadline.saturating_duration_since(Instant::now());
        let stderr = match self.stderr.recv_timeout(left) {
            Ok(s) => s,
            Err(_) => self.fail(&format!(
                "exited ({status}) but its stderr stayed open: some process it started survived"
            )),
        };
        Output {
            desc: std::mem::take(&mut self.desc),
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr,
        }
    }

    /// Kills the command and fails the test with what it printed so far.
    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.stdout.push_str(&line);
        }
        let stderr = self
            .stderr
            .recv_timeout(Duration::from_millis(200))
            .unwrap_or_else(|_| "<still open>".into());
        panic!(
            "{}: {why}\n--- stdout ---\n{}\n--- stderr ---\n{stderr}",
            self.desc, self.stdout
        );
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test that panicked mid-way must not leave the command running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a finished command did.
#[derive(Debug)]
pub struct Output {
    pub desc: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The exit code (None when sifbox itself died of a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn context(&self) -> String {
        format!(
            "{}\nexit: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.desc, self.status, self.stdout, self.stderr
        )
    }

    /// Asserts the exit code.
    #[track_caller]
    pub fn code_is(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            Some(code),
            "unexpected exit code of {}",
            self.context()
        );
        self
    }

    /// Asserts exit code 0, and gives the image digest the command printed
    /// alone on stdout (`image import`, `pull`, `build`): [`digest_of`].
    #[track_caller]
    pub fn digest(&self) -> String {
        self.success();
        digest_of(self)
    }

    /// Asserts exit code 0.
    #[track_caller]
    pub fn success(&self) -> &Self {
        self.code_is(0)
    }

    /// Asserts a non-zero exit code that is not sifbox's own error (the
    /// command ran and failed).
    #[track_caller]
    pub fn command_failed(&self) -> &Self {
        let code = self.code();
        assert!(
            matches!(code, Some(c) if c != 0 && c != SIFBOX_ERROR),
            "expected the command to fail by itself (exit 1..124), got {}",
            self.context()
        );
        self
    }

    /// Asserts sifbox's own error: exit 125 and exactly one stderr line,
    /// starting with `sifbox: `.
    #[track_caller]
    pub fn sifbox_error(&self) -> &Self {
        self.code_is(SIFBOX_ERROR);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("sifbox: ") && lines[0].len() > 10,
            "expected exactly one stderr line starting with 'sifbox: ', got {}",
            self.context()
        );
        self
    }

    /// Asserts a command-line usage error (clap): exit 125 and something
    /// on stderr (clap may print several lines of usage).
    #[track_caller]
    pub fn usage_error(&self) -> &Self {
        self.code_is(SIFBOX_ERROR);
        assert!(
            !self.stderr.trim().is_empty() && self.stdout.is_empty(),
            "expected a usage message on stderr only, got {}",
            self.context()
        );
        self
    }

    /// Asserts that stderr mentions `needle`.
    #[track_caller]
    pub fn stderr_has(&self, needle: &str) -> &Self {
        assert!(
            self.stderr.contains(needle),
            "stderr does not mention {needle:?}: {}",
            self.context()
        );
        self
    }

    /// Parses the last non-empty stdout line as JSON (the probe's report).
    #[track_caller]
    pub fn json(&self) -> Value {
        let last = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| panic!("no output to parse: {}", self.context()));
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.context()))
    }
}

// ---------------------------------------------------------------------------
// Probe report accessors
// ---------------------------------------------------------------------------

/// Number of ids in a probe `uid_map`/`gid_map` (`[[inside, outside, count]]`).
pub fn map_count(map: &Value) -> u64 {
    let lines = map
        .as_array()
        .unwrap_or_else(|| panic!("id map missing: {map}"));
    assert!(!lines.is_empty(), "empty id map");
    lines
        .iter()
        .map(|l| l[2].as_u64().unwrap_or_else(|| panic!("bad map line {l}")))
        .sum()
}

/// The probe's mounts, as (target, fstype, readonly).
pub fn mounts(report: &Value) -> Vec<(String, String, bool)> {
    report["mounts"]
        .as_array()
        .unwrap_or_else(|| panic!("no mounts in report: {report}"))
        .iter()
        .map(|m| {
            (
                m["target"].as_str().unwrap_or_default().to_string(),
                m["fstype"].as_str().unwrap_or_default().to_string(),
                m["readonly"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The topmost mount at `target` (the last one in mountinfo order).
pub fn mount_at(report: &Value, target: &str) -> Option<(String, bool)> {
    mounts(report)
        .into_iter()
        .rev()
        .find(|(t, _, _)| t == target)
        .map(|(_, fs, ro)| (fs, ro))
}

/// `paths[P].exists` of a `--check-path P` probe.
pub fn path_exists(report: &Value, p: &str) -> bool {
    report["paths"][p]["exists"]
        .as_bool()
        .unwrap_or_else(|| panic!("no check for {p} in report: {}", report["paths"]))
}

/// `paths[P].kind` of a `--check-path P` probe.
pub fn path_kind(report: &Value, p: &str) -> String {
    report["paths"][p]["kind"]
        .as_str()
        .unwrap_or("none")
        .to_string()
}

/// `writable[P]` of a `--write-test P` probe.
pub fn writable(report: &Value, p: &str) -> bool {
    report["writable"][p]
        .as_bool()
        .unwrap_or_else(|| panic!("no write test for {p} in report: {}", report["writable"]))
}

// ---------------------------------------------------------------------------
// Host processes
// ---------------------------------------------------------------------------

/// A host process: pid and start time (against pid reuse).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub start: u64,
}

/// (ppid, start time, state) of a host process; None if gone.
fn stat(pid: i32) -> Option<(i32, u64, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // f[0] is field 3 (state), f[1] field 4 (ppid), f[19] field 22 (start).
    let state = f.first()?.chars().next()?;
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?, state))
}

/// A host process with its start time, if it runs (or is a zombie).
pub fn proc_of(pid: i32) -> Option<Proc> {
    stat(pid).map(|(_, start, _)| Proc { pid, start })
}

fn host_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("listing /proc")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Every host process below `root` (not `root` itself).
pub fn descendants(root: i32) -> Vec<Proc> {
    let table: Vec<(i32, i32, u64)> = host_pids()
        .into_iter()
        .filter_map(|pid| stat(pid).map(|(ppid, start, _)| (pid, ppid, start)))
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, start) in &table {
            if ppid == parent {
                found.push(Proc { pid, start });
                frontier.push(pid);
            }
        }
    }
    found
}

/// Those of `procs` that still run (zombies count as gone).
pub fn still_running(procs: &[Proc]) -> Vec<Proc> {
    procs
        .iter()
        .copied()
        .filter(
            |p| matches!(stat(p.pid), Some((_, start, state)) if start == p.start && state != 'Z'),
        )
        .collect()
}

/// Host processes (not zombies) with an argument containing `marker`,
/// as (pid, argv).
pub fn processes_with_arg(marker: &str) -> Vec<(i32, Vec<String>)> {
    host_pids()
        .into_iter()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let argv: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            argv.iter()
                .any(|a| a.contains(marker))
                .then_some((pid, argv))
        })
        .collect()
}

/// What a failing check says of a process left behind: its command line,
/// state, parents, pid namespace and cgroups, and how long it has run.
pub fn describe_process(pid: i32) -> String {
    let read =
        |what: &str| std::fs::read_to_string(format!("/proc/{pid}/{what}")).unwrap_or_default();
    let status: Vec<String> = read("status")
        .lines()
        .filter(|l| {
            ["State:", "PPid:", "NSpid:", "Uid:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .map(|l| l.display().to_string())
        .unwrap_or_default();
    let mut parents = Vec::new();
    let mut at = stat(pid).map(|(ppid, _, _)| ppid);
    while let Some(p) = at.filter(|p| *p > 1 && parents.len() < 8) {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        parents.push(format!(
            "{p} {}",
            String::from_utf8_lossy(&cmd).replace('\0', " ").trim_end()
        ));
        at = stat(p).map(|(ppid, _, _)| ppid);
    }
    format!(
        "pid {pid}: {:?} {status:?} {ns} (ours {}), cgroups {:?}, parents {parents:?}",
        read("cmdline").replace('\0', " "),
        host_namespace("pid"),
        read("cgroup").lines().collect::<Vec<_>>(),
    )
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Host file trees
// ---------------------------------------------------------------------------

/// A description of every entry below `root`: path -> kind, mode, owner,
/// size, mtime and a hash of the contents (files) or the target (symlinks).
/// Two equal snapshots mean the tree was not modified.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .map(|e| e.expect("reading a dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let md = std::fs::symlink_metadata(&p)
                .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
            let ft = md.file_type();
            let content = if ft.is_symlink() {
                let t = std::fs::read_link(&p).expect("readlink");
                format!("-> {}", t.display())
            } else if ft.is_file() {
                let data =
                    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
                let mut h = std::collections::hash_map::DefaultHasher::new();
                data.hash(&mut h);
                format!("#{:016x}", h.finish())
            } else if ft.is_char_device() || ft.is_block_device() {
                format!("dev {:x}", md.rdev())
            } else {
                String::new()
            };
            let desc = format!(
                "mode {:o} owner {}:{} size {} mtime {}.{} {content}",
                md.mode(),
                md.uid(),
                md.gid(),
                if ft.is_dir() { 0 } else { md.size() },
                md.mtime(),
                md.mtime_nsec()
            );
            let rel = p.strip_prefix(root).expect("below root").to_path_buf();
            out.insert(rel, desc);
            if ft.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The differences between two snapshots, one per line.
pub fn snapshot_diff(a: &BTreeMap<PathBuf, String>, b: &BTreeMap<PathBuf, String>) -> String {
    let mut out = String::new();
    for (p, da) in a {
        match b.get(p) {
            None => out.push_str(&format!("removed {}\n", p.display())),
            Some(db) if db != da => {
                out.push_str(&format!("changed {}: {da} => {db}\n", p.display()));
            }
            Some(_) => {}
        }
    }
    for p in b.keys().filter(|p| !a.contains_key(*p)) {
        out.push_str(&format!("added {}\n", p.display()));
    }
    out
}

/// Gives the owner full access to every dir below `root`, so a temp dir
/// holding an overlay work dir (which the kernel leaves at mode 0) can be
/// removed by an unprivileged user.
pub fn make_removable(root: &Path) {
    let Ok(md) = std::fs::symlink_metadata(root) else {
        return;
    };
    if !md.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(
        root,
        std::fs::Permissions::from_mode(md.mode() & 0o7777 | 0o700),
    );
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            make_removable(&e.path());
        }
    }
}

// ---------------------------------------------------------------------------
// Host configuration
// ---------------------------------------------------------------------------

/// The caller's subordinate id range (start, count) in `file`
/// (/etc/subuid or /etc/subgid), found by user name or uid.
pub fn subid_range(file: &str) -> Option<(u64, u64)> {
    let uid = my_ids().0.to_string();
    let name = std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid).then(|| f[0].to_string())
        });
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.trim().split(':').collect();
            if f.len() != 3 || (Some(f[0]) != name.as_deref() && f[0] != uid) {
                return None;
            }
            let (start, count) = (f[1].parse().ok()?, f[2].parse().ok()?);
            (count > 0).then_some((start, count))
        })
}

/// Whether the caller has a subordinate uid and gid range and
/// newuidmap/newgidmap exist, i.e. whether `--userns full` can work for a
/// non-root caller.
pub fn has_subid_range() -> bool {
    let tool = |t: &str| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .any(|d| Path::new(d).join(t).is_file())
    };
    subid_range("/etc/subuid").is_some()
        && subid_range("/etc/subgid").is_some()
        && tool("newuidmap")
        && tool("newgidmap")
}

/// The host's `/proc/self/ns/NAME` link (e.g. `ipc:[4026531839]`).
pub fn host_namespace(name: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{name}"))
        .unwrap_or_else(|e| panic!("reading /proc/self/ns/{name}: {e}"))
        .to_string_lossy()
        .into_owned()
}
