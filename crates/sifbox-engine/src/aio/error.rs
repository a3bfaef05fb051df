//! Misuses of the async API (a leaf).

use std::path::PathBuf;

/// A misuse of the async API, or a sandbox it cannot reach.
#[derive(Debug, thiserror::Error)]
pub enum AioError {
    #[error("root file system {}: {source}; pass an unpacked root file system directory", .path.display())]
    Rootfs {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("root file system {}: not a directory; pass an unpacked root file system directory", .0.display())]
    RootfsNotDir(PathBuf),
    #[error("StartOptions::oneshot: an async client cannot tie a sandbox to its life (the parent-death signal follows the starting thread, and tokio ends idle blocking threads); leave oneshot false and stop the sandbox with AsyncSandbox::stop")]
    OneShot,
    #[error("sandbox {name} was not ready in time; it is removed once its start returns (raise the ready timeout?)")]
    NotReadyInTime { name: String },
    #[error("sandbox {name}: the runtime dir changed since it was started (now {}, was {}); keep SIFBOX_RUNTIME unchanged while sandboxes run", .now.display(), .was.display())]
    RuntimeDirChanged {
        name: String,
        now: PathBuf,
        was: PathBuf,
    },
    #[error("sandbox {0:?}: it is not running (it was stopped, or its supervisor died); start it again; `sifbox ps` lists running sandboxes and `sifbox gc` removes dead ones")]
    NotRunning(String),
    #[error("ExecRequest::tty: the async API does not allocate ptys; use Sandbox::exec_tty")]
    Tty,
    #[error("ExecRequest::stop_after: a spawned process cannot be the sandbox's last command; wait for the process, then call AsyncSandbox::stop")]
    StopAfter,
    #[error("exec id {0:?}: ids are 1 to 64 letters and digits; leave detach_id empty to get a random id")]
    ExecId(String),
    #[error("Process::writeline: the line contains a newline; encode messages on one line (JSON does: newlines in strings are escaped)")]
    Newline,
    #[error("stdin of exec {0}: it is not piped or was closed; spawn with Stdio::Piped stdin and write before wait()")]
    StdinNotPiped(String),
    #[error("stdout of exec {0}: it is not piped; spawn with Stdio::Piped stdout")]
    StdoutNotPiped(String),
    #[error("exec {id} of sandbox {name}: it is no longer running; check Process::wait for how it ended")]
    ExecEnded { id: String, name: String },
}

impl AioError {
    /// Whether the caller is at fault (all but a start that took too long).
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, AioError::NotReadyInTime { .. })
    }
}
