//! Relaying the caller's stdio (`run`, `exec`): a command gets pipes, not
//! the caller's own descriptors, wherever those lead somewhere it could
//! reopen or keep. Through `/proc/self/fd/1` a command given the caller's
//! log file as stdout reopens it (reads it, writes anywhere in it), and one
//! given the caller's terminal keeps reading it after the exec returned
//! (a process left running). So a regular file, a terminal, or anything
//! else but a pipe, a socket or /dev/null is relayed: the command gets a
//! pipe, and a thread of this process copies between it and the caller's
//! descriptor until the command has exited (and its output is drained).
//! A process the command leaves behind holds only pipe ends, which lead
//! nowhere once the exec returned. Pipes, sockets and /dev/null are handed
//! over as they are (as before, and at no cost): reopening them gives
//! nothing more than the descriptor itself.

use super::exit::wait_exit;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::pipe::{pipe_with, PipeFlags};

use super::{ExecStatus, Sandbox};
use crate::error::{Error, IoContext, Result};
use crate::protocol::{self, ExecRequest, Request};

/// Whether the caller's `fd` must be relayed rather than handed over.
fn needs_relay(fd: BorrowedFd<'_>) -> bool {
    use rustix::fs::FileType;
    let Ok(st) = rustix::fs::fstat(fd) else {
        // Not open: the send fails and says so.
        return false;
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Fifo | FileType::Socket => false,
        FileType::CharacterDevice => {
            // /dev/null (1:3) reads and writes nothing.
            !(rustix::fs::major(st.st_rdev) == 1 && rustix::fs::minor(st.st_rdev) == 3)
        }
        _ => true,
    }
}

/// Whether `a` and `b` are the same file (device and inode).
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(x), Ok(y)) => (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino),
        _ => false,
    }
}

/// Writes all of `data` to `to`; false once `to` refuses (its reader went).
fn write_all(to: BorrowedFd<'_>, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        match rustix::io::write(to, data) {
            Ok(0) => return false,
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
    true
}

/// What one wait of a copy loop ([`pump_out`], `exec`'s reader) found.
pub(super) enum Wait {
    /// A signal came first: wait again.
    Interrupted,
    /// poll failed: stop copying.
    Failed,
    /// `stop` is readable (the command exited): the fds were made
    /// non-blocking, so what is buffered drains without waiting.
    Stopped,
    /// One of the fds is readable.
    Input,
}

/// Waits until one of `fds` or `stop` is readable; once `stop` is, makes
/// each of `fds` non-blocking.
pub(super) fn wait_input(fds: &[BorrowedFd<'_>], stop: BorrowedFd<'_>) -> Wait {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    polled.push(PollFd::new(&stop, PollFlags::IN));
    match poll(&mut polled, None) {
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Wait::Interrupted,
        Err(_) => return Wait::Failed,
    }
    let stopped = polled.last().is_some_and(|f| !f.revents().is_empty());
    if !stopped {
        return Wait::Input;
    }
    for fd in fds {
        let _ = rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK);
    }
    Wait::Stopped
}

/// Whether `fd` has input now (a poll that does not wait).
pub(super) fn readable_now(fd: BorrowedFd<'_>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}

/// Copies what the command writes (each pipe's read end) to the caller's
/// descriptor, until `stop` is readable (the command exited) and what is
/// buffered has been read. A caller's descriptor that refuses writes
/// (a closed reader) has the rest of its stream read and dropped, so the
/// command never blocks on it.
fn pump_out(streams: Vec<(OwnedFd, BorrowedFd<'_>)>, stop: OwnedFd) {
    let mut open: Vec<Option<(OwnedFd, BorrowedFd<'_>, bool)>> = streams
        .into_iter()
        .map(|(from, to)| Some((from, to, true)))
        .collect();
    let mut buf = vec![0u8; 65536];
    let mut draining = false;
    while open.iter().any(Option::is_some) {
        if !draining {
            let fds: Vec<BorrowedFd<'_>> =
                open.iter().flatten().map(|(fd, _, _)| fd.as_fd()).collect();
            match wait_input(&fds, stop.as_fd()) {
                Wait::Interrupted => continue,
                Wait::Failed => break,
                Wait::Stopped => draining = true,
                Wait::Input => {}
            }
        }
        for slot in &mut open {
            let Some((from, to, writable)) = slot else {
                continue;
            };
            if !draining && !readable_now(from.as_fd()) {
                continue;
            }
            match rustix::io::read(&*from, &mut buf) {
                Ok(0) => *slot = None,
                Ok(n) => {
                    if *writable {
                        *writable = write_all(*to, &buf[..n]);
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                // Drained (EAGAIN) or broken: done with this stream.
                Err(_) => *slot = None,
            }
        }
    }
}

/// Copies the caller's input to the command's stdin pipe until either
/// ends. It runs on its own (never joined): reading a terminal blocks
/// until the user types, whether or not the command still runs.
fn pump_in(from: OwnedFd, to: OwnedFd) {
    let mut buf = vec![0u8; 65536];
    loop {
        match rustix::io::read(&from, &mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if !write_all(to.as_fd(), &buf[..n]) {
                    return;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

/// Whether this process may read the terminal `fd` now: it is in the
/// foreground process group of its controlling terminal (a background job
/// that read it would be stopped by SIGTTIN), or `fd` is another terminal
/// (which stops nobody).
fn in_foreground(fd: BorrowedFd<'_>) -> bool {
    match rustix::termios::tcgetpgrp(fd) {
        Ok(pg) => pg == rustix::process::getpgrp(),
        Err(_) => true,
    }
}

/// The stdin to hand a command for the caller's `fd`: `fd` itself (as
/// `None`) when it needs no relay; else a pipe's read end, with a thread
/// that copies `fd` into it started (or /dev/null for a terminal this
/// process may not read now).
pub(super) fn relayed_input(fd: BorrowedFd<'_>) -> Result<Option<OwnedFd>> {
    if !needs_relay(fd) {
        return Ok(None);
    }
    if rustix::termios::isatty(fd) && !in_foreground(fd) {
        // A background job gets no input, as the kernel would have it.
        let null = File::open("/dev/null").ctx(|| "opening /dev/null".into())?;
        return Ok(Some(OwnedFd::from(null)));
    }
    let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
    let from =
        rustix::io::fcntl_dupfd_cloexec(fd, 3).map_err(|e| Error::io("duplicating stdin", e))?;
    std::thread::spawn(move || pump_in(from, w));
    Ok(Some(r))
}

impl Sandbox {
    /// [`Sandbox::exec`] with the caller's stdio, relayed where it must be
    /// (see the module docs): what the command (and whatever it leaves
    /// running) holds are pipes, never the caller's file or terminal.
    pub fn exec_relayed(&self, req: ExecRequest, stdio: [BorrowedFd<'_>; 3]) -> Result<ExecStatus> {
        let relay = stdio.map(needs_relay);
        if !relay.iter().any(|r| *r) {
            return self.exec(req, stdio);
        }
        let pipe = || pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e));
        // What the command gets in place of a relayed descriptor, and the
        // read ends of its output pipes this process copies from.
        let mut theirs: [Option<OwnedFd>; 3] = [None, None, None];
        let mut outputs: Vec<(OwnedFd, BorrowedFd<'_>)> = Vec::new();
        for (i, fd) in stdio.iter().enumerate().skip(1) {
            if relay[i] {
                let (r, w) = pipe()?;
                theirs[i] = Some(w);
                outputs.push((r, *fd));
            }
        }
        // stdout and stderr on one file or terminal (`>LOG 2>&1`): one
        // pipe for both, so that their order is kept.
        if relay[1] && relay[2] && same_file(stdio[1], stdio[2]) {
            outputs.truncate(1);
            theirs[2] = theirs[1]
                .as_ref()
                .map(|w| w.try_clone())
                .transpose()
                .ctx(|| "duplicating a pipe".into())?;
        }
        // Last: its copying starts at once.
        if relay[0] {
            theirs[0] = relayed_input(stdio[0])?;
        }
        let kills_before = self.oom_kills_now();
        let conn = self.connect()?;
        let last = req.stop_after;
        {
            let handed: Vec<BorrowedFd<'_>> = theirs
                .iter()
                .zip(stdio)
                .map(|(t, s)| t.as_ref().map_or(s, AsFd::as_fd))
                .collect();
            protocol::send(
                &conn,
                &Request::Exec(ExecRequest { tty: false, ..req }),
                &handed,
            )
            .map_err(|e| self.proto(e))?;
        }
        // The command's ends are its own now.
        drop(theirs);
        let (stop_r, stop_w) = pipe()?;
        let ended = std::thread::scope(|s| {
            let pump = s.spawn(move || pump_out(outputs, stop_r));
            let ended = self
                .wait_ready()
                .and_then(|()| wait_exit(&conn, &self.name));
            drop(stop_w);
            let _ = pump.join();
            ended
        });
        Ok(self.exec_ended(ended, kills_before, last)?.0)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn files_and_terminals_are_relayed_pipes_sockets_and_null_are_not() {
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).expect("pipe");
        assert!(!needs_relay(r.as_fd()) && !needs_relay(w.as_fd()));
        let (a, _b) = UnixStream::pair().expect("socketpair");
        assert!(!needs_relay(a.as_fd()));
        let null = File::open("/dev/null").expect("null");
        assert!(!needs_relay(null.as_fd()));
        let file = tempfile::tempfile().expect("file");
        assert!(needs_relay(file.as_fd()));
        let zero = File::open("/dev/zero").expect("zero");
        assert!(needs_relay(zero.as_fd()), "a device other than /dev/null");
        let pty =
            rustix::pty::openpt(rustix::pty::OpenptFlags::RDWR | rustix::pty::OpenptFlags::NOCTTY)
                .expect("openpt");
        assert!(needs_relay(pty.as_fd()), "a terminal");
    }

    #[test]
    fn output_is_copied_until_the_stop_then_drained() {
        use std::io::{Read, Seek};
        let mut dest = tempfile::tempfile().expect("file");
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).expect("pipe");
        let (stop_r, stop_w) = pipe_with(PipeFlags::CLOEXEC).expect("pipe");
        rustix::io::write(&w, b"before the exit\n").expect("write");
        // The writer stays open (a process left behind): the stop ends it.
        drop(stop_w);
        pump_out(vec![(r, dest.as_fd())], stop_r);
        let mut got = String::new();
        dest.rewind().expect("rewind");
        dest.read_to_string(&mut got).expect("read");
        assert_eq!(got, "before the exit\n");
        drop(w);
    }
}
