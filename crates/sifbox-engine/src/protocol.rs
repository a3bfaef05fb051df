//! The control protocol between clients and a sandbox's exec server.
//!
//! Frames on a Unix stream socket: a little-endian u32 length, then that many
//! bytes of JSON. File descriptors (a command's stdio, a pty master) travel
//! with the first byte of a frame as SCM_RIGHTS, so a client never has to
//! enter the sandbox's namespaces itself.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Name of the control socket in the sandbox's runtime dir.
pub const CONTROL_SOCKET: &str = "control.sock";

/// What a sandbox used so far, as the mechanisms that enforce its limits
/// see it (see [`crate::limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// CPU time of all its processes, in nanoseconds.
    pub cpu_ns: Option<u64>,
    /// The most memory it held at once since it started or since
    /// [`crate::Sandbox::reset_memory_peak`], in bytes (the cgroup's peak, or the
    /// watchdog's sampled one).
    pub memory_peak: Option<u64>,
    /// Processes killed for going over the memory limit (by the kernel's
    /// OOM killer in a cgroup, or by the watchdog).
    pub oom_kills: u64,
    /// How many times the watchdog started a new peak on request.
    #[serde(default)]
    pub peak_resets: u64,
}

/// Largest frame accepted (argv and env of an exec included).
pub const MAX_FRAME: u32 = 64 << 20;
/// Most descriptors carried by one frame.
const MAX_FDS: usize = 5;

/// What a client asks of the exec server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Run a command. Without `tty`, three fds (stdin, stdout, stderr) come
    /// with the frame; with `detach_id`, a fourth where the exit status is
    /// written when the command ends.
    Exec(ExecRequest),
    /// Send `signal` to a detached exec: SIGKILL reaches every process the
    /// exec started; other signals go to the command's process group.
    Signal { exec_id: String, signal: i32 },
    /// Write a tar stream of `path` (a file or a directory, symlinks kept as
    /// links) to the fd that comes with the frame. With `follow`, a symlink
    /// at `path` itself is followed (`cp -L`); nothing below it is.
    Download {
        path: String,
        #[serde(default)]
        follow: bool,
    },
    /// Read a tar stream from the fd that comes with the frame and unpack it
    /// at `dst` as `docker cp` does: into `dst` when it is a directory, else
    /// as `dst`. Entries are named `name/...`. `owner` (a user of the
    /// image) owns what is written; else root.
    Upload {
        dst: String,
        name: String,
        owner: Option<String>,
    },
    /// Read a tar stream of relative entry names from the fd that comes with
    /// the frame and unpack it into the directory `dst` (made with its
    /// parents when missing), confined to it. With `owner` (numeric ids as
    /// seen inside) everything written belongs to it; else to root. Build
    /// steps (`COPY`, `ADD`) use it.
    Extract {
        dst: String,
        owner: Option<(u32, u32)>,
    },
    /// Read a tar stream of relative entry names from the fd that comes
    /// with the frame (`sifbox cp - NAME:DIR`) and unpack it into `dst`, a
    /// directory that must exist, confined to it. `owner` (a user of the
    /// image) owns what is written; else root.
    UploadTar { dst: String, owner: Option<String> },
    /// Write a tar stream of the whole root file system as the sandbox sees
    /// it (owners as seen inside; other mounts left out, their mount points
    /// kept as empty directories; a file's further names as hard links) to
    /// the fd that comes with the frame.
    Snapshot,
    /// Remove the tree at `path` (a directory bound in from the host whose
    /// files belong to ids of the sandbox's mapping, which the caller
    /// cannot remove on the host). A missing path is not an error.
    Remove { path: String },
    /// Give `path` and every entry beneath it (a tree bound in from the
    /// host) to the sandbox's root, following no symlink
    /// (`transfer::give_back`): what other ids of the caller's mapping
    /// wrote there becomes the caller's on the host.
    GiveBack { path: String },
    /// Give the copy of the root file system at `dst` (bound in from the
    /// host) the owners of the original, where they are not root's.
    MirrorOwners { dst: String },
    /// Give `path` itself (never what a symlink there points to) to `user`
    /// of the image (`name`, `uid`, `uid:gid` or `name:group`; the user's
    /// group when none is named): a logs dir bound in from the host, which
    /// an unprivileged caller cannot chown to the sandbox's other ids.
    Chown { path: String, user: String },
    /// A file request (`Chown`, `GiveBack`, `Remove`) served in the mount
    /// namespace where the sandbox's guarded binds are writable (see
    /// [`crate::spec::GuardedBind`]); an exec says so itself
    /// ([`ExecRequest::guarded`]).
    Guarded { request: Box<Request> },
    /// End (SIGKILL) every process of the sandbox that commands started,
    /// but those of detached execs (a compose service's own command),
    /// before a verifier runs; answered with [`Event::Ended`].
    EndProcesses,
    /// Stop the sandbox: every process gets SIGTERM, then SIGKILL after
    /// `grace_ms`.
    Stop { grace_ms: u64 },
    /// Stop as `Stop` does, and once every process is gone copy the
    /// writable layer's upper dir into the dir of
    /// `SandboxSpec::keep_layer` (see [`crate::layer_copy`]); the reply
    /// says whether it was copied.
    StopKeepingLayer { grace_ms: u64 },
    /// Liveness check.
    Ping,
}

/// A command to run inside the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// Allocate a pty inside the sandbox; its master comes back with
    /// [`Event::Started`].
    #[serde(default)]
    pub tty: bool,
    /// Initial window size of the pty (rows, cols).
    #[serde(default)]
    pub winsize: Option<(u16, u16)>,
    /// Run as this user of the image (`name`, `uid`, `uid:gid` or
    /// `name:group`) instead of root.
    #[serde(default)]
    pub user: Option<String>,
    /// HOME was not given by the caller: with `user`, it becomes that
    /// user's home from the image's /etc/passwd.
    #[serde(default)]
    pub default_home: bool,
    /// Kill every process the exec started after this long; the exit code
    /// is then 124.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Detached: the exec is known by this id (for `Signal`), and its exit
    /// status goes to the fourth fd instead of the connection.
    #[serde(default)]
    pub detach_id: Option<String>,
    /// The sandbox's last command: once it ends (and its exit is reported),
    /// the sandbox stops by itself, with no further round trip. A one-shot
    /// `run` is start + this exec.
    #[serde(default)]
    pub stop_after: bool,
    /// Make the `chown` and `set*id` system calls succeed without effect
    /// (root emulation where only one id is mapped; see `fakeroot`).
    #[serde(default)]
    pub fake_ids: bool,
    /// Run the command in a network namespace of its own with only `lo`
    /// (a phase of a task that must have no network in a sandbox that
    /// otherwise has the host's).
    #[serde(default)]
    pub isolate_net: bool,
    /// Run the command in the mount namespace where the sandbox's guarded
    /// binds are writable (see [`crate::spec::GuardedBind`]): eval's
    /// verifier. Served by a process of its own, which enters it.
    #[serde(default)]
    pub guarded: bool,
}

/// What the exec server answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The command runs (pid inside the sandbox). With a tty, the pty master
    /// comes with this frame.
    Started { pid: i32 },
    /// The command ended: `code` follows the exit-code contract (128+N for
    /// signal N, 124 after a timeout); `time_ns` is the sandbox's clock then.
    ///
    /// `denied`: the calls the default seccomp policy denied during the
    /// exec, counted (absent when none, so older peers still parse it).
    Exit {
        code: i32,
        #[serde(default)]
        timed_out: bool,
        #[serde(default)]
        time_ns: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        denied: Vec<crate::denials::Denied>,
    },
    /// The command could not be started; `code` is 125, 126 or 127.
    Error { code: i32, message: String },
    /// [`Request::EndProcesses`] was carried out: this many processes
    /// were ended.
    Ended { processes: u32 },
    /// The request was carried out (stop, ping, signal, transfers);
    /// `time_ns` is the sandbox's clock then. `denied`, in the reply to
    /// stop: every call the default seccomp policy denied in the sandbox.
    Ok {
        #[serde(default)]
        time_ns: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        denied: Vec<crate::denials::Denied>,
    },
}

/// Protocol failures.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes is larger than the limit")]
    TooLarge(u32),
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Sends one frame with `fds` attached.
pub fn send<T: Serialize>(
    sock: &UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    let body = serde_json::to_vec(msg)?;
    let len = u32::try_from(body.len()).map_err(|_| ProtocolError::TooLarge(u32::MAX))?;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let header = len.to_le_bytes();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(ProtocolError::Io(std::io::Error::other(
            "too many fds for one frame",
        )));
    }
    let iov = [IoSlice::new(&header), IoSlice::new(&body)];
    let sent = loop {
        match sendmsg(sock, &iov, &mut anc, SendFlags::NOSIGNAL) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    // The rest (if the kernel took only part) goes without descriptors.
    let total = header.len() + body.len();
    if sent < total {
        let mut all = Vec::with_capacity(total);
        all.extend_from_slice(&header);
        all.extend_from_slice(&body);
        (&*sock).write_all(&all[sent..])?;
    }
    Ok(())
}

/// Receives one frame and the descriptors that came with it.
pub fn recv<T: DeserializeOwned>(sock: &UnixStream) -> Result<(T, Vec<OwnedFd>), ProtocolError> {
    let mut header = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < header.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut header[got..])];
        let n = match recvmsg(sock, &mut iov, &mut anc, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(std::io::Error::from(e).into()),
        };
        for msg in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        if n == 0 {
            return Err(ProtocolError::Closed);
        }
        got += n;
    }
    let len = u32::from_le_bytes(header);
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    (&*sock).read_exact(&mut body).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ProtocolError::Closed
        } else {
            ProtocolError::Io(e)
        }
    })?;
    Ok((serde_json::from_slice(&body)?, fds))
}

/// Borrows a list of owned descriptors for [`send`].
pub fn borrow_all(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|f| f.as_fd()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_roundtrip_with_fds() {
        let (a, b) = UnixStream::pair().expect("pair");
        let req = Request::Exec(ExecRequest {
            argv: vec!["echo".into(), "hi".into()],
            env: vec![("A".into(), "1".into())],
            cwd: "/".into(),
            ..Default::default()
        });
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        send(&a, &req, &[r.as_fd(), w.as_fd()]).expect("send");
        send(&a, &Request::Ping, &[]).expect("send");
        let (got, fds): (Request, _) = recv(&b).expect("recv");
        assert_eq!(got, req);
        assert_eq!(fds.len(), 2);
        // The received write end feeds the original read end.
        rustix::io::write(&fds[1], b"x").expect("write");
        let mut buf = [0u8; 1];
        rustix::io::read(&r, &mut buf).expect("read");
        assert_eq!(&buf, b"x");
        let (got, fds): (Request, _) = recv(&b).expect("recv");
        assert_eq!(got, Request::Ping);
        assert!(fds.is_empty());
        drop(a);
        assert!(matches!(recv::<Request>(&b), Err(ProtocolError::Closed)));
    }

    #[test]
    fn large_frame_roundtrip() {
        let (a, b) = UnixStream::pair().expect("pair");
        let big = "x".repeat(4 << 20);
        let t = std::thread::spawn(move || {
            send(
                &a,
                &Event::Error {
                    code: 1,
                    message: big,
                },
                &[],
            )
            .expect("send");
        });
        let (got, _): (Event, _) = recv(&b).expect("recv");
        t.join().expect("join");
        assert!(matches!(got, Event::Error { message, .. } if message.len() == 4 << 20));
    }

    #[test]
    fn oversized_header_is_rejected() {
        let (a, b) = UnixStream::pair().expect("pair");
        (&a).write_all(&(MAX_FRAME + 1).to_le_bytes())
            .expect("write");
        assert!(matches!(recv::<Event>(&b), Err(ProtocolError::TooLarge(_))));
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever bytes a peer sends, receiving gives a frame or an
            /// error, never a panic or a hang.
            #[test]
            fn recv_survives_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                let (a, b) = UnixStream::pair().expect("pair");
                (&a).write_all(&bytes).expect("write");
                drop(a);
                let _ = recv::<Request>(&b);
                let _ = recv::<Event>(&b);
            }

            /// Exec requests survive the wire unchanged.
            #[test]
            fn exec_request_roundtrip(
                argv in proptest::collection::vec("\\PC{0,20}", 1..5),
                env in proptest::collection::vec(("[A-Z_]{1,8}", "\\PC{0,20}"), 0..5),
                cwd in "/\\PC{0,20}",
                stop_after in any::<bool>(),
            ) {
                let (a, b) = UnixStream::pair().expect("pair");
                let req = Request::Exec(ExecRequest { argv, env, cwd, stop_after, ..Default::default() });
                send(&a, &req, &[]).expect("send");
                let (got, _) = recv::<Request>(&b).expect("recv");
                prop_assert_eq!(got, req);
            }
        }
    }
}
