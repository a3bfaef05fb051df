//! Relaying a terminal to a pty inside the sandbox (`run -t`).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::termios::{tcgetattr, tcgetwinsize, tcsetattr, tcsetwinsize, OptionalActions};
use sifbox_engine::protocol::ExecRequest;
use sifbox_engine::{Error, ExecStatus, Sandbox};

/// Puts the caller's terminal in raw mode until dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(stdin.as_fd()) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        if tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw).is_err() {
            return RawMode(None);
        }
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, saved);
        }
    }
}

/// Runs `req` on a pty in `sandbox`, relaying the caller's terminal.
pub fn exec(sandbox: &Sandbox, mut req: ExecRequest) -> sifbox_engine::Result<ExecStatus> {
    let stdin = std::io::stdin();
    req.winsize = tcgetwinsize(stdin.as_fd())
        .ok()
        .map(|w| (w.ws_row, w.ws_col));
    let session = match sandbox.exec_tty(req)? {
        Ok(s) => s,
        Err(failed) => return Ok(failed),
    };
    let raw = RawMode::enter();
    let master: OwnedFd = session
        .master
        .try_clone()
        .map_err(|e| Error::io("duplicating the pty", e))?;
    let to_pty = std::fs::File::from(
        master
            .try_clone()
            .map_err(|e| Error::io("duplicating the pty", e))?,
    );
    let from_pty = std::fs::File::from(master);

    // Window size changes follow the caller's terminal.
    let winch_fd = session
        .master
        .try_clone()
        .map_err(|e| Error::io("duplicating the pty", e))?;
    if let Ok(mut sigs) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGWINCH]) {
        std::thread::spawn(move || {
            for _ in sigs.forever() {
                if let Ok(ws) = tcgetwinsize(std::io::stdin().as_fd()) {
                    let _ = tcsetwinsize(&winch_fd, ws);
                }
            }
        });
    }
    // Keystrokes in; this thread ends with the process.
    std::thread::spawn(move || {
        let mut to_pty = to_pty;
        let mut buf = [0u8; 4096];
        let mut input = std::io::stdin().lock();
        while let Ok(n) = input.read(&mut buf) {
            if n == 0 || to_pty.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    // Output out, until every holder of the pty's other side is gone.
    let output = std::thread::spawn(move || {
        let mut from_pty = from_pty;
        let mut buf = [0u8; 8192];
        let mut out = std::io::stdout().lock();
        while let Ok(n) = from_pty.read(&mut buf) {
            if n == 0 || out.write_all(&buf[..n]).is_err() {
                break;
            }
            let _ = out.flush();
        }
    });
    let status = session.wait_reporting(sandbox.name());
    // The command is gone; what it wrote is drained once the pty closes.
    let _ = output.join();
    drop(raw);
    status.map(|(status, denied)| {
        // Also for sandbox.json at stop.
        sandbox.note_denied(&denied);
        crate::cmd::report_denials(&denied);
        status
    })
}
